"""Several connections adding to one service at once lose nothing and keep order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ledgerq.store import migrate_database, open_store

from .conftest import make_batch

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
