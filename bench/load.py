"""``ledgerq bench load``: the gateway's REST API under wrk, as the database grows.

``ledgerq serve`` runs on PostgreSQL in front of ``ledgerq node`` (both their
own processes, loopback); ``wrk`` (Debian package ``wrk``; ``make bench``
installs it when missing) drives it from another process with
``bench/lua/replay.lua``, replaying requests prepared here:

* ``POST /batches?service_id=load<n>``: distinct signed BatchLists of one
  intkey ``set`` each over 1,000 services (so the gateway really submits
  them to the node while it is loaded);
* ``GET /batch_statuses?id=<id>&service_id=<s>``: ids picked at random among
  the rows pre-loaded so far and the batches posted.

Before each stage the store is grown, set-based (``INSERT ... SELECT
generate_series``), to the stage's number of final (Committed) batches, each
with its status row and one transaction row, spread over 10,000 services.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click
import psycopg
from rich.console import Console
from rich.table import Table

from bench import report
from bench._harness import (
    DEFAULT_PG,
    ROOT,
    create_database,
    drop_database,
    gateway_proc,
    node_proc,
)
from ledgerq.codec import Signer
from ledgerq.codec.intkey import make_intkey_batch

LUA = ROOT / "bench" / "lua" / "replay.lua"
PRE_SERVICES = 10_000

_PRELOAD = """
INSERT INTO batches (service_id, batch_id, signer_public_key, trace, serialized_batch,
                     submitted, created_at, status, final, last_attempt_at, attempts)
SELECT 'pre' || (g %% {services}), {bid}, %(pk)s, false, %(blob)s,
       true, g, 'Committed', true, g, 1
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g;
INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, updated_at)
SELECT 'pre' || (g %% {services}), {bid}, 'Committed', g, g
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g;
INSERT INTO transactions (service_id, transaction_id, batch_id, position, payload,
                          family_name, family_version, signer_public_key)
