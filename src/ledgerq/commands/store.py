"""``ledgerq migrate`` and ``ledgerq store ...``: the batch tracking store from the shell."""

from __future__ import annotations

import asyncio
import re

import click
from rich.console import Console
from rich.table import Table

from ledgerq.clock import now_ms
from ledgerq.errors import LedgerqError
from ledgerq.store import migrate_database, open_store
from ledgerq.store.migrate import redact

#: The embedded default: a SQLite file in the working directory.
DEFAULT_DB = "sqlite:///ledgerq.sqlite3"

db_option = click.option(
    "--db",
    "db_url",
    envvar="LEDGERQ_DB",
    default=DEFAULT_DB,
    show_default=True,
    show_envvar=True,
    help="Store URL: sqlite:///path, postgresql://user@host:port/db.",
)


@click.command()
@db_option
def migrate(db_url: str) -> None:
    """Bring the store's schema up to date (creating it if the database is empty)."""
    try:
        result = asyncio.run(migrate_database(db_url))
    except LedgerqError as exc:
        raise click.ClickException(str(exc)) from exc
    where = redact(db_url)
    if result.before == result.after:
        click.echo(f"{where}: schema at version {result.after}, up to date")
    else:
        click.echo(f"{where}: schema migrated from version {result.before} to {result.after}")


@click.group()
def store() -> None:
    """Inspect the batch tracking store."""


@store.command()
@db_option
@click.option(
    "--services",
    "max_services",
    default=20,
    show_default=True,
    help="Show at most this many services.",
)
def summary(db_url: str, max_services: int) -> None:
    """Migrate the store if needed, then print batches per status and per service."""

    async def run() -> None:
        async with await open_store(db_url) as s:
            counts = await s.status_counts()
            services = await s.list_services(limit=max(1, max_services))
        console = Console()
        console.print(f"store: {redact(db_url)}")
        table = Table(title="batches")
        table.add_column("status")
        table.add_column("batches", justify="right")
        for name in ("none", "Pending", "Delayed", "Unknown", "Invalid", "Valid", "Committed"):
            table.add_row(name, str(counts.get(name, 0)))
        table.add_row("total", str(sum(counts.values())), style="bold")
        console.print(table)
        if services:
            per = Table(title="services")
            for col in ("service", "queued", "total", "head", "in flight"):
                per.add_column(col)
            for sv in services:
                per.add_row(
                    sv.service_id,
                    str(sv.queue_depth),
                    str(sv.total),
                    (sv.head_batch_id or "-")[:16],
                    (sv.in_flight_batch_id or "-")[:16],
                )
            console.print(per)

    try:
        asyncio.run(run())
    except LedgerqError as exc:
        raise click.ClickException(str(exc)) from exc


_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``90s``, ``15m``, ``12h``, ``7d``, ``500ms`` → milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration; write e.g. 90s, 15m, 12h or 7d")
    return int(match[1]) * _UNITS_MS[match[2]]


@store.command()
@db_option
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Delete final batches whose final status is older than this (e.g. 7d, 12h).",
)
def clean(db_url: str, older_than: str) -> None:
    """Delete final (Committed, Valid, Invalid) batches whose outcome is older than a cut-off.

    Batches still waiting, in flight, Pending, Delayed or Unknown are never deleted.
    """
    # An age reaching back before 1970 deletes nothing (and fits the column).
    cutoff = max(0, now_ms() - parse_duration_ms(older_than))

    async def run() -> int:
        async with await open_store(db_url) as s:
            return await s.clean_stale_records(cutoff)

    try:
        deleted = asyncio.run(run())
    except LedgerqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{redact(db_url)}: deleted {deleted} final batch(es) older than {older_than}")
