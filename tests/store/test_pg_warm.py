"""PostgreSQL: a warmed store has its hot statements prepared before any request.

``open_store(..., warm=True)`` (what ``ledgerq serve`` asks for) opens
``WARM_CONNECTIONS`` pooled connections and prepares ``WARM_STATEMENTS`` on
each, so that the first inserts and group writes neither wait for a new
connection nor have the server parse and analyse those statements inside
their transactions.
"""

from __future__ import annotations

import asyncio

import pytest

from ledgerq.model import Committed, Pending
from ledgerq.store import BatchWrite, open_store
from ledgerq.store import postgres as pg

from .conftest import make_batch, pooled_connections

pytestmark = pytest.mark.pg

WANTED = {f"lq_{name}" for name in pg.WARM_STATEMENTS}


async def _prepared(conn: object) -> set[str]:
    cur = await conn.execute("SELECT name FROM pg_prepared_statements")  # type: ignore[attr-defined]
    return {str(row[0]) for row in await cur.fetchall()}


async def test_warm_prepares_the_hot_statements_on_pooled_connections(pg_url: str) -> None:
    store = await open_store(pg_url, warm=True)
    try:
        backend = store._backend  # type: ignore[attr-defined]
        async with pooled_connections(store, pg.WARM_CONNECTIONS) as conns:
            for conn in conns:
                # On the server, and known to the store (it will not PREPARE them again).
                assert await _prepared(conn) >= WANTED
                assert backend.prepared_on(conn).names >= WANTED
    finally:
        await store.close()


async def test_a_store_opened_cold_prepares_nothing_ahead(pg_url: str) -> None:
    store = await open_store(pg_url)
    try:
        backend = store._backend  # type: ignore[attr-defined]
        async with backend._connection() as conn:
            assert not WANTED & await _prepared(conn)
    finally:
        await store.close()


async def test_a_warmed_store_inserts_and_writes_on_every_warm_connection(pg_url: str) -> None:
    """Each connection's first insert and group write use the prepared
    statements as they are (a second ``PREPARE`` of one would fail)."""
    store = await open_store(pg_url, warm=True, lock_entries=True)
    try:
        for n in range(pg.WARM_CONNECTIONS * 2):
            # Concurrent calls spread over the pool's connections.
            batches = [make_batch(f"svc{n}-{k}") for k in range(pg.WARM_CONNECTIONS)]
            await asyncio.gather(*(store.add_batches([b]) for b in batches))
            results = await asyncio.gather(
                *(
                    store.apply_writes([BatchWrite(b.service_id, b.batch_id, attempt=True)])
                    for b in batches
                )
            )
            assert all(r == [None] for r in results)
            await asyncio.gather(
                *(store.update_batch_status(b.batch_id, b.service_id, Pending()) for b in batches)
            )
            await asyncio.gather(
                *(
                    store.update_batch_status(b.batch_id, b.service_id, Committed(()))
                    for b in batches
                )
            )
            for b in batches:
                got = await store.get_batch(b.batch_id, b.service_id)
                assert got is not None and got.is_final
    finally:
        await store.close()
