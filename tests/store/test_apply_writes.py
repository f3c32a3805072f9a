"""apply_writes: a group of pipeline writes in one transaction, each with its
own outcome — the same outcome its single call would have had."""

from __future__ import annotations

import pytest

from ledgerq.errors import BatchNotFoundError, StatusTransitionError, StoreInputError
from ledgerq.model import (
    BatchStatusName,
    Committed,
    Delayed,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    Unknown,
)
from ledgerq.store import BatchTrackingStore, BatchWrite

from .conftest import make_batch

NOW = 1_700_000_000_000


async def test_each_write_lands_as_its_single_call_would(store: BatchTrackingStore) -> None:
    a, b, c = await store.add_batches([make_batch("s1"), make_batch("s1"), make_batch("s2")])
    tx = c.transactions[0].transaction_header
    results = await store.apply_writes(
        [
            BatchWrite("s1", a.batch_id, attempt=True, now=NOW),
            BatchWrite("s1", a.batch_id, Pending(), now=NOW + 1),
            BatchWrite(
                "s1",
                b.batch_id,
                BatchStatusName.DELAYED,
                submission_error=SubmissionError("busy", "503 after 5 attempts"),
                attempt=True,
                now=NOW + 2,
            ),
            BatchWrite("s2", c.batch_id, Invalid((InvalidTransaction(tx, "bad"),)), now=NOW + 3),
        ]
    )
    assert results == [None, None, None, None]
    got_a = await store.get_batch(a.batch_id, "s1")
    assert got_a is not None
    assert (got_a.submitted, got_a.status_name, got_a.attempts) == (
        True,
        BatchStatusName.PENDING,
        1,
    )
    got_b = await store.get_batch(b.batch_id, "s1")
    assert got_b is not None
    assert got_b.batch_status == Delayed()
    assert (got_b.submitted, got_b.last_attempt_at) == (False, NOW + 2)
    assert got_b.submission_error == SubmissionError("busy", "503 after 5 attempts")
    got_c = await store.get_batch(c.batch_id, "s2")
    assert got_c is not None and got_c.status_name is BatchStatusName.INVALID


async def test_a_refused_write_changes_nothing_and_the_others_land(
    store: BatchTrackingStore,
) -> None:
    done, fine = await store.add_batches([make_batch("s1"), make_batch("s1")])
    await store.update_batch_status(done.batch_id, "s1", Committed())
    results = await store.apply_writes(
        [
            BatchWrite("s1", done.batch_id, Pending()),  # final already
            BatchWrite("s1", "f" * 128, Pending()),  # not tracked
            BatchWrite("s1", fine.batch_id, attempt=True, now=NOW),
            BatchWrite("s1", done.batch_id, attempt=True),  # never resubmitted
            BatchWrite("s1", fine.batch_id, BatchStatusName.PENDING),  # a name, no details
        ]
    )
    assert isinstance(results[0], StatusTransitionError)
    assert isinstance(results[1], BatchNotFoundError)
    assert results[2] is None
    assert isinstance(results[3], StatusTransitionError)
    assert isinstance(results[4], StoreInputError)
    got_done = await store.get_batch(done.batch_id, "s1")
    assert got_done is not None
    assert (got_done.status_name, got_done.attempts) == (BatchStatusName.COMMITTED, 0)
    got_fine = await store.get_batch(fine.batch_id, "s1")
    assert got_fine is not None
    assert (got_fine.submitted, got_fine.attempts, got_fine.status_name) == (True, 1, None)


async def test_an_empty_group_touches_nothing(store: BatchTrackingStore) -> None:
    assert await store.apply_writes([]) == []


@pytest.mark.parametrize("order", ["attempt-first", "status-first"])
async def test_writes_of_one_batch_apply_in_their_order(
    store: BatchTrackingStore, order: str
) -> None:
    (a,) = await store.add_batches([make_batch("s1")])
    attempt = BatchWrite("s1", a.batch_id, attempt=True, now=NOW)
    committed = BatchWrite("s1", a.batch_id, Committed(), now=NOW + 1)
    writes = [attempt, committed] if order == "attempt-first" else [committed, attempt]
    results = await store.apply_writes(writes)
    if order == "attempt-first":
        assert results == [None, None]
    else:
        # Committed first: the attempt after it is refused, as a final batch
        # is never submitted again.
        assert results[0] is None and isinstance(results[1], StatusTransitionError)
    got = await store.get_batch(a.batch_id, "s1")
    assert got is not None and got.status_name is BatchStatusName.COMMITTED


async def test_list_in_flight_holds_every_batch_taken_but_unanswered(
    store: BatchTrackingStore,
) -> None:
    """Pending, and submitted without an answer: first attempts and
    resubmissions after Unknown or Delayed (a submitter that died there
    leaves them so); not waiting, final or Delayed-and-waiting batches."""
    (
        first,
        pending,
        delayed,
        resent_delayed,
        resent_unknown,
        done,
        waiting,
    ) = await store.add_batches([make_batch(f"s{i}") for i in range(7)])
    await store.change_batch_to_submitted(first.batch_id, "s0", now=NOW)
    await store.change_batch_to_submitted(pending.batch_id, "s1", now=NOW)
    await store.update_batch_status(pending.batch_id, "s1", Pending())
    await store.change_batch_to_submitted(delayed.batch_id, "s2", None, "Delayed", now=NOW)
    await store.change_batch_to_submitted(resent_delayed.batch_id, "s3", None, "Delayed", now=NOW)
    await store.change_batch_to_submitted(resent_delayed.batch_id, "s3", now=NOW + 1)
    await store.update_batch_status(resent_unknown.batch_id, "s4", Unknown())
    await store.change_batch_to_submitted(resent_unknown.batch_id, "s4", now=NOW + 2)
    await store.update_batch_status(done.batch_id, "s5", Committed())
    got = await store.list_in_flight()
    assert [(b.service_id, b.status_name, b.submitted) for b in got] == [
        ("s0", None, True),
        ("s1", BatchStatusName.PENDING, True),
        ("s3", BatchStatusName.DELAYED, True),
        ("s4", BatchStatusName.UNKNOWN, True),
    ]
    assert waiting.batch_id not in {b.batch_id for b in got}
