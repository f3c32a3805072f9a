"""Driver failures reach callers as ledgerq errors that say what to do."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from ledgerq.errors import StoreError, StoreUnavailableError
from ledgerq.store import migrate_database, open_store

from .conftest import make_batch


async def test_unreachable_postgresql_is_unavailable_and_says_so() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    with pytest.raises(StoreUnavailableError, match="check that the server is up") as info:
        await open_store("postgresql://postgres@127.0.0.1:1/ledgerq", migrate=False)
    assert info.value.__cause__ is not None


async def test_sqlite_path_that_cannot_exist_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailableError, match="check the path"):
        await open_store(f"sqlite:///{blocker / 'store.sqlite3'}")


async def test_sqlite_writer_locked_out_past_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "locked.sqlite3"
    await migrate_database(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        # Without the parallel queuer's lock entries: opening writes nothing.
        url = f"sqlite:///{path}?busy_timeout_ms=50"
        async with await open_store(url, lock_entries=False) as store:
            with pytest.raises(StoreUnavailableError, match="busy_timeout"):
                await store.add_batches([make_batch()])
            holder.execute("ROLLBACK")
            # Once the other writer is done, the same store works.
            assert len(await store.add_batches([make_batch()])) == 1
    finally:
        holder.close()


@pytest.mark.parametrize(
    "url",
    [
        "mysql://x/y",
        "sqlite:///",
        "sqlite:///x.db?journal=off",
        "sqlite:///x.db?busy_timeout_ms=x",
        "sqlite:///x.db?synchronous=off",
    ],
)
async def test_bad_urls_are_refused_with_the_forms_that_work(url: str) -> None:
    with pytest.raises(StoreError):
        await open_store(url)


async def test_sqlite_reads_do_not_wait_for_a_write_in_progress(tmp_path: Path) -> None:
    from ledgerq.store.sqlite import SqliteBackend

    async with await open_store(f"sqlite:///{tmp_path / 'rw.sqlite3'}") as store:
        [b] = await store.add_batches([make_batch()])
        backend = store._backend  # type: ignore[attr-defined]
        assert isinstance(backend, SqliteBackend)
        async with backend.transaction(write=True) as session:
            await session.execute(
                "record_attempt",
                {
                    "service_id": b.service_id,
                    "batch_id": b.batch_header,
                    "error_type": None,
                    "error_message": None,
                    "now": 5,
                },
            )
            # The write is open and holds the writing connection; a read of the
            # same store still answers, with the last committed state. (With one
            # connection it would wait for the write, which waits for it: the
            # timeout turns that deadlock into a failure.)
            seen = await asyncio.wait_for(store.get_batch(b.batch_header, b.service_id), 10)
            assert seen is not None and seen.attempts == 0
        after = await store.get_batch(b.batch_header, b.service_id)
        assert after is not None and after.attempts == 1


# PRAGMA synchronous reads back as a number: 1 = NORMAL, 2 = FULL.
@pytest.mark.parametrize(("query", "expected"), [("", 2), ("?synchronous=normal", 1)])
async def test_every_sqlite_connection_uses_the_configured_synchronous(
    tmp_path: Path, query: str, expected: int
) -> None:
    """A ``202`` means the batch is on disk: FULL by default, on every connection."""
    async with await open_store(f"sqlite:///{tmp_path / 'durable.sqlite3'}{query}") as store:
        found = await store._backend.pragma("synchronous")  # type: ignore[attr-defined]
        assert found == {"write": expected, "read": expected, "checkpoint": expected}
        assert (await store._backend.pragma("journal_mode"))["write"] == "wal"  # type: ignore[attr-defined]


async def test_sqlite_list_in_flight_reads_the_busy_index_not_the_table(tmp_path: Path) -> None:
    """The follower reads the batches in flight every poll interval: a walk
    over every batch ever tracked would grow with the history."""
    from ledgerq.store.sqlite import SqliteBackend

    async with await open_store(f"sqlite:///{tmp_path / 'plan.sqlite3'}") as store:
        await store.add_batches([make_batch() for _ in range(20)])
        backend = store._backend  # type: ignore[attr-defined]
        assert isinstance(backend, SqliteBackend)
        sql = backend.queries["list_in_flight"]
        plan = await backend.call(
            lambda c: c.execute(f"EXPLAIN QUERY PLAN {sql}", {"limit": 10}).fetchall()
        )
        details = [row[3] for row in plan]
        assert any("batches_busy_idx" in d for d in details), details
        assert "SCAN b" not in details, details


async def test_sqlite_short_reads_between_writes_see_each_and_leave_nothing_open(
    tmp_path: Path,
) -> None:
    """A short read while no write is under way runs on the writing
    connection (its cache holds what the writes touched): it sees the last
    commit and ends its read transaction, so the next write can begin."""
    from ledgerq.store.sqlite import SqliteBackend

    async with await open_store(f"sqlite:///{tmp_path / 'rw2.sqlite3'}") as store:
        [b] = await store.add_batches([make_batch()])
        backend = store._backend  # type: ignore[attr-defined]
        assert isinstance(backend, SqliteBackend)
        for attempt in range(1, 4):
            await store.change_batch_to_submitted(b.batch_header, b.service_id, now=attempt)
            seen = await store.get_batch(b.batch_header, b.service_id)
            assert seen is not None and seen.attempts == attempt
            assert not await backend.call(lambda c: c.in_transaction)
