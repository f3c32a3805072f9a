"""Store throughput: ``add_batches`` and status updates, in batches per second.

For each backend (SQLite file in WAL mode, with the default
``synchronous=FULL`` and with ``?synchronous=normal``; PostgreSQL in a
database created for the run and dropped after) and each
batch size (~1 KiB and ~10 KiB serialized, one transaction each), batches are
added in chunks of ``--chunks`` batches per ``add_batches`` call, one call at
a time; then every added batch of one case goes through the submitter's and
monitor's writes: ``change_batch_to_submitted`` and
``update_batch_status(Committed, receipts)``, from ``--writers`` concurrent
tasks. Batches (random, incompressible bytes, like signed data) are built
before the clock starts: the figures are the store's, not the test data's.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import click
import psycopg

from bench import report
from ledgerq.model import (
    Committed,
    TrackingBatch,
    TrackingTransaction,
    TransactionReceipt,
    ValidTransaction,
)
from ledgerq.store import BatchTrackingStore, open_store

DEFAULT_PG = os.environ.get(
    "LEDGERQ_BENCH_PG",
    os.environ.get("LEDGERQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
)
SERVICES = 100


def _batches(run: str, count: int, size: int) -> list[TrackingBatch]:
    """Batches of incompressible bytes, like signed batches."""
    overhead = 200  # headers and signatures around the payload in a real batch
    out = []
    for i in range(count):
        payload = os.urandom(max(1, size - overhead))
        bid = f"{run}{i:010x}".ljust(128, "b")
        tid = f"{run}{i:010x}".ljust(128, "t")
        sid = f"bench::{i % SERVICES:04d}"
        out.append(
            TrackingBatch(
                service_id=sid,
                batch_header=bid,
                data_change_id=None,
                signer_public_key="02" + "ab" * 32,
                trace=False,
                serialized_batch=os.urandom(overhead) + payload,
                transactions=(
                    TrackingTransaction(
                        family_name="intkey",
                        family_version="1.0",
                        transaction_header=tid,
                        payload=payload,
                        signer_public_key="03" + "cd" * 32,
                        service_id=sid,
                    ),
                ),
            )
        )
    return out


@contextmanager
def _pg_database(admin_url: str) -> Iterator[str]:
    name = f"ledgerq_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


async def _add(
    store: BatchTrackingStore, batches: list[TrackingBatch], chunk: int, bar: object, task: int
) -> float:
    start = time.perf_counter()
    for i in range(0, len(batches), chunk):
        await store.add_batches(batches[i : i + chunk])
        bar.advance(task, min(chunk, len(batches) - i))  # type: ignore[attr-defined]
    return len(batches) / (time.perf_counter() - start)


async def _updates(
    store: BatchTrackingStore, batches: list[TrackingBatch], writers: int, bar: object, task: int
) -> float:
    queue = list(reversed(batches))

    async def writer() -> None:
        while queue:
            b = queue.pop()
            tid = b.transactions[0].transaction_header
            await store.change_batch_to_submitted(b.batch_header, b.service_id)
            await store.update_batch_status(
                b.batch_header,
                b.service_id,
                Committed((ValidTransaction(tid),)),
                [TransactionReceipt(tid, True, serialized_receipt=b"receipt")],
            )
            bar.advance(task)  # type: ignore[attr-defined]

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return len(batches) / (time.perf_counter() - start)


def _rounds(items: list[TrackingBatch], rounds: int) -> list[list[TrackingBatch]]:
    """``rounds`` consecutive parts of ``items``; the last takes the remainder."""
    size = max(1, len(items) // max(1, rounds))
    parts = [items[i : i + size] for i in range(0, len(items), size)]
    if len(parts) > rounds:
        parts[rounds - 1 :] = [[b for part in parts[rounds - 1 :] for b in part]]
    return parts


async def _run_backend(
    name: str,
    url: str,
    batches: int,
    chunks: list[int],
    sizes: list[int],
    updates: int,
    writers: int,
    rounds: int,
) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    store = await open_store(url, pg_pool_max_size=max(2, writers))
    try:
        with report.progress() as bar:
            for size in sizes:
                for chunk in chunks:
                    run = uuid.uuid4().hex[:8]
                    data = _batches(run, batches, size)
                    label = f"{name} {size // 1024} KiB x{chunk}"
                    task = bar.add_task(f"add {label}", total=len(data))
                    add_rate = max(
                        [
                            await _add(store, part, chunk, bar, task)
                            for part in _rounds(data, rounds)
                        ]
                    )
                    sample = data[: min(updates, len(data))]
                    task = bar.add_task(f"update {label}", total=len(sample))
                    upd_rate = max(
                        [
                            await _updates(store, part, writers, bar, task)
                            for part in _rounds(sample, rounds)
                        ]
                    )
                    rows.append(
                        (
                            name,
                            f"{size // 1024} KiB",
                            chunk,
                            f"{add_rate:,.0f}",
                            f"{upd_rate:,.0f}",
                        )
                    )
            counts = await store.status_counts()
            rows.append((name, "rows at the end", "", f"{sum(counts.values()):,}", ""))
    finally:
        await store.close()
    return rows


@click.command("store")
@click.option(
    "--backend",
    "backends",
    type=click.Choice(["sqlite", "sqlite-normal", "postgresql"]),
    multiple=True,
    default=["sqlite", "sqlite-normal", "postgresql"],
    show_default=True,
)
@click.option("--batches", default=10_000, show_default=True, help="Batches added per case.")
@click.option("--chunk", "chunks", multiple=True, type=int, default=[100, 1000], show_default=True)
@click.option("--size", "sizes", multiple=True, type=int, default=[1024, 10240], show_default=True)
@click.option("--updates", default=2_000, show_default=True, help="Batches updated per case.")
@click.option("--writers", default=4, show_default=True, help="Concurrent updating tasks.")
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    help="Each case in this many parts; the fastest counts.",
)
@click.option(
    "--pg-url", default=DEFAULT_PG, show_default=True, help="Admin URL (a database is created)."
)
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(
    backends: tuple[str, ...],
    batches: int,
    chunks: tuple[int, ...],
    sizes: tuple[int, ...],
    updates: int,
    writers: int,
    rounds: int,
    pg_url: str,
    write: bool,
) -> None:
    """add_batches and status-update throughput of the store on SQLite and PostgreSQL."""

    rows: list[tuple[object, ...]] = []
    for backend in backends:
        if backend.startswith("sqlite"):
            normal = backend == "sqlite-normal"
            with tempfile.TemporaryDirectory() as tmp:
                url = f"sqlite:///{Path(tmp) / 'bench.sqlite3'}"
                url += "?synchronous=normal" if normal else ""
                name = "SQLite (synchronous=normal)" if normal else "SQLite"
                rows += asyncio.run(
                    _run_backend(name, url, batches, list(chunks), list(sizes), updates, 1, rounds)
                )
        else:
            with _pg_database(pg_url) as url:
                rows += asyncio.run(
                    _run_backend(
                        "PostgreSQL",
                        url,
                        batches,
                        list(chunks),
                        list(sizes),
                        updates,
                        writers,
                        rounds,
                    )
                )
    markdown = (
        "Batches/s, `add_batches` / updates, per batch size × chunk. "
        f"{batches:,} batches per case over {SERVICES} services, one transaction each, added "
        "by one caller in chunks of *chunk* batches per `add_batches` call; then "
        f"{updates:,} of them each get `change_batch_to_submitted` and "
        "`update_batch_status(Committed, receipts)` (two transactions per batch) from "
        f"{writers} concurrent tasks on PostgreSQL, one on SQLite (one connection). "
        f"Each case runs in {rounds} consecutive parts and the fastest part counts (the "
        "machine is shared; slower parts measure the neighbours). "
        "Cases run one after the other in one database, so later cases insert into "
        "bigger tables. Payloads are random bytes (signed data does not compress). "
        "SQLite: WAL, `synchronous=FULL` (the default: survives power loss; one disk flush "
        "per commit) and `synchronous=normal` (survives a process crash only); PostgreSQL: "
        "binary `COPY`, `synchronous_commit=on`.\n\n" + _table(rows)
    )
    click.echo(markdown)
    if write:
        report.write_section("store", markdown)


def _table(rows: list[tuple[object, ...]]) -> str:
    """One row per backend, one column per batch size × chunk (add / update), and
    the rows the backend's tables held at the end."""
    cases = list(dict.fromkeys((r[1], r[2]) for r in rows if r[1] != "rows at the end"))
    backends = list(dict.fromkeys(r[0] for r in rows))
    cell = {(r[0], r[1], r[2]): f"{r[3]} / {r[4]}" for r in rows}
    left = {r[0]: r[3] for r in rows if r[1] == "rows at the end"}
    return report.table(
        ["backend", *(f"{size} × {chunk}" for size, chunk in cases), "rows at the end"],
        [
            [b, *(cell.get((b, size, chunk), "-") for size, chunk in cases), left.get(b, "-")]
            for b in backends
        ],
    )
