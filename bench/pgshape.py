"""``ledgerq bench pgshape``: what PostgreSQL does for each batch ``ledgerq serve`` commits.

The workload of ``bench compare`` against the plain ledger (S services × M
intkey batches; the fault ledger without faults, committing 20 ms after
accepting), run by ``ledgerq serve`` on PostgreSQL at ``bench compare``'s two
sizes, under the serial strategy and under ``--strategy parallel`` (the same
batches: each declares its service's key, so the parallel queuer sends them
one at a time too, with the lock entries and blockers it keeps). The ideal
client runs the same workload first: its CPU per batch is the unit the
targets are written in.

Each ``ledgerq serve`` run gets a database of its own; ``bench/_pgstats.py``
says what is read around it and when. Everything is divided by the batches
the ledger committed. Needs a server that loads ``pg_stat_statements``
(``shared_preload_libraries``); a server without it is refused at once,
saying so.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import click

from bench import report
from bench._harness import DEFAULT_PG
from bench._pgstats import Shape, ShapeProbe, index_entries, require_pg_stat_statements
from bench._systems import Setup
from bench.compare import DEFAULT_SIZES, _one, _parse_sizes

STRATEGIES = ("serial", "parallel")


# -- running ------------------------------------------------------------------------


async def _measure(
    setup: Setup, sizes: Sequence[tuple[int, int]], strategies: Sequence[str], ideal: bool
) -> list[Shape]:
    shapes = []
    for s, m in sizes:
        unit = None
        if ideal:
            report.console.print(f"[bold]ideal client[/] on the plain ledger: {s} × {m}")
            unit = await _one(setup, "ideal", s, m, None)
        for strategy in strategies:
            report.console.print(
                f"[bold]ledgerq-pg[/], strategy {strategy}, on the plain ledger: {s} × {m}"
            )
            shape = Shape(strategy, s, m)
            probe = ShapeProbe(setup.pg_admin, shape)
            f = await _one(
                setup,
                "ledgerq-pg",
                s,
                m,
                None,
                env={"LEDGERQ_QUEUER_STRATEGY": strategy},
                probe=probe,
            )
            if f.committed != s * m or f.invalid or f.missing:
                raise click.ClickException(
                    f"{shape.label}: {f.committed} committed, {f.invalid} INVALID, "
                    f"{f.missing} missing of {s * m}: the run is not one to measure"
                )
            shape.committed = f.committed
            shape.throughput = f.throughput
            shape.gateway_cpu_s = (f.cpu_ms_per_batch or 0.0) * f.committed / 1000
            if unit is not None:
                shape.ideal_throughput = unit.throughput
                shape.ideal_cpu_ms = unit.cpu_ms_per_batch
            report.console.print(_summary_line(shape))
            shapes.append(shape)
    return shapes


def _summary_line(shape: Shape) -> str:
    pb = shape.per_batch
    return (
        f"  {shape.committed} committed, {shape.throughput:,.0f} batches/s; per batch: "
        f"gateway CPU {pb(shape.gateway_cpu_s) * 1000:.2f} ms, PostgreSQL sessions "
        f"{pb(shape.backends_cpu_s) * 1000:.2f} ms, {pb(shape.commits):.2f} transactions, "
        f"{pb(sum(s.calls for s in shape.top_level())):.1f} statements, "
        f"{pb(shape.rows_written()):.1f} rows and ≤ {pb(shape.index_entries()):.1f} index "
        f"entries written, {pb(shape.server_wal.bytes):,.0f} WAL bytes"
    )


# -- writing it down ----------------------------------------------------------------

PG_CPU_TARGET_MS = 0.3  # the server's CPU (sessions and background) per committed batch


def target(shapes: Sequence[Shape]) -> report.Target:
    """The page's target on the server's CPU per batch: serial runs, each size."""
    parts, met = [], True
    for sh in shapes:
        if sh.strategy != "serial" or not sh.committed:
            continue
        ms = sh.per_batch(sh.backends_cpu_s + sh.background_cpu_s) * 1000
        parts.append(f"{ms:.2f} ms at {sh.services:,} × {sh.per_service}")
        met = met and ms <= PG_CPU_TARGET_MS
    return report.Target(
        "pg-cpu", ", ".join(parts) or "no serial run", "yes" if parts and met else "no"
    )


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _times(value_ms: float, unit_ms: float | None) -> str:
    """``value_ms``, and its ratio to the ideal client's ``unit_ms`` when known."""
    if unit_ms is None or unit_ms <= 0:
        return _f(value_ms)
    return f"{_f(value_ms)} ({value_ms / unit_ms:.1f} ×)"


