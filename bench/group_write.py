"""The pipeline's store writes on their own: group writes on PostgreSQL, per batch.

A database created for the run (dropped after) gets ``--services`` ×
``--batches`` batches (one transaction each; ``--access unknown``: the
transactions declare no inputs or outputs, so each batch holds the next one
of its service, as the plain benchmarks' batches do; ``--access keyed``: each
declares one of 8 addresses of its service). Then every service, all at once,
walks its batches in order as the gateway does with each: the woken round
(``queue_round`` for the service, narrow), *taken*
(``change_batch_to_submitted``), *accepted* (``Pending``) and *final*
(``Committed`` with a receipt), the three writes through one
:class:`~ledgerq.record.completer.Completer` with ``--flushers``, as the
gateway groups them. No ledger and no HTTP: what is measured is the store.

Reported per run: batches/s, this process's CPU per batch, the CPU per
batch of the PostgreSQL sessions serving it (from ``/proc``: the server must
run on this machine), the final write's p50, and the writes per group.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from pathlib import Path

import click
import psycopg

from bench import report
from bench.store import DEFAULT_PG, _pg_database
from ledgerq.model import (
    BatchWrite,
    Committed,
    Pending,
    TrackingBatch,
    TrackingTransaction,
    TransactionReceipt,
    ValidTransaction,
)
from ledgerq.record.completer import Completer
from ledgerq.store import open_store


def _batches(run: str, services: int, per_service: int, keyed: bool) -> list[TrackingBatch]:
    out = []
    for s in range(services):
        sid = f"svc{s:05d}"
        for i in range(per_service):
            bid = f"{run}{s:05d}{i:06d}".ljust(128, "b")
            tid = f"{run}{s:05d}{i:06d}".ljust(128, "c")
            address = ("1cf126" + f"{s:05d}{i % 8:02d}").ljust(70, "0")
            out.append(
                TrackingBatch(
                    service_id=sid,
                    batch_header=bid,
                    data_change_id=None,
                    signer_public_key="02" + "ab" * 32,
                    trace=False,
                    serialized_batch=os.urandom(600),
                    transactions=(
                        TrackingTransaction(
                            family_name="intkey",
                            family_version="1.0",
                            transaction_header=tid,
                            payload=os.urandom(100),
                            signer_public_key="03" + "cd" * 32,
                            service_id=sid,
                            inputs=(address,) if keyed else None,
                            outputs=(address,) if keyed else None,
                        ),
                    ),
                )
            )
    return out


def _server_cpu_s(url: str) -> float:
    """CPU seconds of the server processes of this database's sessions."""
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            int(r[0])
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def _cycle(
    url: str, services: int, per_service: int, keyed: bool, flushers: int, lock_entries: bool
) -> tuple[float, float, float, float, float]:
    store = await open_store(url, pg_pool_max_size=8, lock_entries=lock_entries)
    try:
        data = _batches(uuid.uuid4().hex[:8], services, per_service, keyed)
        for i in range(0, len(data), 500):
            await store.add_batches(data[i : i + 500])
        writer = Completer(store, flushers=flushers)
        by_service: dict[str, list[TrackingBatch]] = {}
        for b in data:
            by_service.setdefault(b.service_id, []).append(b)
        final_s: list[float] = []

        async def walk(sid: str, batches: list[TrackingBatch]) -> None:
            for b in batches:
                now = int(time.time() * 1000)
                await store.queue_round(now=now, delay_window_ms=300, services=[sid], narrow=True)
                tid = b.transactions[0].transaction_header
                await writer.apply(BatchWrite(sid, b.batch_header, attempt=True))
                await writer.apply(BatchWrite(sid, b.batch_header, Pending()))
                start = time.perf_counter()
                await writer.apply(
                    BatchWrite(
                        sid,
                        b.batch_header,
                        Committed((ValidTransaction(tid),)),
                        (TransactionReceipt(tid, True, serialized_receipt=b"receipt"),),
                    )
                )
                final_s.append(time.perf_counter() - start)

        server_before = _server_cpu_s(url)
        cpu_before, start = time.process_time(), time.perf_counter()
        groups_before, writes_before = writer.groups, writer.writes
        await asyncio.gather(*(walk(s, bs) for s, bs in by_service.items()))
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_before
        server = _server_cpu_s(url) - server_before
        counts = await store.status_counts()
        if counts.get("Committed") != len(data):
            raise click.ClickException(f"not every batch committed: {counts}")
        per_group = (writer.writes - writes_before) / max(1, writer.groups - groups_before)
        n = len(data)
        return (
            n / seconds,
            cpu / n * 1000,
            server / n * 1000,
            statistics.median(final_s) * 1000,
            per_group,
        )
    finally:
        await store.close()


@click.command("group_write")
@click.option("--services", default=50, show_default=True)
@click.option("--batches", default=20, show_default=True, help="Batches per service.")
@click.option(
    "--access",
    type=click.Choice(["unknown", "keyed"]),
    default="unknown",
    show_default=True,
    help="unknown: no declared inputs/outputs (each batch holds the next); keyed: 8 addresses.",
)
@click.option("--flushers", default=2, show_default=True, help="Groups committing at once.")
@click.option(
    "--lock-entries/--no-lock-entries",
    default=False,
    show_default=True,
    help="Keep the parallel queuer's lock entries and blockers (a gateway does when some "
    "service may be parallel); without, as a gateway whose services are all serial.",
)
@click.option("--rounds", default=3, show_default=True, help="Runs, each in a fresh database.")
@click.option("--pg-url", default=DEFAULT_PG, show_default=True, help="Admin URL.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(
    services: int,
    batches: int,
    access: str,
    flushers: int,
    lock_entries: bool,
    rounds: int,
    pg_url: str,
    write: bool,
) -> None:
    """Store-level pipeline cycle on PostgreSQL: round, taken, accepted, final, grouped."""
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for r in range(rounds):
        with _pg_database(pg_url) as url:
            rate, cpu, server, final_ms, per_group = asyncio.run(
                _cycle(url, services, batches, access == "keyed", flushers, lock_entries)
            )
        rows.append(
            (
                str(r + 1),
                f"{rate:,.0f}",
                f"{cpu:.2f}",
                f"{server:.2f}",
                f"{final_ms:.1f}",
                f"{per_group:.1f}",
            )
        )
        report.console.print(
            f"run {r + 1}: {rate:,.0f} batches/s, client CPU {cpu:.2f} ms/batch, "
            f"PostgreSQL CPU {server:.2f} ms/batch, final write p50 {final_ms:.1f} ms, "
            f"{per_group:.1f} writes per group"
        )
    load_after = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    markdown = (
        f"{services} services × {batches} batches, access {access}, "
        f"`Completer(flushers={flushers})`, lock entries "
        f"{'kept' if lock_entries else 'not kept (every service serial)'}, "
        f"{rounds} runs each in a fresh database. "
        f"Load average (1, 5, 15 min) before: {load_before}; after: {load_after}.\n\n"
        + report.table(
            [
                "run",
                "batches/s",
                "client CPU ms/batch",
                "PostgreSQL CPU ms/batch",
                "final write p50 ms",
                "writes per group",
            ],
            rows,
        )
    )
    click.echo(markdown)
    if write:
        report.write_section("group-write", markdown)
