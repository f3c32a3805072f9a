"""QueueSource with narrow rounds: full batches handed out, stale picks dropped."""

from __future__ import annotations

from ledgerq.clock import ManualClock
from ledgerq.model import TrackingBatch, Unknown
from ledgerq.queue.source import QueueSource
from ledgerq.store import BatchTrackingStore

from .conftest import make_batch


async def test_batches_handed_out_are_loaded_in_full(
    store: BatchTrackingStore,
) -> None:
    (a,) = await store.add_batches([make_batch("svc-a", txns=2)])
    src = QueueSource(store, clock=ManualClock(1_700_000_000_000), narrow=True)
    got = await src.next()
    assert got is not None
    assert got == await store.get_batch(a.batch_header, "svc-a")
    assert got.serialized_batch == a.serialized_batch
    assert len(got.transactions) == 2


async def test_a_pick_changed_since_its_round_is_decided_again(
    store: BatchTrackingStore,
) -> None:
    (a,) = await store.add_batches([make_batch("svc-a")])
    (b,) = await store.add_batches([make_batch("svc-b")])
    src = QueueSource(store, clock=ManualClock(1_700_000_000_000), narrow=True)
    first = await src.next()  # the round holds svc-b's new batch now
    assert first is not None and first.batch_header == a.batch_header
    await store.update_batch_status(b.batch_header, "svc-b", Unknown())
    # The round's picture of b is stale: not handed out as it was...
    assert await src.next() is None
    # ... but looked at again: the store now queues it as Unknown.
    again: TrackingBatch | None = await src.next()
    assert again is not None and again.batch_header == b.batch_header
    assert again.status_name is not None and again.status_name.value == "Unknown"


async def test_a_woken_service_comes_whole_in_one_query(store: BatchTrackingStore) -> None:
    clock = ManualClock(1_700_000_000_000)
    src = QueueSource(store, clock=clock, narrow=True)
    assert await src.next() is None  # the first full round: nothing yet
    (a,) = await store.add_batches([make_batch("svc-a", txns=2)])
    loads = 0
    real_load = store.get_batches_by_seq

    async def counting_load(seqs: object) -> list[TrackingBatch]:
        nonlocal loads
        loads += 1
        return await real_load(seqs)  # type: ignore[arg-type]

    store.get_batches_by_seq = counting_load  # type: ignore[method-assign]
    src.wake("svc-a")
    got = await src.next()
    assert got is not None and got == await store.get_batch(a.batch_header, "svc-a")
    assert len(got.transactions) == 2
    assert loads == 0  # the round of the woken service carried the whole batch
    assert src.rounds == 1  # and no round over every service was asked for
