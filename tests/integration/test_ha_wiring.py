"""The gateway's HA wiring: claims on PostgreSQL, the single-instance lock on SQLite."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from ledgerq.claims.lock import InstanceLockedError
from ledgerq.config import load_settings
from ledgerq.gateway.ha import open_high_availability
from ledgerq.store import open_store
from tests.integration.claims_helpers import claimants


async def test_sqlite_gateway_takes_the_file_lock(tmp_path: Path) -> None:
    settings = load_settings(
        {"db": f"sqlite:///{tmp_path / 'g.sqlite3'}"}, environ={}, cwd=tmp_path
    )
    async with AsyncExitStack() as first:
        assert await open_high_availability(settings, first) is None
        async with AsyncExitStack() as second:
            with pytest.raises(InstanceLockedError, match="PostgreSQL"):
                await open_high_availability(settings, second)
    async with AsyncExitStack() as again:  # released with the first gateway
        assert await open_high_availability(settings, again) is None


@pytest.mark.pg
async def test_postgres_gateway_claims_before_serving_and_releases_on_exit(
    pg_url: str, tmp_path: Path
) -> None:
    async with await open_store(pg_url) as store:
        from tests.store.conftest import make_batch

        await store.add_batches([make_batch("s1"), make_batch("s2")])
    settings = load_settings(
        {"db": pg_url}, environ={"LEDGERQ_CLAIMS_INSTANCE_ID": "gw"}, cwd=tmp_path
    )
    async with AsyncExitStack() as stack:
        claims = await open_high_availability(settings, stack, address="127.0.0.1:1234")
        assert claims is not None
        assert claims.claimed_services() == {"s1", "s2"}
        assert claimants(pg_url) == {"s1": "gw", "s2": "gw"}
        (me,) = await claims.list_instances()
        assert me.address == "127.0.0.1:1234"
    assert claimants(pg_url) == {"s1": None, "s2": None}


@pytest.mark.pg
async def test_store_sessions_left_idle_in_a_transaction_are_ended_by_the_server(
    pg_url: str,
) -> None:
    # A gateway frozen mid-write (SIGSTOP) must not keep its claim row
    # share-locked past the TTL: the server ends such sessions.
    store = await open_store(pg_url, pg_idle_in_transaction_ms=1_234)
    async with store:
        backend = store._backend  # type: ignore[attr-defined]
        async with backend.transaction(write=False) as session:
            cur = await session.conn.execute(b"SHOW idle_in_transaction_session_timeout")
            row = await cur.fetchone()
    assert row is not None and row[0] == "1234ms"
