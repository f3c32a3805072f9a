"""``ledgerq bench compare``: the same ordered workload run by ledgerq and by procrastinate.

S services × M intkey batches (``set`` then ``inc``s: a reorder shows up as
INVALID), every batch POSTed to ``ledgerq node`` (its own process, loopback)
and done only when the node reports it COMMITTED. For each S the bare client
(no queue: the node's floor), ledgerq (``ledgerq serve`` on PostgreSQL) and
procrastinate (a job per batch, ``lock=<service id>``, on the same PostgreSQL
server in another database) run one after the other, the order alternating
from one S to the next. The failure case kills (SIGKILL) one of two worker
processes in each system once a third of the batches are committed.

Definitions of every figure: ``bench/_metrics.py``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from bench import report
from bench._harness import DEFAULT_PG, Workload, read_keys, workload_keys
from bench._metrics import Figures, figures
from bench._systems import Setup, node_and_watcher, run_bare, run_ledgerq, run_procrastinate

IMG = report.ROOT / "docs" / "img"
COLORS = {"bare": "C0", "ledgerq": "C1", "procrastinate": "C2"}
DEFAULT_SIZES = "10:100,100:20,1000:3"


def _parse_sizes(value: str) -> list[tuple[int, int]]:
    out = []
    for part in value.split(","):
        s, _, m = part.partition(":")
        if not (s.isdigit() and m.isdigit() and int(s) > 0 and int(m) > 1):
            raise click.BadParameter(f"{part!r}: expected SERVICES:BATCHES, e.g. 100:40")
        out.append((int(s), int(m)))
    return out


async def _one(setup: Setup, system: str, s: int, m: int, kill_after: float | None) -> Figures:
    workload = Workload(s, m)
    tag = f"{system}-{s}x{m}{'-kill' if kill_after is not None else ''}"
    async with node_and_watcher(setup, tag) as (node, watcher):
        if system == "bare":
            run = await run_bare(setup, workload, watcher, node.url)
        elif system == "ledgerq":
            run = await run_ledgerq(setup, workload, watcher, node.url, kill_after)
        else:
            run = await run_procrastinate(setup, workload, watcher, node.url, kill_after)
        keys = await read_keys(node.url, workload_keys(workload))
        return figures(run, dict(watcher.events), keys)


async def _main(
    setup: Setup, sizes: list[tuple[int, int]], systems: list[str], failure: tuple[int, int] | None
) -> tuple[list[Figures], list[Figures]]:
    results: list[Figures] = []
    for n, (s, m) in enumerate(sizes):
        order = systems if n % 2 == 0 else [systems[0], *reversed(systems[1:])]
        for system in order:
            report.console.print(f"[bold]{system}[/]: {s} services × {m} batches")
            results.append(await _one(setup, system, s, m, None))
    failures: list[Figures] = []
    if failure is not None:
        two = Setup(setup.workdir, setup.pg_admin, setup.slots, 2, setup.timeout_s)
        for system in [x for x in systems if x != "bare"]:
            report.console.print(f"[bold]{system}[/]: worker SIGKILLed mid-run")
            failures.append(await _one(two, system, *failure, 1 / 3))
    return results, failures


def _ratio(a: float, b: float) -> str:
    # An overhead at or below zero (slot contention dominates the bare client) has no ratio.
    return f"{a / b:.2f}" if a > 0 and b > 0 else "-"


def _tables(results: list[Figures]) -> tuple[Table, str]:
    headers = [
        "S × M",
        "system",
        "batches/s",
        "p50 ms",
        "p99 ms",
        "cycle p50 ms",
        "cycle overhead ms",
        "INVALID",
        "missing",
    ]
    rich = Table(*headers, title="ledgerq vs procrastinate (same node, same PostgreSQL)")
    rows: list[list[str]] = []
    by_size: dict[tuple[int, int], dict[str, Figures]] = {}
    for f in results:
        by_size.setdefault((f.services, f.per_service), {})[f.system] = f
    for (s, m), systems in by_size.items():
        bare = systems.get("bare")
        for name, f in systems.items():
            overhead = f.cycle_p50_ms - bare.cycle_p50_ms if bare else float("nan")
            rows.append(
                [
                    f"{s} × {m}",
                    name,
                    f"{f.throughput:,.0f}",
                    f"{f.latency_p50_ms:.1f}",
                    f"{f.latency_p99_ms:.1f}",
                    f"{f.cycle_p50_ms:.1f}",
                    f"{overhead:.1f}" if name != "bare" else "-",
                    str(f.invalid),
                    str(f.missing),
                ]
            )
        lq, pc = systems.get("ledgerq"), systems.get("procrastinate")
        if lq and pc:
            ovh_lq = lq.cycle_p50_ms - bare.cycle_p50_ms if bare else lq.cycle_p50_ms
            ovh_pc = pc.cycle_p50_ms - bare.cycle_p50_ms if bare else pc.cycle_p50_ms
            rows.append(
                [
                    f"{s} × {m}",
                    "**ledgerq / procrastinate**",
                    _ratio(lq.throughput, pc.throughput),
                    _ratio(lq.latency_p50_ms, pc.latency_p50_ms),
                    _ratio(lq.latency_p99_ms, pc.latency_p99_ms),
                    _ratio(lq.cycle_p50_ms, pc.cycle_p50_ms),
                    _ratio(ovh_lq, ovh_pc),
                    "",
                    "",
                ]
            )
    for row in rows:
        rich.add_row(*(c.replace("**", "") for c in row))
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


def _plots(results: list[Figures], failures: list[Figures]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    written = []
    sizes = sorted({(f.services, f.per_service) for f in results})
    if sizes:
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
            axes[0][col].set(title=f"S={s}, M={m}", xlabel="s", ylabel="batches committed")
            axes[1][col].set(xscale="log", xlabel="latency ms (log)", ylabel="fraction")
            axes[0][col].legend()
            axes[1][col].legend()
        fig.tight_layout()
        fig.savefig(IMG / "compare.png", dpi=90)
        plt.close(fig)
        written.append("compare.png")
    if failures:
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
        written.append("compare-failure.png")
    return written


@click.command("compare")
@click.option(
    "--sizes",
    default=DEFAULT_SIZES,
    show_default=True,
    help="Comma-separated SERVICES:BATCHES_PER_SERVICE runs.",
)
@click.option(
    "--systems",
    default="bare,ledgerq,procrastinate",
    show_default=True,
    help="Which systems to run (bare = no queue, the node's floor).",
)
@click.option("--slots", default=64, show_default=True, help="Concurrent submissions per system.")
@click.option(
    "--failure",
    "failure_size",
    default="100:20",
    show_default=True,
    help="SERVICES:BATCHES for the kill-a-worker run; 'none' to skip it.",
)
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds allowed per run.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
@click.option("--keep-logs", is_flag=True, help="Keep the processes' logs (path printed).")
def command(
    sizes: str,
    systems: str,
    slots: int,
    failure_size: str,
    pg: str,
    timeout: float,
    write: bool,
    keep_logs: bool,
) -> None:
    """ledgerq vs procrastinate: the same ordered workload, committed on `ledgerq node`."""
    chosen = [x.strip() for x in systems.split(",") if x.strip()]
    unknown = set(chosen) - {"bare", "ledgerq", "procrastinate"}
    if unknown:
        raise click.BadParameter(f"unknown systems {sorted(unknown)}", param_hint="--systems")
    failure = None if failure_size == "none" else _parse_sizes(failure_size)[0]
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-compare-"))
    load_before = os.getloadavg()[0]
    setup = Setup(workdir, pg, slots, 1, timeout)
    try:
        results, failures = asyncio.run(_main(setup, _parse_sizes(sizes), chosen, failure))
    finally:
        if keep_logs:
            report.console.print(f"logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    console = Console(width=160)
    rich_main, md_main = _tables(results)
    console.print(rich_main)
    md_fail = ""
    if failures:
        rich_fail, md_fail = _failure_tables(failures)
        console.print(rich_fail)
    if not write:
        return
    images = _plots(results, failures)
    text = [
        f"{slots} concurrent submissions per system (ledgerq `submitter.slots`, procrastinate "
        "worker `concurrency`); a fresh `ledgerq node` process and database per run; "
        "definitions in `bench/_metrics.py`. Cycle overhead = system's median cycle minus the "
        "bare client's at the same S. Machine load average (1 min) before/after: "
        f"{load_before:.1f}/{os.getloadavg()[0]:.1f}.",
        "",
        md_main,
    ]
    if md_fail:
        text += [
            "",
            "Failure case: two worker processes per system (two `ledgerq serve` instances; two "
            "procrastinate workers with the stalled-job retry of its documentation run every "
            "second), one SIGKILLed once a third of the batches are committed.",
            "",
            md_fail,
        ]
        if any(f.extra.get("single_instance_restart") for f in failures):
            text += [
                "",
                "ledgerq ran one instance here (its instances reported no high availability), "
                "SIGKILLed and restarted 1 s later.",
            ]
    text += ["", *(f"![{name}](img/{name})" for name in images)]
    report.write_section("compare", "\n".join(text))
