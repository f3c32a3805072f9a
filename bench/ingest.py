"""``ledgerq bench ingest``: ``POST /batches`` with 1 and 2 workers, SQLite and PostgreSQL.

The target: ``ledgerq serve --workers 2`` accepts ≥ 1.7 × the batches per
second of ``--workers 1`` on this 2-core machine, on either store. What is
measured is ingest alone — decode, signature checks, insert — so the ledger
is a *black hole*: a loopback socket that listens but never accepts. The
pipeline's first submissions hang there (up to the submit timeout) and it
does almost nothing else, so the CPU goes to the API.

Load: ``wrk`` is not assumed (often not installed); the load generator is
here, ``--clients`` processes each keeping ``--connections`` keep-alive
HTTP/1.1 connections busy (closed loop), replaying distinct signed
BatchLists prepared beforehand (``--batches-per-post`` single-``set``
intkey batches each, over 1,000 services). The same requests are replayed
against a fresh database per run; a run that sends more than ``--requests``
posts lists again (retries, answered 202 without an insert), which the
table counts as re-posts. Per run: a warm-up, then the accepted
(202) POSTs counted over ``--seconds``; the load generator's own CPU is
reported beside the figure (it shares the machine's two cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import socket
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import click

from bench import report
from bench._harness import DEFAULT_PG, LEDGERQ, Proc, cpu_seconds, create_database, drop_database
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch

_BANNER = re.compile(rb"ledgerq gateway listening on (http://[\w.\[\]:-]+)")
SERVICES = 1_000


def _make_requests(args: tuple[int, int, int]) -> list[bytes]:
    """Full HTTP requests, ``count`` POSTs of ``per_post`` fresh batches (a pool task)."""
    seed, count, per_post = args
    signer = Signer.generate()
    out = []
    for n in range(count):
        service = f"ingest{(seed * count + n) % SERVICES:04d}"
        body = encode_batch_list(
            [make_intkey_batch(signer, [("set", f"i{seed}x{n}y{k}", 1)]) for k in range(per_post)]
        )
        head = (
            f"POST /batches?service_id={service} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


def _read_response(sock: socket.socket, buf: bytearray) -> tuple[int, bytearray]:
    """One HTTP/1.1 response (Content-Length framed): its status and what follows it."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return status, body[length:]


