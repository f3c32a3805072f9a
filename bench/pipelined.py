"""``ledgerq bench pipelined``: chained batches through ``--strategy pipelined``
against ``--strategy serial``, side by side, to a ledger that keeps their order.

Each case (``--cases``, ``SERVICESxBATCHES``) is an
:class:`~ledgerq.testing.intkey_load.IntkeyLoad` of the ``chain`` shape: per
service one name, ``set`` by the first batch, then batches that ``inc`` it,
each depending on the transaction of the one before (``intkey load``'s
chains). It is posted to ``ledgerq serve --strategy S`` (its own process, a
fresh SQLite or PostgreSQL store per run) in the order made, each service's
lists of at most 100 batches one after the other, every service at once.

The ledger is the fault ledger (``ledgerq.testing.fault_ledger``, in this
process), which treats dependencies as a Sawtooth validator does: it commits
a batch ``--commit-delay-ms`` after accepting it, and only once the batch it
depends on is committed, so it keeps each chain's order whatever the gateway
has in flight. It has no blocks: each batch's commit is due on its own
clock, not with a block's.

Every case runs for both strategies, on each store (``--dbs``), in each mode
(``--modes``):

* ``clean``: no fault. Target (issue 36, DESIGN §6): pipelined ≥ 10 × the
  batches/s of serial with several services, ≥ 20 × with one.
* ``faults``: the ledger answers some POSTs 503 or 429, drops the connection
  after accepting some, forgets some accepted batches before committing them
  (each fault at least once per run), and the first service's chain has an
  INVALID batch at its middle (a ``dec`` its name cannot take). The batches
  after it depend on it: they must fail (the gateway records them INVALID,
  naming it) and never commit. The ratio is shown, not judged: the faults a
  run is dealt are luck.

Every run is judged, whatever its speed: on the ledger's record, every batch
committed but the INVALID one and those after it, each name's final value,
and no *order violation* (a batch committed before the one it depends on, or
a name's commits out of its chain's order); no *blind resend* (a POST of a
batch the ledger had without its saying it had lost it: the fault ledger's
violations); and the gateway's own final status of every batch as expected.
A run ends when the ledger, then the gateway, has a final status for every
batch, when nothing became final for ``--stall-s`` (*stalled*), or after
``--timeout`` (*timed out*): never a hang.

*Batches/s*: batches committed over the time from the first POST to the
gateway to the ledger's last final status (one clock: ``time.monotonic``).
*CPU ms/batch*: the gateway's processes, and for PostgreSQL the server
processes serving its database, over the same span, per batch committed;
not given for a run that did not finish.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import click

from bench import report
from bench._harness import (
    DEFAULT_PG,
    Proc,
    backend_cpu_seconds,
    cpu_delta,
    create_database,
    drop_database,
    gateway_proc,
    tree_cpu_seconds,
)
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan
from ledgerq.testing.intkey_load import IntkeyLoad

STRATEGIES = ("serial", "pipelined")
DBS = ("sqlite", "postgresql")
MODES = ("clean", "faults")
DEFAULT_CASES = "10x100,1x500"
#: The faults of the ``faults`` mode (per POST; forget: per accepted batch).
FAULTS = {"busy_503": 0.03, "busy_429": 0.02, "drop_after_accept": 0.02, "forget": 0.02}
#: What the ledger counts of each fault, as the report names them.
FAULT_COUNTS = {
    "busy_503": "503",
    "busy_429": "429",
    "dropped_after_accept": "dropped",
    "forgotten": "forgotten",
}
#: The gateway's delay window after a refused POST, both strategies (its
#: default, 15 s, would rest a Delayed batch's service past the whole run).
DELAY_WINDOW_MS = 300
_CASE = re.compile(r"(?P<services>\d+)x(?P<batches>\d+)")


@dataclass(frozen=True)
class Case:
    services: int
    per_service: int

    @property
    def label(self) -> str:
        return f"{self.services} × {self.per_service}"

    @property
    def target(self) -> float:
        """Pipelined ÷ serial batches/s to reach (clean mode)."""
        return 20.0 if self.services == 1 else 10.0


def parse_cases(value: str) -> list[Case]:
    out = []
    for part in value.split(","):
        m = _CASE.fullmatch(part.strip())
        if m is None or int(m["services"]) < 1 or int(m["batches"]) < 4:
            raise click.BadParameter(
                f"{part!r}: expected SERVICESxBATCHES, at least 1 service and 4 batches, "
                "e.g. 10x100"
            )
        out.append(Case(int(m["services"]), int(m["batches"])))
    return out


def _choices(value: str, known: tuple[str, ...], flag: str) -> list[str]:
    chosen = [x.strip() for x in value.split(",") if x.strip()]
    if not chosen or set(chosen) - set(known):
        raise click.BadParameter(f"use some of {', '.join(known)}", param_hint=flag)
    return chosen


@dataclass(frozen=True)
class Options:
    workdir: Path
    pg_admin: str
    commit_delay_ms: int = 100
    delay_window_ms: int = DELAY_WINDOW_MS
    #: ``queuer.pipeline_depth`` (None: the gateway's default).
    pipeline_depth: int | None = None
    stall_s: float = 60.0
    timeout_s: float = 300.0
    seed: int = 0


@dataclass
class Outcome:
    """What one strategy did with one case, on one store, in one mode."""

    case: Case
    mode: str
    db: str
    strategy: str
    total: int
    #: Batches that must commit (all but the INVALID one and those after it).
    expected: int
    committed: int = 0
    #: ``done`` (every batch final), ``stalled``, ``timed out``, ``posting failed``.
    ended: str = "done"
    elapsed_s: float = 0.0
    #: First POST to the ledger's last final status, when every batch that must
    #: commit did; else None.
    seconds: float | None = None
    order_violations: int = 0
    blind_resends: int = 0
    #: Everything else the judge found (not committed, wrong values, the
    #: gateway's statuses).
    problems: list[str] = field(default_factory=list)
    posts: int = 0
    held: int = 0
    peak_pending: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    gateway_cpu_s: float | None = None
    db_cpu_s: float | None = None

    @property
    def rate(self) -> float | None:
        if self.seconds is None or self.seconds <= 0 or self.ended != "done":
            return None
        return self.committed / self.seconds

    def cpu_ms_per_batch(self, cpu_s: float | None) -> float | None:
        if cpu_s is None or self.rate is None or not self.committed:
            return None
        return cpu_s * 1000 / self.committed


def verdict(o: Outcome) -> tuple[bool, list[str]]:
    """Whether a run is clean (its speed aside), and why not."""
    why = []
    if o.ended != "done":
        why.append(
            f"{o.ended} after {o.elapsed_s:.0f} s with {o.committed} of {o.expected} committed"
        )
    if o.order_violations:
        why.append(f"{o.order_violations} order violations")
    if o.blind_resends:
        why.append(f"{o.blind_resends} blind resends")
    return (not why and not o.problems, why + o.problems)


def ratio_verdict(serial: Outcome, pipelined: Outcome) -> tuple[float | None, bool, list[str]]:
    """Pipelined ÷ serial batches/s of one case, store and mode; whether it
    passes (both runs clean, and in clean mode the case's target met)."""
    why = [f"{o.strategy} run failed" for o in (serial, pipelined) if not verdict(o)[0]]
    s, p = serial.rate, pipelined.rate
    ratio = p / s if s and p else None
    if ratio is None:
        why.append("no rate to compare")
    elif serial.mode == "clean" and ratio < serial.case.target:
        why.append(f"{ratio:.1f} × (target ≥ {serial.case.target:g} ×)")
    return ratio, not why, why


# -- one run ----------------------------------------------------------------------


def plan_for(mode: str, opts: Options) -> FaultPlan:
    if mode == "clean":
        return FaultPlan(commit_delay_ms=opts.commit_delay_ms)
    return FaultPlan(commit_delay_ms=opts.commit_delay_ms, **FAULTS)


def load_for(case: Case, mode: str, seed: int) -> IntkeyLoad:
    return IntkeyLoad(
        case.services,
        case.per_service,
        shape="chain",
        seed=seed,
        invalid_at=case.per_service // 2 if mode == "faults" else None,
        tag=f"p{uuid.uuid4().hex[:6]}",
    )


async def wait_until(
    count: Callable[[], Awaitable[int]],
    total: int,
    started: float,
    opts: Options,
    on_progress: Callable[[int], None] | None = None,
) -> str:
    """Until ``count()`` reaches ``total`` (``done``), has not moved for
    ``stall_s`` (``stalled``), or ``timeout_s`` has passed since ``started``."""
    last, last_change = -1, time.monotonic()
    while True:
        n = await count()
        now = time.monotonic()
        if on_progress is not None:
            on_progress(n)
        if n >= total:
            return "done"
        if n != last:
            last, last_change = n, now
        elif now - last_change >= opts.stall_s:
            return "stalled"
        if now - started >= opts.timeout_s:
            return "timed out"
        await asyncio.sleep(0.1)  # polling the ledger's record or the gateway


async def gateway_statuses(
    session: aiohttp.ClientSession, url: str, ids: list[str]
) -> dict[str, str]:
    """The gateway's status of each of ``ids`` it answered about (a gateway
    that does not answer gives none: the wait stalls, the judge says so)."""
    out: dict[str, str] = {}
    for i in range(0, len(ids), 100):
        try:
            async with session.post(f"{url}/batch_statuses", json=ids[i : i + 100]) as resp:
                if resp.status != 200:
                    continue  # asked again on the next poll
                out.update({d["id"]: d["status"] for d in (await resp.json())["data"]})
        except (aiohttp.ClientError, TimeoutError):
            continue
    return out


def judge(load: IntkeyLoad, ledger: FaultLedger, gateway: dict[str, str], o: Outcome) -> None:
    """Fill ``o``'s counts and problems from the ledger's record and the
    gateway's statuses."""
    records = ledger.batches
    statuses = {b: records[b].status for b in load.all_ids() if b in records}
    order = {b: r.commit_seq for b, r in records.items() if r.commit_seq is not None}
    o.committed = sum(1 for s in statuses.values() if s == "COMMITTED")
    # A batch committed before the one it depends on, and a name whose commits
    # are not its chain's order (what the ledger's intkey state saw).
    o.order_violations = sum(
        1
        for b, deps in load.depends_on.items()
        if b in order and any(d not in order or order[d] > order[b] for d in deps)
    )
    for s in range(load.services):
        name = load.name(s, 0)
        batches = load.batches[load.service_id(s)]
        chain = [b.header_signature for b in batches if b.header_signature in order]
        if ledger.state.order.get(name, []) != chain:
            o.order_violations += 1
    o.problems = [p for p in load.judge(statuses, order) if "before a batch" not in p]
    wrong = {n for n, v in load.values.items() if ledger.state.values.get(n) != v}
    if wrong:
        o.problems.append(f"{len(wrong)} names with a wrong final value")
    expected = load.expected()
    off = [b for b, s in expected.items() if gateway.get(b) != s]
    if off:
        seen = sorted({f"{expected[b]}→{gateway.get(b, 'none')}" for b in off})
        o.problems.append(f"the gateway's status of {len(off)} batches not as expected ({seen})")
    o.blind_resends = len(ledger.violations)
    o.posts = sum(r.posts for r in records.values())
    o.held = ledger.counts["held"]
    o.peak_pending = ledger.peak_pending
    o.faults = {name: ledger.counts[key] for key, name in FAULT_COUNTS.items()}


async def run_one(case: Case, mode: str, db: str, strategy: str, opts: Options) -> Outcome:
    """One strategy with one case, on a fresh store and ledger, judged."""
    load = load_for(case, mode, opts.seed)
    expected = load.total - len(load.invalid) - len(load.doomed)
    o = Outcome(case, mode, db, strategy, load.total, expected)
    workdir = opts.workdir / f"{case.services}x{case.per_service}-{mode}-{db}-{strategy}"
    workdir.mkdir(parents=True, exist_ok=True)
    url = (
        create_database(opts.pg_admin, "bench_pipelined")
        if db == "postgresql"
        else f"sqlite:///{workdir / 'gateway.sqlite3'}"
    )
    try:
        async with FaultLedger(
            plan_for(mode, opts), seed=opts.seed, verify=False, each_fault_once=mode == "faults"
        ) as ledger:
            env = {
                "LEDGERQ_LOG_LEVEL": "WARNING",
                "LEDGERQ_DELAY_WINDOW_MS": str(opts.delay_window_ms),
            }
            if opts.pipeline_depth is not None:
                env["LEDGERQ_QUEUER_PIPELINE_DEPTH"] = str(opts.pipeline_depth)
            gateway = gateway_proc(workdir, url, f"sawtooth+{ledger.url}", env=env)
            gateway.args += ["--strategy", strategy]
            try:
                await gateway.start()
                started, statuses = await _drive(load, ledger, gateway, url, o, opts)
            finally:
                await gateway.stop()  # before the ledger closes under it
            judge(load, ledger, statuses, o)
            if o.ended == "done" and o.committed == expected:
                t0 = ledger.report()["t0_monotonic"]
                last = max(r.final_ms for r in ledger.batches.values() if r.final_ms is not None)
                o.seconds = t0 + last / 1000 - started
    finally:
        if db == "postgresql":
            drop_database(opts.pg_admin, url)
    return o


async def _drive(
    load: IntkeyLoad, ledger: FaultLedger, gateway: Proc, db_url: str, o: Outcome, opts: Options
) -> tuple[float, dict[str, str]]:
    """Post the load to the gateway and wait for the ledger's final statuses
    (CPU read over that span), then for the gateway's; when the first POST
    went, and the gateway's statuses at the end."""
    label = f"{o.case.label} {o.mode} {o.db} {o.strategy}"
    # Ledger-side finals: the batches that must commit and the INVALID one.
    on_ledger = o.expected + len(load.invalid)

    async def ledger_final() -> int:
        return ledger.progress()["final"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def gateway_final() -> int:
            got = await gateway_statuses(session, gateway.url, load.all_ids())
            return sum(1 for s in got.values() if s in ("COMMITTED", "INVALID"))

        cpu0 = tree_cpu_seconds([gateway.pid])
        db0 = await backend_cpu_seconds(opts.pg_admin, db_url)
        with report.progress() as bar:
            task = bar.add_task(label, total=load.total)
            started = time.monotonic()
            try:
                await asyncio.wait_for(
                    load.post(session, gateway.url, posters=o.case.services, in_order=True),
                    opts.timeout_s,
                )
            except (TimeoutError, RuntimeError, aiohttp.ClientError) as exc:
                report.console.print(f"[red]posting failed: {exc!r}")
                o.ended = "posting failed"
            if o.ended == "done":
                o.ended = await wait_until(
                    ledger_final, on_ledger, started, opts, lambda n: bar.update(task, completed=n)
                )
            o.gateway_cpu_s = cpu_delta(cpu0, tree_cpu_seconds([gateway.pid]))
            db1 = await backend_cpu_seconds(opts.pg_admin, db_url)
            if db0 is not None and db1 is not None:
                o.db_cpu_s = cpu_delta(db0, db1)
            if o.ended == "done":
                # The gateway's own verdicts (the batches after an INVALID one
                # are failed by it, never by the ledger).
                bar.update(task, description=f"{label}: the gateway's statuses")
                o.ended = await wait_until(
                    gateway_final,
                    load.total,
                    started,
                    opts,
                    lambda n: bar.update(task, completed=n),
                )
        o.elapsed_s = time.monotonic() - started
        return started, await gateway_statuses(session, gateway.url, load.all_ids())


# -- the report -------------------------------------------------------------------

RUN_HEADERS = [
    "case",
    "mode",
    "store",
    "strategy",
    "batches/s",
    "seconds",
    "committed",
    "POSTs per batch",
    "peak pending at the ledger",
    "faults dealt (503 / 429 / dropped / forgotten)",
    "order violations",
    "blind resends",
    "gateway CPU ms/batch",
    "PostgreSQL CPU ms/batch",
    "verdict",
]
RATIO_HEADERS = [
    "case",
    "mode",
    "store",
    "serial batches/s",
    "pipelined batches/s",
    "pipelined ÷ serial",
    "target",
    "verdict",
]


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_rows(outcomes: list[Outcome]) -> list[list[str]]:
    out = []
    for o in outcomes:
        ok, why = verdict(o)
        f = o.faults
        out.append(
            [
                o.case.label,
                o.mode,
                o.db,
                o.strategy,
                _f(o.rate),
                _f(o.seconds, 2) if o.seconds is not None else f"– ({o.ended})",
                f"{o.committed} of {o.expected}",
                f"{o.posts / o.total:.2f}",
                str(o.peak_pending),
                " / ".join(str(f.get(k, 0)) for k in FAULT_COUNTS.values()),
                str(o.order_violations),
                str(o.blind_resends),
                _f(o.cpu_ms_per_batch(o.gateway_cpu_s), 2),
                _f(o.cpu_ms_per_batch(o.db_cpu_s), 2),
                "PASS" if ok else "FAIL: " + "; ".join(why),
            ]
        )
    return out


def pairs(outcomes: list[Outcome]) -> list[tuple[Outcome, Outcome]]:
    """Per case, mode and store: (serial, pipelined), the median-rate run of
    each when there were several rounds."""
    groups: dict[tuple[str, str, str], dict[str, list[Outcome]]] = {}
    for o in outcomes:
        groups.setdefault((o.case.label, o.mode, o.db), {}).setdefault(o.strategy, []).append(o)
    out = []
    for runs in groups.values():
        if "serial" in runs and "pipelined" in runs:
            out.append((_median_run(runs["serial"]), _median_run(runs["pipelined"])))
    return out


def _median_run(runs: list[Outcome]) -> Outcome:
    """The run of median rate (a run without a rate counts as the slowest)."""
    ranked = sorted(runs, key=lambda o: o.rate or 0.0)
    return ranked[(len(ranked) - 1) // 2]


def ratio_rows(outcomes: list[Outcome]) -> list[list[str]]:
    out = []
    for serial, pipelined in pairs(outcomes):
        ratio, ok, why = ratio_verdict(serial, pipelined)
        target = f"≥ {serial.case.target:g} ×" if serial.mode == "clean" else "(not judged)"
        out.append(
            [
                serial.case.label,
                serial.mode,
                serial.db,
                _f(serial.rate),
                _f(pipelined.rate),
                "-" if ratio is None else f"{ratio:.1f} ×",
                target,
                "PASS" if ok else "FAIL: " + "; ".join(why),
            ]
        )
    return out


def target(outcomes: list[Outcome]) -> report.Target:
    """The run's figure for the page's pipelined target: clean-mode ratios, each pair."""
    parts, met = [], True
    judged = pairs(outcomes)
    for s, p in judged:
        ratio, ok, _ = ratio_verdict(s, p)
        met = met and ok
        if s.mode == "clean":
            parts.append(f"{s.case.label} {s.db} {'-' if ratio is None else f'{ratio:.1f} ×'}")
    figure = ", ".join(parts) or "no clean pair"
    return report.Target("pipelined", figure, "yes" if judged and met else "no")


def summary(outcomes: list[Outcome]) -> str:
    """The verdict of the whole run in one sentence."""
    judged = pairs(outcomes)
    failed_runs = [o for o in outcomes if not verdict(o)[0]]
    failed_ratios = [
        f"{s.case.label} {s.mode} {s.db} ({'-' if r is None else f'{r:.1f} ×'})"
        for s, p in judged
        for r, ok, _ in [ratio_verdict(s, p)]
        if not ok
    ]
    if not judged:
        return "No case ran both strategies: nothing to compare."
    if not failed_runs and not failed_ratios:
        return (
            "**Targets met**: pipelined ≥ 10 × serial's batches/s with several services and "
            "≥ 20 × with one where there were no faults; every run, with faults too, committed "
            "every valid batch and failed those after the INVALID one, with no order "
            "violation and no blind resend."
        )
    text = "**Targets not met**:"
    if failed_ratios:
        text += " " + ", ".join(failed_ratios) + " below target or not comparable"
    if failed_runs:
        text += (
            ("; " if failed_ratios else " ")
            + f"{len(failed_runs)} of {len(outcomes)} runs not clean ("
            + ", ".join(f"{o.case.label} {o.mode} {o.db} {o.strategy}" for o in failed_runs)
            + ")"
        )
    return text + "."


def section(
    cases: list[Case],
    opts: Options,
    verdict_line: str,
    ratios: str,
    load_before: str,
    load_after: str,
) -> str:
    """The page's section: the verdict, the setup and the ratio per case; the
    table of every run (faults dealt, order violations, CPU) goes to the
    console only."""
    depth = (
        "its default"
        if opts.pipeline_depth is None
        else f"`queuer.pipeline_depth = {opts.pipeline_depth}`"
    )
    faults = ", ".join(f"{k} {v:.0%}" for k, v in FAULTS.items())
    return "\n".join(
        [
            verdict_line,
            "",
            f"Cases: {', '.join(c.label for c in cases)} chained batches (each depends on the "
            "one before, posted in order). The ledger: the fault ledger, committing each batch "
            f"{opts.commit_delay_ms} ms after accepting it and only after the batch it depends "
            f"on. The gateway: `ledgerq serve --strategy serial` or `pipelined` ({depth}), "
            f"delay window {opts.delay_window_ms} ms. Faults mode: {faults}, each at least "
            "once, and the first service's middle batch INVALID. A run gives up after "
            f"{opts.stall_s:g} s without a new final status, or after {opts.timeout_s:g} s. "
            f"Load average (1, 5, 15 min) before: {load_before}; after: {load_after} (a shared "
            "2-core machine). Definitions: `bench/pipelined.py`.",
            "",
            ratios,
        ]
    )


@click.command("pipelined")
@click.option(
    "--cases",
    default=DEFAULT_CASES,
    show_default=True,
    help="Comma-separated SERVICESxBATCHES of chained batches.",
)
@click.option("--dbs", default=",".join(DBS), show_default=True, help="sqlite, postgresql.")
@click.option("--modes", default=",".join(MODES), show_default=True, help="clean, faults.")
@click.option(
    "--commit-delay-ms", default=100, show_default=True, help="The ledger's commit delay."
)
@click.option(
    "--pipeline-depth",
    type=int,
    default=None,
    help="The gateway's queuer.pipeline_depth (default: the gateway's).",
)
@click.option(
    "--delay-window-ms",
    default=DELAY_WINDOW_MS,
    show_default=True,
    help="The gateway's delay window after a refused POST (both strategies).",
)
@click.option("--rounds", default=1, show_default=True, help="Runs per case, store and mode.")
@click.option(
    "--stall-s",
    default=60.0,
    show_default=True,
    help="End a run when no batch has become final for this long.",
)
@click.option("--timeout", default=300.0, show_default=True, help="Seconds allowed per run.")
@click.option("--seed", default=0, show_default=True)
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--write/--no-write", default=True, help="Write docs/BENCHMARKS.md.")
@click.option("--keep-logs", is_flag=True, help="Keep the gateways' logs (path printed).")
def command(
    cases: str,
    dbs: str,
    modes: str,
    commit_delay_ms: int,
    pipeline_depth: int | None,
    delay_window_ms: int,
    rounds: int,
    stall_s: float,
    timeout: float,
    seed: int,
    pg: str,
    write: bool,
    keep_logs: bool,
) -> None:
    """Chained batches: the pipelined strategy against serial, side by side, with and
    without faults, judged against the targets."""
    specs = parse_cases(cases)
    stores = _choices(dbs, DBS, "--dbs")
    chosen_modes = _choices(modes, MODES, "--modes")
    if rounds < 1:
        raise click.BadParameter("at least 1", param_hint="--rounds")
    if pipeline_depth is not None and pipeline_depth < 1:
        raise click.BadParameter("at least 1", param_hint="--pipeline-depth")
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-bench-pipelined-"))
    opts = Options(
        workdir,
        pg,
        commit_delay_ms=commit_delay_ms,
        delay_window_ms=delay_window_ms,
        pipeline_depth=pipeline_depth,
        stall_s=stall_s,
        timeout_s=timeout,
        seed=seed,
    )
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    outcomes: list[Outcome] = []
    try:
        for db in stores:
            for mode in chosen_modes:
                for case in specs:
                    for r in range(rounds):
                        # The strategies take turns going first.
                        order = STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]
                        for strategy in order:
                            o = asyncio.run(run_one(case, mode, db, strategy, opts))
                            outcomes.append(o)
                            row = run_rows([o])[0]
                            report.console.print(
                                f"{case.label} {mode} {db} {strategy}: {row[4]} batches/s "
                                f"({row[5]} s), {row[6]} committed, peak {row[8]} pending; "
                                f"{row[-1]}"
                            )
    finally:
        if keep_logs:
            report.console.print(f"logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    load_after = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    ratios = report.table(RATIO_HEADERS, ratio_rows(outcomes))
    runs = report.table(RUN_HEADERS, run_rows(outcomes))
    verdict_line = summary(outcomes)
    report.console.print(runs)
    report.console.print(ratios)
    report.console.print(verdict_line)
    if write:
        text = section(specs, opts, verdict_line, ratios, load_before, load_after)
        report.write_section("pipelined", text, targets=[target(outcomes)])
