"""PostgreSQL's ``queue_heads``: each service's first non-final batch, kept by triggers.

``queue_round`` trusts the table instead of probing ``batches``, so it must
equal ``min(seq) WHERE NOT final`` per service after every kind of write,
including writes racing in two transactions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from ledgerq.clock import ManualClock
from ledgerq.model import Committed, Invalid, Pending, TrackingBatch, Unknown
from ledgerq.store import BatchTrackingStore, open_store

from .conftest import make_batch

pytestmark = pytest.mark.pg

WINDOW = 15_000
HEADS = "SELECT service_id, head_seq FROM queue_heads WHERE head_seq IS NOT NULL"
EXPECTED = """
    SELECT service_id, min(seq) FROM batches WHERE NOT final
    GROUP BY service_id HAVING min(seq) IS NOT NULL"""


@pytest.fixture
async def store(pg_url: str, clock: ManualClock) -> AsyncIterator[BatchTrackingStore]:
    async with await open_store(pg_url, clock=clock) as s:
        yield s


async def _rows(url: str, sql: str) -> set[tuple[str, int]]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(sql)
        return {(r[0], r[1]) for r in await cur.fetchall()}


async def _head(url: str, service: str) -> int | None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT head_seq FROM queue_heads WHERE service_id = %s", (service,)
        )
        row = await cur.fetchone()
        return None if row is None else row[0]


async def _wait_until_blocked(url: str, timeout_s: float = 10.0) -> None:
    """Until some backend waits for a lock (the racing write is parked)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with asyncio.timeout(timeout_s):
            while True:
                cur = await conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                row = await cur.fetchone()
                if row is not None and row[0] > 0:
                    return
                await asyncio.sleep(0.005)


async def add(store: BatchTrackingStore, service: str, count: int = 1) -> list[TrackingBatch]:
    return await store.add_batches([make_batch(service) for _ in range(count)])


async def test_heads_follow_every_write(store: BatchTrackingStore, pg_url: str) -> None:
    a = await add(store, "svc-a", 4)
    b = await add(store, "svc-b", 2)
    c = await add(store, "svc-c", 1)
    assert await _rows(pg_url, HEADS) == await _rows(pg_url, EXPECTED)
    # Finalizing a head moves it to the next open batch; a middle one, nowhere.
    await store.update_batch_status(a[0].batch_header, "svc-a", Committed())
    await store.update_batch_status(a[2].batch_header, "svc-a", Invalid())
    await store.update_batch_status(b[0].batch_header, "svc-b", Pending())
    await store.update_batch_status(b[1].batch_header, "svc-b", Unknown())
    await store.update_batch_status(c[0].batch_header, "svc-c", Committed())
    assert await _rows(pg_url, HEADS) == await _rows(pg_url, EXPECTED)
    assert await _head(pg_url, "svc-c") is None
    # Cleaning final batches leaves heads alone; new batches behind an open
    # head do not move it; a service without open batches gets a new head.
    assert await store.clean_stale_records(2**62) >= 1
    await add(store, "svc-a", 2)
    (c_new,) = await add(store, "svc-c")
    assert await _rows(pg_url, HEADS) == await _rows(pg_url, EXPECTED)
    assert await _head(pg_url, "svc-a") == a[1].seq
    assert await _head(pg_url, "svc-c") == c_new.seq


async def test_a_non_final_batch_deleted_moves_the_head(
    store: BatchTrackingStore, pg_url: str
) -> None:
    a = await add(store, "svc-a", 3)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        await conn.execute("DELETE FROM batches WHERE seq = %s", (a[0].seq,))
        await conn.commit()
    assert await _head(pg_url, "svc-a") == a[1].seq


async def test_head_finalized_while_a_batch_is_added(
    store: BatchTrackingStore, pg_url: str, clock: ManualClock
) -> None:
    # The finalizing transaction holds the service's head row; the insert's
    # trigger waits for it, then sees the row it left and lowers it.
    (head,) = await add(store, "svc-a")
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        await conn.execute(
            "UPDATE batches SET status = 'Committed', final = TRUE WHERE seq = %s", (head.seq,)
        )
        adding = asyncio.create_task(add(store, "svc-a"))
        await _wait_until_blocked(pg_url)
        await conn.commit()
    (new,) = await asyncio.wait_for(adding, 10)
    assert await _head(pg_url, "svc-a") == new.seq
    (pick,) = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    assert pick.batch_header == new.batch_header


async def test_batch_added_while_the_head_is_finalized(
    store: BatchTrackingStore, pg_url: str, clock: ManualClock
) -> None:
    # The inserting transaction holds the head row; the finalizing one waits,
    # then must read the head with a snapshot that sees the committed insert.
    (head,) = await add(store, "svc-a")
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute(
            "INSERT INTO batches (service_id, batch_id, signer_public_key, trace, "
            "serialized_batch) VALUES ('svc-a', 'late', 'k', FALSE, 'x') RETURNING seq"
        )
        row = await cur.fetchone()
        assert row is not None
        finalizing = asyncio.create_task(
            store.update_batch_status(head.batch_header, "svc-a", Committed())
        )
        await _wait_until_blocked(pg_url)
        await conn.commit()
    await asyncio.wait_for(finalizing, 10)
    assert await _head(pg_url, "svc-a") == row[0]
    (pick,) = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    assert pick.batch_header == "late"