def summary_table(shapes: Sequence[Shape]) -> str:
    headers = [
        "strategy, S × M",
        "batches/s (× ideal)",
        "ideal client CPU ms",
        "gateway CPU ms (× ideal)",
        "PostgreSQL sessions CPU ms (× ideal)",
        "PostgreSQL background CPU ms",
        "transactions",
        "statements (top-level)",
        "nested statements",
        "rows written",
        "index entries (≤)",
        "WAL records / bytes (statements)",
        "WAL records / full pages / bytes (server)",
    ]
    rows = []
    for sh in shapes:
        pb = sh.per_batch
        top = sh.top_level()
        ratio = f" ({sh.throughput / sh.ideal_throughput:.2f} ×)" if sh.ideal_throughput else ""
        rows.append(
            [
                sh.label,
                f"{sh.throughput:,.0f}{ratio}",
                _f(sh.ideal_cpu_ms),
                _times(pb(sh.gateway_cpu_s) * 1000, sh.ideal_cpu_ms),
                _times(pb(sh.backends_cpu_s) * 1000, sh.ideal_cpu_ms),
                _f(pb(sh.background_cpu_s) * 1000),
                _f(pb(sh.commits)),
                _f(pb(sum(s.calls for s in top)), 1),
                _f(pb(sum(s.calls for s in sh.nested())), 1),
                _f(pb(sh.rows_written()), 1),
                _f(pb(sh.index_entries()), 1),
                f"{pb(sum(s.wal_records for s in top)):.1f} / "
                f"{pb(sum(s.wal_bytes for s in top)):,.0f}",
                f"{pb(sh.server_wal.records):.1f} / {pb(sh.server_wal.fpi):.2f} / "
                f"{pb(sh.server_wal.bytes):,.0f}",
            ]
        )
    return report.table(headers, rows)


def gateway_table(shapes: Sequence[Shape]) -> str:
    """The gateway's own counters per committed batch, one column per run."""
    names = sorted({name for sh in shapes for name in sh.gateway})
    rows = [
        [f"`{name}`", *(_f(sh.per_batch(sh.gateway.get(name, 0.0))) for sh in shapes)]
        for name in names
    ]
    return report.table(["counter", *(sh.label for sh in shapes)], rows)


def statements_table(shape: Shape, top: int) -> str:
    headers = [
        "statement",
        "level",
        "calls",
        "rows",
        "time µs",
        "WAL bytes",
        "total ms (run)",
        "mean ms",
    ]
    pb = shape.per_batch
    shown = shape.statements[:top]
    rest = shape.statements[top:]
    rows = [
        [
            f"`{s.name}`",
            "top" if s.toplevel else "nested",
            _f(pb(s.calls)),
            _f(pb(s.rows)),
            _f(pb(s.total_ms) * 1000, 0),
            _f(pb(s.wal_bytes), 0),
            _f(s.total_ms, 1),
            _f(s.total_ms / s.calls, 3) if s.calls else "-",
        ]
        for s in shown
    ]
    if rest:
        rest_top = [s for s in rest if s.toplevel]
        rows.append(
            [
                f"{len(rest)} others ({len(rest_top)} top-level)",
                "",
                _f(pb(sum(s.calls for s in rest_top))),
                _f(pb(sum(s.rows for s in rest_top))),
                _f(pb(sum(s.total_ms for s in rest_top)) * 1000, 0),
                _f(pb(sum(s.wal_bytes for s in rest_top)), 0),
                _f(sum(s.total_ms for s in rest_top), 1),
                "",
            ]
        )
    return report.table(headers, rows)


def tables_table(shape: Shape) -> str:
    headers = [
        "table",
        "inserted",
        "updated",
        "of which HOT",
        "deleted",
        "seq scans",
        "index scans",
    ]
    pb = shape.per_batch
    rows = [
        [
            f"`{t.name}`",
            _f(pb(t.inserted)),
            _f(pb(t.updated)),
            _f(pb(t.hot)),
            _f(pb(t.deleted)),
            _f(pb(t.seq_scans)),
            _f(pb(t.idx_scans)),
        ]
        for t in shape.tables
        if t.inserted or t.updated or t.deleted or t.seq_scans or t.idx_scans
    ]
    return report.table(headers, rows)


def indexes_table(shape: Shape) -> str:
    headers = ["index", "entries written", "scans per batch", "scans in the run", "bytes"]
    pb = shape.per_batch
    by_table = {t.name: t for t in shape.tables}
    rows = []
    for i in shape.indexes:
        t = by_table.get(i.table)
        if t is None or not (t.inserted or t.updated or i.scans):
            continue
        entries = _f(pb(index_entries(t)))
        rows.append(
            [
                f"`{i.table}.{i.name}`",
                f"≤ {entries} (partial)" if i.partial else entries,
                _f(pb(i.scans)),
                "**never read**" if i.scans == 0 else f"{i.scans:,}",
                _f(pb(i.size_bytes), 0),
            ]
        )
    return report.table(headers, rows)


def functions_table(shape: Shape) -> str:
    headers = ["function (trigger)", "calls", "total µs", "self µs", "total ms (run)"]
    pb = shape.per_batch
    rows = [
        [
            f"`{f.name}`",
            _f(pb(f.calls)),
            _f(pb(f.total_ms) * 1000, 0),
            _f(pb(f.self_ms) * 1000, 0),
            _f(f.total_ms, 1),
        ]
        for f in shape.functions
    ]
    return report.table(headers, rows)


