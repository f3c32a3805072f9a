"""Submitter: outcomes, retries, ordering per service, drain on stop."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pipeline_fakes import MemoryPipelineStore, ScriptedLedger, batch

from ledgerq.backoff import no_jitter
from ledgerq.clock import ManualClock
from ledgerq.errors import ConfigError
from ledgerq.ledgers.base import (
    Abandoned,
    Accepted,
    Ambiguous,
    Busy,
    Rejected,
    Unjudged,
    Unreachable,
)
from ledgerq.model import BatchStatusName, Committed, Invalid
from ledgerq.record.recorder import Recorder
from ledgerq.submit.submitter import Submitter, SubmitterSettings


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def make(
    store: MemoryPipelineStore, ledger: ScriptedLedger, **settings: int | float
) -> tuple[Submitter, Recorder, Sleeps]:
    recorder = Recorder(store, clock=ManualClock())
    sleeps = Sleeps()
    s = SubmitterSettings(**{"poll_timeout_s": 0.05, **settings})  # type: ignore[arg-type]
    submitter = Submitter(store, ledger, recorder, s, sleep=sleeps, jitter=no_jitter)
    return submitter, recorder, sleeps


async def run_until(submitter: Submitter, cond: object) -> None:
    task = asyncio.create_task(submitter.run())
    for _ in range(2000):
        if callable(cond) and cond():
            break
        await asyncio.sleep(0)
    submitter.stop()
    await asyncio.wait_for(task, 5)


async def test_outcomes_are_recorded() -> None:
    store = MemoryPipelineStore()
    ok, busy, gone, bad, lost = (batch(s, 1) for s in "abcde")
    store.add(ok, busy, gone, bad, lost)
    ledger = ScriptedLedger()
    ledger.script = {
        busy.batch_id: [Busy(503)] * 10,
        gone.batch_id: [Unreachable("refused")] * 10,
        bad.batch_id: [Rejected(400, "bad signature")],
        lost.batch_id: [Ambiguous("timeout")],
    }
    submitter, _, sleeps = make(store, ledger, max_retries=2, backoff_initial_ms=10)
    await run_until(submitter, lambda: len(store.writes) >= 10)
    status = {b: store.batches[b].status_name for b in store.batches}
    assert status[ok.batch_id] is BatchStatusName.PENDING
    assert store.batches[ok.batch_id].submitted
    assert status[busy.batch_id] is BatchStatusName.DELAYED
    assert not store.batches[busy.batch_id].submitted
    assert status[gone.batch_id] is BatchStatusName.DELAYED
    assert status[bad.batch_id] is BatchStatusName.INVALID
    invalid = store.batches[bad.batch_id].batch_status
    assert isinstance(invalid, Invalid)
    assert invalid.transactions[0].external_error_message == "bad signature"
    assert invalid.transactions[0].external_error_status == "400"
    # Ambiguous: the ledger may have it. It stays submitted (its service locked,
    # nothing queued) with the ambiguity recorded, until the ledger is asked.
    assert status[lost.batch_id] is None
    assert store.batches[lost.batch_id].submitted
    lost_error = store.batches[lost.batch_id].submission_error
    assert lost_error is not None and lost_error.error_type == "ambiguous"
    assert lost.batch_id not in {b.batch_id for b in store.round(frozenset())}
    # Ambiguous is never resent by the submitter; busy ones 1 + 2 retries.
    assert ledger.sent.count(lost.batch_id) == 1
    assert ledger.sent.count(busy.batch_id) == 3
    assert ledger.sent.count(bad.batch_id) == 1
    err = store.errors[busy.batch_id]
    assert err is not None and "503" in err.error_message
    # Exponential backoff between retries, per batch: 10 ms then 20 ms.
    assert sorted(sleeps.calls) == [0.01, 0.01, 0.02, 0.02]


async def test_retry_after_is_honoured_and_capped() -> None:
    store = MemoryPipelineStore()
    b = batch("a", 1)
    store.add(b)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Busy(429, retry_after_ms=700), Busy(429, retry_after_ms=9000)]}
    submitter, _, sleeps = make(store, ledger, backoff_initial_ms=5, backoff_max_ms=1000)
    await run_until(submitter, lambda: store.batches[b.batch_id].status_name is not None)
    assert sleeps.calls == [0.7, 1.0]
    assert store.batches[b.batch_id].status_name is BatchStatusName.PENDING


async def test_one_batch_per_service_in_flight_and_in_order() -> None:
    store = MemoryPipelineStore()
    for n in range(1, 4):
        store.add(batch("a", n), batch("b", n))
    ledger = ScriptedLedger()
    submitter, recorder, _ = make(store, ledger)
    committed: list[str] = []

    def on_unlock(service_id: str) -> None:
        pass

    recorder.add_unlock_listener(on_unlock)
    task = asyncio.create_task(submitter.run())
    # Play the ledger: commit whatever is pending, in the order it was sent.
    for _ in range(200):
        await asyncio.sleep(0)
        for bid, b in list(store.batches.items()):
            if b.status_name is BatchStatusName.PENDING:
                assert len(submitter.in_flight) <= 2
                committed.append(bid)
                await recorder.ledger_status(b.service_id, _committed(bid))
        if len(committed) == 6:
            break
    submitter.stop()
    await asyncio.wait_for(task, 5)
    for service in "ab":
        order = [bid for bid in ledger.sent if bid.startswith(service)]
        assert order == sorted(order) and len(order) == 3


def _committed(bid: str):  # type: ignore[no-untyped-def]
    from ledgerq.ledgers.base import LedgerBatchStatus

    return LedgerBatchStatus(bid, Committed())


async def test_stop_drains_in_flight_submissions() -> None:
    store = MemoryPipelineStore()
    store.add(batch("a", 1), batch("b", 1))
    ledger = ScriptedLedger()
    ledger.gate = asyncio.Event()
    submitter, _, _ = make(store, ledger)
    task = asyncio.create_task(submitter.run())
    for _ in range(100):
        await asyncio.sleep(0)
    assert len(ledger.sent) == 2
    submitter.stop()
    await asyncio.sleep(0)
    assert not task.done()  # waiting for the two POSTs
    ledger.gate.set()
    await asyncio.wait_for(task, 5)
    assert all(b.status_name is BatchStatusName.PENDING for b in store.batches.values())
    assert submitter.in_flight == {}


async def test_slots_bound_concurrency() -> None:
    store = MemoryPipelineStore()
    store.add(*(batch(f"s{i}", 1) for i in range(10)))
    ledger = ScriptedLedger()
    ledger.gate = asyncio.Event()
    submitter, _, _ = make(store, ledger, slots=3)
    task = asyncio.create_task(submitter.run())
    for _ in range(100):
        await asyncio.sleep(0)
    assert len(ledger.sent) == 3
    ledger.gate.set()
    for _ in range(500):
        await asyncio.sleep(0)
        if len(ledger.sent) == 10:
            break
    submitter.stop()
    await asyncio.wait_for(task, 5)
    assert len(ledger.sent) == 10


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="slots"):
        SubmitterSettings(slots=0)
    with pytest.raises(ConfigError, match="backoff"):
        SubmitterSettings(backoff_initial_ms=10, backoff_max_ms=5)


async def test_accepted_is_default_for_unscripted() -> None:
    ledger = ScriptedLedger()
    assert await ledger.submit("a", "x", b"") == Accepted()


async def test_the_claim_is_checked_before_every_attempt_not_only_the_first() -> None:
    store = MemoryPipelineStore()
    b = batch("s", 1)
    store.add(b)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Busy(503)] * 10}
    asked: list[str] = []

    def may_post(taken: object) -> bool:
        asked.append(getattr(taken, "batch_id", ""))
        return len(asked) <= 2  # the claim lapses after the second attempt

    recorder = Recorder(store, clock=ManualClock())
    submitter = Submitter(
        store,
        ledger,
        recorder,
        SubmitterSettings(poll_timeout_s=0.05, max_retries=5),
        sleep=Sleeps(),
        may_post=may_post,
        jitter=no_jitter,
    )
    await run_until(submitter, lambda: len(store.writes) >= 2)
    assert asked == [b.batch_id] * 3
    assert ledger.sent.count(b.batch_id) == 2  # not the 6 the retry budget allows
    # An earlier attempt may have reached the ledger: it stays submitted, to be
    # asked before anything is resent.
    assert store.batches[b.batch_id].batch_status is None
    assert store.batches[b.batch_id].submitted
    assert store.round(frozenset()) == []


async def test_no_post_at_all_when_the_claim_lapses_before_the_first_attempt() -> None:
    store = MemoryPipelineStore()
    b = batch("s", 1)
    store.add(b)
    ledger = ScriptedLedger()
    recorder = Recorder(store, clock=ManualClock())
    submitter = Submitter(
        store,
        ledger,
        recorder,
        SubmitterSettings(poll_timeout_s=0.05),
        sleep=Sleeps(),
        may_post=lambda _b: False,
    )
    await run_until(submitter, lambda: len(store.writes) >= 2)
    assert ledger.sent == []
    assert store.batches[b.batch_id].submitted
    assert store.round(frozenset()) == []


async def test_an_ambiguous_batch_is_asked_about_not_handed_out_again() -> None:
    store = MemoryPipelineStore()
    first, second = batch("s", 1), batch("s", 2)
    store.add(first, second)
    ledger = ScriptedLedger()
    ledger.script = {first.batch_id: [Ambiguous("connection reset after sending")]}
    submitter, recorder, _ = make(store, ledger)
    asked: list[tuple[str, str]] = []
    recorder.add_ask_listener(lambda b, s: asked.append((b, s)))
    task = asyncio.create_task(submitter.run())
    for _ in range(200):
        await asyncio.sleep(0)
    # Nothing else of the service went out, and the first was not resent.
    assert ledger.sent == [first.batch_id]
    assert asked == [(first.batch_id, "s")]
    submitter.stop()
    await asyncio.wait_for(task, 5)


async def test_a_post_the_gateway_abandoned_is_asked_about_but_is_no_ledger_problem() -> None:
    # Under HA a POST still without an answer when its claim lapses (a
    # paused instance) is ended by the gateway: ambiguous, so the ledger is
    # asked first, but the ledger did nothing wrong. As a ledger problem it
    # showed on the dashboard ("POSTs failing") and on /services until this
    # instance's next good POST, possibly never (its services gone).
    store = MemoryPipelineStore()
    mine, theirs = batch("paused", 1), batch("slow", 1)
    store.add(mine, theirs)
    ledger = ScriptedLedger()
    ledger.script = {
        mine.batch_id: [Abandoned("no answer within the 900 ms left on this instance's claim")],
        theirs.batch_id: [Ambiguous("no answer within the submit timeout")],
    }
    submitter, recorder, _ = make(store, ledger)
    asked: list[str] = []
    recorder.add_ask_listener(lambda b, s: asked.append(s))
    await run_until(submitter, lambda: len(asked) == 2)
    assert sorted(asked) == ["paused", "slow"]
    assert submitter.health.for_service("paused") is None
    problem = submitter.health.for_service("slow")
    assert problem is not None and problem.cause == "ambiguous"
    assert submitter.health.snapshot()["problems_total"]["submit"] == 1


async def test_a_submission_fenced_off_is_a_warning_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Under HA, an instance that lost a service's claim (paused, cut off)
    # has its writes refused: expected, the new holder carries on. Logged
    # at ERROR, a paused instance's wake-up read as a failure.
    store = MemoryPipelineStore()
    b = batch("moved", 1)
    store.add(b)
    recorder = Recorder(store, clock=ManualClock(), fences=lambda _s: None)
    s = SubmitterSettings(poll_timeout_s=0.05)
    submitter = Submitter(store, ScriptedLedger(), recorder, s, sleep=Sleeps(), jitter=no_jitter)
    with caplog.at_level(logging.INFO, logger="ledgerq.submit.submitter"):
        await run_until(
            submitter, lambda: any("not recorded" in r.getMessage() for r in caplog.records)
        )
    (line,) = [r for r in caplog.records if "not recorded" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "holds no valid claim on service 'moved'" in line.getMessage()
    assert not store.batches[b.batch_id].submitted


async def test_an_unjudged_refusal_is_retried_and_never_made_final() -> None:
    """A 404 (a mistyped URL), a 401 or a proxy's 413 says nothing of the batch."""
    store = MemoryPipelineStore()
    b = batch("a", 1)
    store.add(b)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Unjudged(404, "http://h/batches answered 404: Not Found")] * 9}
    submitter, _, sleeps = make(store, ledger, max_retries=3, backoff_initial_ms=10)
    await run_until(submitter, lambda: len(store.writes) >= 2)
    after = store.batches[b.batch_id]
    assert after.status_name is BatchStatusName.DELAYED and not after.submitted
    assert after.submission_error is not None
    assert after.submission_error.error_type == "http_404"
    assert ledger.sent.count(b.batch_id) == 4  # 1 + 3 retries, then the delay window
    assert sleeps.calls == [0.01, 0.02, 0.04]
    problem = submitter.health.for_service("a")
    assert problem is not None and problem.cause == "HTTP 404" and problem.count == 4


