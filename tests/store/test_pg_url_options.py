"""PostgreSQL: ``options`` given in the database URL are kept.

The store's pooled sessions carry their own libpq ``options`` (time-outs,
planner costs). A connection argument replaces the URL's ``options``
outright, so a URL such as ``...?options=-c search_path=ledgerq`` used to
lose its settings in the store's sessions and keep them in the claims'
connection: the two would then read different schemas.
"""

from __future__ import annotations

from urllib.parse import quote

import psycopg
import pytest

from ledgerq.claims.session import ClaimSession
from ledgerq.claims.settings import ClaimSettings
from ledgerq.store import open_store
from ledgerq.store import postgres as pg

from .conftest import pooled_connections

pytestmark = pytest.mark.pg


def test_the_urls_options_come_first_and_the_stores_settings_last() -> None:
    url = "postgresql://u@h/db?options=" + quote("-c search_path=lq -c statement_timeout=0")
    options = pg.session_options(url, statement_timeout=3000, random_page_cost=1.1)
    assert options == (
        "-c search_path=lq -c statement_timeout=0 -c statement_timeout=3000 -c random_page_cost=1.1"
    )
    assert pg.session_options("postgresql://u@h/db", work_mem="4MB") == "-c work_mem=4MB"
    # Key-value connection strings carry options too.
    assert pg.session_options("host=h dbname=db options='-c search_path=lq'", a=1) == (
        "-c search_path=lq -c a=1"
    )


async def test_a_search_path_in_the_url_holds_for_the_store_and_the_claims(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA lq_here")
    url = pg_url + "?options=" + quote("-c search_path=lq_here -c statement_timeout=0")
    store = await open_store(url, warm=True)
    try:
        async with pooled_connections(store, pg.WARM_CONNECTIONS) as conns:
            for conn in conns:
                cur = await conn.execute(
                    b"SELECT current_schema(), current_setting('statement_timeout')"
                )
                row = await cur.fetchone()
                # The URL's schema; the store's own time-out, not the URL's 0.
                assert row is not None and row[0] == "lq_here" and row[1] != "0"
    finally:
        await store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = {
            (schema, name)
            for schema, name in conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables"
                " WHERE table_name IN ('batches', 'service_id_claims')"
            )
        }
    assert tables == {("lq_here", "batches"), ("lq_here", "service_id_claims")}
    session = ClaimSession(url, ClaimSettings(instance_id="gw"))
    try:
        conn = await session.connection()
        cur = await conn.execute(b"SELECT current_schema() AS schema")
        row = await cur.fetchone()
        assert row is not None and row["schema"] == "lq_here"
    finally:
        await session.drop()
