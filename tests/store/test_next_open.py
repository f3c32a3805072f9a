"""The commit → next POST merge in the store: ``next_open_batch`` and the
conditional take (``BatchWrite.after``) of ``apply_writes``.

The take may land only where the serial queuer would pick exactly that
batch once its predecessor is final, and only together with that final
status: the final status is durable before the next batch goes out, and the
next batch's ``submitted`` before its POST.
"""

from __future__ import annotations

import psycopg
import pytest

from ledgerq.errors import FencedOffError, StatusTransitionError, StoreInputError
from ledgerq.model import BatchStatusName, Committed, Fence, Invalid, Pending, Unknown
from ledgerq.queue.serial import select_round
from ledgerq.store import BatchTrackingStore, BatchWrite, open_store

from .conftest import make_batch

NOW = 1_700_000_000_000


async def _pending(store: BatchTrackingStore, service_id: str, batch_id: str) -> None:
    await store.change_batch_to_submitted(batch_id, service_id, now=NOW)
    await store.update_batch_status(batch_id, service_id, Pending(), now=NOW)


async def _fused(store: BatchTrackingStore, service_id: str, after: str, take: str) -> list[object]:
    results: list[object] = list(
        await store.apply_writes(
            [
                BatchWrite(service_id, after, Committed(), now=NOW + 1),
                BatchWrite(service_id, take, attempt=True, now=NOW + 1, after=after),
            ]
        )
    )
    return results


async def test_next_open_batch_is_the_queuers_pick_once_the_batch_is_final(
    store: BatchTrackingStore,
) -> None:
    a, b, _c = await store.add_batches([make_batch("s", txns=2) for _ in range(3)])
    (other,) = await store.add_batches([make_batch("t")])
    await _pending(store, "s", a.batch_id)
    nxt = await store.next_open_batch("s", a.batch_id)
    assert nxt is not None and nxt.batch_id == b.batch_id
    # Loaded in full: what the submitter posts and records.
    assert nxt.serialized_batch == b.serialized_batch
    assert [t.transaction_header for t in nxt.transactions] == [
        t.transaction_header for t in b.transactions
    ]
    assert (nxt.submitted, nxt.batch_status, nxt.attempts) == (False, None, 0)
    # The queuer agrees once a is final.
    await store.update_batch_status(a.batch_id, "s", Committed(), now=NOW)
    [pick] = await store.queue_round(now=NOW, delay_window_ms=15_000, services=["s"])
    assert pick.batch_id == nxt.batch_id
    assert other.batch_id != nxt.batch_id


async def test_next_open_batches_load_each_batch_in_full_in_one_read(
    store: BatchTrackingStore,
) -> None:
    # One statement returns the batches with their transactions: each batch
    # gets its own, in order, across services and sizes.
    pairs = []
    expected = {}
    for n, txns in enumerate((1, 3, 2)):
        first, second = await store.add_batches([make_batch(f"m{n}", txns=txns) for _ in range(2)])
        await _pending(store, f"m{n}", first.batch_id)
        pairs.append((f"m{n}", first.batch_id))
        expected[f"m{n}"] = await store.get_batch(second.batch_id, f"m{n}")
    found = await store.next_open_batches(pairs)
    assert found == expected


async def test_no_next_open_batch_when_the_queuer_would_pick_something_else(
    store: BatchTrackingStore,
) -> None:
    # Nothing left after the batch.
    (a,) = await store.add_batches([make_batch("s1")])
    await _pending(store, "s1", a.batch_id)
    assert await store.next_open_batch("s1", a.batch_id) is None
    # A later batch is Unknown: the queuer resends it first, never a new one.
    a, b, c = await store.add_batches([make_batch("s2") for _ in range(3)])
    await _pending(store, "s2", a.batch_id)
    await store.update_batch_status(c.batch_id, "s2", Unknown(), now=NOW)
    assert await store.next_open_batch("s2", a.batch_id) is None
    # The next batch is Delayed (a resubmission, with its window).
    a, b = await store.add_batches([make_batch("s3") for _ in range(2)])
    await _pending(store, "s3", a.batch_id)
    await store.change_batch_to_submitted(b.batch_id, "s3", None, BatchStatusName.DELAYED, now=NOW)
    assert await store.next_open_batch("s3", a.batch_id) is None
    # Another batch of the service is submitted (locks it).
    a, b, c = await store.add_batches([make_batch("s4") for _ in range(3)])
    await _pending(store, "s4", a.batch_id)
    await store.change_batch_to_submitted(c.batch_id, "s4", now=NOW)
    assert await store.next_open_batch("s4", a.batch_id) is None


