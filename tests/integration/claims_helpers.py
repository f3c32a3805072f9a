"""Helpers for claim tests: a database with the claim tables and a way to put
batches in given states without the whole gateway."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from ledgerq.claims import ClaimManager, ClaimSettings
from ledgerq.clock import ManualClock
from ledgerq.store import open_store

T0 = 1_700_000_000_000


async def prepare(url: str) -> None:
    """Create the store's schema (claim tables included)."""
    store = await open_store(url, migrate=True)
    await store.close()


def put_batch(
    url: str,
    service_id: str,
    batch_id: str,
    *,
    submitted: bool = False,
    status: str | None = None,
) -> None:
    final = status in ("Invalid", "Valid", "Committed")
    # Straight into the table: these tests are about the claim queries, which
    # read only these columns; the store's own rules are tested elsewhere.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO batches (service_id, batch_id, signer_public_key, trace,"
            " serialized_batch, submitted, status, final)"
            " VALUES (%s, %s, '02', FALSE, '', %s, %s, %s)"
            " ON CONFLICT (service_id, batch_id) DO UPDATE"
            " SET submitted = EXCLUDED.submitted, status = EXCLUDED.status,"
            " final = EXCLUDED.final",
            (service_id, batch_id, submitted, status, final),
        )


def claimants(url: str) -> dict[str, str | None]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT service_id, claimant FROM service_id_claims").fetchall()
    return {s: c for s, c in rows}


def epochs(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT service_id, epoch FROM service_id_claims").fetchall()
    return {s: e for s, e in rows}


def counts(url: str, instances: Iterable[str]) -> dict[str, int]:
    owners = claimants(url)
    return {i: sum(1 for c in owners.values() if c == i) for i in instances}


def manager(url: str, name: str, clock: ManualClock, **settings: int) -> ClaimManager:
    return ClaimManager(url, ClaimSettings(instance_id=name, **settings), clock=clock)
