"""``ledgerq clean``: retention — delete final batches older than a cut-off.

Runs :meth:`~ledgerq.store.base.BatchTrackingStore.clean_stale_records` with
``now - older_than`` as the cut-off: final batches (Committed, Invalid) whose
final status was recorded before it go, with their transactions, receipts
and submissions; a batch that is not final is never deleted. Safe to run
while gateways serve the same store (for example from cron).
"""

from __future__ import annotations

import asyncio
import re

import click

from ledgerq.clock import now_ms
from ledgerq.commands.store import db_option
from ledgerq.errors import LedgerqError
from ledgerq.store import open_store
from ledgerq.store.migrate import redact

_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_age(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``45s`` → milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r}: use a number and a unit, e.g. 30d, 12h, 90m, 45s")
    return int(match.group(1)) * _UNITS[match.group(2)]


@click.command()
@db_option
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Age of the final status beyond which batches go: 30d, 12h, 90m, 45s.",
)
def clean(db_url: str, older_than: str) -> None:
    """Delete final batches whose final status is older than --older-than."""
    age_ms = parse_age(older_than)

    async def run() -> int:
        async with await open_store(db_url) as store:
            return await store.clean_stale_records(now_ms() - age_ms)

    try:
        deleted = asyncio.run(run())
    except LedgerqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{redact(db_url)}: deleted {deleted} final batches older than {older_than}")
