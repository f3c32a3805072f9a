"""Wake-ups relayed between processes over PostgreSQL LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from ledgerq.gateway.wakeups import PgWakeups, chunk_payloads

pytestmark = pytest.mark.pg


async def test_published_ids_reach_other_listeners_not_self(pg_url: str) -> None:
    got_a: list[str] = []
    got_b: list[str] = []
    b_got = asyncio.Event()

    def on_b(service_id: str) -> None:
        got_b.append(service_id)
        if len(got_b) >= 3:
            b_got.set()

    a = PgWakeups(pg_url, got_a.append)
    b = PgWakeups(pg_url, on_b)
    async with asyncio.TaskGroup() as tasks:
        ta = tasks.create_task(a.run())
        tb = tasks.create_task(b.run())
        try:
            await asyncio.wait_for(a.listening.wait(), 30)
            await asyncio.wait_for(b.listening.wait(), 30)
            for s in ("s1", "s2", "s2", "s3"):
                a.publish(s)
            await asyncio.wait_for(b_got.wait(), 30)
        finally:
            a.stop()
            b.stop()
        await asyncio.wait_for(asyncio.gather(ta, tb), 30)
    assert sorted(got_b) == ["s1", "s2", "s3"]
    assert got_a == []


async def test_a_listener_that_lost_its_connection_resyncs_once_it_listens_again(
    pg_url: str,
) -> None:
    resynced = asyncio.Event()
    got: list[str] = []
    a = PgWakeups(pg_url, lambda _s: None)
    b = PgWakeups(pg_url, got.append, on_resync=resynced.set)
    async with asyncio.TaskGroup() as tasks:
        ta = tasks.create_task(a.run())
        tb = tasks.create_task(b.run())
        try:
            await asyncio.wait_for(a.listening.wait(), 30)
            await asyncio.wait_for(b.listening.wait(), 30)
            assert b.resyncs == 0
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid",
                    (sorted(b._own_pids),),
                )
            await asyncio.wait_for(resynced.wait(), 30)
            assert b.resyncs == 1
            a.publish("after")
            for _ in range(300):
                if got:
                    break
                await asyncio.sleep(0.1)
        finally:
            a.stop()
            b.stop()
        await asyncio.wait_for(asyncio.gather(ta, tb), 30)
    assert got == ["after"]


def test_payloads_stay_under_the_notify_limit() -> None:
    ids = [f"service-{i:06d}" for i in range(2000)]
    payloads = chunk_payloads(ids)
    assert len(payloads) > 1
    assert all(len(p.encode()) < 8000 for p in payloads)
    assert [s for p in payloads for s in p.split("\n")] == ids
