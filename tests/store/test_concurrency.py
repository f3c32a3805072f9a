"""Several connections adding to one service at once lose nothing and keep order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from ledgerq.errors import DuplicateBatchError
from ledgerq.store import migrate_database, open_store
from ledgerq.store.sqlfiles import load_queries

from .conftest import at_version, make_batch

SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.pg),
]

WRITERS = 4
CALLS = 10
PER_CALL = 20
SVC = "circuit-1::busy"


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_concurrent_writers_lose_nothing_and_keep_call_order(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    url = store_url_factory(backend)
    await migrate_database(url)
    stores = [await open_store(url, migrate=False) for _ in range(WRITERS)]
    calls = [[make_batch(SVC) for _ in range(PER_CALL)] for _ in range(WRITERS * CALLS)]
    try:

        async def writer(w: int) -> None:
            for c in range(CALLS):
                await stores[w].add_batches(calls[w * CALLS + c])

        await asyncio.gather(*(writer(w) for w in range(WRITERS)))
        listed = []
        after = None
        while True:
            page = await stores[0].list_batches(service_id=SVC, limit=97, after_seq=after)
            if not page.batches:
                break
            listed.extend(page.batches)
            after = page.batches[-1].seq
    finally:
        for s in stores:
            await s.close()

    assert len(listed) == WRITERS * CALLS * PER_CALL
    position = {b.batch_header: i for i, b in enumerate(listed)}
    for call in calls:
        places = [position[b.batch_header] for b in call]
        # One call's batches are contiguous and in list order: per service,
        # one writer at a time.
        assert places == list(range(places[0], places[0] + PER_CALL))


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_racing_duplicates_one_wins_the_other_is_told(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    url = store_url_factory(backend)
    await migrate_database(url)
    stores = [await open_store(url, migrate=False) for _ in range(WRITERS)]
    same = [make_batch(SVC) for _ in range(50)]
    try:
        results = await asyncio.gather(
            *(s.add_batches(list(same)) for s in stores), return_exceptions=True
        )
        counts = await stores[0].status_counts()
    finally:
        for s in stores:
            await s.close()
    winners = [r for r in results if isinstance(r, list)]
    losers = [r for r in results if isinstance(r, DuplicateBatchError)]
    assert len(winners) == 1 and len(losers) == WRITERS - 1, results
    assert all(e.batch_id in {b.batch_header for b in same} for e in losers)
    assert counts == {"none": len(same)}


@pytest.mark.pg
@pytest.mark.parametrize("migrated", [False, True], ids=["new", "migrated-from-14"])
async def test_a_first_pause_waits_for_the_take_under_way(
    make_pg_database: Callable[[], str], migrated: bool
) -> None:
    """A take locks its service's control row (stopped_of, FOR SHARE): the
    service's first pause waits for it, so no take commits after a pause
    returned. The row exists from the service's first batch on."""
    url = make_pg_database()
    if migrated:
        at_version(url, 14)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO queue_heads VALUES (%s, NULL)", (SVC,))
    async with await open_store(url) as store:
        await store.add_batches([make_batch(SVC), make_batch("circuit-1::other")])
        async with await psycopg.AsyncConnection.connect(url) as take:
            await take.execute(
                load_queries("postgresql")["stopped_of"].replace("%(service_ids)s", "%s"),
                ([SVC],),
            )
            pause = asyncio.create_task(store.control_service(SVC, "pause", actor="ops"))
            await asyncio.sleep(0.5)
            assert not pause.done(), "the pause did not wait for the take under way"
            await take.commit()
        assert (await asyncio.wait_for(pause, 10)).action == "pause"
        assert (await store.service_controls())[SVC].paused