async def test_a_final_status_and_the_next_take_land_together(store: BatchTrackingStore) -> None:
    a, b, c = await store.add_batches([make_batch("s") for _ in range(3)])
    await _pending(store, "s", a.batch_id)
    assert await _fused(store, "s", a.batch_id, b.batch_id) == [None, None]
    got_a = await store.get_batch(a.batch_id, "s")
    got_b = await store.get_batch(b.batch_id, "s")
    assert got_a is not None and got_a.status_name is BatchStatusName.COMMITTED
    assert got_b is not None
    assert (got_b.submitted, got_b.batch_status, got_b.attempts) == (True, None, 1)
    assert got_b.last_attempt_at == NOW + 1
    # The service is locked by b now: the queuer hands nothing of it out.
    assert await store.queue_round(now=NOW + 2, delay_window_ms=15_000) == []
    in_flight = [x.batch_id for x in await store.list_in_flight()]
    assert in_flight == [b.batch_id]
    c_now = await store.get_batch(c.batch_id, "s")
    assert c_now is not None and not c_now.submitted


async def test_a_take_is_refused_unless_its_predecessor_is_final(
    store: BatchTrackingStore,
) -> None:
    a, b = await store.add_batches([make_batch("s") for _ in range(2)])
    await _pending(store, "s", a.batch_id)
    # The group writes a non-final status: the take does not land.
    results = await store.apply_writes(
        [
            BatchWrite("s", a.batch_id, Pending(), now=NOW + 1),
            BatchWrite("s", b.batch_id, attempt=True, now=NOW + 1, after=a.batch_id),
        ]
    )
    assert results[0] is None
    assert isinstance(results[1], StatusTransitionError)
    got_b = await store.get_batch(b.batch_id, "s")
    assert got_b is not None and (got_b.submitted, got_b.attempts) == (False, 0)


@pytest.mark.parametrize("final", [Committed(), Invalid(())])
async def test_a_take_is_refused_when_another_batch_comes_first(
    store: BatchTrackingStore, final: Committed | Invalid
) -> None:
    a, _b, c = await store.add_batches([make_batch("s") for _ in range(3)])
    await _pending(store, "s", a.batch_id)
    # c is not the first open batch once a is final: b is.
    results = await store.apply_writes(
        [
            BatchWrite("s", a.batch_id, final, now=NOW + 1),
            BatchWrite("s", c.batch_id, attempt=True, now=NOW + 1, after=a.batch_id),
        ]
    )
    assert results[0] is None and isinstance(results[1], StatusTransitionError)
    got_a = await store.get_batch(a.batch_id, "s")
    assert got_a is not None and got_a.status_name is final.name
    got_c = await store.get_batch(c.batch_id, "s")
    assert got_c is not None and not got_c.submitted


async def test_a_take_is_refused_when_the_service_became_busy_meanwhile(
    store: BatchTrackingStore,
) -> None:
    a, b, c = await store.add_batches([make_batch("s") for _ in range(3)])
    await _pending(store, "s", a.batch_id)
    nxt = await store.next_open_batch("s", a.batch_id)
    assert nxt is not None and nxt.batch_id == b.batch_id
    # Between the read and the group, c became Unknown (say): the queuer
    # would resend c first, so b must not be taken.
    await store.update_batch_status(c.batch_id, "s", Unknown(), now=NOW)
    results = await _fused(store, "s", a.batch_id, b.batch_id)
    assert results[0] is None and isinstance(results[1], StatusTransitionError)
    got_b = await store.get_batch(b.batch_id, "s")
    assert got_b is not None and not got_b.submitted
    # ...and the queuer's pick is c, as the store says.
    picks = select_round(
        [x for x in await store.get_batches_by_id([a.batch_id, b.batch_id, c.batch_id])],
        now=NOW,
    )
    assert [p.batch_id for p in picks] == [c.batch_id]


