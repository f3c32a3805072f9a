"""PostgreSQL indexes of ``batches`` that every update of a batch writes to.

Migration 13: the data change id's unique index holds only batches that have
one (it held an entry per batch, written again by each non-HOT update); it
still refuses a second batch with the same data change id in a service, and
the lookups by data change id still find their batch, on a store migrated
from version 12 as on a new one.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from ledgerq.errors import DuplicateBatchError
from ledgerq.model import Committed
from ledgerq.store import migrate_database, open_store
from ledgerq.store.sqlfiles import latest_version

from .conftest import at_version, make_batch

pytestmark = pytest.mark.pg


def _index_entries(url: str) -> int:
    """Entries of the data change id index, as VACUUM counts them."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM batches")
        row = conn.execute(
            "SELECT reltuples FROM pg_class WHERE relname = 'batches_data_change_id_key'"
        ).fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("migrated", [False, True], ids=["new", "migrated-from-12"])
async def test_data_change_ids_stay_unique_and_found(
    make_pg_database: Callable[[], str], migrated: bool
) -> None:
    url = make_pg_database()
    if migrated:
        at_version(url, 12)
        result = await migrate_database(url)
        assert (result.before, result.after) == (12, latest_version("postgresql"))
    async with await open_store(url, lock_entries=False) as store:
        plain = [make_batch("s") for _ in range(5)]
        keyed = make_batch("s", data_change_id="dc-1")
        await store.add_batches([*plain, keyed])
        with pytest.raises(DuplicateBatchError, match="dc-1"):
            await store.add_batches([make_batch("s", data_change_id="dc-1")])
        # Another service may use the same data change id.
        await store.add_batches([make_batch("t", data_change_id="dc-1")])
        got = await store.get_batch("dc:dc-1", "s")
        assert got is not None and got.batch_header == keyed.batch_header
        await store.update_batch_status("dc:dc-1", "s", Committed())
        assert (await store.get_batch_status("dc:dc-1", "s")) is not None
    # Only the two batches with a data change id have an entry.
    assert _index_entries(url) == 2
