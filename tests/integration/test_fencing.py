"""Fencing: two gateway instances on one PostgreSQL store. A paused instance
whose claim moved on changes nothing; the new holder recovers its in-flight
batch through the Unknown path. Time moves through an injected clock."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from ledgerq.clock import ManualClock
from ledgerq.errors import FencedOffError, StoreError
from ledgerq.model import Committed, Fence, Pending, Unknown
from ledgerq.store import BatchTrackingStore, BatchWrite, open_store
from ledgerq.store.sqlfiles import load_migrations, load_queries
from tests.integration.claims_helpers import T0, claimants, manager
from tests.store.conftest import make_batch

pytestmark = pytest.mark.pg


async def _batch_row(url: str, service_id: str, batch_id: str) -> tuple[bool, str | None, int]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT submitted, status, attempts FROM batches"
            " WHERE service_id = %s AND batch_id = %s",
            (service_id, batch_id),
        )
        row = await cur.fetchone()
    assert row is not None
    return row[0], row[1], row[2]


async def test_new_services_get_unclaimed_claim_rows_with_their_first_batch(
    pg_url: str,
) -> None:
    clock = ManualClock(T0)
    async with await open_store(pg_url) as store:
        await store.add_batches([make_batch("s1"), make_batch("s2"), make_batch("s1")], now=T0)
        assert claimants(pg_url) == {"s1": None, "s2": None}
        async with manager(pg_url, "a", clock) as a:
            await a.cycle()
            await store.add_batches([make_batch("s1"), make_batch("s3")], now=T0 + 10)
            # An existing claim is left alone; the new service waits, unclaimed.
            assert claimants(pg_url) == {"s1": "a", "s2": "a", "s3": None}


async def test_upgrading_a_database_gives_tracked_services_claim_rows(pg_url: str) -> None:
    first = load_migrations("postgresql")[0]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(first.sql.encode())
        conn.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at BIGINT NOT NULL)"
        )
        conn.execute("INSERT INTO schema_version VALUES (1, %s, 0)", (first.name,))
        conn.execute(
            "INSERT INTO batches (service_id, batch_id, signer_public_key, trace,"
            " serialized_batch) VALUES ('old', 'b1', '02', FALSE, '')"
        )
    store = await open_store(pg_url, migrate=True)
    await store.close()
    assert claimants(pg_url) == {"old": None}


async def test_a_paused_instance_whose_claim_moved_on_changes_nothing(pg_url: str) -> None:
    clock = ManualClock(T0)
    store_a = await open_store(pg_url)
    store_b = await open_store(pg_url)
    a = manager(pg_url, "a", clock)
    b = manager(pg_url, "b", clock)
    async with store_a, store_b, a, b:
        first, second = make_batch("s"), make_batch("s")
        await store_a.add_batches([first, second], now=T0)
        await a.cycle()
        fence_a = a.fence_for("s")
        assert fence_a is not None and fence_a.instance_id == "a"
        # a takes the first batch for submission, then pauses mid-submission.
        await store_a.change_batch_to_submitted(first.batch_id, "s", now=clock.value, fence=fence_a)
        clock.advance(5_000)
        await b.cycle()
        assert claimants(pg_url) == {"s": "a"}  # mid-submission: only the slow path
        clock.advance(500)
        await b.cycle()
        assert claimants(pg_url) == {"s": "b"}
        fence_b = b.fence_for("s")
        assert fence_b is not None and fence_b.instance_id == "b"
        assert fence_b.epoch > fence_a.epoch

        # a wakes up: every write it attempts under its old claim is refused.
        with pytest.raises(FencedOffError, match=f"epoch {fence_a.epoch}"):
            await store_a.update_batch_status(first.batch_id, "s", Pending(), fence=fence_a)
        with pytest.raises(FencedOffError):
            await store_a.update_batch_status(first.batch_id, "s", Committed(), fence=fence_a)
        with pytest.raises(FencedOffError):
            await store_a.change_batch_to_submitted(second.batch_id, "s", fence=fence_a)
        assert await _batch_row(pg_url, "s", first.batch_id) == (True, None, 1)
        assert await _batch_row(pg_url, "s", second.batch_id) == (False, None, 0)

        # b recovers the in-flight batch through the Unknown path: the ledger
        # is asked first (here it does not know the batch), then it is resent.
        await store_b.update_batch_status(first.batch_id, "s", Unknown(), fence=fence_b)
        assert await _batch_row(pg_url, "s", first.batch_id) == (False, "Unknown", 1)
        await store_b.change_batch_to_submitted(first.batch_id, "s", fence=fence_b)
        await store_b.update_batch_status(first.batch_id, "s", Committed(), fence=fence_b)
        assert await _batch_row(pg_url, "s", first.batch_id) == (True, "Committed", 2)


async def test_an_old_epoch_stays_fenced_after_the_instance_takes_the_claim_back(
    pg_url: str,
) -> None:
    clock = ManualClock(T0)
    a = manager(pg_url, "a", clock)
    b = manager(pg_url, "b", clock)
    async with await open_store(pg_url) as store, a, b:
        batch = make_batch("s")
        await store.add_batches([batch], now=T0)
        await a.cycle()
        old = a.fence_for("s")
        clock.advance(6_000)
        await b.cycle()  # a was silent past the first expiry, idle: fast path
        await b.release()
        await a.cycle()
        assert claimants(pg_url) == {"s": "a"}
        new = a.fence_for("s")
        assert old is not None and new is not None
        assert (old.instance_id, new.instance_id) == ("a", "a") and new.epoch > old.epoch
        with pytest.raises(FencedOffError):
            await store.change_batch_to_submitted(batch.batch_id, "s", fence=old)
        await store.change_batch_to_submitted(batch.batch_id, "s", fence=new)
        assert await _batch_row(pg_url, "s", batch.batch_id) == (True, None, 1)


async def test_a_fenced_write_keeps_the_claim_from_moving_until_it_commits(pg_url: str) -> None:
    clock = ManualClock(T0)
    async with await open_store(pg_url) as store, manager(pg_url, "a", clock) as a:
        await store.add_batches([make_batch("s")], now=T0)
        await a.cycle()
        fence = a.fence_for("s")
        assert fence is not None
        # The fence check the store runs inside a fenced write, left open here.
        async with await psycopg.AsyncConnection.connect(pg_url) as writer:
            async with writer.transaction():
                cur = await writer.execute(
                    load_queries("postgresql")["lock_claim"].encode(),
                    {"service_id": "s", "instance_id": "a", "epoch": fence.epoch},
                )
                assert await cur.fetchone() == (fence.epoch,)
                async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as other:
                    await other.execute("SET lock_timeout = '200ms'")
                    with pytest.raises(psycopg.errors.LockNotAvailable):
                        await other.execute(
                            "UPDATE service_id_claims SET claimant = NULL, expiry_1 = NULL,"
                            " expiry_2 = NULL, claimed_at = NULL, unclaimed_since = 0"
                            " WHERE service_id = 's'"
                        )


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
async def test_stores_without_claims_refuse_a_fence(url: str, tmp_path: Path) -> None:
    if url == "sqlite":
        url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    store: BatchTrackingStore = await open_store(url)
    async with store:
        batch = make_batch("s")
        await store.add_batches([batch])
        with pytest.raises(StoreError, match="fencing needs"):
            await store.change_batch_to_submitted(batch.batch_id, "s", fence=Fence("a", 1))
        with pytest.raises(StoreError, match="fencing needs"):
            await store.update_batch_status(batch.batch_id, "s", Pending(), fence=Fence("a", 1))


async def test_a_group_of_writes_is_fenced_write_by_write(pg_url: str) -> None:
    clock = ManualClock(T0)
    a = manager(pg_url, "a", clock)
    async with await open_store(pg_url) as store, a:
        mine, theirs = make_batch("mine"), make_batch("theirs")
        await store.add_batches([mine, theirs], now=T0)
        await a.cycle()
        fence = a.fence_for("mine")
        assert fence is not None and a.fence_for("theirs") is not None
        stale = Fence("a", fence.epoch + 7)  # an epoch this instance no longer holds
        results = await store.apply_writes(
            [
                BatchWrite("theirs", theirs.batch_id, attempt=True, now=T0, fence=stale),
                BatchWrite("mine", mine.batch_id, attempt=True, now=T0, fence=fence),
            ]
        )
        assert isinstance(results[0], FencedOffError)
        assert results[1] is None
        assert await _batch_row(pg_url, "theirs", theirs.batch_id) == (False, None, 0)
        assert await _batch_row(pg_url, "mine", mine.batch_id) == (True, None, 1)
