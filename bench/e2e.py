"""Gateway end to end: REST in → committed on the in-process node.

One process runs the gateway (store, queue source, submitter, monitor, REST
API) with the in-process node, as ``ledgerq serve`` does; the load comes in
over HTTP on loopback from the same event loop (pre-built, pre-signed
BatchLists, so the client costs little). The node client is wrapped to
timestamp each submission and each commit event as the gateway sees them.

Figures:

* **sustained batches/s** — ``services`` × ``per_service`` batches posted
  at once (a backlog in every service), from the first POST to the last
  commit;
* **per-service cycle overhead** — for consecutive batches n, n+1 of a
  service, the time from batch n's commit event reaching the gateway to the
  gateway's submission of batch n+1 (the gateway's own share of the cycle);
* **end-to-end latency** — POST accepted to commit, at a steady offered load
  of ``--latency-rate`` batches/s (below capacity), one batch per service at a
  time, for ``--latency-seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import click
import psycopg

from bench import report
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.commands.node import tune_gc
from ledgerq.config import load_settings
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers.base import CommitEvent, LedgerBatchStatus, SubmitResult
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.node import Node
from ledgerq.store import open_store


class TimedNode:
    """The node client, timestamping submissions and commit events (perf_counter)."""

    def __init__(self, inner: NodeClient) -> None:
        self.inner = inner
        self.description = inner.description
        self.submitted_at: dict[str, float] = {}
        self.committed_at: dict[str, float] = {}
        self.all_committed = asyncio.Event()
        self.expect = 0

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        self.submitted_at.setdefault(batch_id, time.perf_counter())
        return await self.inner.submit(service_id, batch_id, serialized_batch)

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        return await self.inner.batch_statuses(service_id, batch_ids, wait_s=wait_s)

    def events(self) -> AsyncIterator[CommitEvent] | None:
        return self._events()

    def triggers(self) -> AsyncIterator[None] | None:
        return self.inner.triggers()

    async def _events(self) -> AsyncIterator[CommitEvent]:
        stream = self.inner.events()
        assert stream is not None
        async for event in stream:
            self.committed_at.setdefault(event.batch_id, time.perf_counter())
            if self.expect and len(self.committed_at) >= self.expect:
                self.all_committed.set()
            yield event

    async def close(self) -> None:
        await self.inner.close()


def build_workload(
    services: int, per_service: int, *, prefix: str = "svc"
) -> dict[str, list[tuple[str, bytes]]]:
    signer = Signer.generate()
    out: dict[str, list[tuple[str, bytes]]] = {}
    with report.progress() as bar:
        task = bar.add_task("sign batches", total=services * per_service)
        for s in range(services):
            name = f"{prefix[0]}{s:06d}"
            batches = []
            for n in range(per_service):
                op = ("set", name, 0) if n == 0 else ("inc", name, 1)
                b = make_intkey_batch(signer, [op])
                batches.append((b.header_signature, b.serialized))
                bar.advance(task)
            out[f"{prefix}{s:05d}"] = batches
    return out


async def post(
    session: aiohttp.ClientSession, url: str, service: str, batches: list[bytes]
) -> None:
    async with session.post(
        f"{url}/batches",
        params={"service_id": service},
        data=encode_batch_list(batches),
        headers={"Content-Type": "application/octet-stream"},
    ) as resp:
        if resp.status != 202:
            raise click.ClickException(f"POST /batches answered {resp.status}: {await resp.text()}")


async def run_one(
    db_url: str,
    workdir: Path,
    services: int,
    per_service: int,
    latency_rate: float,
    latency_seconds: float,
    latency_services: int,
) -> dict[str, float]:
    settings = load_settings(
        {"db": db_url, "bind": "127.0.0.1:0", "log.level": "WARNING"},
        environ={},
        cwd=workdir,
    )
    workload = build_workload(services, per_service)
    chains = build_workload(CHAIN_SERVICES, CHAIN_LENGTH, prefix="chain")
    store = await open_store(db_url)
    node = await Node.open(workdir / "node", shards=4)
    timed = TimedNode(NodeClient(node))
    gateway = Gateway(settings, store, timed)
    runner = asyncio.create_task(gateway.run())
    try:
        await asyncio.wait_for(gateway.started.wait(), 30)
        url = f"http://127.0.0.1:{gateway.port}"
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as session:
            # Phase 1: a backlog in every service.
            throughput, cycles = await run_backlog(session, url, timed, workload, "commit backlog")
            # Phase 2: a few services, each with a queue of batches, on an
            # otherwise idle gateway: the gateway's own share of a cycle.
            _, chain_cycles = await run_backlog(session, url, timed, chains, "commit chains")
            # Phase 3: steady load below capacity, one batch per service at a time.
            latencies, steady_cycles = await steady_latency(
                session, url, timed, latency_services, latency_rate, latency_seconds
            )
    finally:
        gateway.stop()
        await asyncio.wait_for(runner, 60)
        await node.close()
        await store.close()
    return {
        "throughput": throughput,
        "backlog_cycle_p50": report.percentile(cycles, 50),
        "chain_cycle_p50": report.percentile(chain_cycles, 50),
        "chain_cycle_p99": report.percentile(chain_cycles, 99),
        "cycle_p50": report.percentile(steady_cycles, 50),
        "cycle_p99": report.percentile(steady_cycles, 99),
        "cycle_n": float(len(steady_cycles)),
        "lat_p50": report.percentile(latencies, 50),
        "lat_p99": report.percentile(latencies, 99),
        "lat_n": float(len(latencies)),
    }


#: The chains phase: services, and batches queued in each.
CHAIN_SERVICES = 10
CHAIN_LENGTH = 50


async def run_backlog(
    session: aiohttp.ClientSession,
    url: str,
    timed: TimedNode,
    workload: dict[str, list[tuple[str, bytes]]],
    title: str,
) -> tuple[float, list[float]]:
    """Post every service's batches at once; wait for all to commit.

    Returns batches/s from the first POST to the last commit, and the cycles
    (batch n's commit event reaching the gateway → batch n+1's submission).
    """
    total = sum(len(b) for b in workload.values())
    timed.all_committed.clear()
    timed.expect = len(timed.committed_at) + total
    start = time.perf_counter()
    sem = asyncio.Semaphore(32)

    async def send(service: str, batches: list[tuple[str, bytes]]) -> None:
        async with sem:
            await post(session, url, service, [b for _, b in batches])

    with report.progress() as bar:
        task = bar.add_task(title, total=total)
        done_before = len(timed.committed_at)
        sends = asyncio.gather(*(send(s, bs) for s, bs in workload.items()))
        while not timed.all_committed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(timed.all_committed.wait(), 0.5)
            bar.update(task, completed=len(timed.committed_at) - done_before)
        await sends
    ids = [bid for batches in workload.values() for bid, _ in batches]
    end = max(timed.committed_at[bid] for bid in ids)
    cycles = []
    for batches in workload.values():
        for (prev, _), (nxt, _) in itertools.pairwise(batches):
            if prev in timed.committed_at and nxt in timed.submitted_at:
                cycles.append((timed.submitted_at[nxt] - timed.committed_at[prev]) * 1000)
    return total / (end - start), cycles


async def steady_latency(
    session: aiohttp.ClientSession,
    url: str,
    timed: TimedNode,
    services: int,
    rate: float,
    seconds: float,
) -> tuple[list[float], list[float]]:
    signer = Signer.generate()
    rng = random.Random(1)
    sent: dict[str, float] = {}
    order: dict[int, list[str]] = {}
    count = int(rate * seconds)
    names = [f"lat{s:05d}" for s in range(services)]
    started: set[str] = set()
    # Signed before the clock starts: the load costs the gateway's process
    # (it shares the event loop) only its HTTP requests.
    load = []
    for _ in range(count):
        s = rng.randrange(services)
        name = names[s]
        op = ("inc", name, 1) if name in started else ("set", name, 0)
        started.add(name)
        load.append((s, make_intkey_batch(signer, [op])))
    timed.all_committed.clear()
    timed.expect = len(timed.committed_at) + count
    loop_start = time.perf_counter()
    tasks = []
    for i, (s, b) in enumerate(load):
        due = loop_start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[b.header_signature] = time.perf_counter()
        order.setdefault(s, []).append(b.header_signature)
        tasks.append(asyncio.create_task(post(session, url, f"latsvc{s:05d}", [b.serialized])))
    await asyncio.gather(*tasks)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(timed.all_committed.wait(), 60)
    latencies = [
        (timed.committed_at[b] - t) * 1000 for b, t in sent.items() if b in timed.committed_at
    ]
    # Cycles where the next batch was already waiting when the previous committed.
    cycles = []
    c, sub = timed.committed_at, timed.submitted_at
    for ids in order.values():
        for prev, nxt in itertools.pairwise(ids):
            if prev in c and nxt in sub and sent[nxt] < c[prev]:
                cycles.append((sub[nxt] - c[prev]) * 1000)
    return latencies, cycles


def fresh_pg_database(admin_url: str) -> str:
    name = f"ledgerq_bench_{int(time.time())}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_pg_database(admin_url: str, db_url: str) -> None:
    name = db_url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@click.command("e2e")
@click.option("--services", default=1000, show_default=True)
@click.option("--per-service", default=10, show_default=True, help="Backlog batches per service.")
@click.option(
    "--latency-rate",
    default=200.0,
    show_default=True,
    help="Offered batches/s at steady load (keep it below the sustained rate).",
)
@click.option("--latency-seconds", default=10.0, show_default=True)
@click.option("--latency-services", default=100, show_default=True, help="Services at steady load.")
@click.option(
    "--pg", "pg_admin", default="postgresql://postgres@127.0.0.1:5432/postgres", show_default=True
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(["sqlite", "sqlite-normal", "postgresql"]),
    default=["sqlite", "postgresql"],
    show_default=True,
    help="sqlite: synchronous=FULL (the default); sqlite-normal: ?synchronous=normal.",
)
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(
    services: int,
    per_service: int,
    latency_rate: float,
    latency_seconds: float,
    latency_services: int,
    pg_admin: str,
    backends: tuple[str, ...],
    write: bool,
) -> None:
    """REST in → committed on the in-process node: throughput, cycle overhead, latency."""
    tune_gc()  # as `ledgerq serve` does
    rows = []
    rates: dict[str, float] = {}
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix="ledgerq-bench-") as tmp:
            work = Path(tmp)
            if backend == "sqlite":
                db = f"sqlite:///{work}/bench.sqlite3"
            elif backend == "sqlite-normal":
                db = f"sqlite:///{work}/bench.sqlite3?synchronous=normal"
            else:
                db = fresh_pg_database(pg_admin)
            try:
                r = asyncio.run(
                    run_one(
                        db,
                        work,
                        services,
                        per_service,
                        latency_rate,
                        latency_seconds,
                        latency_services,
                    )
                )
            finally:
                if not backend.startswith("sqlite"):
                    drop_pg_database(pg_admin, db)
        rates[backend] = r["throughput"]
        rows.append(
            (
                backend,
                f"{r['throughput']:,.0f}",
                f"{r['chain_cycle_p50']:.2f}",
                f"{r['chain_cycle_p99']:.2f}",
                f"{r['cycle_p50']:.2f} (n={r['cycle_n']:.0f})",
                f"{r['backlog_cycle_p50']:,.0f}",
                f"{r['lat_p50']:.1f}",
                f"{r['lat_p99']:.1f}",
            )
        )
    markdown = (
        f"Gateway and in-process node in one process, load from the same event loop over "
        f"HTTP on loopback. *Sustained*: {services} services × {per_service} ordered intkey "
        "batches posted at once (one BatchList per service), first POST to last commit. "
        "*Cycle* is the gateway's share of a service's cycle: from batch n's commit event "
        "reaching the gateway to the submission of batch n+1, for pairs whose batch n+1 was "
        f"already waiting: *idle* with {CHAIN_SERVICES} services × {CHAIN_LENGTH} batches "
        f"on an otherwise idle gateway; *steady* at an offered load of {latency_rate:g} "
        f"batches/s, one batch per request, over {latency_services} services for "
        f"{latency_seconds:g} s; *backlog* during the sustained run, where batch n+1 also "
        "waits its turn in the round over every service. *Latency* is POST to commit at the "
        "steady load.\n\n"
        + report.table(
            [
                "store",
                "sustained batches/s",
                "cycle idle p50 (ms)",
                "cycle idle p99 (ms)",
                "cycle steady p50 (ms)",
                "cycle backlog p50 (ms)",
                "latency p50 (ms)",
                "latency p99 (ms)",
            ],
            rows,
        )
    )
    click.echo(markdown)
    if write:
        report.write_section("e2e", markdown, targets=[_target(rates, services)])


E2E_TARGET = 2000.0  # batches/s at 1,000 services, every store


def _target(rates: dict[str, float], services: int) -> report.Target:
    figure = ", ".join(f"{store} {rate:,.0f} batches/s" for store, rate in rates.items())
    met = services >= 1000 and all(rate >= E2E_TARGET for rate in rates.values())
    return report.Target("e2e", f"{figure} ({services:,} services)", "yes" if met else "no")
