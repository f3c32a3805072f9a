"""``ledgerq bench deps``: the ``intkey load`` shape — batches whose transactions
depend on transactions of other batches, arriving out of dependency order —
straight to a ledger and through the gateway.

Each load (``--loads``, ``SHAPE:SERVICESxBATCHES``) is an
:class:`~ledgerq.testing.intkey_load.IntkeyLoad`: ``star`` is what
sawtooth-sdk-python's ``intkey create_batch`` makes (per service one batch
setting ``--keys`` names, every other batch depending on it), ``chain`` a
chain of batches each depending on the one before. ``--posters`` concurrent
posters send it in a seeded shuffle, in lists of at most 100 batches of one
service (``intkey load``'s shape), each service's ``set`` batch never first.
Every load runs, each on a fresh ledger and store, as:

* ``direct → node``: posted straight to ``ledgerq node`` (its own process):
  the time every ratio is read against;
* ``direct → fault``: posted straight to the fault ledger
  (``ledgerq.testing.fault_ledger``, in this process), which treats
  dependencies as a Sawtooth validator does: a batch whose dependencies it
  has not seen is held, released when they arrive, dropped after
  ``--hold-s`` (Sawtooth's validator: 1,200 s) and then read UNKNOWN;
* ``ledgerq-sqlite``, ``ledgerq-pg`` → ``node`` and → ``fault``: posted to
  ``ledgerq serve`` (its own process, ``--strategy``) on SQLite or
  PostgreSQL, submitting to that ledger.

A run ends when the ledger has a final status for every batch, when no batch
has become final for ``--stall-s`` (*stalled*), or after ``--timeout``
(*timed out*): the benchmark never hangs. Judged on the ledger's own record
(the node's ``/events``, the fault ledger's report): every batch COMMITTED,
each after the batches it depends on, none dropped after a hold, no POST of
a batch the fault ledger had (unless it had answered UNKNOWN about it), and
for the gateway the time to the last commit ≤ 2 × the same load posted
straight to the node (the target). *Time to all COMMITTED* is from the first
POST to the last commit on the ledger's clock (``time.monotonic``, one clock
for every process); no time is given for a run that did not commit
everything, nor CPU per batch (it would divide a stall's CPU by the few
batches it committed). *CPU ms/batch*: the gateway's processes, and for
PostgreSQL the server backends serving the gateway's database, over the
batches committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
import click

from bench import report
from bench._harness import (
    DEFAULT_PG,
    EventWatcher,
    Proc,
    backend_cpu_seconds,
    cpu_delta,
    create_database,
    drop_database,
    gateway_proc,
    node_proc,
    tree_cpu_seconds,
)
from ledgerq.testing.fault_ledger import HELD_STATUSES, FaultLedger, FaultPlan
from ledgerq.testing.intkey_load import SHAPES, IntkeyLoad

#: The gateway's time to all COMMITTED against the same load straight to the node.
TARGET_RATIO = 2.0
SYSTEMS = ("direct", "ledgerq-sqlite", "ledgerq-pg")
LEDGERS = ("node", "fault")
DEFAULT_LOADS = "star:1x400,chain:20x20"
_LOAD = re.compile(r"(?P<shape>\w+):(?P<services>\d+)x(?P<batches>\d+)")


@dataclass(frozen=True)
class LoadSpec:
    shape: str
    services: int
    per_service: int

    @property
    def label(self) -> str:
        return f"{self.shape} {self.services} × {self.per_service}"


def parse_loads(value: str) -> list[LoadSpec]:
    out = []
    for part in value.split(","):
        m = _LOAD.fullmatch(part.strip())
        if m is None or m["shape"] not in SHAPES or int(m["services"]) < 1:
            raise click.BadParameter(
                f"{part!r}: expected SHAPE:SERVICESxBATCHES, SHAPE one of {', '.join(SHAPES)}, "
                "e.g. star:1x400"
            )
        if int(m["batches"]) < 2:
            raise click.BadParameter(f"{part!r}: at least 2 batches per service")
        out.append(LoadSpec(m["shape"], int(m["services"]), int(m["batches"])))
    return out


@dataclass(frozen=True)
class Options:
    workdir: Path
    pg_admin: str
    posters: int = 5
    keys: int = 5
    strategy: str = "pipelined"
    commit_delay_ms: int = 20
    hold_s: float = 30.0
    held_status: str = "UNKNOWN"
    stall_s: float = 45.0
    timeout_s: float = 300.0
    seed: int = 0


@dataclass
class Outcome:
    """What one system did with one load on one ledger."""

    load: str
    system: str
    ledger: str
    total: int
    #: Batches with a final status / COMMITTED on the ledger when the run ended.
    final: int = 0
    committed: int = 0
    #: ``done`` (every batch final), ``stalled`` or ``timed out``.
    ended: str = "done"
    #: Seconds from the first POST to the run's end (done or given up).
    elapsed_s: float = 0.0
    #: Seconds from the first POST to the last commit (every batch committed), else None.
    seconds: float | None = None
    #: What the judge found (not COMMITTED, committed before a dependency, ...).
    problems: list[str] = field(default_factory=list)
    #: Fault ledger only: batches held on arrival, dropped after a hold, stuck on
    #: an INVALID dependency; POSTs in all, and POSTs of batches it had.
    held: int | None = None
    dropped: int | None = None
    stuck: int | None = None
    posts: int | None = None
    resent: int | None = None
    gateway_cpu_s: float | None = None
    db_cpu_s: float | None = None

    @property
    def all_committed(self) -> bool:
        return self.ended == "done" and self.committed == self.total

    def cpu_ms_per_batch(self, cpu_s: float | None) -> float | None:
        if cpu_s is None or not self.all_committed:
            return None
        return cpu_s * 1000 / self.total


def verdict(outcome: Outcome, baseline_s: float | None) -> tuple[bool, list[str]]:
    """Whether ``outcome`` meets the target, and why not.

    ``baseline_s``: the same load's time straight to the node (``None``: that
    run did not commit everything, so no ratio can be judged)."""
    why = list(outcome.problems)
    if outcome.ended != "done":
        why.insert(
            0,
            f"{outcome.ended} after {outcome.elapsed_s:.0f} s with {outcome.committed} of "
            f"{outcome.total} committed",
        )
    if outcome.dropped:
        why.append(f"{outcome.dropped} dropped by the ledger after a hold")
    if outcome.resent:
        why.append(f"{outcome.resent} POSTs of batches the ledger had")
    if outcome.system != "direct" and outcome.seconds is not None:
        if baseline_s is None:
            why.append("no time straight to the node to compare with")
        elif outcome.seconds > TARGET_RATIO * baseline_s:
            why.append(
                f"{outcome.seconds / baseline_s:.1f} × the time straight to the node "
                f"(target ≤ {TARGET_RATIO:g} ×)"
            )
    return (not why, why)


# -- ledgers ----------------------------------------------------------------------


class Ledger(Protocol):
    url: str

    def final_count(self, load: IntkeyLoad) -> int: ...

    def judge(self, load: IntkeyLoad, started: float, outcome: Outcome) -> None:
        """Fill ``outcome``'s counts, time and problems from the ledger's record."""


class NodeLedger:
    """``ledgerq node`` in its own process; its ``/events`` stream timestamps
    and numbers every final status."""

    def __init__(self, url: str, watcher: EventWatcher) -> None:
        self.url = url
        self.watcher = watcher

    def final_count(self, load: IntkeyLoad) -> int:
        events = self.watcher.events
        return sum(1 for b in load.all_ids() if b in events)

    def judge(self, load: IntkeyLoad, started: float, outcome: Outcome) -> None:
        events = self.watcher.events
        statuses = {b: events[b][0][1] for b in load.all_ids() if b in events}
        order = {b: self.watcher.seq[b] for b in statuses if b in self.watcher.seq}
        _fill(outcome, load, statuses, order, [events[b][0][0] for b in statuses], started)


class FaultLedgerRun:
    """The fault ledger in this process, its report read directly."""

    def __init__(self, ledger: FaultLedger) -> None:
        self.ledger = ledger
        self.url = ledger.url

    def final_count(self, load: IntkeyLoad) -> int:
        return self.ledger.progress()["final"]

    def judge(self, load: IntkeyLoad, started: float, outcome: Outcome) -> None:
        records = self.ledger.batches
        statuses = {b: records[b].status for b in load.all_ids() if b in records}
        order = {b: r.commit_seq for b, r in records.items() if r.commit_seq is not None}
        t0 = self.ledger.report()["t0_monotonic"]
        times = [
            t0 + r.final_ms / 1000
            for b, r in records.items()
            if r.final_ms is not None and statuses.get(b) == "COMMITTED"
        ]
        _fill(outcome, load, statuses, order, times, started)
        counts = self.ledger.counts
        outcome.held = counts["held"]
        outcome.dropped = counts["dropped_after_hold"]
        outcome.stuck = counts["stuck_on_invalid_dependency"]
        outcome.posts = sum(r.posts for r in records.values())
        outcome.resent = len(self.ledger.violations)


def _fill(
    outcome: Outcome,
    load: IntkeyLoad,
    statuses: Mapping[str, str],
    order: Mapping[str, int],
    commit_times: list[float],
    started: float,
) -> None:
    outcome.final = sum(1 for s in statuses.values() if s in ("COMMITTED", "INVALID"))
    outcome.committed = sum(1 for s in statuses.values() if s == "COMMITTED")
    outcome.problems = load.judge(statuses, order)
    if outcome.committed == outcome.total and commit_times:
        outcome.seconds = max(commit_times) - started


@contextlib.asynccontextmanager
async def open_ledger(kind: str, opts: Options, tag: str) -> AsyncIterator[Ledger]:
    if kind == "fault":
        plan = FaultPlan(
            commit_delay_ms=opts.commit_delay_ms,
            dependency_hold_s=opts.hold_s,
            held_status=opts.held_status,
        )
        async with FaultLedger(plan, seed=opts.seed, verify=False) as ledger:
            yield FaultLedgerRun(ledger)
        return
    proc = node_proc(opts.workdir / tag)
    url = await proc.start()
    try:
        async with EventWatcher(url) as watcher:
            yield NodeLedger(url, watcher)
    finally:
        await proc.stop()


# -- one run ----------------------------------------------------------------------


async def wait_until_final(
    ledger: Ledger,
    load: IntkeyLoad,
    started: float,
    opts: Options,
    on_progress: Callable[[int], None] | None = None,
) -> str:
    """Until every batch is final (``done``), none has become final for
    ``stall_s`` (``stalled``), or ``timeout_s`` has passed since ``started``."""
    last, last_change = -1, time.monotonic()
    while True:
        final = ledger.final_count(load)
        now = time.monotonic()
        if on_progress is not None:
            on_progress(final)
        if final >= load.total:
            return "done"
        if final != last:
            last, last_change = final, now
        elif now - last_change >= opts.stall_s:
            return "stalled"
        if now - started >= opts.timeout_s:
            return "timed out"
        await asyncio.sleep(0.1)  # polling the ledger's record; nothing to wait on


async def run_one(spec: LoadSpec, system: str, ledger_kind: str, opts: Options) -> Outcome:
    load = IntkeyLoad(
        spec.services,
        spec.per_service,
        shape=spec.shape,
        keys=opts.keys,
        seed=opts.seed,
        tag=f"d{uuid.uuid4().hex[:6]}",
    )
    outcome = Outcome(spec.label, system, ledger_kind, load.total)
    tag = f"{spec.shape}-{spec.services}x{spec.per_service}-{system}-{ledger_kind}"
    db = ""
    gateway: Proc | None = None
    async with open_ledger(ledger_kind, opts, tag) as ledger:
        try:
            url = ledger.url
            if system != "direct":
                store = system.removeprefix("ledgerq-")
                if store == "sqlite":
                    (opts.workdir / tag).mkdir(parents=True, exist_ok=True)
                    db = f"sqlite:///{opts.workdir / tag / 'gateway.sqlite3'}"
                else:
                    db = create_database(opts.pg_admin, "bench_deps")
                gateway = gateway_proc(
                    opts.workdir / tag,
                    db,
                    f"sawtooth+{ledger.url}",
                    env={"LEDGERQ_LOG_LEVEL": "WARNING"},
                )
                gateway.args += ["--strategy", opts.strategy]
                url = await gateway.start()
            cpu0 = tree_cpu_seconds([gateway.pid]) if gateway is not None else {}
            db0 = await backend_cpu_seconds(opts.pg_admin, db)
            with report.progress() as bar:
                task = bar.add_task(f"{spec.label}: {system} → {ledger_kind}", total=load.total)
                async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=120)
                ) as session:
                    started = time.monotonic()
                    failure = await _post(load, session, url, system, opts)
                    outcome.ended = failure or await wait_until_final(
                        ledger, load, started, opts, lambda n: bar.update(task, completed=n)
                    )
            outcome.elapsed_s = time.monotonic() - started
            if gateway is not None:
                outcome.gateway_cpu_s = cpu_delta(cpu0, tree_cpu_seconds([gateway.pid]))
            db1 = await backend_cpu_seconds(opts.pg_admin, db)
            if db0 is not None and db1 is not None:
                outcome.db_cpu_s = cpu_delta(db0, db1)
            ledger.judge(load, started, outcome)
        finally:
            if gateway is not None:
                await gateway.stop()
            if db and not db.startswith("sqlite"):
                drop_database(opts.pg_admin, db)
    return outcome


async def _post(
    load: IntkeyLoad, session: aiohttp.ClientSession, url: str, system: str, opts: Options
) -> str | None:
    """Post the load (bounded by the run's timeout); why it could not be, if so."""
    try:
        await asyncio.wait_for(
            load.post(session, url, posters=opts.posters, gateway=system != "direct"),
            opts.timeout_s,
        )
    except TimeoutError:
        return "timed out while posting"
    except (RuntimeError, aiohttp.ClientError) as exc:
        report.console.print(f"[red]posting failed: {exc}")
        return "posting failed"
    return None


# -- the report -------------------------------------------------------------------


HEADERS = [
    "load",
    "system → ledger",
    "time to all COMMITTED",
    "× straight to the node",
    "committed",
    "each after its dependencies",
    "held / dropped / stuck (fault ledger)",
    "POSTs per batch (fault ledger)",
    "POSTs of batches the ledger had",
    "gateway CPU ms/batch",
    "PostgreSQL CPU ms/batch",
    "verdict",
]


def rows(outcomes: list[Outcome]) -> list[list[str]]:
    """One table row per run; the gateway's runs judged against the same load's
    time straight to the node."""
    baselines = {o.load: o.seconds for o in outcomes if o.system == "direct" and o.ledger == "node"}
    out = []
    for o in outcomes:
        base = baselines.get(o.load)
        ok, why = verdict(o, base)
        ratio = "-"
        if o.seconds is not None and base:
            ratio = f"{o.seconds / base:.2f}"
        early = [p for p in o.problems if "before a batch" in p]
        gw = o.cpu_ms_per_batch(o.gateway_cpu_s)
        pg = o.cpu_ms_per_batch(o.db_cpu_s)
        out.append(
            [
                o.load,
                f"{o.system} → {o.ledger}",
                f"{o.seconds:.2f} s" if o.seconds is not None else f"– ({o.ended})",
                ratio if o.system != "direct" or o.ledger != "node" else "1",
                f"{o.committed} of {o.total}",
                "no: " + early[0] if early else "yes",
                "-" if o.held is None else f"{o.held} / {o.dropped} / {o.stuck}",
                "-" if o.posts is None else f"{o.posts / o.total:.2f}",
                "-" if o.resent is None else str(o.resent),
                "-" if gw is None else f"{gw:.2f}",
                "-" if pg is None else f"{pg:.2f}",
                "PASS" if ok else "FAIL: " + "; ".join(why),
            ]
        )
    return out


def target(outcomes: list[Outcome]) -> report.Target:
    """The page's target: the gateway's time ÷ the time straight to the node, worst run."""
    baselines = {o.load: o.seconds for o in outcomes if o.system == "direct" and o.ledger == "node"}
    judged = [o for o in outcomes if o.system != "direct"]
    ratios = [
        o.seconds / base
        for o in judged
        if o.seconds is not None and (base := baselines.get(o.load))
    ]
    met = bool(judged) and all(verdict(o, baselines.get(o.load))[0] for o in judged)
    figure = (
        f"{max(ratios):.2f} × at worst over {len(judged)} gateway runs"
        if ratios
        else "no gateway run finished"
    )
    return report.Target("deps", figure, "yes" if met else "no")


def summary(outcomes: list[Outcome]) -> str:
    """The verdict of the whole run in one sentence."""
    baselines = {o.load: o.seconds for o in outcomes if o.system == "direct" and o.ledger == "node"}
    judged = [o for o in outcomes if o.system != "direct"]
    failed = [o for o in judged if not verdict(o, baselines.get(o.load))[0]]
    stalled = [o for o in judged if o.ended != "done"]
    if not judged:
        return "No gateway run: nothing to judge against the target."
    if not failed:
        return (
            f"**Target met**: every gateway run committed every batch, each after its "
            f"dependencies, none dropped after a hold, in ≤ {TARGET_RATIO:g} × the time "
            "straight to the node."
        )
    text = f"**Target not met**: {len(failed)} of {len(judged)} gateway runs fail"
    if stalled:
        text += (
            f" ({len(stalled)} stalled or timed out with batches left: "
            + ", ".join(f"{o.system} → {o.ledger} {o.committed}/{o.total}" for o in stalled)
            + ")"
        )
    return text + "."


@click.command("deps")
@click.option(
    "--loads",
    default=DEFAULT_LOADS,
    show_default=True,
    help="Comma-separated SHAPE:SERVICESxBATCHES (star: intkey create_batch's; chain).",
)
@click.option(
    "--posters", default=5, show_default=True, help="Concurrent posters (intkey load: 5)."
)
@click.option("--keys", default=5, show_default=True, help="Names per service (star).")
@click.option(
    "--systems",
    default=",".join(SYSTEMS),
    show_default=True,
    help="direct (no gateway), ledgerq-sqlite, ledgerq-pg.",
)
@click.option("--ledgers", default=",".join(LEDGERS), show_default=True, help="node and/or fault.")
@click.option(
    "--strategy",
    type=click.Choice(["serial", "parallel", "pipelined"]),
    default="pipelined",
    show_default=True,
    help="The gateway's queuer strategy (pipelined: Sawtooth keeps the order it accepts).",
)
@click.option(
    "--commit-delay-ms", default=20, show_default=True, help="The fault ledger's commit delay."
)
@click.option(
    "--hold-s",
    default=30.0,
    show_default=True,
    help="How long the fault ledger holds a batch for dependencies it has not seen "
    "(Sawtooth's validator: 1200).",
)
@click.option(
    "--held-status",
    type=click.Choice(HELD_STATUSES),
    default="UNKNOWN",
    show_default=True,
    help="What the fault ledger's status reads answer about a held batch (a Sawtooth "
    "validator: UNKNOWN).",
)
@click.option(
    "--stall-s",
    default=45.0,
    show_default=True,
    help="End a run when no batch has become final for this long.",
)
@click.option("--timeout", default=300.0, show_default=True, help="Seconds allowed per run.")
@click.option("--seed", default=0, show_default=True)
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--write/--no-write", default=True, help="Write docs/BENCHMARKS.md.")
@click.option("--keep-logs", is_flag=True, help="Keep the processes' logs (path printed).")
def command(
    loads: str,
    posters: int,
    keys: int,
    systems: str,
    ledgers: str,
    strategy: str,
    commit_delay_ms: int,
    hold_s: float,
    held_status: str,
    stall_s: float,
    timeout: float,
    seed: int,
    pg: str,
    write: bool,
    keep_logs: bool,
) -> None:
    """The intkey load shape (dependencies arriving out of order): straight to a ledger
    and through the gateway, judged against the target."""
    specs = parse_loads(loads)
    chosen = [x.strip() for x in systems.split(",") if x.strip()]
    if not chosen or set(chosen) - set(SYSTEMS):
        raise click.BadParameter(f"use some of {', '.join(SYSTEMS)}", param_hint="--systems")
    on = [x.strip() for x in ledgers.split(",") if x.strip()]
    if not on or set(on) - set(LEDGERS):
        raise click.BadParameter(f"use {' and/or '.join(LEDGERS)}", param_hint="--ledgers")
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-bench-deps-"))
    opts = Options(
        workdir,
        pg,
        posters=posters,
        keys=keys,
        strategy=strategy,
        commit_delay_ms=commit_delay_ms,
        hold_s=hold_s,
        held_status=held_status,
        stall_s=stall_s,
        timeout_s=timeout,
        seed=seed,
    )
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    outcomes: list[Outcome] = []
    try:
        for spec in specs:
            # The time straight to the node first: every ratio is read against it.
            runs = [("direct", "node")] if "direct" in chosen and "node" in on else []
            runs += [(s, k) for k in on for s in chosen if (s, k) != ("direct", "node")]
            for system, kind in runs:
                report.console.print(f"[bold]{spec.label}[/]: {system} → {kind}")
                outcome = asyncio.run(run_one(spec, system, kind, opts))
                outcomes.append(outcome)
                row = rows([o for o in outcomes if o.load == spec.label])[-1]
                report.console.print(f"  {row[2]}, {row[4]} committed; {row[-1]}")
    finally:
        if keep_logs:
            report.console.print(f"logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    load_after = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    table = report.table(HEADERS, rows(outcomes))
    verdict_line = summary(outcomes)
    report.console.print(table)
    report.console.print(verdict_line)
    if not write:
        return
    text = section(specs, opts, table, verdict_line, load_before, load_after)
    report.write_section("deps", text, targets=[target(outcomes)])


def section(
    specs: list[LoadSpec],
    opts: Options,
    table: str,
    verdict_line: str,
    load_before: str,
    load_after: str,
) -> str:
    loads = ", ".join(s.label for s in specs)
    return "\n".join(
        [
            verdict_line,
            "",
            f"Loads: {loads} ({opts.posters} concurrent posters, lists of at most 100 batches, "
            f"shuffled; star: {opts.keys} names per service). The gateway: `ledgerq serve "
            f"--strategy {opts.strategy}`. The fault ledger commits "
            f"{opts.commit_delay_ms} ms after accepting and holds a batch whose dependencies "
            f"it has not seen for {opts.hold_s:g} s (status reads: {opts.held_status}). "
            f"A run gives up after {opts.stall_s:g} s without a new final status, "
            f"or after {opts.timeout_s:g} s. Load average (1, 5, 15 min) "
            f"before: {load_before}; after: {load_after}. Definitions: `bench/deps.py`.",
            "",
            table,
        ]
    )