async def test_backoff_is_jittered_between_half_and_all_of_its_nominal_delay() -> None:
    store = MemoryPipelineStore()
    store.add(*(batch(s, 1) for s in "abcdefgh"))
    ledger = ScriptedLedger()
    ledger.script = {batch(s, 1).batch_id: [Busy(503)] * 3 for s in "abcdefgh"}
    sleeps = Sleeps()
    submitter = Submitter(
        store,
        ledger,
        Recorder(store, clock=ManualClock()),
        SubmitterSettings(poll_timeout_s=0.05, max_retries=2, backoff_initial_ms=100),
        sleep=sleeps,
    )
    await run_until(submitter, lambda: len(store.writes) >= 16)
    firsts = [d for d in sleeps.calls if d <= 0.1]
    assert all(0.05 <= d <= 0.1 for d in firsts) and len(set(firsts)) > 1


async def test_a_take_started_after_the_run_ended_is_not_posted_and_frees_its_slot() -> None:
    """The final status's group committed the next batch taken, but the
    submitter's run ended meanwhile: nothing is posted from outside a run (the
    batch stays taken; the follower asks the ledger about it), and the slot,
    the service and the batch are free again."""
    store = MemoryPipelineStore()
    ledger = ScriptedLedger()
    submitter, _, _ = make(store, ledger)
    task = asyncio.create_task(submitter.run())
    for _ in range(10):
        await asyncio.sleep(0)
    take = submitter.reserve("s")
    assert take is not None
    nxt = batch("s", 2)
    take.hold(nxt)
    assert submitter.in_flight == {nxt.batch_id: "s"}
    submitter.stop()
    await asyncio.wait_for(task, 5)
    take.start()
    for _ in range(10):
        await asyncio.sleep(0)
    assert ledger.sent == []
    assert submitter.in_flight == {}
    assert nxt.batch_id not in submitter.held_batches
    assert submitter.reserve("s") is None  # not running: nothing reserved


