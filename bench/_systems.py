"""The ways ``bench compare`` gets a workload committed on a ledger.

* ``ideal``: the benchmark process itself POSTs each service's batches in
  order straight to the ledger and long-polls each until final, every service
  at once. No queue, no database, nothing durable: the bound any queue is
  measured against.
* ``ledgerq-sqlite``, ``ledgerq-pg``: ``ledgerq serve`` on SQLite or
  PostgreSQL submitting to the ledger; the batches are POSTed to the gateway,
  one BatchList per service.
* ``procrastinate``: a job per batch with ``lock=<service id>`` (see
  ``bench/_procrastinate_worker.py``), worker processes with ``slots``
  concurrency in total, polling for jobs every ``poll_s``.

The ledger is ``ledgerq node`` (with its ``/events`` stream) or the plain-REST
fault ledger (Sawtooth's API only, as a validator or a hosted endpoint). Each
run gets a fresh ledger process and a fresh database, and returns, per batch,
when it was accepted by the system under test, and the CPU the system's own
process(es) used; commit times come from the ledger
(:class:`bench._harness.EventWatcher`, :class:`bench._harness.LedgerReport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp

from bench._harness import (
    Batch,
    EventWatcher,
    LedgerReport,
    Proc,
    Workload,
    backend_cpu_seconds,
    cpu_seconds,
    create_database,
    drop_database,
    fault_ledger_proc,
    gateway_proc,
    node_proc,
    tree_cpu_seconds,
)

Watcher = EventWatcher | LedgerReport

#: Called once, mid-run, when a worker should be killed; returns the kill time.
Killer = Callable[[], Awaitable[float]]


@dataclass
class Run:
    """What one system did with one workload."""

    system: str
    workload: Workload
    accepted: dict[str, float] = field(default_factory=dict)  # batch id -> monotonic
    started: float = 0.0
    finished: bool = False
    killed_at: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    #: CPU seconds the system's own processes used during the run (None: not measured).
    cpu_s: float | None = None
    #: CPU seconds of PostgreSQL's sessions serving the run (None: SQLite, or unread).
    db_cpu_s: float | None = None


class RunProbe(Protocol):
    """Looks at a ``ledgerq serve`` run on PostgreSQL from outside (``bench pgshape``):
    called with the run's database URL at each step."""

    async def created(self, db: str) -> None:
        """The fresh database exists; no gateway has connected yet."""

    async def started(self, db: str) -> None:
        """The gateways listen; no batch has been posted yet."""

    async def finished(self, db: str, urls: Sequence[str]) -> None:
        """Every batch is final; the gateways (at ``urls``) still run."""

    async def stopped(self, db: str) -> None:
        """The gateways have exited; the database is not dropped yet."""


@dataclass(frozen=True)
class Setup:
    workdir: Path
    pg_admin: str
    slots: int
    workers: int  # processes per system (2 for the failure case)
    timeout_s: float
    #: ``node`` (``ledgerq node``, with events) or ``plain`` (the fault ledger: REST only).
    ledger: str = "node"
    commit_delay_ms: int = 20
    #: procrastinate's job polling interval (its default is 5 s).
    procrastinate_poll_s: float = 0.02


@contextlib.asynccontextmanager
async def ledger_and_watcher(setup: Setup, tag: str) -> AsyncIterator[tuple[Proc, Watcher]]:
    if setup.ledger == "plain":
        ledger = fault_ledger_proc(setup.workdir / tag, commit_delay_ms=setup.commit_delay_ms)
    else:
        ledger = node_proc(setup.workdir / tag)
    url = await ledger.start()
    try:
        if setup.ledger == "plain":
            yield ledger, LedgerReport(url)
        else:
            async with EventWatcher(url) as watcher:
                yield ledger, watcher
    finally:
        await ledger.stop()


async def _post_list(
    session: aiohttp.ClientSession, url: str, body: bytes, params: dict[str, str] | None = None
) -> None:
    backoff = 0.01
    while True:
        async with session.post(
            f"{url}/batches",
            params=params,
            data=body,
            headers={"Content-Type": "application/octet-stream"},
        ) as resp:
            if resp.status in (429, 503):
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            if resp.status != 202:
                raise RuntimeError(f"POST /batches: {resp.status} {await resp.text()}")
            return


# -- the ideal client ----------------------------------------------------------------


