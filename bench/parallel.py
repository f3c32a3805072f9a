"""Parallel queuer: batches/s of ``--strategy parallel`` against ``serial``, side by side.

Each run starts the fault ledger (``ledgerq.testing.fault_ledger``: Sawtooth's
REST API only, every batch committed ``--commit-delay-ms`` after it was
accepted, judging overlaps), a fresh store, and ``ledgerq serve
--strategy S`` as its own process; then POSTs ``--services`` × ``--batches``
intkey batches (one BatchList per service, all at once) and waits until the
gateway reports every batch final. *Batches/s* is batches over the time from
the first POST to the last final status. Two cases, each run for both
strategies in turn, ``--rounds`` times:

* *independent*: each service's batches spread round-robin over ``--names``
  names of its own (``set`` first, then ``inc``\\ s): batches on different
  names do not conflict;
* *one name*: every batch of a service on one name: everything conflicts, the
  parallel strategy can gain nothing and must lose (almost) nothing.

With ``--faults`` (the default) the ledger answers some POSTs 503, drops the
connection after accepting some, and forgets some accepted batches before
committing them. Every run is judged as the end-to-end tests judge: each
batch's verdict, each name's final value and commit order equal a serial run
(the serial oracle), no POST of a batch the ledger held, and no two
conflicting batches pending together. The gateway's delay window is
``--delay-window-ms`` in both strategies (a ``Delayed`` batch would otherwise
wait 15 s).

*The faults' bound.* Faults cost time whatever the client does: a refused
POST is sent again after a backoff (the submitter's first, at least 10 ms
with its jitter, before any delay window: a batch is only ``Delayed`` after
``max_retries`` refusals in a row), and a forgotten batch is only known lost
when its commit was due, then waits for a second commit. Each run reports
its *bound*: the least time a client with no cost of its own could have
taken given the faults the ledger dealt in that run (per batch, the commit
delay for each acceptance plus 10 ms for each refused POST; summed along
each chain of batches that must go one after the other: a service in
``serial``, a name in ``parallel``; the longest chain). Before the runs, the
same bound is drawn 2,000 times from the fault plan's probabilities alone
(every POST of one batch): the ratio such a client would reach under these
faults, the ceiling the measured ratio is read against.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import click

from bench import _harness as harness
from bench import report
from ledgerq.submit.submitter import SubmitterSettings
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan
from ledgerq.testing.intkey import names_of
from ledgerq.testing.workload import KeyedWorkload

_FAULTS = (
    "with faults (503: 5 %, connection dropped after accepting: 3 %, accepted batch forgotten: 3 %)"
)
GATEWAY_ENV = {"LEDGERQ_LOG_LEVEL": "WARNING"}
#: The gateway's delay window in both strategies (its default, 15 s, would
#: hold a Delayed batch past the whole run).
DELAY_WINDOW_MS = 300


@dataclass(frozen=True)
class Run:
    case: str
    strategy: str
    batches: int
    seconds: float
    posts: int
    faults: dict[str, int]
    peak_pending: int
    problems: list[str]
    #: The least time the faults of this run allowed any client (module docstring).
    bound_s: float

    @property
    def rate(self) -> float:
        return self.batches / self.seconds


def _chains(workload: KeyedWorkload, strategy: str) -> list[list[str]]:
    """Batch ids that must commit one after the other: each service's whole
    list in ``serial``; in ``parallel`` each name's batches of a service."""
    chains: list[list[str]] = []
    for batches in workload.batches.values():
        if strategy == "serial":
            chains.append([b.header_signature for b in batches])
            continue
        by_name: dict[tuple[str, ...], list[str]] = {}
        for b in batches:
            by_name.setdefault(names_of(b), []).append(b.header_signature)
        chains.extend(by_name.values())
    return chains


#: What a refused POST costs at least: the submitter's first backoff (its
#: default), of which the jitter keeps at least half.
REFUSED_S = SubmitterSettings().backoff_initial_ms / 2000


def _bound(chains: list[list[str]], ledger: FaultLedger) -> float:
    """The longest chain's commit delays and first backoffs, from what the ledger dealt."""
    commit_s = ledger.plan.commit_delay_ms / 1000

    def cost(batch_id: str) -> float:
        record = ledger.batches[batch_id]
        return commit_s * record.acceptances + REFUSED_S * (record.posts - record.acceptances)

    return max(sum(cost(b) for b in chain) for chain in chains)


