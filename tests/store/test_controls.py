"""Operator control of a service and declared dependencies: the store's contract,
run unchanged on memory, SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses

import pytest

from ledgerq.clock import ManualClock
from ledgerq.errors import (
    BatchNotFoundError,
    ControlRefusedError,
    ServiceNotFoundError,
    StatusTransitionError,
)
from ledgerq.model import (
    DEPENDENCY,
    BatchStatusName,
    BatchWrite,
    Committed,
    Delayed,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TrackingBatch,
    TrackingTransaction,
)
from ledgerq.store import BatchTrackingStore
from ledgerq.store.base import DependencyPath

from .conftest import make_batch

SVC = "circuit-1::svc1"


async def _write(store: BatchTrackingStore, write: BatchWrite) -> None:
    [error] = await store.apply_writes([write])
    if error is not None:
        raise error


async def test_a_paused_service_takes_nothing_new_and_resumes(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    a, b = await store.add_batches([make_batch(SVC), make_batch(SVC)])
    await _write(store, BatchWrite(SVC, a.batch_id, attempt=True))
    done = await store.control_service(SVC, "pause", actor="ops")
    assert (done.action, done.actor, done.at, done.detail) == ("pause", "ops", clock.value, None)
    assert (await store.service_controls())[SVC].paused
    # What is in flight is followed to its end: its outcomes land.
    await _write(store, BatchWrite(SVC, a.batch_id, Pending()))
    await _write(store, BatchWrite(SVC, a.batch_id, Committed()))
    # Nothing new is taken: the take is refused, nothing written.
    with pytest.raises(StatusTransitionError, match="paused or halted"):
        await _write(store, BatchWrite(SVC, b.batch_id, attempt=True))
    got = await store.get_batch(b.batch_id, SVC)
    assert got is not None and not got.submitted and got.attempts == 0
    # Pausing again changes nothing but is said so; resuming lets takes in.
    again = await store.control_service(SVC, "pause", actor="ops")
    assert again.detail == "already paused"
    await store.control_service(SVC, "resume", actor="ops")
    assert await store.service_controls() == {}
    await _write(store, BatchWrite(SVC, b.batch_id, attempt=True))
    history = await store.service_actions(SVC)
    assert [h.action for h in history] == ["resume", "pause", "pause"]  # newest first
    assert [h.action for h in await store.service_actions(SVC, before=history[0].id)] == [
        "pause",
        "pause",
    ]


async def test_an_invalid_status_written_with_halt_halts_its_service(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    a, b = await store.add_batches([make_batch(SVC), make_batch(SVC)])
    await _write(store, BatchWrite(SVC, a.batch_id, attempt=True))
    tid = a.transactions[0].transaction_header
    invalid = Invalid((InvalidTransaction(tid, error_message="no such key"),))
    await _write(store, BatchWrite(SVC, a.batch_id, invalid, halt="no such key"))
    control = (await store.service_controls([SVC]))[SVC]
    assert (control.halted_batch_id, control.halted_reason, control.halted_at) == (
        a.batch_id,
        "no such key",
        clock.value,
    )
    assert control.stopped and not control.paused
    with pytest.raises(StatusTransitionError):
        await _write(store, BatchWrite(SVC, b.batch_id, attempt=True))
    [halt] = await store.service_actions(SVC)
    assert (halt.action, halt.actor, halt.batch_ids) == ("halt", "gateway", (a.batch_id,))
    # Resuming is refused (it is not paused); skipping needs the halted batch.
    with pytest.raises(ControlRefusedError, match="halted at batch"):
        await store.control_service(SVC, "resume", actor="ops")
    with pytest.raises(ControlRefusedError, match="name that batch"):
        await store.control_service(SVC, "skip", actor="ops", batch_ids=[b.batch_id])
    skipped = await store.control_service(SVC, "skip", actor="ops", batch_ids=[a.batch_id])
    assert skipped.detail == f"resumed past invalid batch {a.batch_id}"
    assert await store.service_controls() == {}
    await _write(store, BatchWrite(SVC, b.batch_id, attempt=True))
    with pytest.raises(ControlRefusedError, match="not halted"):
        await store.control_service(SVC, "skip", actor="ops", batch_ids=[a.batch_id])


async def test_list_services_says_what_stops_a_service(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    a, b = await store.add_batches([make_batch(SVC), make_batch(SVC)])
    await store.add_batches([make_batch("other::svc")])
    for s in await store.list_services():
        assert (s.paused, s.paused_by, s.paused_at) == (False, None, None)
        assert (s.halted_batch_id, s.halted_reason, s.halted_at) == (None, None, None)
        assert s.next_waits_for is None
    paused_at = clock.value
    await store.control_service(SVC, "pause", actor="alice")
    clock.advance(1000)
    await store.control_service(SVC, "pause", actor="bob")  # already paused: alice's stands
    [s, other] = await store.list_services()
    assert (s.paused, s.paused_by, s.paused_at) == (True, "alice", paused_at)
    assert not other.paused
    await store.control_service(SVC, "resume", actor="bob")
    [s] = await store.list_services(service_id=SVC)
    assert (s.paused, s.paused_by, s.paused_at) == (False, None, None)
    # Halted at a, which the ledger judged Invalid.
    await _write(store, BatchWrite(SVC, a.batch_id, attempt=True))
    tid = a.transactions[0].transaction_header
    invalid = Invalid((InvalidTransaction(tid, error_message="no such key"),))
    halted_at = clock.advance(1000)
    await _write(store, BatchWrite(SVC, a.batch_id, invalid, halt="no such key"))
    [s] = await store.list_services(service_id=SVC)
    assert (s.halted_batch_id, s.halted_reason, s.halted_at) == (
        a.batch_id,
        "no such key",
        halted_at,
    )
    await store.control_service(SVC, "skip", actor="bob", batch_ids=[a.batch_id])
    # The next batch waits for a declared dependency: what it waits for, until taken.
    waits = "waits for transaction " + "ab" * 64 + ", not seen on the ledger"
    await _write(store, BatchWrite(SVC, b.batch_id, None, (), SubmissionError(DEPENDENCY, waits)))
    [s, other] = await store.list_services()
    assert (s.halted_batch_id, s.halted_reason, s.halted_at) == (None, None, None)
    assert (s.next_batch_id, s.next_waits_for) == (b.batch_id, waits)
    assert other.next_waits_for is None
    await _write(store, BatchWrite(SVC, b.batch_id, attempt=True))
    [s] = await store.list_services(service_id=SVC)
    assert s.next_waits_for is None


async def test_a_halt_is_written_only_with_an_invalid_status(store: BatchTrackingStore) -> None:
    [a] = await store.add_batches([make_batch(SVC)])
    await _write(store, BatchWrite(SVC, a.batch_id, Committed(), halt="ignored"))
    assert await store.service_controls([SVC]) == {}


async def test_only_batches_that_cannot_be_on_the_ledger_are_cancelled_all_or_none(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    new, delayed, taken, pending, done = await store.add_batches(
        [make_batch(SVC, txns=2) for _ in range(5)]
    )
    await _write(store, BatchWrite(SVC, delayed.batch_id, BatchStatusName.DELAYED, attempt=True))
    await _write(store, BatchWrite(SVC, taken.batch_id, attempt=True))
    await _write(store, BatchWrite(SVC, pending.batch_id, attempt=True))
    await _write(store, BatchWrite(SVC, pending.batch_id, Pending()))
    await _write(store, BatchWrite(SVC, done.batch_id, Committed()))
    for refused, why in ((taken, "in flight"), (pending, "in flight"), (done, "final")):
        with pytest.raises(ControlRefusedError, match=why):
            await store.control_service(
                SVC, "cancel", actor="ops", batch_ids=[new.batch_id, refused.batch_id]
            )
        got = await store.get_batch(new.batch_id, SVC)
        assert got is not None and got.batch_status is None  # none of them
    with pytest.raises(BatchNotFoundError):
        await store.control_service(SVC, "cancel", actor="ops", batch_ids=["ab" * 64])
    with pytest.raises(ControlRefusedError, match="name the batches"):
        await store.control_service(SVC, "cancel", actor="ops")
    action = await store.control_service(
        SVC, "cancel", actor="ops", batch_ids=[new.batch_id, delayed.batch_id]
    )
    assert action.batch_ids == (new.batch_id, delayed.batch_id)
    assert action.detail is not None and action.detail.startswith("cancelled by ops at 2023-")
    for batch in (new, delayed):
        got = await store.get_batch(batch.batch_id, SVC)
        assert got is not None and got.is_final
        status = got.batch_status
        assert isinstance(status, Invalid)
        assert [t.error_message for t in status.transactions] == [action.detail] * 2
        assert got.submission_error is not None
        assert got.submission_error.error_type == "cancelled"
    # A cancelled batch is final: never taken.
    with pytest.raises(StatusTransitionError):
        await _write(store, BatchWrite(SVC, new.batch_id, attempt=True))


async def test_controls_of_an_unknown_service_are_refused(store: BatchTrackingStore) -> None:
    with pytest.raises(ServiceNotFoundError, match="no batch of service 'nobody'"):
        await store.control_service("nobody", "pause", actor="ops")


async def test_dependency_states_name_the_batch_of_each_tracked_transaction(
    store: BatchTrackingStore,
) -> None:
    a = make_batch(SVC)
    b = make_batch("other")
    c = make_batch(SVC)
    await store.add_batches([a, b, c])
    await _write(store, BatchWrite(SVC, a.batch_id, Committed()))
    await _write(store, BatchWrite("other", b.batch_id, Delayed(), attempt=True))
    await store.control_service(SVC, "cancel", actor="ops", batch_ids=[c.batch_id])
    ta, tb, tc = (x.transactions[0].transaction_header for x in (a, b, c))
    states = await store.dependency_states([ta, tb, tc, "f" * 128])
    assert set(states) == {ta, tb, tc}  # the untracked one is left out
    assert states[ta].committed and states[ta].service_id == SVC
    assert (states[tb].service_id, states[tb].batch_id) == ("other", b.batch_id)
    assert not states[tb].committed and not states[tb].failed
    assert states[tb].status is BatchStatusName.DELAYED and not states[tb].submitted
    assert states[tc].failed and states[tc].cancelled
    assert await store.dependency_states([]) == {}


def _depending(batch: TrackingBatch, *on: TrackingBatch | str) -> TrackingBatch:
    """``batch`` with its first transaction depending on ``on`` (batches: their
    first transaction)."""
    deps = tuple(d if isinstance(d, str) else d.transactions[0].transaction_header for d in on)
    tx = dataclasses.replace(batch.transactions[0], dependencies=deps)
    return dataclasses.replace(batch, transactions=(tx, *batch.transactions[1:]))


def _tx(batch: TrackingBatch) -> str:
    return batch.transactions[0].transaction_header


async def test_the_dependency_path_follows_first_dependencies_not_sent(
    store: BatchTrackingStore,
) -> None:
    untracked = "e" * 128
    a = make_batch(SVC)
    b = _depending(make_batch("other"), untracked, a)
    # c's second transaction depends on its first: not a dependency to resolve.
    c2 = make_batch(SVC, txns=2)
    own = dataclasses.replace(c2.transactions[1], dependencies=(_tx(c2),))
    c = _depending(dataclasses.replace(c2, transactions=(c2.transactions[0], own)), b, a)
    await store.add_batches([c, b, a])  # accepted out of dependency order
    path = await store.dependency_path(SVC, c.batch_id, 32)
    assert path is not None
    assert [(s.transaction_id, s.batch_id, s.service_id) for s in path.steps] == [
        (_tx(b), b.batch_id, "other"),
        (_tx(a), a.batch_id, SVC),
    ]
    assert path.untracked == ()  # a's
    assert [s.status for s in path.steps] == [None, None]
    # At most max_steps steps; the untracked dependencies are the last batch's.
    short = await store.dependency_path(SVC, c.batch_id, 1)
    assert short is not None and [s.batch_id for s in short.steps] == [b.batch_id]
    assert short.untracked == (untracked,)
    # A batch in flight ends the path.
    await _write(store, BatchWrite(SVC, a.batch_id, attempt=True))
    path = await store.dependency_path(SVC, c.batch_id, 32)
    assert path is not None and [s.batch_id for s in path.steps] == [b.batch_id, a.batch_id]
    assert path.steps[1].submitted
    # A committed dependency is passed over: the next one not committed counts.
    await _write(store, BatchWrite(SVC, a.batch_id, Committed()))
    path = await store.dependency_path(SVC, c.batch_id, 32)
    assert path is not None and [s.batch_id for s in path.steps] == [b.batch_id]
    path = await store.dependency_path("other", b.batch_id, 32)
    assert path == DependencyPath((), (untracked,))
    assert await store.dependency_path(SVC, "ab" * 64, 32) is None


async def test_the_dependency_path_ends_at_a_failed_batch_and_repeats_a_cycle(
    store: BatchTrackingStore,
) -> None:
    a = make_batch(SVC)
    b = _depending(make_batch(SVC), a)
    await store.add_batches([b, a])
    await store.control_service(SVC, "cancel", actor="ops", batch_ids=[a.batch_id])
    path = await store.dependency_path(SVC, b.batch_id, 32)
    assert path is not None and [s.batch_id for s in path.steps] == [a.batch_id]
    assert path.steps[0].failed and path.steps[0].cancelled
    # x and y depend on each other: the path goes round until max_steps.
    x0, y0 = make_batch("cyc"), make_batch("cyc")
    x, y = _depending(x0, y0), _depending(y0, x0)
    await store.add_batches([x, y])
    path = await store.dependency_path("cyc", x.batch_id, 3)
    assert path is not None
    assert [s.batch_id for s in path.steps] == [y.batch_id, x.batch_id, y.batch_id]


async def test_dependencies_are_kept_as_declared(store: BatchTrackingStore) -> None:
    base = make_batch(SVC)
    tx = dataclasses.replace(
        base.transactions[0], dependencies=("d" * 128,), inputs=("1cf126",), outputs=("1cf126",)
    )
    [added] = await store.add_batches([dataclasses.replace(base, transactions=(tx,))])
    got = await store.get_batch(added.batch_id, SVC)
    assert got is not None
    assert got.transactions[0].dependencies == ("d" * 128,)
    assert isinstance(got.transactions[0], TrackingTransaction)


async def test_the_batches_following_another_are_the_next_open_ones_whatever_their_state(
    store: BatchTrackingStore,
) -> None:
    a, b, c, d = await store.add_batches([make_batch(SVC, txns=2) for _ in range(4)])
    await store.add_batches([make_batch("other")])
    await _write(store, BatchWrite(SVC, b.batch_id, Committed()))
    await _write(store, BatchWrite(SVC, c.batch_id, attempt=True))
    [following] = await store.batches_following(SVC, a.batch_id, limit=1)
    assert following.batch_id == c.batch_id  # b is final
    assert following.submitted and following.transactions == c.transactions
    assert following.serialized_batch == c.serialized_batch
    both = await store.batches_following(SVC, a.batch_id, limit=5)
    assert [x.batch_id for x in both] == [c.batch_id, d.batch_id]
    assert [x.transactions for x in both] == [c.transactions, d.transactions]
    first = await store.batches_following(SVC, None, limit=2)
    assert [x.batch_id for x in first] == [a.batch_id, c.batch_id]
    assert await store.batches_following(SVC, d.batch_id, limit=5) == []
    assert await store.batches_following(SVC, "ab" * 64, limit=5) == []