async def run_ideal(setup: Setup, workload: Workload, watcher: Watcher, ledger_url: str) -> Run:
    """Every service at once: POST a batch, long-poll it until final, then the next."""
    run = Run("ideal", workload)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=60)
    ) as session:

        async def one_service(batches: list[Batch]) -> None:
            for b in batches:
                while True:
                    await _post_list(session, ledger_url, b.batch_list)
                    status = "PENDING"
                    while status == "PENDING":
                        async with session.get(
                            f"{ledger_url}/batch_statuses",
                            params={"id": b.batch_id, "wait": "10"},
                        ) as resp:
                            status = (await resp.json())["data"][0]["status"]
                    if status != "UNKNOWN":  # a ledger that lost it: post again
                        break

        cpu0 = time.process_time()
        run.started = time.monotonic()
        for b in workload.by_id.values():
            run.accepted[b.batch_id] = run.started
        await asyncio.wait_for(
            asyncio.gather(*(one_service(bs) for bs in workload.batches.values())),
            setup.timeout_s,
        )
        run.cpu_s = time.process_time() - cpu0
    run.finished = await watcher.wait_for(list(workload.by_id), 30)
    return run


# -- ledgerq --------------------------------------------------------------------


async def run_ledgerq(
    setup: Setup,
    workload: Workload,
    watcher: Watcher,
    node_url: str,
    kill_after: float | None = None,
    *,
    store: str = "pg",
    processes: int = 1,
    env: Mapping[str, str] = {},
    probe: RunProbe | None = None,
) -> Run:
    """``ledgerq serve`` instances (``setup.workers``), each of ``processes``
    worker processes (``--workers``; on SQLite the others only take ingest),
    with ``env`` added to their environment; ``probe`` (PostgreSQL only) is
    told of each step of the run."""
    name = f"ledgerq-{store}" + (f"-w{processes}" if processes > 1 else "")
    run = Run(name, workload)
    if store == "sqlite":
        (setup.workdir / "ledgerq").mkdir(parents=True, exist_ok=True)
        db = f"sqlite:///{setup.workdir / 'ledgerq' / f'gw-{workload.run_tag}.sqlite3'}"
    else:
        db = create_database(setup.pg_admin, "bench_ledgerq")
    slots = str(max(1, setup.slots // setup.workers))
    gateways = [
        gateway_proc(
            setup.workdir / "ledgerq",
            db,
            f"sawtooth+{node_url}",
            name=f"gateway{i}",
            env={
                "LEDGERQ_SUBMITTER_SLOTS": slots,
                "LEDGERQ_CLAIMS_INSTANCE_ID": f"bench-gw{i}",
                "LEDGERQ_LOG_LEVEL": "WARNING",
                "LEDGERQ_WORKERS": str(processes),
                **env,
            },
        )
        for i in range(setup.workers)
    ]
    try:
        if probe is not None and store != "sqlite":
            await probe.created(db)
        urls = [await gateways[0].start()]
        if len(gateways) > 1 and not await _high_availability(urls[0]):
            # Instances that share no claims would both submit every service: run one,
            # and restart it after the kill instead.
            gateways = gateways[:1]
            run.extra["single_instance_restart"] = 1.0
        urls += [await g.start() for g in gateways[1:]]
        if probe is not None and store != "sqlite":
            await probe.started(db)
        cpu0 = tree_cpu_seconds([g.pid for g in gateways])
        db0 = await backend_cpu_seconds(setup.pg_admin, db)
        sem = asyncio.Semaphore(16)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            from ledgerq.codec import encode_batch_list

            async def post_service(i: int, service: str, batches: list[Batch]) -> None:
                body = encode_batch_list([b.batch for b in batches])
                async with sem:
                    await _post_list(session, urls[i % len(urls)], body, {"service_id": service})
                now = time.monotonic()
                for b in batches:
                    run.accepted[b.batch_id] = now

            run.started = time.monotonic()
            await asyncio.gather(
                *(post_service(i, s, bs) for i, (s, bs) in enumerate(workload.batches.items()))
            )
        if kill_after is not None:
            await _wait_fraction(watcher, workload, kill_after, setup.timeout_s)
            victim = gateways[await _busiest_instance(urls[0], len(gateways))]
            run.killed_at = time.monotonic()
            await victim.kill()
            if len(gateways) == 1:
                await asyncio.sleep(1.0)
                await victim.start()
        run.finished = await watcher.wait_for(
            list(workload.by_id), setup.timeout_s - (time.monotonic() - run.started)
        )
        if kill_after is None:
            cpu1 = tree_cpu_seconds([g.pid for g in gateways])
            run.cpu_s = sum(used - cpu0.get(pid, 0.0) for pid, used in cpu1.items())
            db1 = await backend_cpu_seconds(setup.pg_admin, db)
            if db1 is not None:
                # Sessions opened during the run count from zero.
                start = db0 or {}
                run.db_cpu_s = sum(used - start.get(pid, 0.0) for pid, used in db1.items())
        if probe is not None and store != "sqlite":
            await probe.finished(db, urls)
        for g in gateways:
            await g.stop()
        if probe is not None and store != "sqlite":
            await probe.stopped(db)
    finally:
        for g in gateways:
            await g.stop()
        if store != "sqlite":
            drop_database(setup.pg_admin, db)
    return run


async def _high_availability(url: str) -> bool:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(f"{url}/instances") as resp,
    ):
        return resp.status == 200 and bool((await resp.json()).get("high_availability"))


async def _busiest_instance(url: str, count: int) -> int:
    """Index of the gateway instance holding the most services with work left."""
    held = [0] * count
    after = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while True:
            params = {"limit": "1000", **({"after": after} if after else {})}
            async with session.get(f"{url}/services", params=params) as resp:
                rows = (await resp.json())["data"] if resp.status == 200 else []
            for r in rows:
                claimant = str(r.get("claimant") or "")
                busy = r.get("queue_depth") or r.get("in_flight_batch_id")
                if busy and claimant.startswith("bench-gw"):
                    held[int(claimant.removeprefix("bench-gw"))] += 1
            if len(rows) < 1000:
                break
            after = rows[-1]["service_id"]
    return held.index(max(held))


async def _wait_fraction(
    watcher: EventWatcher, workload: Workload, fraction: float, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    target = int(workload.total * fraction)
    while time.monotonic() < deadline:
        if sum(1 for i in workload.by_id if i in watcher.events) >= target:
            return
        await asyncio.sleep(0.02)


# -- procrastinate --------------------------------------------------------------


async def run_procrastinate(
    setup: Setup,
    workload: Workload,
    watcher: Watcher,
    node_url: str,
    kill_after: float | None = None,
    recover_every_s: float = 1.0,
) -> Run:
    from bench._procrastinate_worker import make_app

    run = Run("procrastinate", workload)
    db = create_database(setup.pg_admin, "bench_procrastinate")
    app = make_app(db)
    workers: list[Proc] = []
    try:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for i in range(setup.workers):
                proc = Proc(
                    [
                        sys.executable,
                        "-m",
                        "bench._procrastinate_worker",
                        "--pg",
                        db,
                        "--node",
                        node_url,
                        "-c",
                        str(max(1, setup.slots // setup.workers)),
                        "--name",
                        f"worker{i}",
                        "--index",
                        str(i),
                        "--poll-s",
                        str(setup.procrastinate_poll_s),
                    ],
                    setup.workdir / "procrastinate" / f"worker{i}.log",
                    banner=__import__("re").compile(rb"procrastinate worker ready"),
                )
                await proc.start()
                workers.append(proc)
            cpu0 = {w.pid: cpu_seconds(w.pid) for w in workers}
            run.started = time.monotonic()
            sem = asyncio.Semaphore(16)

            async def defer_service(service: str, batches: list[Batch]) -> None:
                deferrer = app.configure_task("submit_batch", lock=service)
                async with sem:
                    await deferrer.batch_defer_async(
                        *(
                            {"batch_list": b.batch_list.hex(), "batch_id": b.batch_id}
                            for b in batches
                        )
                    )
                now = time.monotonic()
                for b in batches:
                    run.accepted[b.batch_id] = now

            await asyncio.gather(*(defer_service(s, bs) for s, bs in workload.batches.items()))
            recovery: asyncio.Task[None] | None = None
            if kill_after is not None:
                await _wait_fraction(watcher, workload, kill_after, setup.timeout_s)
                victim = workers[await _busiest_worker(app)]
                run.killed_at = time.monotonic()
                await victim.kill()
                # procrastinate's documented remedy: retry the jobs of workers whose
                # heartbeat stopped (30 s by default), here checked every second.
                recovery = asyncio.create_task(_recover_stalled(app, recover_every_s, run))
            run.finished = await watcher.wait_for(
                list(workload.by_id), setup.timeout_s - (time.monotonic() - run.started)
            )
            if kill_after is None:
                run.cpu_s = sum(cpu_seconds(pid) - used for pid, used in cpu0.items())
            if recovery is not None:
                recovery.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await recovery
            async with app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
                row = await (
                    await conn.execute(
                        "SELECT count(*) FROM procrastinate_events WHERE type = 'started'"
                    )
                ).fetchone()
                run.extra["job_starts"] = float(row[0]) if row else 0.0
    finally:
        for w in workers:
            await w.stop()
        drop_database(setup.pg_admin, db)
    return run


async def _busiest_worker(app: object) -> int:
    """Index (in start order) of the worker with the most jobs in flight."""
    async with app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
        cur = await conn.execute(
            "SELECT w.id, count(j.id) FROM procrastinate_workers w "
            "LEFT JOIN procrastinate_jobs j ON j.worker_id = w.id AND j.status = 'doing' "
            "GROUP BY w.id ORDER BY w.id"
        )
        rows = await cur.fetchall()
    counts = [int(n) for _, n in rows]
    return counts.index(max(counts)) if counts else 0


async def _recover_stalled(app: object, every_s: float, run: Run) -> None:
    manager = app.job_manager  # type: ignore[attr-defined]
    while True:
        await asyncio.sleep(every_s)
        for job in await manager.get_stalled_jobs():
            await manager.retry_job(job)
            run.extra["retried"] = run.extra.get("retried", 0.0) + 1
