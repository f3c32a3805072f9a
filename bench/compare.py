"""``ledgerq bench compare``: the same ordered workload run by an ideal client, ledgerq
and procrastinate, against a plain Sawtooth-shaped REST ledger and against ``ledgerq node``.

S services × M intkey batches (``set`` then ``inc``s: a reorder shows up as
INVALID), every batch POSTed to the ledger (its own process, loopback) and
done only when the ledger reports it COMMITTED. Two ledgers:

* ``plain``: the fault ledger without faults (``ledgerq.testing.fault_ledger``):
  Sawtooth's REST API only — ``POST /batches``, ``batch_statuses?wait=``, no
  ``/events``, no ``/subscriptions`` — committing each batch
  ``--commit-delay-ms`` after accepting it; what a validator behind a proxy or
  a hosted endpoint offers. It records when each batch was first POSTed, so
  the gap between a commit and the next batch of the service is measured on
  one clock, and it judges every POST (a resend of a batch it holds counts).
* ``node``: ``ledgerq node``, whose ``/events`` stream timestamps commits.

For each S, on each ledger, the systems run one after the other, the order
alternating from one S to the next: the *ideal* client (no store: each
service's batches posted in order straight to the ledger, each long-polled;
the bound), ledgerq on SQLite and on PostgreSQL (``ledgerq serve``), and
procrastinate (a job per batch, ``lock=<service id>``, job polling tuned to
20 ms). The failure case (on the node) kills (SIGKILL) one of two worker
processes in each system once a third of the batches are committed.

Definitions of every figure: ``bench/_metrics.py``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from bench import report
from bench._harness import DEFAULT_PG, LedgerReport, Workload, read_keys, workload_keys
from bench._metrics import Figures, figures
from bench._systems import (
    RunProbe,
    Setup,
    ledger_and_watcher,
    run_ideal,
    run_ledgerq,
    run_procrastinate,
)

IMG = report.ROOT / "docs" / "img"
SYSTEMS = ("ideal", "ledgerq-sqlite", "ledgerq-pg", "procrastinate")
#: Not in the full run: ``ledgerq serve --workers 2`` (its default on two cores), to
#: set beside the one-process figures above in one run.
EXTRA_SYSTEMS = ("ledgerq-sqlite-w2", "ledgerq-pg-w2")
LEDGERS = ("plain", "node")
COLORS = {"ideal": "C0", "ledgerq-sqlite": "C1", "ledgerq-pg": "C3", "procrastinate": "C2"}
DEFAULT_SIZES = "50:20,1000:5"


def _parse_sizes(value: str) -> list[tuple[int, int]]:
    out = []
    for part in value.split(","):
        s, _, m = part.partition(":")
        if not (s.isdigit() and m.isdigit() and int(s) > 0 and int(m) > 1):
            raise click.BadParameter(f"{part!r}: expected SERVICES:BATCHES, e.g. 100:40")
        out.append((int(s), int(m)))
    return out


async def _one(
    setup: Setup,
    system: str,
    s: int,
    m: int,
    kill_after: float | None,
    *,
    env: Mapping[str, str] = {},
    probe: RunProbe | None = None,
) -> Figures:
    """One run of ``system``; ``env`` and ``probe`` go to ``ledgerq serve`` (see
    :func:`bench._systems.run_ledgerq`)."""
    workload = Workload(s, m)
    tag = f"{setup.ledger}-{system}-{s}x{m}{'-kill' if kill_after is not None else ''}"
    async with ledger_and_watcher(setup, tag) as (ledger, watcher):
        if system == "ideal":
            run = await run_ideal(setup, workload, watcher, ledger.url)
        elif system.startswith("ledgerq"):
            store, _, w = system.removeprefix("ledgerq-").partition("-w")
            run = await run_ledgerq(
                setup,
                workload,
                watcher,
                ledger.url,
                kill_after,
                store=store,
                processes=int(w or 1),
                env=env,
                probe=probe,
            )
        else:
            run = await run_procrastinate(setup, workload, watcher, ledger.url, kill_after)
        if isinstance(watcher, LedgerReport):
            keys = {svc: watcher.values.get(key) for svc, key in workload_keys(workload)}
            return figures(run, watcher.events, keys, watcher.first_post, len(watcher.violations))
        keys = await read_keys(ledger.url, workload_keys(workload))
        return figures(run, dict(watcher.events), keys)


async def _main(
    setup: Setup,
    sizes: list[tuple[int, int]],
    systems: list[str],
    ledgers: list[str],
    failure: tuple[int, int] | None,
) -> tuple[dict[str, list[Figures]], list[Figures]]:
    results: dict[str, list[Figures]] = {}
    for ledger in ledgers:
        on = Setup(**{**setup.__dict__, "ledger": ledger})
        for n, (s, m) in enumerate(sizes):
            order = systems if n % 2 == 0 else [systems[0], *reversed(systems[1:])]
            for system in order:
                report.console.print(f"[bold]{system}[/] on the {ledger} ledger: {s} × {m}")
                results.setdefault(ledger, []).append(await _one(on, system, s, m, None))
    failures: list[Figures] = []
    if failure is not None:
        two = Setup(**{**setup.__dict__, "workers": 2, "ledger": "node"})
        for system in [x for x in systems if x in ("ledgerq-pg", "procrastinate")]:
            report.console.print(f"[bold]{system}[/]: worker SIGKILLed mid-run")
            failures.append(await _one(two, system, *failure, 1 / 3))
    return results, failures


#: The BENCHMARKS.md section of each ledger's figures, and of the failure case: a
#: run replaces the sections of what it ran, whatever systems and sizes it picked.
SECTION_OF = {"plain": "compare-plain", "node": "compare-node"}
FAILURE_SECTION = "compare-failure"
#: The design's floors on the plain ledger: ledgerq's batches/s ÷ the ideal client's.
PLAIN_FLOORS = {(50, 20): 0.7, (1000, 5): 0.5}
GAP_TARGET_MS = 5.0
GATEWAY_CPU_TARGET_MS = 0.5


def plain_targets(results: list[Figures]) -> list[report.Target]:
    """This run's figures for the page's targets measured on the plain ledger."""
    by_size: dict[tuple[int, int], dict[str, Figures]] = {}
    for f in results:
        by_size.setdefault((f.services, f.per_service), {})[f.system] = f
    out: list[report.Target] = []
    for key, system in (("plain-sqlite", "ledgerq-sqlite"), ("plain-pg", "ledgerq-pg")):
        parts, met = [], True
        for size, floor in PLAIN_FLOORS.items():
            ideal, f = by_size.get(size, {}).get("ideal"), by_size.get(size, {}).get(system)
            if ideal is None or f is None or ideal.throughput <= 0:
                met = False
                continue
            ratio = f.throughput / ideal.throughput
            parts.append(f"{ratio:.2f} × at {size[0]:,} × {size[1]}")
            met = met and ratio >= floor
        if parts:
            out.append(report.Target(key, ", ".join(parts), "yes" if met else "no"))
    small = by_size.get((50, 20), {})
    gaps = [
        f"{name.removeprefix('ledgerq-')} {f.gap_p50_ms:.1f} ms"
        for name in ("ledgerq-sqlite", "ledgerq-pg")
        if (f := small.get(name)) is not None and f.gap_p50_ms is not None
    ]
    if gaps:
        ok = all(
            f.gap_p50_ms is not None and f.gap_p50_ms <= GAP_TARGET_MS
            for name in ("ledgerq-sqlite", "ledgerq-pg")
            if (f := small.get(name)) is not None
        )
        out.append(report.Target("gap", ", ".join(gaps), "yes" if ok else "no"))
    if by_size:
        size = max(by_size)
        cpus = {
            name.removeprefix("ledgerq-"): f.cpu_ms_per_batch
            for name in ("ledgerq-sqlite", "ledgerq-pg")
            if (f := by_size[size].get(name)) is not None and f.cpu_ms_per_batch is not None
        }
        if cpus:
            text = ", ".join(f"{k} {v:.2f} ms" for k, v in cpus.items())
            ok = all(v <= GATEWAY_CPU_TARGET_MS for v in cpus.values())
            out.append(
                report.Target(
                    "gateway-cpu", f"{text} at {size[0]:,} × {size[1]}", "yes" if ok else "no"
                )
            )
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if a > 0 and b > 0 else "-"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _tables(ledger: str, results: list[Figures]) -> tuple[Table, str]:
    headers = [
        "S × M",
        "system",
        "batches/s",
        "× ideal",
        "× procrastinate",
        "gap p50 ms",
        "gap p99 ms",
        "cycle p50 ms",
        "latency p50 ms",
        "latency p99 ms",
        "CPU ms/batch",
        "PostgreSQL CPU ms/batch",
        "INVALID",
        "missing",
        "resent while held",
    ]
    rich = Table(*headers, title=f"the {ledger} ledger")
    rows: list[list[str]] = []
    by_size: dict[tuple[int, int], dict[str, Figures]] = {}
    for f in results:
        by_size.setdefault((f.services, f.per_service), {})[f.system] = f
    for (s, m), systems in by_size.items():
        ideal = systems.get("ideal")
        pc = systems.get("procrastinate")
        for name in (*SYSTEMS, *EXTRA_SYSTEMS):
            f = systems.get(name)
            if f is None:
                continue
            rows.append(
                [
                    f"{s} × {m}",
                    name,
                    f"{f.throughput:,.0f}",
                    _ratio(f.throughput, ideal.throughput) if ideal else "-",
                    _ratio(f.throughput, pc.throughput) if pc and name != "procrastinate" else "-",
                    _ms(f.gap_p50_ms),
                    _ms(f.gap_p99_ms),
                    _ms(f.cycle_p50_ms),
                    _ms(f.latency_p50_ms),
                    _ms(f.latency_p99_ms),
                    "-" if f.cpu_ms_per_batch is None else f"{f.cpu_ms_per_batch:.2f}",
                    "-" if f.db_cpu_ms_per_batch is None else f"{f.db_cpu_ms_per_batch:.2f}",
                    str(f.invalid),
                    str(f.missing),
                    "-" if f.violations is None else str(f.violations),
                ]
            )
    for row in rows:
        rich.add_row(*row)
    return rich, report.table(headers, rows)


def _failure_tables(failures: list[Figures]) -> tuple[Table, str]:
    headers = [
        "system",
        "S × M",
        "keys with work left",
        "blocked p50 s",
        "blocked max s",
        "INVALID",
        "executed twice (node)",
        "keys wrong",
        "missing",
        "job re-runs",
    ]
    rich = Table(*headers, title="one of two workers SIGKILLed at 1/3 of the run")
    rows = []
    for f in failures:
        runs = f.extra.get("job_starts")
        rows.append(
            [
                f.system,
                f"{f.services} × {f.per_service}",
                str(f.blocked_keys),
                f"{f.blocked_p50_s:.2f}",
                f"{f.blocked_max_s:.2f}",
                str(f.invalid),
                str(f.executed_twice),
                str(f.wrong_keys),
                str(f.missing),
                f"{runs - f.services * f.per_service:.0f}" if runs else "-",
            ]
        )
    for row in rows:
        rich.add_row(*row)
    return rich, report.table(headers, rows)


def _plots(ledger: str, results: list[Figures]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    sizes = sorted({(f.services, f.per_service) for f in results})
    if not sizes:
        return []
    fig, axes = plt.subplots(2, len(sizes), figsize=(5 * len(sizes), 8), squeeze=False)
    for col, (s, m) in enumerate(sizes):
        for f in (f for f in results if (f.services, f.per_service) == (s, m)):
            color = COLORS.get(f.system)
            axes[0][col].plot(
                f.commit_times, range(1, len(f.commit_times) + 1), label=f.system, color=color
            )
            lat = sorted(f.latencies_ms)
            axes[1][col].plot(
                lat, [i / len(lat) for i in range(len(lat))], label=f.system, color=color
            )
        axes[0][col].set(title=f"{ledger}: S={s}, M={m}", xlabel="s", ylabel="batches committed")
        axes[1][col].set(xscale="log", xlabel="latency ms (log)", ylabel="fraction")
        axes[0][col].legend()
        axes[1][col].legend()
    fig.tight_layout()
    name = f"compare-{ledger}.png"
    fig.savefig(IMG / name, dpi=90)
    plt.close(fig)
    return [name]


def _failure_plot(failures: list[Figures]) -> list[str]:
    if not failures:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for f in failures:
        ax.plot(
            f.commit_times,
            range(1, len(f.commit_times) + 1),
            label=f.system,
            color=COLORS.get(f.system),
        )
        if f.killed_at is not None:
            ax.axvline(f.killed_at, linestyle=":", color="grey")
    ax.set(title="SIGKILL of one worker (dotted)", xlabel="s", ylabel="batches committed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(IMG / "compare-failure.png", dpi=90)
    plt.close(fig)
    return ["compare-failure.png"]


@click.command("compare")
@click.option(
    "--sizes",
    default=DEFAULT_SIZES,
    show_default=True,
    help="Comma-separated SERVICES:BATCHES_PER_SERVICE runs.",
)
@click.option(
    "--systems",
    default=",".join(SYSTEMS),
    show_default=True,
    help="Which systems to run (ideal = no store: the bound); also "
    + ", ".join(EXTRA_SYSTEMS)
    + " (ledgerq serve --workers 2).",
)
@click.option(
    "--ledgers",
    default=",".join(LEDGERS),
    show_default=True,
    help="plain (Sawtooth REST only, no events) and/or node (ledgerq node).",
)
@click.option(
    "--commit-delay-ms",
    default=20,
    show_default=True,
    help="How long the plain ledger takes to commit a batch it accepted.",
)
@click.option(
    "--slots",
    default=256,
    show_default=True,
    help="Concurrent submissions: ledgerq submitter.slots, procrastinate's worker concurrency.",
)
@click.option(
    "--failure",
    "failure_size",
    default="100:20",
    show_default=True,
    help="SERVICES:BATCHES for the kill-a-worker run (on the node); 'none' to skip it.",
)
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds allowed per run.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
@click.option("--keep-logs", is_flag=True, help="Keep the processes' logs (path printed).")
def command(
    sizes: str,
    systems: str,
    ledgers: str,
    commit_delay_ms: int,
    slots: int,
    failure_size: str,
    pg: str,
    timeout: float,
    write: bool,
    keep_logs: bool,
) -> None:
    """An ideal client, ledgerq and procrastinate: the same ordered workload, on two ledgers."""
    chosen = [x.strip() for x in systems.split(",") if x.strip()]
    unknown = set(chosen) - {*SYSTEMS, *EXTRA_SYSTEMS}
    if unknown:
        raise click.BadParameter(f"unknown systems {sorted(unknown)}", param_hint="--systems")
    on = [x.strip() for x in ledgers.split(",") if x.strip()]
    if set(on) - set(LEDGERS):
        raise click.BadParameter(f"use {' and/or '.join(LEDGERS)}", param_hint="--ledgers")
    failure = None if failure_size == "none" else _parse_sizes(failure_size)[0]
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-compare-"))
    load_before = os.getloadavg()
    setup = Setup(workdir, pg, slots, 1, timeout, commit_delay_ms=commit_delay_ms)
    try:
        results, failures = asyncio.run(_main(setup, _parse_sizes(sizes), chosen, on, failure))
    finally:
        if keep_logs:
            report.console.print(f"logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    console = Console(width=200)
    tables = {}
    for ledger, figs in results.items():
        rich, md = _tables(ledger, figs)
        console.print(rich)
        tables[ledger] = md
    md_fail = ""
    if failures:
        rich_fail, md_fail = _failure_tables(failures)
        console.print(rich_fail)
    if not write:
        return
    text = (
        f"Machine load average (1, 5, 15 min) before: {load_before[0]:.1f}, "
        f"{load_before[1]:.1f}, {load_before[2]:.1f}; after: {load_after[0]:.1f}, "
        f"{load_after[1]:.1f}, {load_after[2]:.1f} (2 cores shared with other work: "
        "compare ratios within one table, measured side by side). Every system runs "
        "against a fresh ledger process; the ledgers, the systems' processes and the "
        "benchmark client share the machine. ledgerq: `submitter.slots` and procrastinate's "
        f"worker concurrency {slots}; procrastinate polls for jobs every 20 ms. "
        "*Gap* = the next batch's first POST reaching the ledger minus the previous batch's "
        "commit, on the ledger's clock (plain ledger only); *CPU ms/batch* = the system's own "
        "processes (gateway; workers; the benchmark process for the ideal client); "
        "*resent while held* = POSTs of a batch the ledger held pending or committed. "
        "Definitions: `bench/_metrics.py`."
    )
    for ledger, md in tables.items():
        label = (
            f"The plain Sawtooth-shaped REST ledger (no `/events`, no `/subscriptions`; "
            f"commits {commit_delay_ms} ms after accepting)."
            if ledger == "plain"
            else "`ledgerq node` (with its `/events` stream)."
        )
        images = [f"![{image}](img/{image})" for image in _plots(ledger, results[ledger])]
        report.write_section(
            SECTION_OF[ledger],
            "\n".join([f"{text} {label}", "", md, "", *images]),
            targets=plain_targets(results[ledger]) if ledger == "plain" else (),
        )
    if md_fail:
        images = [f"![{image}](img/{image})" for image in _failure_plot(failures)]
        report.write_section(
            FAILURE_SECTION,
            "\n".join(
                [
                    "Two worker processes per system on `ledgerq node` (two `ledgerq serve` "
                    "instances; two procrastinate workers with the stalled-job retry of its "
                    "documentation run every second), one SIGKILLed once a third of the "
                    "batches are committed.",
                    "",
                    md_fail,
                    "",
                    *images,
                ]
            ),
        )
