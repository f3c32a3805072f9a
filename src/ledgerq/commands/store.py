"""``ledgerq migrate`` and ``ledgerq store ...``: the batch tracking store from the shell."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ledgerq.clock import now_ms
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError, LedgerqError
from ledgerq.store import migrate_database, open_store
from ledgerq.store.migrate import redact
from ledgerq.store.sqlite import path_from_url


def _store_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--db`` and ``--config``: the store ``ledgerq serve`` would open."""
    func = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        help="TOML settings file whose db key names the store (default: $LEDGERQ_CONFIG, "
        "else ./ledgerq.toml if present).",
    )(func)
    return click.option(
        "--db",
        "db_url",
        default=None,
        help="Store URL: sqlite:///path, postgresql://user@host:port/db. Default: as "
        "ledgerq serve resolves its db key ($LEDGERQ_DB, the settings file, "
        "sqlite:///ledgerq.sqlite3).",
    )(func)


def resolve_db(db_url: str | None, config_file: str | None) -> str:
    """The store URL: ``--db``, else the ``db`` setting as ``ledgerq serve``
    reads it (``LEDGERQ_DB``, the settings file, the default)."""
    try:
        settings = load_settings(
            {"db": db_url} if db_url is not None else {}, config_file=config_file
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    return str(settings.db)


def _existing(url: str) -> str:
    """``url``, once the store it names exists: an inspection command opened
    on a mistyped SQLite path must not create an empty store there and
    report it empty."""
    if url.startswith("sqlite:///"):
        try:
            path = Path(path_from_url(url))
        except LedgerqError as exc:
            raise click.UsageError(str(exc)) from exc
        if not path.is_file():
            raise click.ClickException(
                f"no store at {path}: the file does not exist; check --db, or run "
                "ledgerq migrate to create it"
            )
    return url


@click.command()
@_store_options
def migrate(db_url: str | None, config_file: str | None) -> None:
    """Bring the store's schema up to date (creating it if the database is empty)."""
    db_url = resolve_db(db_url, config_file)
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
@_store_options
@click.option(
    "--services",
    "max_services",
    default=20,
    show_default=True,
    help="Show at most this many services.",
)
def summary(db_url: str | None, config_file: str | None, max_services: int) -> None:
    """Migrate the store if needed, then print batches per status and per service."""
    db_url = _existing(resolve_db(db_url, config_file))

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
@_store_options
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Delete final batches whose final status is older than this (e.g. 7d, 12h).",
)
def clean(db_url: str | None, config_file: str | None, older_than: str) -> None:
    """Delete final (Committed, Valid, Invalid) batches whose outcome is older than a cut-off.

    Batches still waiting, in flight, Pending, Delayed or Unknown are never deleted.
    """
    db_url = _existing(resolve_db(db_url, config_file))
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
