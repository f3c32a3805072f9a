"""The store contract: every backend (memory, SQLite, PostgreSQL) passes it unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from ledgerq.clock import ManualClock
from ledgerq.errors import (
    BatchNotFoundError,
    DuplicateBatchError,
    StatusTransitionError,
    StoreInputError,
)
from ledgerq.model import (
    MAX_SERVICE_ID_LENGTH,
    NO_SERVICE,
    BatchStatusName,
    Committed,
    Delayed,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TransactionReceipt,
    Unknown,
    Valid,
    ValidTransaction,
)
from ledgerq.store import BatchTrackingStore, BatchWrite

from .conftest import make_batch

SVC = "circuit-1::svc1"


async def test_add_then_get_round_trips_every_field(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    batch = dataclasses.replace(make_batch(SVC, txns=3, data_change_id="order-17"), trace=True)
    [added] = await store.add_batches([batch])
    got = await store.get_batch(batch.batch_header, SVC)
    assert got is not None
    assert got == added
    assert got.seq is not None and got.seq >= 1
    assert got.created_at == clock.value  # 0 means "now"
    assert got.transactions == batch.transactions  # order kept
    assert got.trace is True
    assert got.serialized_batch == batch.serialized_batch
    assert (got.submitted, got.batch_status, got.submission_error) == (False, None, None)
    assert (got.attempts, got.last_attempt_at) == (0, None)


async def test_get_by_data_change_id_takes_the_dc_prefix(store: BatchTrackingStore) -> None:
    batch = make_batch(SVC, data_change_id="order-17")
    await store.add_batches([batch])
    by_dc = await store.get_batch("dc:order-17", SVC)
    assert by_dc is not None and by_dc.batch_header == batch.batch_header
    # Without the prefix the id is a batch id, and no batch has that id.
    assert await store.get_batch("order-17", SVC) is None
    assert await store.get_batch("dc:order-17", "other::svc") is None


async def test_unknown_ids_read_as_none(store: BatchTrackingStore) -> None:
    assert await store.get_batch("ff" * 64, SVC) is None
    assert await store.get_batch_status("ff" * 64, SVC) is None
    assert await store.get_batch("dc:nothing", SVC) is None


async def test_seq_follows_list_order_and_grows_across_calls(store: BatchTrackingStore) -> None:
    # Ids deliberately out of alphabetical order: seq follows the list, not the id.
    first = [make_batch(SVC, batch_id=f"{i:02x}" * 64) for i in (9, 3, 7, 1, 5)]
    added = await store.add_batches(first)
    seqs = [b.seq for b in added]
    assert all(s is not None for s in seqs)
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    [later] = await store.add_batches([make_batch(SVC)])
    assert later.seq is not None and later.seq > max(s for s in seqs if s is not None)
    listed = await store.list_batches(service_id=SVC)
    assert [b.batch_header for b in listed] == [b.batch_header for b in [*first, later]]


async def test_explicit_created_at_is_kept(store: BatchTrackingStore) -> None:
    [added] = await store.add_batches([make_batch(SVC, created_at=1234)])
    got = await store.get_batch(added.batch_header, SVC)
    assert got is not None and got.created_at == 1234


async def test_empty_add_is_a_no_op(store: BatchTrackingStore) -> None:
    assert await store.add_batches([]) == []
    assert await store.status_counts() == {}


# -- duplicates ---------------------------------------------------------------


async def test_duplicate_batch_id_is_refused_and_nothing_is_added(
    store: BatchTrackingStore,
) -> None:
    old = make_batch(SVC)
    await store.add_batches([old])
    fresh = make_batch(SVC)
    again = dataclasses.replace(make_batch(SVC), batch_header=old.batch_header)
    with pytest.raises(DuplicateBatchError) as info:
        await store.add_batches([fresh, again])
    assert info.value.batch_id == old.batch_header
    assert old.batch_header in str(info.value)
    assert await store.get_batch(fresh.batch_header, SVC) is None
    assert await store.status_counts() == {"none": 1}


async def test_a_batch_id_belongs_to_one_service(store: BatchTrackingStore) -> None:
    a = make_batch(SVC)
    await store.add_batches([a])
    b = make_batch("circuit-2::svc2", batch_id=a.batch_header)
    with pytest.raises(DuplicateBatchError) as info:
        await store.add_batches([b])
    # The refusal names the service that tracks it.
    assert info.value.service_id == SVC
    assert SVC in str(info.value) and "circuit-2::svc2" in str(info.value)
    assert await store.get_batch(a.batch_header, "circuit-2::svc2") is None
    with pytest.raises(DuplicateBatchError):
        await store.add_batches([make_batch("circuit-3::svc3", batch_id="f" * 128), b])
    assert await store.status_counts() == {"none": 1}


async def test_get_batches_by_id_finds_them_whatever_their_service(
    store: BatchTrackingStore,
) -> None:
    a, b = make_batch(SVC), make_batch("circuit-2::svc2")
    await store.add_batches([a])
    await store.add_batches([b])
    found = await store.get_batches_by_id([b.batch_header, "0" * 128, a.batch_header])
    assert [(x.batch_id, x.service_id) for x in found] == [
        (a.batch_header, SVC),
        (b.batch_header, "circuit-2::svc2"),
    ]
    assert found[0].serialized_batch == a.serialized_batch
    assert found[0].transactions == a.transactions
    assert await store.get_batches_by_id([]) == []


async def test_duplicate_data_change_id_is_refused(store: BatchTrackingStore) -> None:
    await store.add_batches([make_batch(SVC, data_change_id="dc-1")])
    other = make_batch(SVC, data_change_id="dc-1")
    with pytest.raises(DuplicateBatchError) as info:
        await store.add_batches([other])
    assert info.value.data_change_id == "dc-1"
    assert "dc-1" in str(info.value)
    assert await store.get_batch(other.batch_header, SVC) is None
    # Data change ids are unique per service.
    await store.add_batches([make_batch("circuit-2::svc2", data_change_id="dc-1")])


async def test_duplicate_transaction_id_is_refused(store: BatchTrackingStore) -> None:
    old = make_batch(SVC)
    await store.add_batches([old])
    clash = dataclasses.replace(make_batch(SVC), transactions=old.transactions)
    with pytest.raises(DuplicateBatchError) as info:
        await store.add_batches([clash])
    assert info.value.transaction_id == old.transactions[0].transaction_header
    assert await store.get_batch(clash.batch_header, SVC) is None


@pytest.mark.parametrize("what", ["batch", "data_change", "transaction"])
async def test_duplicates_inside_one_call_are_refused(store: BatchTrackingStore, what: str) -> None:
    a = make_batch(SVC, data_change_id="x")
    if what == "batch":
        b = dataclasses.replace(make_batch(SVC), batch_header=a.batch_header)
    elif what == "data_change":
        b = make_batch(SVC, data_change_id="x")
    else:
        b = dataclasses.replace(make_batch(SVC), transactions=a.transactions)
    with pytest.raises(DuplicateBatchError):
        await store.add_batches([a, b])
    assert await store.status_counts() == {}


# -- bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"service_id": "s" * (MAX_SERVICE_ID_LENGTH + 1)}, "service_id"),
        ({"service_id": ""}, "service_id"),
        ({"transactions": ()}, "at least one transaction"),
        ({"batch_header": ""}, "batch_header"),
        ({"batch_header": "a" * 129}, "batch_header"),
        ({"data_change_id": "d" * 257}, "data_change_id"),
        ({"submitted": True}, "new batches only"),
        ({"batch_status": Pending()}, "new batches only"),
        ({"created_at": -1}, "created_at"),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_added(
    store: BatchTrackingStore, change: dict[str, object], message: str
) -> None:
    good = make_batch(SVC)
    bad = dataclasses.replace(make_batch(SVC), **change)  # type: ignore[arg-type]
    with pytest.raises(StoreInputError, match=message):
        await store.add_batches([good, bad])
    assert await store.status_counts() == {}


async def test_transaction_of_another_service_is_refused(store: BatchTrackingStore) -> None:
    batch = make_batch(SVC)
    txn = dataclasses.replace(batch.transactions[0], service_id="other::svc")
    with pytest.raises(StoreInputError, match="must match"):
        await store.add_batches([dataclasses.replace(batch, transactions=(txn,))])


async def test_longest_service_id_and_no_service_sentinel_are_accepted(
    store: BatchTrackingStore,
) -> None:
    longest = "s" * MAX_SERVICE_ID_LENGTH
    await store.add_batches([make_batch(longest), make_batch(NO_SERVICE)])
    services = [s.service_id for s in await store.list_services()]
    assert services == sorted([longest, NO_SERVICE])


# -- submission and status ----------------------------------------------------


async def test_change_to_submitted_records_the_attempt(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    clock.advance(500)
    await store.change_batch_to_submitted(b.batch_header, SVC)
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None
    assert (got.submitted, got.attempts, got.last_attempt_at) == (True, 1, clock.value)
    assert got.batch_status is None
    await store.change_batch_to_submitted(b.batch_header, SVC, now=clock.value + 7)
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None and (got.attempts, got.last_attempt_at) == (2, clock.value + 7)


async def test_change_to_submitted_by_data_change_id_with_status(
    store: BatchTrackingStore,
) -> None:
    await store.add_batches([make_batch(SVC, data_change_id="dc-9")])
    await store.change_batch_to_submitted("dc:dc-9", SVC, dlt_status="Pending")
    got = await store.get_batch("dc:dc-9", SVC)
    assert got is not None and got.submitted and got.batch_status == Pending()


@pytest.mark.parametrize("status", ["Delayed", "Unknown"])
async def test_submitted_with_delayed_or_unknown_is_not_in_flight(
    store: BatchTrackingStore, clock: ManualClock, status: str
) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    error = SubmissionError("busy", "503 after 3 retries")
    await store.change_batch_to_submitted(
        b.batch_header, SVC, dlt_status=status, submission_error=error, now=clock.value + 50
    )
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None
    assert got.submitted is False
    assert got.status_name == BatchStatusName(status)
    assert got.submission_error == error
    assert (got.attempts, got.last_attempt_at) == (1, clock.value + 50)


async def test_new_attempt_replaces_the_previous_attempts_error(
    store: BatchTrackingStore,
) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    await store.change_batch_to_submitted(
        b.batch_header, SVC, dlt_status="Delayed", submission_error=SubmissionError("busy", "503")
    )
    await store.change_batch_to_submitted(b.batch_header, SVC)
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None and got.submission_error is None and got.submitted


async def test_unknown_clears_submitted(store: BatchTrackingStore) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    await store.change_batch_to_submitted(b.batch_header, SVC)
    await store.update_batch_status(b.batch_header, SVC, Pending())
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None and got.submitted and got.batch_status == Pending()
    await store.update_batch_status(b.batch_header, SVC, Unknown())
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None and not got.submitted and got.batch_status == Unknown()


async def test_delayed_starts_the_delay_window(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    await store.change_batch_to_submitted(b.batch_header, SVC, now=clock.value)
    await store.update_batch_status(
        b.batch_header,
        SVC,
        Delayed(),
        submission_error=SubmissionError("busy", "429"),
        now=clock.value + 3_000,
    )
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None
    assert (got.submitted, got.last_attempt_at, got.attempts) == (False, clock.value + 3_000, 1)
    assert got.submission_error == SubmissionError("busy", "429")


async def test_committed_lists_every_transaction_in_order(store: BatchTrackingStore) -> None:
    batch = make_batch(SVC, txns=3)
    await store.add_batches([batch])
    ids = [t.transaction_header for t in batch.transactions]
    receipts = [TransactionReceipt(t, True, serialized_receipt=b"r" + t.encode()) for t in ids]
    await store.change_batch_to_submitted(batch.batch_header, SVC)
    await store.update_batch_status(
        batch.batch_header, SVC, Committed(tuple(ValidTransaction(t) for t in ids)), receipts
    )
    expected = Committed(tuple(ValidTransaction(t) for t in ids))
    assert await store.get_batch_status(batch.batch_header, SVC) == expected
    got = await store.get_batch(batch.batch_header, SVC)
    assert got is not None and got.is_final and got.submitted


async def test_invalid_keeps_the_failed_transactions(store: BatchTrackingStore) -> None:
    batch = make_batch(SVC, txns=3, data_change_id="d")
    await store.add_batches([batch])
    t0, t1, t2 = (t.transaction_header for t in batch.transactions)
    bad = InvalidTransaction(
        t1,
        error_message="Verb must be set, inc, or dec",
        error_data=b"\x01\x02",
        external_error_status=None,
        external_error_message=None,
    )
    external = InvalidTransaction(
        t2, external_error_status="404", external_error_message="Not Found"
    )
    # A receipt passed alongside wins over the status's own details.
    receipt = TransactionReceipt(
        t2, False, error_message=None, external_status="404", external_error_message="Not Found"
    )
    await store.update_batch_status("dc:d", SVC, Invalid((bad, external)), [receipt])
    assert await store.get_batch_status("dc:d", SVC) == Invalid((bad, external))
    assert t0  # the valid one is not listed


async def test_status_none_records_only_receipts_and_error(store: BatchTrackingStore) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    await store.update_batch_status(
        b.batch_header, SVC, None, submission_error=SubmissionError("http", "404 Not Found")
    )
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None and got.batch_status is None
    assert got.submission_error == SubmissionError("http", "404 Not Found")


async def test_final_status_is_final(store: BatchTrackingStore) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    await store.update_batch_status(b.batch_header, SVC, Valid())
    with pytest.raises(StatusTransitionError, match="final"):
        await store.update_batch_status(b.batch_header, SVC, Unknown())
    with pytest.raises(StatusTransitionError, match="never submitted again"):
        await store.change_batch_to_submitted(b.batch_header, SVC)
    # final → final is a ledger refining its answer (Valid, then Committed).
    await store.update_batch_status(b.batch_header, SVC, Committed())
    got = await store.get_batch(b.batch_header, SVC)
    assert got is not None and got.status_name is BatchStatusName.COMMITTED
    assert got.attempts == 0


async def test_writes_to_unknown_batches_raise_not_found(store: BatchTrackingStore) -> None:
    with pytest.raises(BatchNotFoundError, match="dc:"):
        await store.update_batch_status("ab" * 64, SVC, Pending())
    with pytest.raises(BatchNotFoundError):
        await store.change_batch_to_submitted("dc:missing", SVC)


async def test_unknown_status_name_is_refused(store: BatchTrackingStore) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    with pytest.raises(StoreInputError, match="unknown batch status"):
        await store.change_batch_to_submitted(b.batch_header, SVC, dlt_status="Lost")


# -- listings -----------------------------------------------------------------


async def _lifecycle(store: BatchTrackingStore) -> dict[str, str]:
    """One batch in each state; returns state name → batch id."""
    names = ["new", "inflight", "pending", "unknown", "delayed", "invalid", "committed", "failed"]
    added = await store.add_batches([make_batch(SVC) for _ in names])
    ids = {n: b.batch_header for n, b in zip(names, added, strict=True)}
    for n in names[1:]:
        await store.change_batch_to_submitted(ids[n], SVC)
    await store.update_batch_status(ids["pending"], SVC, Pending())
    await store.update_batch_status(ids["unknown"], SVC, Unknown())
    await store.update_batch_status(
        ids["delayed"], SVC, Delayed(), submission_error=SubmissionError("busy", "503")
    )
    await store.update_batch_status(ids["invalid"], SVC, Invalid())
    await store.update_batch_status(ids["committed"], SVC, Committed())
    await store.update_batch_status(
        ids["failed"], SVC, None, submission_error=SubmissionError("http", "404")
    )
    return ids


async def test_listings_select_by_state(store: BatchTrackingStore) -> None:
    ids = await _lifecycle(store)

    def names(batches: object) -> set[str]:
        inverse = {v: k for k, v in ids.items()}
        return {inverse[b.batch_header] for b in batches}  # type: ignore[attr-defined]

    assert names(await store.list_batches_by_status(BatchStatusName.PENDING)) == {"pending"}
    assert names(await store.list_batches_by_status(Committed())) == {"committed"}
    assert names(await store.get_unsubmitted_batches()) == {"new", "unknown", "delayed"}
    assert names(await store.get_failed_batches()) == {"invalid", "delayed", "failed"}
    assert await store.status_counts() == {
        "none": 3,
        "Pending": 1,
        "Unknown": 1,
        "Delayed": 1,
        "Invalid": 1,
        "Committed": 1,
    }
    assert names(await store.list_batches(status="none")) == {"new", "inflight", "failed"}
    assert names(await store.list_batches(status=BatchStatusName.UNKNOWN)) == {"unknown"}


async def test_list_batches_pages_by_seq(store: BatchTrackingStore) -> None:
    mine = await store.add_batches([make_batch(SVC) for _ in range(5)])
    await store.add_batches([make_batch("other::svc") for _ in range(3)])
    page1 = await store.list_batches(service_id=SVC, limit=2)
    page2 = await store.list_batches(service_id=SVC, limit=2, after_seq=page1.batches[-1].seq)
    page3 = await store.list_batches(service_id=SVC, limit=2, after_seq=page2.batches[-1].seq)
    assert [b.batch_header for b in (*page1, *page2, *page3)] == [b.batch_header for b in mine]
    assert len(await store.list_batches(limit=100)) == 8
    await store.update_batch_status(mine[1].batch_header, SVC, Pending())
    await store.update_batch_status(mine[3].batch_header, SVC, Pending())
    pending = await store.list_batches(service_id=SVC, status=BatchStatusName.PENDING, limit=1)
    assert [b.batch_header for b in pending] == [mine[1].batch_header]
    later = await store.list_batches(
        service_id=SVC, status="Pending", after_seq=pending.batches[0].seq
    )
    assert [b.batch_header for b in later] == [mine[3].batch_header]
    fresh = await store.list_batches(service_id="other::svc", status="none")
    assert len(fresh) == 3
    assert len(await store.list_batches(service_id=SVC, status="none")) == 3
    with pytest.raises(StoreInputError):
        await store.list_batches(limit=0)


async def test_list_services_reports_depth_head_and_in_flight(store: BatchTrackingStore) -> None:
    a = await store.add_batches([make_batch("a::1") for _ in range(3)])
    await store.add_batches([make_batch("b::2")])
    await store.update_batch_status(a[0].batch_header, "a::1", Committed())
    await store.change_batch_to_submitted(a[1].batch_header, "a::1")
    services = {s.service_id: s for s in await store.list_services()}
    sa = services["a::1"]
    assert (sa.queue_depth, sa.total) == (2, 3)
    assert sa.head_batch_id == a[1].batch_header
    assert sa.in_flight_batch_id == a[1].batch_header
    assert services["b::2"].in_flight_batch_id is None
    after = await store.list_services(after="a::1")
    assert [s.service_id for s in after] == ["b::2"]
    # One service by its id (what GET /services/{id} reads).
    assert await store.list_services(service_id="a::1") == [sa]
    assert await store.list_services(service_id="b::2", limit=1) == [services["b::2"]]
    assert await store.list_services(service_id="a::") == []
    assert await store.list_services(service_id="a::1", after="a::1") == []


# -- clean-up -----------------------------------------------------------------


async def test_clean_stale_records_deletes_only_old_final_batches(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    t0 = clock.value
    old_done, old_open, new_done = await store.add_batches([make_batch(SVC) for _ in range(3)])
    receipt = TransactionReceipt(old_done.transactions[0].transaction_header, True)
    await store.update_batch_status(old_done.batch_header, SVC, Committed(), [receipt], now=t0 + 10)
    await store.update_batch_status(old_open.batch_header, SVC, Pending(), now=t0 + 10)
    await store.update_batch_status(new_done.batch_header, SVC, Invalid(), now=t0 + 1_000)
    foreign = TransactionReceipt("ee" * 64, True)
    await store.update_batch_status(new_done.batch_header, SVC, None, [foreign], now=t0 + 10)

    assert await store.clean_stale_records(t0 + 500) == 1
    assert await store.get_batch(old_done.batch_header, SVC) is None
    assert await store.get_batch(old_open.batch_header, SVC) is not None
    assert await store.get_batch(new_done.batch_header, SVC) is not None
    # The freed ids can be tracked again, with a seq that never goes back.
    again = dataclasses.replace(
        make_batch(SVC), batch_header=old_done.batch_header, transactions=old_done.transactions
    )
    [re_added] = await store.add_batches([again])
    assert re_added.seq is not None and new_done.seq is not None
    assert re_added.seq > new_done.seq
    assert await store.get_batch_status(re_added.batch_header, SVC) is None
    assert await store.clean_stale_records(t0 + 10_000) == 1  # new_done; old_open stays
    assert await store.get_batch(old_open.batch_header, SVC) is not None


async def test_status_written_twice_in_one_millisecond_keeps_the_injected_clock(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    [b] = await store.add_batches([make_batch(SVC)])
    await store.update_batch_status(b.batch_header, SVC, Pending(), now=clock.value)
    await store.update_batch_status(b.batch_header, SVC, Committed(), now=clock.value)
    # Recorded at (about) clock.value, not at the database's wall clock.
    assert await store.clean_stale_records(clock.value + 1_000) == 1


async def test_a_final_status_reported_again_is_not_written_again(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    # The ledger may answer COMMITTED for one batch more than once: the
    # status stays as the first answer wrote it, and retention counts from it.
    t0 = clock.value
    a, b = await store.add_batches([make_batch(SVC) for _ in range(2)])
    await store.apply_writes([BatchWrite(SVC, a.batch_header, Committed(), now=t0 + 10)])
    await store.update_batch_status(b.batch_header, SVC, Invalid(), now=t0 + 10)
    results = await store.apply_writes(
        [
            BatchWrite(SVC, a.batch_header, Committed(), now=t0 + 5_000),
            BatchWrite(SVC, b.batch_header, Invalid(), now=t0 + 5_000),
        ]
    )
    assert results == [None, None]
    await store.update_batch_status(a.batch_header, SVC, Committed(), now=t0 + 6_000)
    got = await store.get_batch(a.batch_header, SVC)
    assert got is not None and got.status_name is BatchStatusName.COMMITTED
    assert await store.clean_stale_records(t0 + 1_000) == 2


async def test_status_reads_are_the_batches_without_their_transactions(
    store: BatchTrackingStore,
) -> None:
    pending = make_batch(SVC, txns=2)
    invalid = make_batch(SVC, txns=2)
    await store.add_batches([pending, invalid])
    bad = InvalidTransaction(
        invalid.transactions[1].transaction_header,
        error_message="Verb must be set, inc, or dec",
        error_data=b"\x01",
        external_error_status=None,
        external_error_message=None,
    )
    await store.update_batch_status(invalid.batch_header, SVC, Invalid((bad,)))
    ids = [pending.batch_header, invalid.batch_header, "f" * 128]
    full = {b.batch_header: b for b in await store.get_batches_by_id(ids)}
    narrow = {b.batch_header: b for b in await store.get_batch_statuses_by_id(ids)}
    assert narrow.keys() == full.keys() == {pending.batch_header, invalid.batch_header}
    for batch_id, batch in narrow.items():
        assert batch.batch_status == full[batch_id].batch_status
        assert (batch.service_id, batch.submitted) == (SVC, False)
        # The body may be left out (the SQL stores do), never altered.
        assert batch.serialized_batch in (b"", full[batch_id].serialized_batch)
    assert narrow[invalid.batch_header].batch_status == Invalid((bad,))
    assert await store.get_batch_statuses_by_id([]) == []


async def test_final_status_reads_leave_out_the_batches_not_final(
    store: BatchTrackingStore,
) -> None:
    """The parked status requests' refresher reads only the final batches:
    every final state in, every other state (and unknown ids) out."""
    made = {
        name: make_batch(SVC)
        for name in ("new", "pending", "unknown", "valid", "committed", "invalid")
    }
    await store.add_batches(list(made.values()))
    ids = {name: b.batch_header for name, b in made.items()}
    await store.update_batch_status(ids["pending"], SVC, Pending())
    await store.update_batch_status(ids["unknown"], SVC, Unknown())
    await store.update_batch_status(ids["valid"], SVC, Valid())
    await store.update_batch_status(ids["committed"], SVC, Committed())
    await store.update_batch_status(ids["invalid"], SVC, Invalid())
    asked = [*ids.values(), "f" * 128]
    final = await store.get_final_batch_statuses_by_id(asked)
    by_id = {b.batch_header: b for b in final}
    assert by_id.keys() == {ids["valid"], ids["committed"], ids["invalid"]}
    every = {b.batch_header: b for b in await store.get_batch_statuses_by_id(asked)}
    for batch_id, batch in by_id.items():
        assert batch.batch_status == every[batch_id].batch_status
        assert batch.service_id == SVC
    assert await store.get_final_batch_statuses_by_id([]) == []


async def test_in_flight_batches_of_some_services(store: BatchTrackingStore) -> None:
    a1, _a2, b1, c1 = await store.add_batches(
        [make_batch("a"), make_batch("a"), make_batch("b"), make_batch("c")]
    )
    for b in (a1, b1, c1):
        await store.apply_writes([BatchWrite(b.service_id, b.batch_header, attempt=True)])
    await store.update_batch_status(c1.batch_header, "c", Committed())
    got = await store.list_in_flight(services=["a", "c", "z"])
    assert [b.batch_header for b in got] == [a1.batch_header]
    assert await store.list_in_flight(services=[]) == []
    everything = await store.list_in_flight()
    assert [b.batch_header for b in everything] == [a1.batch_header, b1.batch_header]
    with pytest.raises(StoreInputError):
        await store.list_in_flight(services=[""])
