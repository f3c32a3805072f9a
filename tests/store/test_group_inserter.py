"""GroupInserter on the real stores: a re-posted list in a group of requests
is refused alone, naming its batch; the others land together, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ledgerq.errors import DuplicateBatchError
from ledgerq.model import TrackingBatch
from ledgerq.store import BatchTrackingStore
from ledgerq.store.group import GroupInserter
from tests.store.conftest import make_batch


class Counting:
    """The store, with the size of every insert it was asked for."""

    def __init__(self, store: BatchTrackingStore) -> None:
        self.store = store
        self.calls: list[int] = []

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        self.calls.append(len(batches))
        return await self.store.add_batches(batches, now=now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
async def test_a_reposted_list_is_refused_alone_and_the_rest_land_together(
    store: BatchTrackingStore,
) -> None:
    (held,) = await store.add_batches([make_batch("s0")])
    counting = Counting(store)
    inserter = GroupInserter(counting)  # type: ignore[arg-type]
    lists = [
        [held] if i == 6 else [make_batch(f"s{i + 1}"), make_batch(f"s{i + 1}")] for i in range(9)
    ]
    first = asyncio.create_task(inserter.add_batches([make_batch("s0")]))
    await asyncio.sleep(0)  # under way: the nine below wait for it together
    waiting = [asyncio.create_task(inserter.add_batches(b)) for b in lists]
    await first
    results = await asyncio.gather(*waiting, return_exceptions=True)
    refusal = results[6]
    assert isinstance(refusal, DuplicateBatchError) and refusal.batch_id == held.batch_id
    landed = [r for i, r in enumerate(results) if i != 6]
    assert all(isinstance(r, list) and len(r) == 2 for r in landed)
    seqs = [b.seq for r in landed for b in r]  # type: ignore[union-attr]
    assert seqs == sorted(seqs)  # arrival order
    for i, r in enumerate(results):
        if i != 6:
            got = await store.list_batches(service_id=f"s{i + 1}")
            assert [b.batch_id for b in got.batches] == [b.batch_id for b in r]  # type: ignore[union-attr]
    # The first alone; the nine together, refused naming the held batch; the
    # six before it together, it alone, the two after it together.
    assert counting.calls == [1, 17, 12, 1, 4]
