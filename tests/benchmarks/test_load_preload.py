"""The load benchmark's set-based pre-load: rows the store can read back, with the
ids the benchmark computes for its GET requests."""

from __future__ import annotations

import psycopg
import pytest

from bench.load import get_requests, preload, preloaded_id
from ledgerq.store import migrate_database, open_store


@pytest.mark.pg
async def test_preload_grows_the_store_with_final_batches_the_load_can_ask_for(
    pg_url: str,
) -> None:
    await migrate_database(pg_url)
    preload(pg_url, 0, 30, chunk=7)
    preload(pg_url, 30, 50, chunk=100)
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT b.batch_id, b.status, b.final, s.dlt_status, count(t.*) "
            "FROM batches b JOIN batch_statuses s USING (service_id, batch_id) "
            "JOIN transactions t USING (service_id, batch_id) "
            "WHERE b.service_id = %s GROUP BY 1, 2, 3, 4",
            ("pre42",),
        ).fetchall()
        total = conn.execute("SELECT count(*) FROM batches").fetchone()
    assert total == (50,)
    assert rows == [(preloaded_id(42), "Committed", True, "Committed", 1)]
    async with await open_store(pg_url) as store:
        status = await store.get_batch_status(preloaded_id(42), "pre42")
    assert status is not None


def test_get_requests_name_preloaded_rows_with_their_service() -> None:
    import random

    reqs = get_requests(10, [], 20, random.Random(1))
    assert len(reqs) == 20
    path, body = reqs[0]
    assert body == b""
    bid = path.split("id=")[1].split("&")[0]
    service = path.split("service_id=")[1]
    g = int(service.removeprefix("pre"))
    assert bid == preloaded_id(g)