async def test_an_accepted_batch_is_handed_to_the_follower_before_it_is_recorded() -> None:
    # The follower's read of an accepted batch goes out at once (the accept
    # listeners); were the batch still held by its submission, an answer
    # coming back before the Pending write landed would be dropped as one
    # that predates the submission.
    store = MemoryPipelineStore()
    a = batch("a", 1)
    store.add(a)
    submitter, recorder, _ = make(store, ScriptedLedger())
    held_when_followed: list[bool] = []
    recorder.add_accept_listener(
        lambda batch_id, _service: held_when_followed.append(batch_id in submitter.held_batches)
    )
    await run_until(submitter, lambda: held_when_followed)
    assert held_when_followed == [False]
    assert store.batches[a.batch_id].status_name is BatchStatusName.PENDING


async def test_slots_for_what_a_final_status_frees() -> None:
    """A parallel service's final status reserves up to ``most`` slots for
    the batches it frees (taken in its transaction): the ones taken are
    posted without a further write, the others are free again at once; a
    serial service, a cancelled reservation or a stopped run reserve or post
    nothing."""
    store = MemoryPipelineStore()
    ledger = ScriptedLedger()
    recorder = Recorder(store, clock=ManualClock())
    submitter = Submitter(
        store,
        ledger,
        recorder,
        SubmitterSettings(poll_timeout_s=0.05, slots=3),
        sleep=Sleeps(),
        jitter=no_jitter,
        parallel=lambda service_id: service_id.startswith("p"),
    )
    assert submitter.reserve_freed("p", 4) is None  # not running
    task = asyncio.create_task(submitter.run())
    for _ in range(10):
        await asyncio.sleep(0)
    assert submitter.reserve_freed("s", 4) is None  # serial: the commit → next POST merge
    take = submitter.reserve_freed("p", 4)
    assert take is not None and take.slots == 3  # no more than the free slots
    assert submitter.reserve_freed("p", 4) is None  # none left
    take.cancel()
    take = submitter.reserve_freed("p", 2)
    assert take is not None and take.slots == 2
    a, b = batch("p", 1), batch("p", 2)
    store.add(a, b)
    for x in (a, b):  # what the store's take recorded
        await store.change_batch_to_submitted(x.batch_id, x.service_id)
    writes = len(store.writes)
    take.start([a, b])
    assert submitter.in_flight == {a.batch_id: "p", b.batch_id: "p"}
    assert submitter.taken_freed == submitter.taken_with_final == 2
    for _ in range(200):
        if len(ledger.sent) == 2 and not submitter.in_flight:
            break
        await asyncio.sleep(0)
    assert sorted(ledger.sent) == sorted([a.batch_id, b.batch_id])
    assert store.batches[a.batch_id].status_name is BatchStatusName.PENDING
    # Accepted, recorded Pending: no second taken write before the POST.
    assert len(store.writes) == writes + 2
    one = submitter.reserve_freed("p", 4)
    assert one is not None and one.slots == 3  # all free again
    one.start([])
    submitter.stop()
    await asyncio.wait_for(task, 5)
    late = submitter.reserve_freed("p", 1)
    assert late is None


async def test_freed_batches_taken_after_the_run_ended_are_not_posted_and_free_their_slots() -> (
    None
):
    """As for the serial take: a final status's transaction took two freed
    batches, but the run ended before they were started: nothing is posted,
    and their slots, their service and the batches are free again."""
    store = MemoryPipelineStore()
    ledger = ScriptedLedger()
    submitter = Submitter(
        store,
        ledger,
        Recorder(store, clock=ManualClock()),
        SubmitterSettings(poll_timeout_s=0.05, slots=3),
        sleep=Sleeps(),
        jitter=no_jitter,
        parallel=lambda service_id: service_id.startswith("p"),
    )
    task = asyncio.create_task(submitter.run())
    for _ in range(10):
        await asyncio.sleep(0)
    take = submitter.reserve_freed("p", 2)
    assert take is not None
    a, b = batch("p", 1), batch("p", 2)
    store.add(a, b)
    submitter.stop()
    await asyncio.wait_for(task, 5)
    take.start([a, b])
    for _ in range(10):
        await asyncio.sleep(0)
    assert ledger.sent == []
    assert submitter.in_flight == {}
    assert not {a.batch_id, b.batch_id} & submitter.held_batches
    assert not submitter._busy  # the service is free again
