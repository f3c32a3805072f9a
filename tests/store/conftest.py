"""Fixtures for the store tests: one ``store`` per backend, and batch factories."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledgerq.clock import ManualClock
from ledgerq.model import TrackingBatch, TrackingTransaction
from ledgerq.store import BatchTrackingStore, open_store
from ledgerq.store.sqlfiles import load_migrations

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.pg),
]

_counter = itertools.count(1)


def hex_id(prefix: str = "") -> str:
    """A unique 128-hex-character id (like a Sawtooth header signature)."""
    n = next(_counter)
    return (prefix.encode().hex() + f"{n:08x}").ljust(128, "0")


def make_batch(
    service_id: str = "circuit-1::svc1",
    *,
    txns: int = 1,
    batch_id: str | None = None,
    data_change_id: str | None = None,
    created_at: int = 0,
    payload_size: int = 16,
) -> TrackingBatch:
    bid = batch_id or hex_id("b")
    return TrackingBatch(
        service_id=service_id,
        batch_header=bid,
        data_change_id=data_change_id,
        signer_public_key="02" + "ab" * 32,
        trace=False,
        serialized_batch=b"batch:" + bid.encode(),
        created_at=created_at,
        transactions=tuple(
            TrackingTransaction(
                family_name="intkey",
                family_version="1.0",
                transaction_header=hex_id("t"),
                payload=bytes([i % 256]) * payload_size,
                signer_public_key="03" + "cd" * 32,
                service_id=service_id,
            )
            for i in range(txns)
        ),
    )


@contextlib.asynccontextmanager
async def pooled_connections(store: BatchTrackingStore, n: int) -> AsyncIterator[list[Any]]:
    """``n`` distinct pooled connections of a PostgreSQL store, held together."""
    backend = store._backend  # type: ignore[attr-defined]
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(backend._connection()) for _ in range(n)]
        assert len({id(c) for c in conns}) == n
        yield conns


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000_000)


@pytest.fixture
def store_url_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """URL of a fresh database for a backend name."""

    def make(backend: str) -> str:
        if backend == "memory":
            return "memory://"
        if backend == "sqlite":
            return f"sqlite:///{tmp_path / f'store-{next(_counter)}.sqlite3'}"
        factory = request.getfixturevalue("make_pg_database")
        url: str = factory()
        return url

    return make


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def store_url(backend: str, store_url_factory: Callable[[str], str]) -> str:
    return store_url_factory(backend)


@pytest.fixture
async def store(store_url: str, clock: ManualClock) -> AsyncIterator[BatchTrackingStore]:
    # Lock entries kept, as a gateway with parallel services keeps them: the
    # contract holds either way, and the parallel queuer's reads need them.
    async with await open_store(store_url, clock=clock, lock_entries=True) as s:
        yield s


def at_version(url: str, version: int) -> None:
    """An empty PostgreSQL database migrated by hand up to ``version``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at BIGINT NOT NULL)"
        )
        for m in load_migrations("postgresql")[:version]:
            conn.execute(m.sql.encode())
            conn.execute("INSERT INTO schema_version VALUES (%s, %s, 0)", (m.version, m.name))