def _ceiling(
    plan: FaultPlan, services: int, batches: int, names: int, trials: int = 2000
) -> list[float]:
    """Serial ÷ parallel bound of a client with no cost of its own, drawn
    ``trials`` times from ``plan``'s probabilities (sorted)."""
    rng = random.Random(0)
    commit_s = plan.commit_delay_ms / 1000

    def batch() -> float:
        spent = 0.0
        while True:
            if rng.random() < plan.busy_503 + plan.busy_429:
                spent += REFUSED_S
                continue
            spent += commit_s
            if rng.random() >= plan.forget:
                return spent

    def longest(chains: int, length: int) -> float:
        return max(sum(batch() for _ in range(length)) for _ in range(chains))

    per_name = -(-batches // names)
    return sorted(
        longest(services, batches) / longest(services * names, per_name) for _ in range(trials)
    )


def _plan(commit_delay_ms: int, faults: bool) -> FaultPlan:
    if not faults:
        return FaultPlan(commit_delay_ms=commit_delay_ms)
    return FaultPlan(
        commit_delay_ms=commit_delay_ms,
        busy_503=0.05,
        drop_after_accept=0.03,
        forget=0.03,
    )


async def _wait_final(
    session: aiohttp.ClientSession, gateway: str, workload: KeyedWorkload, timeout_s: float
) -> dict[str, str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    final: dict[str, str] = {}
    total = len(workload.all_ids())

    async def one(service: str, ids: list[str]) -> None:
        async with session.get(
            f"{gateway}/batch_statuses",
            params={"id": ",".join(ids), "service_id": service, "wait": "1"},
        ) as resp:
            for entry in (await resp.json())["data"]:
                if entry["status"] in ("COMMITTED", "INVALID"):
                    final[entry["id"]] = entry["status"]

    while len(final) < total and loop.time() < deadline:
        waits = []
        for service, bs in workload.batches.items():
            ids = [b.header_signature for b in bs if b.header_signature not in final]
            if ids:
                waits.append(one(service, ids))
        await asyncio.gather(*waits)
    return final


async def _one(
    case: str,
    strategy: str,
    workload: KeyedWorkload,
    plan: FaultPlan,
    db: str,
    pg_admin: str,
    seed: int,
    window_ms: int = DELAY_WINDOW_MS,
) -> Run:
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-parallel-") as tmp:
        url = (
            harness.create_database(pg_admin, "ledgerq_bench_parallel")
            if db == "postgresql"
            else f"sqlite:///{tmp}/gateway.sqlite3"
        )
        try:
            async with FaultLedger(plan, seed=seed, judge_overlaps=True, verify=False) as ledger:
                gateway = harness.gateway_proc(
                    Path(tmp),
                    url,
                    f"sawtooth+{ledger.url}",
                    env={**GATEWAY_ENV, "LEDGERQ_DELAY_WINDOW_MS": str(window_ms)},
                )
                gateway.args += ["--strategy", strategy]
                await gateway.start()
                try:
                    async with aiohttp.ClientSession(
                        timeout=aiohttp.ClientTimeout(total=60)
                    ) as session:
                        started = time.monotonic()
                        await workload.post(session, gateway.url, waves=1)
                        final = await _wait_final(session, gateway.url, workload, 600)
                        seconds = time.monotonic() - started
                finally:
                    await gateway.stop()
                expected = workload.serial()
                problems = []
                if final != expected.statuses:
                    missing = len(expected.statuses) - len(final)
                    problems.append(f"{missing} not final or verdicts differ from a serial run")
                if ledger.violations:
                    problems.append(f"{len(ledger.violations)} POSTs of batches the ledger held")
                if ledger.overlaps:
                    problems.append(f"{len(ledger.overlaps)} conflicting batches pending together")
                if ledger.state.order != expected.order:
                    problems.append("a name's batches committed out of acceptance order")
                if ledger.state.values != expected.values:
                    problems.append("final values differ from a serial run")
                return Run(
                    case,
                    strategy,
                    len(expected.statuses),
                    seconds,
                    sum(r.posts for r in ledger.batches.values()),
                    dict(ledger.counts),
                    ledger.peak_pending,
                    problems,
                    _bound(_chains(workload, strategy), ledger),
                )
        finally:
            if db == "postgresql":
                harness.drop_database(pg_admin, url)


def _median(runs: list[Run], case: str, strategy: str) -> float:
    return statistics.median(r.rate for r in runs if r.case == case and r.strategy == strategy)


@click.command(name="parallel")
@click.option("--services", default=10, show_default=True)
@click.option("--batches", default=40, show_default=True, help="Batches per service.")
@click.option("--names", default=8, show_default=True, help="Independent names per service.")
@click.option("--commit-delay-ms", default=100, show_default=True)
@click.option(
    "--delay-window-ms",
    "window_ms",
    default=DELAY_WINDOW_MS,
    show_default=True,
    help="The gateway's delay window after a refused POST (both strategies).",
)
@click.option("--rounds", default=3, show_default=True, help="Runs per case and strategy.")
@click.option("--faults/--no-faults", default=True, show_default=True)
@click.option(
    "--db", type=click.Choice(["sqlite", "postgresql"]), default="sqlite", show_default=True
)
@click.option("--pg", "pg_admin", default=harness.DEFAULT_PG, show_default=True)
@click.option("--write/--no-write", default=True, help="Write docs/BENCHMARKS.md.")
def command(
    services: int,
    batches: int,
    names: int,
    commit_delay_ms: int,
    window_ms: int,
    rounds: int,
    faults: bool,
    db: str,
    pg_admin: str,
    write: bool,
) -> None:
    """Parallel vs serial strategy against a ledger that commits in --commit-delay-ms."""
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    plan = _plan(commit_delay_ms, faults)
    cases = {
        "independent": KeyedWorkload(services, batches, names=names, spread="round-robin"),
        "one name": KeyedWorkload(services, batches, names=1),
    }
    ceiling = _ceiling(plan, services, batches, names)
    ceiling_text = (
        f"a client with no cost of its own would reach {statistics.median(ceiling):.2f} × "
        f"(median; 10th–90th percentile {ceiling[len(ceiling) // 10]:.2f}–"
        f"{ceiling[len(ceiling) * 9 // 10]:.2f} ×) under these faults"
    )
    report.console.print(f"The faults' ceiling: {ceiling_text}.")
    runs: list[Run] = []
    for r in range(rounds):
        for case, workload in cases.items():
            for strategy in ("serial", "parallel") if r % 2 == 0 else ("parallel", "serial"):
                run = asyncio.run(
                    _one(case, strategy, workload, plan, db, pg_admin, seed=r, window_ms=window_ms)
                )
                runs.append(run)
                report.console.print(
                    f"{case:>11} {strategy:>8}: {run.rate:7.1f} batches/s "
                    f"({run.seconds:.2f} s, the faults' bound {run.bound_s:.2f} s, "
                    f"{run.posts} POSTs, peak {run.peak_pending} pending)"
                    + (f" PROBLEMS: {run.problems}" if run.problems else "")
                )
    load_after = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    for r in runs:  # every run on the console; the page keeps the medians
        faults_seen = ", ".join(
            f"{k} {v}"
            for k, v in sorted(r.faults.items())
            if k in ("busy_503", "dropped_after_accept", "forgotten")
        )
        report.console.print(
            f"{r.case} {r.strategy}: {r.rate:.1f} batches/s, {r.seconds:.2f} s, bound "
            f"{r.bound_s:.2f} s, {r.posts} POSTs, faults {faults_seen or '-'}, peak pending "
            f"{r.peak_pending}, problems: {'; '.join(r.problems) or 'none'}"
        )
    rows = []
    for case in cases:
        for strategy in ("serial", "parallel"):
            mine = [r for r in runs if r.case == case and r.strategy == strategy]
            rows.append(
                [
                    case,
                    strategy,
                    str(len(mine)),
                    f"{statistics.median(r.rate for r in mine):.1f}",
                    f"{statistics.median(r.seconds for r in mine):.2f}",
                    f"{statistics.median(r.bound_s for r in mine):.2f}",
                    str(sum(1 for r in mine if r.problems)),
                ]
            )
    table = report.table(
        [
            "case",
            "strategy",
            "runs",
            "batches/s",
            "seconds",
            "the faults' bound, s",
            "runs with a problem",
        ],
        rows,
    )
    ratios = {
        case: _median(runs, case, "parallel") / _median(runs, case, "serial") for case in cases
    }
    bound_ratio = statistics.median(
        r.bound_s for r in runs if r.case == "independent" and r.strategy == "serial"
    ) / statistics.median(
        r.bound_s for r in runs if r.case == "independent" and r.strategy == "parallel"
    )
    problems = sum(1 for r in runs if r.problems)
    summary = (
        f"{services} services × {batches} batches, the ledger committing each batch "
        f"{commit_delay_ms} ms after accepting it, store {db}, "
        f"{_FAULTS if faults else 'no faults'}, the gateway's delay window {window_ms} ms; "
        f"{rounds} rounds, the strategies taking turns. Load average (1, 5, 15 min) "
        f"before: {load_before}; after: {load_after} — the machine is shared. "
        f"**Median parallel ÷ serial batches/s: {ratios['independent']:.2f} × with "
        f"{names} independent names per service (target ≥ 5), {ratios['one name']:.2f} × "
        f"with every batch on one name (target ≥ 0.9).** Runs with a problem: {problems}. "
        "The table: medians over the rounds."
    )
    report.console.print(summary)
    # Printed, not written: what the faults allowed.
    report.console.print(
        f"The faults' ceiling: {ceiling_text}; the faults these runs were dealt allowed "
        f"{bound_ratio:.2f} × with independent names (serial ÷ parallel bound, medians)."
    )
    if write:
        # One section per store: a PostgreSQL run does not replace SQLite's figures.
        name, key = (
            ("parallel", "parallel-sqlite")
            if db == "sqlite"
            else ("parallel-postgresql", "parallel-pg")
        )
        gain = ratios["independent"]
        met = gain >= 5 and ratios["one name"] >= 0.9 and not problems
        figure = f"{gain:.2f} × ({ratios['one name']:.2f} × on one name)"
        report.write_section(
            name,
            f"{summary}\n\n{table}\n",
            targets=[report.Target(key, figure, "yes" if met else "no")],
        )
