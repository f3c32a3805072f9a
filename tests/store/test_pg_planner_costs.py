"""PostgreSQL: the store's and the claims' sessions price index probes as in memory.

With the server's default ``random_page_cost`` (4), statements that lock or
read a few services' rows of a table of one row per service
(``queue_heads``, ``service_id_claims``), or a few batches' rows of a young
store's ``submissions``, were planned as scans of the whole table, and a
prepared statement kept that plan as the table grew. The gateway's sessions
set ``RANDOM_PAGE_COST`` instead (docs/store.md, "Planner costs"; measured
in docs/design-notes.md).
"""

from __future__ import annotations

import pytest

from ledgerq.claims.session import RANDOM_PAGE_COST as CLAIMS_RANDOM_PAGE_COST
from ledgerq.claims.session import ClaimSession
from ledgerq.claims.settings import ClaimSettings
from ledgerq.store import open_store
from ledgerq.store import postgres as pg

from .conftest import pooled_connections

pytestmark = pytest.mark.pg


async def test_every_pooled_store_session_prices_index_probes_as_in_memory(pg_url: str) -> None:
    store = await open_store(pg_url, warm=True)
    try:
        async with pooled_connections(store, pg.WARM_CONNECTIONS) as conns:
            for conn in conns:
                cur = await conn.execute(b"SHOW random_page_cost")
                row = await cur.fetchone()
                assert row is not None and float(row[0]) == pg.RANDOM_PAGE_COST
    finally:
        await store.close()


async def test_the_claims_connection_prices_index_probes_as_the_store_does(pg_url: str) -> None:
    assert CLAIMS_RANDOM_PAGE_COST == pg.RANDOM_PAGE_COST
    session = ClaimSession(pg_url, ClaimSettings(instance_id="gw"))
    try:
        conn = await session.connection()
        cur = await conn.execute(b"SHOW random_page_cost")
        row = await cur.fetchone()
        assert row is not None and float(row["random_page_cost"]) == pg.RANDOM_PAGE_COST
    finally:
        await session.drop()
