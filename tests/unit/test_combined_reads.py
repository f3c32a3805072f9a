"""Status requests' store reads, combined (ledgerq.ingest.combined): at most
``slots`` at once; requests arriving meanwhile share the next query."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from ledgerq.codec import Signer
from ledgerq.codec.decode import to_tracking_batch
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.errors import StoreUnavailableError
from ledgerq.ingest.combined import CombinedReads, StatusQueueFull
from ledgerq.model import TrackingBatch

SIGNER = Signer.generate()


class GatedStore:
    """Reads that finish only when the test opens the gate."""

    def __init__(self, batches: list[TrackingBatch]) -> None:
        self.batches = {b.batch_id: b for b in batches}
        self.reads: list[set[str]] = []
        self.gate = asyncio.Event()
        self.fail = False

    async def read(self, ids: Collection[str]) -> list[TrackingBatch]:
        self.reads.append(set(ids))
        await self.gate.wait()
        if self.fail:
            raise StoreUnavailableError("down")
        return [self.batches[i] for i in ids if i in self.batches]


def _batches(n: int) -> list[TrackingBatch]:
    return [
        to_tracking_batch(make_intkey_batch(SIGNER, [("set", f"k{i}", i)]), "s") for i in range(n)
    ]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_requests_waiting_for_a_slot_share_one_query() -> None:
    batches = _batches(6)
    ids = [b.batch_id for b in batches]
    store = GatedStore(batches)
    reads = CombinedReads(store.read, slots=1)
    first = asyncio.create_task(reads.read(ids[:1]))
    await _settle()
    assert len(store.reads) == 1  # a lone request is read at once
    later = [asyncio.create_task(reads.read(ids[k : k + 2])) for k in (1, 3)]
    later.append(asyncio.create_task(reads.read(["f" * 128])))
    await _settle()
    assert len(store.reads) == 1 and reads.queued == 3  # the slot is taken: they wait
    store.gate.set()
    got = await asyncio.gather(first, *later)
    # The three that waited were read together, in one query.
    assert store.reads[1] == set(ids[1:5]) | {"f" * 128}
    assert reads.reads == 2 and reads.requests == 4
    assert ids[0] in got[0] and ids[1] in got[1] and ids[3] in got[2]
    assert "f" * 128 not in got[3]


async def test_a_failed_read_fails_each_request_and_the_queue_is_bounded() -> None:
    store = GatedStore(_batches(1))
    reads = CombinedReads(store.read, slots=1, max_queued=2)
    running = asyncio.create_task(reads.read(["a" * 128]))
    await _settle()
    queued = [asyncio.create_task(reads.read(["b" * 128])) for _ in range(2)]
    await _settle()
    with pytest.raises(StatusQueueFull):
        await reads.read(["c" * 128])
    store.fail = True
    store.gate.set()
    results = await asyncio.gather(running, *queued, return_exceptions=True)
    assert all(isinstance(r, StoreUnavailableError) for r in results)
    assert reads.queued == 0


async def test_a_request_whose_caller_left_is_dropped_not_the_read() -> None:
    batches = _batches(2)
    store = GatedStore(batches)
    reads = CombinedReads(store.read, slots=1)
    running = asyncio.create_task(reads.read([batches[0].batch_id]))
    await _settle()
    gone = asyncio.create_task(reads.read([batches[1].batch_id]))
    stays = asyncio.create_task(reads.read([batches[1].batch_id]))
    await _settle()
    gone.cancel()
    store.gate.set()
    assert batches[1].batch_id in await stays
    await running
    with pytest.raises(asyncio.CancelledError):
        await gone
    await reads.aclose()