def _client(
    host: str, port: int, requests: list[bytes], conns: int, start: float, stop: float, q: object
) -> None:
    """A load-generator process: ``conns`` connections, one request in flight on each."""
    import selectors

    sel = selectors.DefaultSelector()
    state: dict[socket.socket, bytearray] = {}
    nxt = 0
    accepted = other = 0
    statuses: dict[int, int] = {}
    for _ in range(conns):
        s = socket.create_connection((host, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state[s] = bytearray()
        sel.register(s, selectors.EVENT_READ)
        s.sendall(requests[nxt % len(requests)])
        nxt += 1
    while time.time() < stop:
        for key, _ in sel.select(timeout=0.5):
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            status, state[conn] = _read_response(conn, state[conn])
            now = time.time()
            if start <= now < stop:
                if status == 202:
                    accepted += 1
                else:
                    other += 1
                    statuses[status] = statuses.get(status, 0) + 1
            conn.sendall(requests[nxt % len(requests)])
            nxt += 1
    cpu = os.times()
    if statuses:
        print(f"load generator: answers other than 202: {statuses}", flush=True)
    q.put((accepted, other, nxt, cpu.user + cpu.system))  # type: ignore[attr-defined]
    for s in state:
        s.close()


def _load(
    url: str, requests: list[bytes], clients: int, conns: int, start: float, stop: float
) -> tuple[int, int, int, float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    seconds, warmup = stop - start, max(start - time.time(), 0.0)
    share = len(requests) // clients
    procs = [
        ctx.Process(
            target=_client,
            args=(host, int(port), requests[i * share : (i + 1) * share], conns, start, stop, q),
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    got = [q.get(timeout=seconds + warmup + 120) for _ in procs]
    for p in procs:
        p.join(30)
    return (
        sum(g[0] for g in got),
        sum(g[1] for g in got),
        sum(g[2] for g in got),
        sum(g[3] for g in got),
    )


async def _run(
    db: str,
    workers: int,
    workdir: Path,
    requests: list[bytes],
    clients: int,
    conns: int,
    warmup: float,
    seconds: float,
) -> dict[str, float]:
    hole = socket.socket()  # the black-hole ledger: listens, never accepts
    hole.bind(("127.0.0.1", 0))
    hole.listen(4096)
    ledger = f"sawtooth+http://127.0.0.1:{hole.getsockname()[1]}"
    args = [LEDGERQ, "serve", "--db", db, "--ledger", ledger, "--bind", "127.0.0.1:0"]
    env = {
        "LEDGERQ_CONFIG": "",
        "LEDGERQ_WORKERS": str(workers),
        "LEDGERQ_LOG_LEVEL": "warning",
    }
    proc = Proc(args, workdir / f"serve-{workers}.log", env=env, banner=_BANNER)
    try:
        url = await proc.start(timeout_s=120)
        pids = _tree(proc.pid)
        start = time.time() + warmup
        stop = start + seconds
        load = asyncio.ensure_future(
            asyncio.to_thread(_load, url, requests, clients, conns, start, stop)
        )
        # CPU is read over the counted window only (not the warm-up), for the
        # gateway's processes, every PostgreSQL process, and the whole machine.
        await asyncio.sleep(max(start - time.time(), 0))
        postgres = _postgres_pids()
        before = (_cpu_by_pid(pids), _cpu_by_pid(postgres), _machine_busy_s())
        waits = (
            asyncio.ensure_future(asyncio.to_thread(_pg_waits, db, stop))
            if db.startswith("postgresql")
            else None
        )
        await asyncio.sleep(max(stop - time.time(), 0))
        after = (_cpu_by_pid(pids), _cpu_by_pid(postgres), _machine_busy_s())
        waited = await waits if waits is not None else {}
        accepted, other, sent, client_cpu = await load
    finally:
        await proc.stop()
        hole.close()
    return {
        "posts_s": accepted / seconds,
        "other": other,
        "sent": sent,
        "server_cpu_s": _delta(before[0], after[0]),
        "postgres_cpu_s": _delta(before[1], after[1]),
        "machine_cpu_s": after[2] - before[2],
        "client_cpu_s": client_cpu,
        **{f"wait:{k}": v for k, v in waited.items()},
    }


def _pg_waits(db: str, stop: float, every_s: float = 0.02) -> dict[str, float]:
    """What the run's PostgreSQL backends were doing, sampled until ``stop``: per
    wait event (``CPU`` when running, not waiting), the average number of active
    backends in it. Lock waits between the workers' transactions show here."""
    import psycopg

    counts: dict[str, int] = {}
    samples = 0
    with psycopg.connect(db, autocommit=True) as conn:
        while time.time() < stop:
            rows = conn.execute(
                "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*)"
                " FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'active' AND pid <> pg_backend_pid() GROUP BY 1"
            ).fetchall()
            samples += 1
            for what, n in rows:
                counts[what] = counts.get(what, 0) + int(n)
            time.sleep(every_s)
    return {k: v / max(samples, 1) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


def _cpu_by_pid(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = cpu_seconds(pid)
    return out


def _delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between the two readings by the processes alive at both (one that
    exited meanwhile is missed rather than counted negative)."""
    return sum(after[p] - before[p] for p in before.keys() & after.keys())


def _postgres_pids() -> list[int]:
    """Every PostgreSQL server process on the machine (backends, WAL writer, ...)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() in ("postgres", "postmaster"):
                    out.append(int(entry.name))
    return out


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy, all cores (/proc/stat: user, nice,
    system, irq, softirq; not idle, iowait or time stolen by the hypervisor)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _cpu(pids: list[int]) -> float:
    """CPU seconds used so far by the live processes of ``pids``."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def _tree(pid: int) -> list[int]:
    """``pid`` and its children (the supervisor's workers)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        out += [int(c) for c in children]
    return out


def _stores(which: Sequence[str], pg: str, workdir: Path, tag: str) -> list[tuple[str, str]]:
    out = []
    for store in which:
        if store == "sqlite":
            out.append((store, f"sqlite:///{workdir / f'ingest-{tag}.sqlite3'}"))
        else:
            out.append((store, create_database(pg, "bench_ingest")))
    return out


@click.command("ingest")
@click.option("--seconds", default=10.0, show_default=True, help="Measured seconds per run.")
@click.option("--warmup", default=3.0, show_default=True, help="Warm-up seconds per run.")
@click.option("--clients", default=1, show_default=True, help="Load-generator processes.")
@click.option("--connections", default=16, show_default=True, help="Connections per client.")
@click.option("--batches-per-post", default=10, show_default=True, help="Batches per POST.")
@click.option(
    "--requests",
    "count",
    default=8_000,
    show_default=True,
    help="Distinct POSTs (past them, lists already accepted are posted again).",
)
@click.option("--repeat", default=2, show_default=True, help="Runs per (store, workers).")
@click.option(
    "--store", "stores", multiple=True, default=("sqlite", "postgresql"), show_default=True
)
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(
    seconds: float,
    warmup: float,
    clients: int,
    connections: int,
    batches_per_post: int,
    count: int,
    repeat: int,
    stores: tuple[str, ...],
    pg: str,
    write: bool,
) -> None:
    """POST /batches accepted per second with 1 and 2 workers (SQLite, PostgreSQL)."""
    load_before = os.getloadavg()
    parts = 8
    with multiprocessing.get_context("fork").Pool(2) as pool:
        chunks = pool.map(
            _make_requests, [(i, count // parts, batches_per_post) for i in range(parts)]
        )
    requests = [r for chunk in chunks for r in chunk]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-ingest-") as tmp:
        workdir = Path(tmp)
        for r in range(repeat):
            for store in stores:
                # Alternate the order so neither worker count always runs second.
                for workers in (1, 2) if r % 2 == 0 else (2, 1):
                    ((_, db),) = _stores([store], pg, workdir, f"{r}-{workers}")
                    try:
                        got = asyncio.run(
                            _run(
                                db,
                                workers,
                                workdir,
                                requests,
                                clients,
                                connections,
                                warmup,
                                seconds,
                            )
                        )
                    finally:
                        if store != "sqlite":
                            drop_database(pg, db)
                    click.echo(f"{store} workers={workers} run {r}: {got}")
                    results.setdefault((store, workers), []).append(got)
    load_after = os.getloadavg()
    rows = []
    for store in stores:
        one = [g["posts_s"] * batches_per_post for g in results[(store, 1)]]
        two = [g["posts_s"] * batches_per_post for g in results[(store, 2)]]
        ratio = statistics.median(two) / statistics.median(one)
        for workers, rates in ((1, one), (2, two)):
            runs = results[(store, workers)]
            wall = seconds + warmup
            rows.append(
                [
                    store,
                    workers,
                    " / ".join(f"{x:,.0f}" for x in rates),
                    f"{statistics.median(rates):,.0f}",
                    f"{statistics.median(g['server_cpu_s'] for g in runs) / seconds:.2f}",
                    f"{statistics.median(g['client_cpu_s'] for g in runs) / wall:.2f}",
                    f"{statistics.median(g['postgres_cpu_s'] for g in runs) / seconds:.2f}",
                    f"{statistics.median(g['machine_cpu_s'] for g in runs) / seconds:.2f}",
                    sum(int(g["other"]) for g in runs),
                    " / ".join(f"{max(int(g['sent']) - len(requests), 0):,}" for g in runs),
                    f"{ratio:.2f} ×" if workers == 2 else "",
                ]
            )
    text = "\n".join(
        [
            f"`POST /batches` to `ledgerq serve --workers N` (a black-hole ledger: ingest "
            f"alone), {batches_per_post} signed single-transaction intkey batches per POST over "
            f"{SERVICES:,} services, {clients} load-generator process(es) × {connections} "
            f"keep-alive connections (closed loop; `wrk` not installed), {warmup:.0f} s warm-up "
            f"then {seconds:.0f} s counted, a fresh database per run, runs alternated. The load "
            "generator shares the two cores with the gateway. CPU in cores over the counted "
            "seconds (user + system, /proc): the gateway's processes (supervisor and workers), "
            "the load generator (over warm-up and counted seconds), every PostgreSQL server "
            "process, and the whole machine busy (/proc/stat: everything, other work on the "
            "machine included; not idle, iowait or stolen time). Re-posts: POSTs (warm-up "
            f"included) past the {len(requests):,} distinct ones, each a list already "
            "accepted, answered 202 as a retry without an insert or a flush: a run with many "
            "is not measuring ingest alone. Machine load "
            f"average (1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; "
            f"after: {', '.join(f'{x:.1f}' for x in load_after)} — a machine shared with other "
            "engineers' tests and benchmarks.",
            "",
            report.table(
                [
                    "store",
                    "workers",
                    "batches/s per run",
                    "median",
                    "gateway CPU (cores)",
                    "load-generator CPU (cores)",
                    "PostgreSQL CPU (cores)",
                    f"machine busy (cores, of {os.cpu_count()})",
                    "non-202",
                    "re-posts per run",
                    "2 ÷ 1 workers (target ≥ 1.7)",
                ],
                rows,
            ),
        ]
    )
    waits = []
    for store in stores:
        for workers in (1, 2):
            runs = results[(store, workers)]
            keys = sorted({k for g in runs for k in g if k.startswith("wait:")})
            if not keys:
                continue
            avg = {k[5:]: statistics.median(g.get(k, 0.0) for g in runs) for k in keys}
            top = sorted(avg.items(), key=lambda kv: -kv[1])[:6]
            waits.append(
                f"* {store}, {workers} worker(s): "
                + ", ".join(f"{what} {n:.2f}" for what, n in top)
                + "."
            )
    click.echo(text)
    if waits:  # printed, not written: the page keeps the table
        click.echo(
            "\nPostgreSQL's active backends of the run's database, sampled every 20 ms over "
            "the counted seconds: the average number running (`CPU`) or waiting, per wait "
            "event (median of the runs):\n\n" + "\n".join(waits)
        )
    if write:
        report.write_section("ingest", text)
