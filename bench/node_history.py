"""``ledgerq bench node_history``: the node process over a long history, fed over REST.

A real ``ledgerq node`` process with a data directory is fed ``--batches``
intkey batches of ``--txns`` transactions (each ``set``s a name of its own,
so the state grows with history) over ``POST /batches`` by one client
process per core (each
pre-signs its share, then posts ``--chunk`` batches per request with
``--concurrency`` requests in flight). Measured:

* throughput: committed transactions per second over REST, first POST to
  last commit, and per tenth of the run;
* memory: the node's RSS at every tenth of the batches, and its two parts
  apart: anonymous memory (the heap) and file pages mapped in (the store's
  pages read through LMDB's memory map: the page cache, which the kernel can
  drop at will);
* restart: after ``kill -9`` at the end, the time until the node listens
  again (store opened, journal tail replayed), and after a clean stop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp
import click

from bench.report import Target, console, table, write_section
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch

LEDGERQ = str(Path(sys.executable).parent / "ledgerq")
_FIELDS = ("VmRSS", "RssAnon", "RssFile")


def _sign(args: tuple[int, int, int, int, int]) -> tuple[list[bytes], list[str]]:
    client, first, count, chunk, txns = args
    signer = Signer.generate()
    bodies, last_ids = [], []
    for start in range(first, first + count, chunk):
        batches = [
            make_intkey_batch(
                signer, [("set", f"h{client}-{i}-{j}", i % 1000) for j in range(txns)]
            )
            for i in range(start, min(start + chunk, first + count))
        ]
        bodies.append(encode_batch_list(batches))
        last_ids.append(batches[-1].header_signature)
    return bodies, last_ids


def _post_all(url: str, bodies: list[bytes], last_ids: list[str], concurrency: int) -> None:
    asyncio.run(_post(url, bodies, last_ids, concurrency))


async def _post(url: str, bodies: list[bytes], last_ids: list[str], concurrency: int) -> None:
    queue = list(range(len(bodies)))[::-1]
    headers = {"Content-Type": "application/octet-stream"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                while True:
                    async with session.post(f"{url}/batches", data=bodies[i], headers=headers) as r:
                        if r.status == 202:
                            break
                        if r.status not in (429, 503):  # busy: try again
                            raise RuntimeError(f"POST /batches answered {r.status}")
                    await asyncio.sleep(0.05)
                # The window: wait for this chunk's last batch before sending another.
                async with session.get(f"{url}/batch_statuses?id={last_ids[i]}&wait=60") as r:
                    await r.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


class NodeProcess:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [LEDGERQ, "node", "--bind", "127.0.0.1:0", "--data-dir", str(data_dir)],
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        assert self.proc.stderr is not None
        self.startup: list[str] = []  # the node's own account of its start-up phases
        for line in self.proc.stderr:
            if "start-up:" in line:
                self.startup.append(line.split("start-up:", 1)[1].strip())
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise RuntimeError(f"the node exited with {self.proc.wait()}")
        self.ready_s = time.perf_counter() - self.started
        # Keep reading: a node that logs a lot during the run must not block
        # on a full pipe (its last lines are kept for a failure's message).
        self.last_lines: collections.deque[str] = collections.deque(maxlen=50)
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True)
        self._drain.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(ValueError, OSError):  # closed by stop()
            for line in self.proc.stderr:
                self.last_lines.append(line)

    def memory(self) -> tuple[float, float, float]:
        """RSS, its anonymous part (the heap) and its file-backed part, MiB."""
        fields = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            fields[name] = value.strip()
        rss, anon, file = (int(fields[k].split()[0]) / 1024 for k in _FIELDS)
        return rss, anon, file

    def cpu(self) -> tuple[float, float]:
        """CPU seconds (user and system) used so far by the node's process (its event
        loop and threads) and by its live children (the decoding workers): the node's
        cost, whatever else shares the cores."""
        own = _cpu_seconds(self.proc.pid, children=False)
        return own, _cpu_seconds(self.proc.pid) - own

    def stop(self, sig: int) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(120)
        self._drain.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def _cpu_seconds(pid: int, *, children: bool = True) -> float:
    """utime + stime of a process and (``children``), recursively, of its live children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        kids: list[int] = []
        for task in Path(f"/proc/{pid}/task").iterdir() if children else ():
            with contextlib.suppress(OSError):
                kids += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, IndexError, ValueError):
        return 0.0
    return ticks / os.sysconf("SC_CLK_TCK") + sum(_cpu_seconds(c) for c in kids)


