"""Store contract: ``queue_round``, the one-round serial queuer set-based, on every backend."""

from __future__ import annotations

import psycopg
import pytest

from ledgerq.clock import ManualClock
from ledgerq.errors import StoreError, StoreInputError
from ledgerq.model import Committed, Delayed, Invalid, Pending, TrackingBatch, Unknown
from ledgerq.store import BatchTrackingStore

from .conftest import make_batch

WINDOW = 15_000


async def add(store: BatchTrackingStore, service: str, count: int = 1) -> list[TrackingBatch]:
    return await store.add_batches([make_batch(service) for _ in range(count)])


def ids(batches: list[TrackingBatch]) -> list[str]:
    return [b.batch_header for b in batches]


async def test_empty_store_has_an_empty_round(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    assert await store.queue_round(now=clock(), delay_window_ms=WINDOW) == []


async def test_oldest_batch_of_each_service_fully_loaded(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    a = await add(store, "svc-a", 3)
    b = await add(store, "svc-b", 2)
    got = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    assert ids(got) == [a[0].batch_header, b[0].batch_header]
    # What the submitter needs: the serialized batch, the transactions, seq.
    assert got[0] == await store.get_batch(a[0].batch_header, "svc-a")
    assert got[0].transactions == a[0].transactions
    assert got[0].seq == a[0].seq


async def test_a_narrow_round_leaves_the_blobs_to_get_batches_by_seq(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    a = await add(store, "svc-a", 2)
    b = await add(store, "svc-b")
    full = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    narrow = await store.queue_round(now=clock(), delay_window_ms=WINDOW, narrow=True)
    assert ids(narrow) == ids(full) == [a[0].batch_header, b[0].batch_header]
    assert [x.seq for x in narrow] == [x.seq for x in full]
    for got in narrow:
        # Memory stores hold loaded batches; SQL ones leave the blobs out.
        assert got.serialized_batch in (b"", a[0].serialized_batch, b[0].serialized_batch)
    seqs = [x.seq for x in narrow if x.seq is not None]
    assert await store.get_batches_by_seq([*reversed(seqs), 10**9]) == full
    assert await store.get_batches_by_seq([]) == []


async def test_final_batches_are_skipped_and_unlock(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    a = await add(store, "svc-a", 3)
    await store.change_batch_to_submitted(a[0].batch_header, "svc-a", dlt_status="Pending")
    await store.update_batch_status(a[0].batch_header, "svc-a", Committed())
    await store.update_batch_status(a[1].batch_header, "svc-a", Invalid())
    got = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    assert ids(got) == [a[2].batch_header]


@pytest.mark.parametrize("state", ["submitted", "pending", "unsubmitted-pending", "resubmitting"])
async def test_a_service_in_flight_is_locked(
    store: BatchTrackingStore, clock: ManualClock, state: str
) -> None:
    a = await add(store, "svc-a", 2)
    (b,) = await add(store, "svc-b")
    head = a[0].batch_header
    if state == "submitted":
        await store.change_batch_to_submitted(head, "svc-a")
    elif state == "pending":
        await store.change_batch_to_submitted(head, "svc-a", dlt_status="Pending")
    elif state == "unsubmitted-pending":
        await store.update_batch_status(head, "svc-a", Pending())
    else:
        await store.update_batch_status(head, "svc-a", Unknown())
        await store.change_batch_to_submitted(head, "svc-a")
    got = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    assert ids(got) == [b.batch_header]


async def test_unknown_is_resubmitted_first_and_alone(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    (fresh,) = await add(store, "svc-0")
    a = await add(store, "svc-a", 2)
    await store.change_batch_to_submitted(a[0].batch_header, "svc-a")
    await store.update_batch_status(a[0].batch_header, "svc-a", Unknown())
    got = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    assert ids(got) == [a[0].batch_header, fresh.batch_header]
    assert got[0].submitted is False and got[0].status_name == "Unknown"


async def test_delayed_waits_out_the_window_from_the_recorded_attempt(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    a = await add(store, "svc-a", 2)
    attempt = clock() + 500
    await store.change_batch_to_submitted(a[0].batch_header, "svc-a", now=clock())
    await store.update_batch_status(a[0].batch_header, "svc-a", Delayed(), now=attempt)
    assert await store.queue_round(now=attempt + WINDOW - 1, delay_window_ms=WINDOW) == []
    got = await store.queue_round(now=attempt + WINDOW, delay_window_ms=WINDOW)
    assert ids(got) == [a[0].batch_header]
    got = await store.queue_round(now=attempt + 1_000, delay_window_ms=1_000)
    assert ids(got) == [a[0].batch_header]


async def test_round_order_unknown_then_delayed_then_new(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    (n1,) = await add(store, "svc-n1")
    (d,) = await add(store, "svc-d")
    (u,) = await add(store, "svc-u")
    (n2,) = await add(store, "svc-n2")
    await store.update_batch_status(d.batch_header, "svc-d", Delayed(), now=0)
    await store.update_batch_status(u.batch_header, "svc-u", Unknown())
    got = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
    assert ids(got) == [u.batch_header, d.batch_header, n1.batch_header, n2.batch_header]
    got = await store.queue_round(now=clock(), delay_window_ms=WINDOW, limit=3)
    assert ids(got) == [u.batch_header, d.batch_header, n1.batch_header]


async def test_services_restricts_the_round(store: BatchTrackingStore, clock: ManualClock) -> None:
    (a,) = await add(store, "svc-a")
    await add(store, "svc-b")
    (c,) = await add(store, "svc-c")
    (d,) = await add(store, "svc-d")
    await store.update_batch_status(d.batch_header, "svc-d", Unknown())
    got = await store.queue_round(
        now=clock(), delay_window_ms=WINDOW, services=["svc-c", "svc-a", "svc-a", "nope", "svc-d"]
    )
    assert ids(got) == [d.batch_header, a.batch_header, c.batch_header]
    assert await store.queue_round(now=clock(), delay_window_ms=WINDOW, services=[]) == []
    got = await store.queue_round(now=clock(), delay_window_ms=WINDOW, services={"svc-c"}, limit=1)
    assert ids(got) == [c.batch_header]


async def test_a_claimant_restricts_the_round_to_its_claims(
    store: BatchTrackingStore, store_url: str, clock: ManualClock
) -> None:
    (a,) = await add(store, "svc-a")
    await add(store, "svc-b")
    (c,) = await add(store, "svc-c")
    (d,) = await add(store, "svc-d")
    await store.update_batch_status(d.batch_header, "svc-d", Unknown())
    if store.dialect != "postgresql":
        with pytest.raises(StoreError, match="no claims"):
            await store.queue_round(now=clock(), delay_window_ms=WINDOW, claimant="gw-1")
        return
    # The claims table says gw-1 holds a, c and d, gw-2 holds b.
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE service_id_claims SET claimant = CASE service_id WHEN 'svc-b' THEN 'gw-2'"
            " ELSE 'gw-1' END, epoch = 1, expiry_1 = 1, expiry_2 = 1, claimed_at = 1,"
            " unclaimed_since = NULL"
        )
    for narrow in (False, True):
        got = await store.queue_round(
            now=clock(), delay_window_ms=WINDOW, claimant="gw-1", narrow=narrow
        )
        listed = await store.queue_round(
            now=clock(), delay_window_ms=WINDOW, services=["svc-a", "svc-c", "svc-d"], narrow=narrow
        )
        assert ids(got) == ids(listed) == [d.batch_header, a.batch_header, c.batch_header]
        assert got == listed
    assert await store.queue_round(now=clock(), delay_window_ms=WINDOW, claimant="gw-9") == []
    with pytest.raises(StoreInputError, match="not both"):
        await store.queue_round(
            now=clock(), delay_window_ms=WINDOW, claimant="gw-1", services=["svc-a"]
        )


async def test_batches_posted_within_one_second_come_out_in_acceptance_order(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    # One add_batches call and several, all in the same second (and the same
    # millisecond): ids chosen so the seed's alphabetical tie-break would
    # reverse them.
    def named(n: int) -> TrackingBatch:
        return make_batch("svc-a", batch_id=f"{999 - n:03d}".ljust(128, "f"))

    accepted = await store.add_batches([named(n) for n in range(5)], now=clock())
    for n in range(5, 12):
        accepted += await store.add_batches([named(n)], now=clock())
    accepted += await store.add_batches([named(n) for n in range(12, 20)], now=clock())
    assert len({b.created_at for b in accepted}) == 1
    order = []
    for _ in accepted:
        (head,) = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
        order.append(head.batch_header)
        await store.change_batch_to_submitted(head.batch_header, "svc-a", dlt_status="Pending")
        assert await store.queue_round(now=clock(), delay_window_ms=WINDOW) == []
        await store.update_batch_status(head.batch_header, "svc-a", Committed())
    assert order == ids(accepted)
    assert order == sorted(order, reverse=True)
    assert await store.queue_round(now=clock(), delay_window_ms=WINDOW) == []


@pytest.mark.parametrize(("window", "limit"), [(-1, None), (0, 0), (0, -5)])
async def test_bad_arguments_are_refused(
    store: BatchTrackingStore, clock: ManualClock, window: int, limit: int | None
) -> None:
    with pytest.raises(StoreInputError):
        await store.queue_round(now=clock(), delay_window_ms=window, limit=limit)