async def test_takes_of_many_services_in_one_group(store: BatchTrackingStore) -> None:
    services = [f"s{i}" for i in range(5)]
    pairs = []
    for s in services:
        a, b = await store.add_batches([make_batch(s), make_batch(s)])
        await _pending(store, s, a.batch_id)
        pairs.append((s, a, b))
    writes: list[BatchWrite] = []
    for s, a, b in pairs:
        writes.append(BatchWrite(s, a.batch_id, Committed(), now=NOW + 1))
        writes.append(BatchWrite(s, b.batch_id, attempt=True, now=NOW + 1, after=a.batch_id))
    # A take of a service whose batch stays pending, in the same group.
    x, y = await store.add_batches([make_batch("busy"), make_batch("busy")])
    await _pending(store, "busy", x.batch_id)
    writes.append(BatchWrite("busy", y.batch_id, attempt=True, now=NOW + 1, after=x.batch_id))
    results = await store.apply_writes(writes)
    assert results[:-1] == [None] * (len(writes) - 1)
    assert isinstance(results[-1], StatusTransitionError)
    for s, _, b in pairs:
        got = await store.get_batch(b.batch_id, s)
        assert got is not None and got.submitted
    got_y = await store.get_batch(y.batch_id, "busy")
    assert got_y is not None and not got_y.submitted


async def test_next_open_batches_reads_many_services_at_once(store: BatchTrackingStore) -> None:
    firsts = {}
    seconds = {}
    for s in ("s1", "s2", "s3"):
        a, b = await store.add_batches([make_batch(s), make_batch(s)])
        await _pending(store, s, a.batch_id)
        firsts[s], seconds[s] = a, b
    # s3's next batch is Unknown: nothing for it.
    await store.update_batch_status(seconds["s3"].batch_id, "s3", Unknown(), now=NOW)
    found = await store.next_open_batches([(s, firsts[s].batch_id) for s in ("s1", "s2", "s3")])
    assert {s: b.batch_id for s, b in found.items()} == {
        "s1": seconds["s1"].batch_id,
        "s2": seconds["s2"].batch_id,
    }
    assert found["s1"].serialized_batch == seconds["s1"].serialized_batch
    with pytest.raises(StoreInputError, match="one"):
        await store.next_open_batches([("s1", "x"), ("s1", "y")])


@pytest.mark.pg
async def test_a_take_under_a_claim_that_moved_on_lands_nothing(pg_url: str) -> None:
    # Fencing (docs/ha.md): a paused instance that wakes up after its claim
    # moved on must neither finish the batch nor take the next one.
    async with await open_store(pg_url) as store:
        a, b = await store.add_batches([make_batch("s"), make_batch("s")])
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(
                "UPDATE service_id_claims SET claimant = 'new', epoch = 2, expiry_1 = 9e15,"
                " expiry_2 = 9e15, claimed_at = 1, unclaimed_since = NULL"
                " WHERE service_id = 's'"
            )
        current, stale = Fence("new", 2), Fence("old", 1)
        await store.apply_writes([BatchWrite("s", a.batch_id, attempt=True, fence=current)])
        await store.apply_writes([BatchWrite("s", a.batch_id, Pending(), fence=current)])
        results = await store.apply_writes(
            [
                BatchWrite("s", a.batch_id, Committed(), now=NOW, fence=stale),
                BatchWrite("s", b.batch_id, attempt=True, now=NOW, fence=stale, after=a.batch_id),
            ]
        )
        assert isinstance(results[0], FencedOffError)
        assert isinstance(results[1], StatusTransitionError | FencedOffError)
        got_a = await store.get_batch(a.batch_id, "s")
        got_b = await store.get_batch(b.batch_id, "s")
        assert got_a is not None and got_a.status_name is BatchStatusName.PENDING
        assert got_b is not None and (got_b.submitted, got_b.attempts) == (False, 0)
        # Under the current claim the same pair lands.
        results = await store.apply_writes(
            [
                BatchWrite("s", a.batch_id, Committed(), now=NOW, fence=current),
                BatchWrite("s", b.batch_id, attempt=True, now=NOW, fence=current, after=a.batch_id),
            ]
        )
        assert results == [None, None]