class StatusProbe:
    """Times ``POST /batch_statuses`` of ``ids`` every ``every`` s from its own
    thread while the node is under the run's load: what a gateway's status
    read (issue 15's take-over reads 40–76 ids) waits behind on the node's
    event loop. The read itself costs the node about a quarter of a
    millisecond."""

    def __init__(self, url: str, ids: list[str], every: float = 0.25) -> None:
        self.url, self.body, self.every = url, json.dumps(ids).encode(), every
        self.times: list[tuple[float, float]] = []  # (when, seconds to answer)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            request = urllib.request.Request(
                f"{self.url}/batch_statuses",
                data=self.body,
                headers={"Content-Type": "application/json"},
            )
            t0 = time.perf_counter()
            with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=30) as r:
                r.read()
                self.times.append((t0, time.perf_counter() - t0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(35)

    def between(self, start: float, end: float) -> list[float]:
        return sorted(s for t, s in self.times if start <= t <= end)


async def _height(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/blocks?limit=1") as r:
        doc = await r.json()
        return int(doc["data"][0]["header"]["block_num"]) if doc["data"] else 0


@click.command("node_history")
@click.option("--batches", default=1_000_000, show_default=True)
@click.option("--chunk", default=500, show_default=True, help="Batches per POST.")
@click.option("--concurrency", default=4, show_default=True, help="POSTs in flight per client.")
@click.option("--clients", default=os.cpu_count() or 1, show_default=True)
@click.option(
    "--txns",
    default=1,
    show_default=True,
    help="Transactions per batch (Sawtooth clients put many in one batch).",
)
@click.option(
    "--tracemalloc",
    "trace_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Trace the node's allocations; at every tenth append where its heap grew to this "
    "file (see ledgerq.node.memdebug; slows the node down: figures not comparable).",
)
@click.option(
    "--lock",
    "lock_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Hold an exclusive flock on this file while measuring (after signing), e.g. "
    "/tmp/ledgerq-bench.lock.",
)
@click.option("--write/--no-write", default=True, show_default=True)
def command(
    batches: int,
    chunk: int,
    concurrency: int,
    clients: int,
    txns: int,
    trace_file: Path | None,
    lock_file: Path | None,
    write: bool,
) -> None:
    """RSS over a long history, restart time, REST throughput with one client per core."""
    load_before = os.getloadavg()[0]
    share = batches // clients
    ctx = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    with ctx.Pool(clients) as pool:
        signed = pool.map(_sign, [(c, c * share, share, chunk, txns) for c in range(clients)])
    console.print(f"signed {share * clients:,} batches in {time.perf_counter() - t0:.0f} s")
    with contextlib.ExitStack() as held:
        if lock_file is not None:
            lock = held.enter_context(lock_file.open("a"))
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            load_before = os.getloadavg()[0]
        markdown, target = _measure(
            signed, share, clients, chunk, concurrency, txns, trace_file, load_before
        )
    console.print(markdown)
    if write and trace_file is None:
        # One transaction per batch measures memory and restart over a long history,
        # several per batch the REST throughput: each has its section.
        write_section(
            "node-history" if txns == 1 else "node-history-txns", markdown, targets=[target]
        )


def _measure(
    signed: list[tuple[list[bytes], list[str]]],
    share: int,
    clients: int,
    chunk: int,
    concurrency: int,
    txns: int,
    trace_file: Path | None,
    load_before: float,
) -> tuple[str, Target]:
    ctx = multiprocessing.get_context("spawn")
    total = share * clients
    with tempfile.TemporaryDirectory(prefix="ledgerq-history-") as tmp:
        env = None
        if trace_file is not None:
            env = {"LEDGERQ_NODE_TRACEMALLOC": str(trace_file.resolve())}
        node = NodeProcess(Path(tmp), env)
        posters = [
            ctx.Process(target=_post_all, args=(node.url, b, ids, concurrency)) for b, ids in signed
        ]
        # 76 ids, as a take-over's status read: the chunks' last batches, client by client.
        probe_ids = [i for _, ids in signed for i in ids[:38]][:76]
        del signed
        start = time.perf_counter()
        for p in posters:
            p.start()
        probe = StatusProbe(node.url, probe_ids)
        marks: list[tuple[int, float, float, float, float]] = []  # height, s, rss, anon, file
        cpu: list[tuple[float, float]] = []  # the node's CPU seconds at each mark
        client_cpu = [0.0] * len(posters)
        client_marks: list[float] = []  # the clients' CPU seconds at each mark
        tenth = max(1, total // 10)
        next_mark = tenth
        while True:
            height = asyncio.run(_height(node.url))
            if height >= next_mark or height >= total:
                rss, anon, file = node.memory()
                marks.append((height, time.perf_counter() - start, rss, anon, file))
                cpu.append(node.cpu())
                for i, poster in enumerate(posters):  # the last value read (0 once gone)
                    if poster.pid is not None:
                        client_cpu[i] = max(client_cpu[i], _cpu_seconds(poster.pid))
                client_marks.append(sum(client_cpu))
                if trace_file is not None:
                    node.proc.send_signal(signal.SIGUSR2)
                console.print(
                    f"{height:,} committed, {rss:.0f} MiB RSS ({anon:.0f} anon, {file:.0f} file)"
                )
                next_mark += tenth
            if height >= total:
                break
            if not any(p.is_alive() for p in posters) and height < total:
                time.sleep(1)
                if asyncio.run(_height(node.url)) < total:
                    node.stop(signal.SIGKILL)  # leave no node behind
                    raise RuntimeError("the clients stopped before every batch committed")
            time.sleep(0.5)
        elapsed = time.perf_counter() - start
        probe.stop()
        reads = probe.between(start + marks[0][1], start + marks[-1][1])
        for p in posters:
            p.join(60)
        node.stop(signal.SIGKILL)
        killed = NodeProcess(Path(tmp))
        after_kill = killed.ready_s
        kill_phases = "; ".join(killed.startup) or "not logged"
        rss_restart, anon_restart, _ = killed.memory()
        killed.stop(signal.SIGTERM)
        clean = NodeProcess(Path(tmp))
        after_clean = clean.ready_s
        clean_phases = "; ".join(clean.startup) or "not logged"
        clean.stop(signal.SIGTERM)
        disk = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file()) / 2**20
    first, last = marks[0], marks[-1]
    steady = (last[0] - first[0]) / max(1e-9, last[1] - first[1])
    per_tx = max(1, (last[0] - first[0]) * txns) / 1e6
    own_per_tx = (cpu[-1][0] - cpu[0][0]) / per_tx
    workers_per_tx = (cpu[-1][1] - cpu[0][1]) / per_tx
    cpu_per_tx = own_per_tx + workers_per_tx
    # Clients that finished posting before the last mark count up to their last reading.
    clients_per_tx = (client_marks[-1] - client_marks[0]) / per_tx
    cores = cpu_per_tx * steady * txns / 1e6
    # The first tenth, the middle and the end: the growth and the rate's trend.
    shown = [first, marks[len(marks) // 2], last] if len(marks) > 3 else marks
    rows = [
        [f"{h:,}", f"{s:.0f}", f"{h * txns / s:,.0f}", f"{r:.0f}", f"{a:.0f}", f"{f:.0f}"]
        for h, s, r, a, f in shown
    ]
    markdown = (
        f"`ledgerq node` with a data directory, fed {total:,} intkey batches of {txns} "
        f"transaction(s) (each sets a new name: the state grows with the history) over REST "
        f"by {clients} "
        f"client processes (one per core, batches pre-signed), {chunk} batches per POST, "
        f"{concurrency} POSTs in flight per client. Node, clients and everything else on the "
        f"machine share its cores. Load average (1 min) before/after: {load_before:.1f}/"
        f"{os.getloadavg()[0]:.1f}.\n\n"
        f"* REST throughput from the first tenth to the end: **{steady * txns:,.0f} tx/s** "
        f"({steady:,.0f} batches/s; first POST to last commit, client start-up included: "
        f"{total * txns / elapsed:,.0f} tx/s).\n"
        f"* The node's CPU (its process and its decoding workers, user and system) per "
        f"transaction over the same span: **{cpu_per_tx:.0f} µs** ({cores:.2f} cores busy "
        f"at that rate; less sensitive than the rate to what else runs on the machine): "
        f"its process (event loop and threads) {own_per_tx:.0f} µs, its decoding workers "
        f"{workers_per_tx:.0f} µs. The clients' processes: {clients_per_tx:.0f} µs "
        f"(up to their last reading).\n"
        + _reads_line(reads)
        + f"* Growth from {first[0]:,} to {last[0]:,} batches: RSS **{last[2] - first[2]:+.0f} "
        f"MiB**, of which anonymous memory (the heap) **{last[3] - first[3]:+.0f} MiB** and "
        f"file pages mapped in (the store read through its memory map, the page cache) "
        f"{last[4] - first[4]:+.0f} MiB.\n"
        f"* Restart after `kill -9` at the end: listening again in **{after_kill:.2f} s** "
        f"(RSS then {rss_restart:.0f} MiB, {anon_restart:.0f} anon); after a clean stop: "
        f"{after_clean:.2f} s.\n"
    )
    # Printed, not written: the memory at each tenth, the start-up phases, the disk.
    console.print(
        table(["committed", "s", "tx/s so far", "RSS MiB", "anon MiB", "file MiB"], rows)
        + f"\n\n* The node's start-up phases after `kill -9`: {kill_phases}; after a clean "
        f"stop: {clean_phases}.\n"
        f"* Data directory at the end: {disk:,.0f} MiB.\n"
    )
    if txns == 1:
        growth = last[2] - first[2]
        target = Target(
            "node-memory",
            f"RSS {growth:+.0f} MiB from {first[0]:,} to {last[0]:,} batches; restart "
            f"{after_kill:.2f} s after kill -9",
            "yes" if growth <= MEMORY_TARGET_MIB and last[0] >= 1_000_000 else "no",
        )
    else:
        rate = steady * txns
        target = Target(
            "node-rest",
            f"{rate:,.0f} tx/s ({txns} per batch)",
            "yes" if rate >= REST_TARGET_TX_S else "no",
        )
    return markdown, target


MEMORY_TARGET_MIB = 64.0  # RSS growth from the first tenth of the history to its end
REST_TARGET_TX_S = 10_000.0


def _reads_line(reads: list[float]) -> str:
    if not reads:
        return "* Status reads under this load: none answered in the span.\n"

    def q(f: float) -> float:
        return 1000 * reads[min(len(reads) - 1, int(f * len(reads)))]

    return (
        f"* Status reads under this load (`POST /batch_statuses` of 76 ids every 0.25 s from "
        f"the benchmark's process, over the same span): **p50 {q(0.5):.1f} ms**, p95 "
        f"{q(0.95):.1f} ms, max {1000 * reads[-1]:.1f} ms ({len(reads)} reads).\n"
    )
