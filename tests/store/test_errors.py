"""Driver failures reach callers as ledgerq errors that say what to do."""

from __future__ import annotations

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
        async with await open_store(f"sqlite:///{path}?busy_timeout_ms=50") as store:
            with pytest.raises(StoreUnavailableError, match="busy_timeout"):
                await store.add_batches([make_batch()])
            holder.execute("ROLLBACK")
            # Once the other writer is done, the same store works.
            assert len(await store.add_batches([make_batch()])) == 1
    finally:
        holder.close()


@pytest.mark.parametrize(
    "url",
    ["mysql://x/y", "sqlite:///", "sqlite:///x.db?journal=off", "sqlite:///x.db?busy_timeout_ms=x"],
)
async def test_bad_urls_are_refused_with_the_forms_that_work(url: str) -> None:
    with pytest.raises(StoreError):
        await open_store(url)