def markdown(shapes: Sequence[Shape], top: int, note: str, details: bool = True) -> str:
    """The figures as Markdown: the setup and the summary per committed batch;
    ``details``: the definitions, the gateway's counters and each run's statements,
    tables, indexes and functions too (a few hundred lines)."""
    parts = [f"{note} **Summary, per committed batch:**", "", summary_table(shapes)]
    if not details:
        return "\n".join(parts)
    parts += [
        "",
        "Every figure is **per committed batch** (counts divided by the batches the "
        "ledger committed), except *total ms (run)* and *scans in the run*. CPU: the "
        "database's sessions and the server's background processes (WAL writer, "
        "checkpointer, autovacuum of this database) from `/proc` between the first POST "
        "and the last commit, the gateway's processes likewise, the ideal client's own "
        "process (its run just before, same size). *transactions*: `xact_commit` "
        "(`pg_stat_database`). Statements: `pg_stat_statements` with `track = all`: "
        "*top* statements are the gateway's (the time of a top statement includes its "
        "nested ones), *nested* ones run inside functions and triggers; named by the query "
        "they were prepared from (`queries.sql`, `claims.sql`), a nested one by the function "
        "whose body holds it (`schema.sql`), else by their text. The gateway's start-up "
        "(migrations, first claims) is not counted: the statistics are reset once it has "
        "listened for a few seconds, and read once its sessions ended. "
        "*Index entries*: one per row inserted and per non-HOT update of its table; "
        "for a partial index an upper bound. *bytes* of an index: its size after the run "
        "(the database was created for the run). WAL *(statements)*: what the statements "
        "wrote (`pg_stat_statements`, without commit records); *(server)*: `pg_stat_wal` "
        "over the run, the whole server (other databases' work included); *full pages*: "
        "page images, the first change of a page after a checkpoint. Uniqueness checks of "
        "inserts do not count as index scans: an index *never read* may still enforce a "
        "unique key.",
        "",
        "**The gateway's own counters** (its `/metrics`, when the last batch was final), "
        "per committed batch: what its writes answer to",
        "",
        gateway_table(shapes),
    ]
    for sh in shapes:
        parts += [
            "",
            f"**{sh.label}**: statements (top {top} by time)",
            "",
            statements_table(sh, top),
            "",
            f"**{sh.label}**: tables",
            "",
            tables_table(sh),
            "",
            f"**{sh.label}**: indexes",
            "",
            indexes_table(sh),
            "",
            f"**{sh.label}**: functions and triggers (`track_functions = all`)",
            "",
            functions_table(sh),
        ]
    return "\n".join(parts)


def _parse_strategies(value: str) -> list[str]:
    chosen = [x.strip() for x in value.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in STRATEGIES]
    if unknown or not chosen:
        raise click.BadParameter(
            f"{value!r}: expected one or more of {', '.join(STRATEGIES)}",
            param_hint="--strategies",
        )
    return chosen


@click.command("pgshape")
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True, help="SERVICES:BATCHES runs.")
@click.option(
    "--strategies",
    default=",".join(STRATEGIES),
    show_default=True,
    help="serial and/or parallel (the same serial workload, lock entries kept).",
)
@click.option("--ideal/--no-ideal", default=True, help="Run the ideal client first (the unit).")
@click.option("--top", default=20, show_default=True, help="Statements listed per run.")
@click.option(
    "--details/--no-details",
    default=False,
    show_default=True,
    help="Write the definitions, the gateway's counters and each run's statements, tables, "
    "indexes and functions to BENCHMARKS.md too (they are always printed).",
)
@click.option("--commit-delay-ms", default=20, show_default=True, help="The ledger's commit time.")
@click.option("--slots", default=256, show_default=True, help="ledgerq submitter.slots.")
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds allowed per run.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(
    sizes: str,
    strategies: str,
    ideal: bool,
    top: int,
    details: bool,
    commit_delay_ms: int,
    slots: int,
    pg: str,
    timeout: float,
    write: bool,
) -> None:
    """What PostgreSQL does per batch ledgerq serve commits: statements, rows, WAL, CPU."""
    chosen = _parse_strategies(strategies)
    parsed = _parse_sizes(sizes)
    require_pg_stat_statements(pg)
    workdir = Path(tempfile.mkdtemp(prefix="ledgerq-pgshape-"))
    load_before = os.getloadavg()
    setup = Setup(workdir, pg, slots, 1, timeout, ledger="plain", commit_delay_ms=commit_delay_ms)
    try:
        shapes = asyncio.run(_measure(setup, parsed, chosen, ideal))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    note = (
        "`ledgerq serve` on PostgreSQL against the plain ledger (the fault ledger without "
        f"faults, commits {commit_delay_ms} ms after accepting), `bench compare`'s workload "
        f"(intkey, `set` then `inc`s of one key per service), `submitter.slots` {slots}, a "
        "database created for each run. Load average (1, 5, 15 min) before: "
        + ", ".join(f"{x:.1f}" for x in load_before)
        + "; after: "
        + ", ".join(f"{x:.1f}" for x in load_after)
        + " (2 cores shared with other work)."
    )
    full = markdown(shapes, top, note)
    click.echo(full)
    if write:
        text = full if details else markdown(shapes, top, note, details=False)
        report.write_section("pgshape", text, targets=[target(shapes)])