SELECT 'pre' || (g %% {services}), {tid}, {bid}, 0, %(payload)s, 'intkey', '1.0', %(pk)s
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g;
"""


def _hex128(prefix: str) -> str:
    return " || ".join(f"md5('{prefix}{c}' || g)" for c in "abcd")


PRELOAD_SQL = _PRELOAD.format(services=PRE_SERVICES, bid=_hex128("b"), tid=_hex128("t"))


def preloaded_id(g: int) -> str:
    """The batch id the pre-load SQL gives row ``g``."""
    return "".join(hashlib.md5(f"b{c}{g}".encode()).hexdigest() for c in "abcd")


def preload(db: str, have: int, want: int, chunk: int = 200_000) -> None:
    """Grow the store from ``have`` to ``want`` pre-loaded final batches."""
    if want <= have:
        return
    pk = "02" + "ab" * 32
    with psycopg.connect(db, autocommit=True) as conn, report.progress() as bar:
        task = bar.add_task("pre-loading batches", total=want - have)
        lo = have + 1
        while lo <= want:
            hi = min(want, lo + chunk - 1)
            with conn.transaction():
                params = {"pk": pk, "blob": b"\x0a" * 180, "payload": b"\xa3" * 40}
                for statement in PRELOAD_SQL.split(";"):
                    if statement.strip():
                        conn.execute(statement.encode(), {**params, "lo": lo, "hi": hi})
            bar.advance(task, hi - lo + 1)
            lo = hi + 1
        conn.execute("VACUUM ANALYZE batches")
        conn.execute("VACUUM ANALYZE batch_statuses")
        conn.execute("VACUUM ANALYZE transactions")


def _write_requests(workdir: Path, name: str, reqs: list[tuple[str, bytes]]) -> tuple[Path, Path]:
    index, blob = workdir / f"{name}.idx", workdir / f"{name}.bin"
    offset = 0
    with index.open("w") as idx, blob.open("wb") as out:
        for n, (path, body) in enumerate(reqs):
            idx.write(f"{n} {path} {offset} {len(body)}\n")
            out.write(body)
            offset += len(body)
    return index, blob


def post_requests(stage: int, count: int, signer: Signer) -> tuple[list[tuple[str, bytes]], list]:
    reqs, posted = [], []
    for n in range(count):
        service = f"load{n % 1000:04d}"
        b = make_intkey_batch(signer, [("set", f"l{stage}x{n:08d}", 1)])
        from ledgerq.codec import encode_batch_list

        reqs.append((f"/batches?service_id={service}", encode_batch_list([b])))
        posted.append((service, b.header_signature))
    return reqs, posted


def get_requests(
    rows: int, posted: list[tuple[str, str]], count: int, rng: random.Random
) -> list[tuple[str, bytes]]:
    reqs = []
    for _ in range(count):
        if rows and (not posted or rng.random() < 0.9):
            g = rng.randint(1, rows)
            service, bid = f"pre{g % PRE_SERVICES}", preloaded_id(g)
        else:
            service, bid = rng.choice(posted)
        reqs.append((f"/batch_statuses?id={bid}&service_id={service}", b""))
    return reqs


@dataclass
class WrkResult:
    endpoint: str
    rows: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    non2xx: int
    socket_errors: int


def run_wrk(
    url: str, method: str, index: Path, blob: Path, threads: int, conns: int, seconds: int
) -> dict[str, float]:
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s", "--timeout", "10s"]
    cmd += ["-s", str(LUA), url, "--", str(index), str(blob), str(threads), method]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 120)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return dict(json.loads(line))


def _db_size(db: str) -> tuple[int, str]:
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM batches),"
            " pg_size_pretty(pg_database_size(current_database()))"
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


async def _main(
    stages: list[int], seconds: int, threads: int, conns: int, pg: str, workdir: Path
) -> tuple[list[WrkResult], list[tuple[int, int, str]]]:
    if shutil.which("wrk") is None:
        raise click.ClickException("wrk is not installed: `apt-get install wrk` (or `make bench`)")
    db = create_database(pg, "bench_load")
    node = node_proc(workdir)
    results: list[WrkResult] = []
    sizes: list[tuple[int, int, str]] = []
    signer = Signer.generate()
    rng = random.Random(7)
    try:
        node_url = await node.start()
        gateway = gateway_proc(workdir, db, f"sawtooth+{node_url}")
        url = await gateway.start()
        have = 0
        try:
            for i, rows in enumerate(stages):
                await asyncio.to_thread(preload, db, have, rows)
                have = max(have, rows)
                # wrk is closed-loop; a generous supply of distinct batches per stage.
                posts, posted = post_requests(i, max(20_000, 3_000 * seconds), signer)
                pidx, pblob = _write_requests(workdir, f"post{i}", posts)
                report.console.print(f"[bold]{have:,} pre-loaded batches[/]: POST /batches")
                r = await asyncio.to_thread(
                    run_wrk, url, "POST", pidx, pblob, threads, conns, seconds
                )
                results.append(_result("POST /batches", have, r))
                gets = get_requests(have, posted[: int(r["requests"])], 50_000, rng)
                gidx, gblob = _write_requests(workdir, f"get{i}", gets)
                report.console.print(f"[bold]{have:,} pre-loaded batches[/]: GET /batch_statuses")
                r = await asyncio.to_thread(
                    run_wrk, url, "GET", gidx, gblob, threads, conns, seconds
                )
                results.append(_result("GET /batch_statuses", have, r))
                count, size = _db_size(db)
                sizes.append((have, count, size))
        finally:
            await gateway.stop()
    finally:
        await node.stop()
        drop_database(pg, db)
    return results, sizes


def _result(endpoint: str, rows: int, r: dict[str, float]) -> WrkResult:
    return WrkResult(
        endpoint,
        rows,
        r["requests"] / (r["duration_us"] / 1e6),
        r["p50_us"] / 1000,
        r["p90_us"] / 1000,
        r["p99_us"] / 1000,
        r["max_us"] / 1000,
        int(r["non2xx"]),
        int(r["socket_errors"]),
    )


@click.command("load")
@click.option(
    "--rows",
    default="0,1000000,2000000",
    show_default=True,
    help="Comma-separated pre-loaded batch counts, one stage each (grown in place).",
)
@click.option("--seconds", default=15, show_default=True, help="wrk duration per endpoint.")
@click.option("--threads", default=2, show_default=True, help="wrk threads.")
@click.option("--connections", default=32, show_default=True, help="wrk connections.")
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(rows: str, seconds: int, threads: int, connections: int, pg: str, write: bool) -> None:
    """Requests/s and latency of POST /batches and GET /batch_statuses as the store grows."""
    stages = sorted(int(x) for x in rows.split(",") if x.strip())
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-load-"))
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    try:
        results, sizes = asyncio.run(_main(stages, seconds, threads, connections, pg, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    headers = [
        "pre-loaded batches",
        "endpoint",
        "requests/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "non-2xx",
        "socket errors",
    ]
    rows_out = [
        [
            f"{r.rows:,}",
            r.endpoint,
            f"{r.rps:,.0f}",
            f"{r.p50_ms:.2f}",
            f"{r.p90_ms:.2f}",
            f"{r.p99_ms:.2f}",
            f"{r.max_ms:.1f}",
            str(r.non2xx),
            str(r.socket_errors),
        ]
        for r in results
    ]
    table = Table(*headers, title="gateway REST API under wrk")
    for row in rows_out:
        table.add_row(*row)
    Console(width=160).print(table)
    sizes_table = Table("pre-loaded", "batches rows", "database size", title="store size")
    for h, c, s in sizes:
        sizes_table.add_row(f"{h:,}", f"{c:,}", s)
    Console(width=160).print(sizes_table)
    if not write:
        return
    report.write_section(
        "load",
        "\n".join(
            [
                f"`ledgerq serve` (PostgreSQL) → `ledgerq node`, driven by wrk ({threads} threads, "
                f"{connections} connections, {seconds} s per endpoint) from its own process on "
                "loopback; all on the same 2 cores. POSTs are distinct one-batch BatchLists "
                "over 1,000 services, which the gateway submits to the node while loaded. "
                f"Total {time.monotonic() - started:.0f} s; machine load average (1 min) "
                f"before/after: {load_before:.1f}/{os.getloadavg()[0]:.1f}.",
                "",
                _page_table(results),
            ]
        ),
    )


def _page_table(results: list[WrkResult]) -> str:
    """The page's table: one row per database size, the endpoints side by side."""
    endpoints = list(dict.fromkeys(r.endpoint for r in results))
    sizes = list(dict.fromkeys(r.rows for r in results))
    by = {(r.rows, r.endpoint): r for r in results}
    headers = ["pre-loaded batches"]
    for e in endpoints:
        headers += [f"{e} requests/s", f"{e} p50 / p90 / p99 / max ms"]
    headers += [f"non-2xx ({' / '.join(endpoints)})", "socket errors"]
    rows = []
    for n in sizes:
        got = [by.get((n, e)) for e in endpoints]
        row = [f"{n:,}"]
        for r in got:
            row += (
                [
                    f"{r.rps:,.0f}",
                    f"{r.p50_ms:.2f} / {r.p90_ms:.2f} / {r.p99_ms:.2f} / {r.max_ms:.1f}",
                ]
                if r
                else ["-", "-"]
            )
        row += [
            " / ".join(str(r.non2xx) if r else "-" for r in got),
            " / ".join(str(r.socket_errors) if r else "-" for r in got),
        ]
        rows.append(row)
    return report.table(headers, rows)
