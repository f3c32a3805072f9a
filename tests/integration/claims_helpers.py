"""Helpers for claim tests: a database with the claim tables and a way to put
batches in given states without the whole gateway."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from ledgerq.claims import ClaimManager, ClaimSettings
from ledgerq.claims.queries import claim_schema
from ledgerq.clock import ManualClock

T0 = 1_700_000_000_000

# Until a store schema is in the database, the columns the claim queries read.
_MINIMAL_BATCHES = """
CREATE TABLE IF NOT EXISTS batches (
    service_id VARCHAR(64) NOT NULL,
    batch_id   VARCHAR(128) NOT NULL,
    submitted  BOOLEAN NOT NULL DEFAULT FALSE,
    status     VARCHAR(16),
    final      BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (service_id, batch_id)
);
"""


def prepare(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_MINIMAL_BATCHES.encode())
        conn.execute(claim_schema().encode())


def put_batch(
    url: str,
    service_id: str,
    batch_id: str,
    *,
    submitted: bool = False,
    status: str | None = None,
) -> None:
    final = status in ("Invalid", "Valid", "Committed")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO batches (service_id, batch_id, submitted, status, final)"
            " VALUES (%s, %s, %s, %s, %s)"
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
