"""The producer: lanes, takes, outcomes and statuses recorded, on the reference store.

The store is the in-memory reference model (:class:`~ledgerq.store.MemoryStore`),
the ledger a scripted one. Every interval is an hour: what a test sees comes
from wake-ups and answers, never from a poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

import pytest

from ledgerq.backoff import no_jitter
from ledgerq.clock import ManualClock
from ledgerq.errors import LedgerError, StoreError
from ledgerq.follow.follower import FollowSettings
from ledgerq.ledgers.base import (
    Accepted,
    Ambiguous,
    Busy,
    LedgerBatchStatus,
    Rejected,
    SubmitResult,
    Unreachable,
)
from ledgerq.model import (
    BatchStatusName,
    BatchWrite,
    Committed,
    Fence,
    Invalid,
    Pending,
    TrackingBatch,
    Unknown,
)
from ledgerq.pipeline.producer import PipelineSettings, Producer
from ledgerq.queue.strategy import SERIAL_ONLY, OnInvalidMap, StrategyMap
from ledgerq.record.completer import Completer
from ledgerq.store import MemoryStore
from ledgerq.submit.submitter import SubmitterSettings
from tests.factories import tracking_batch as batch
from tests.ledger_fakes import ScriptedLedger

HOUR = 3600.0


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class Claims:
    """This instance's claims: a fence per service held (None: not held)."""

    def __init__(self, fences: dict[str, Fence]) -> None:
        self.fences = fences

    def fence_for(self, service_id: str) -> Fence | None:
        return self.fences.get(service_id)

    def may_post(self, service_id: str, fence: Fence) -> bool:
        return self.fences.get(service_id) == fence

    def claim_left_ms(self, service_id: str, fence: Fence) -> int:
        return 60_000 if self.may_post(service_id, fence) else 0


class FencingStore(MemoryStore):
    """The reference store, keeping the fence of every write (it has no claims)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.fences: list[tuple[str, bool, Fence | None]] = []

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        self.fences += [(w.id, w.attempt, w.fence) for w in writes]
        return await super().apply_writes([dataclasses.replace(w, fence=None) for w in writes])


class Rig:
    def __init__(
        self,
        *,
        store: MemoryStore | None = None,
        slots: int = 256,
        max_retries: int = 2,
        strategies: StrategyMap = SERIAL_ONLY,
        claims: Claims | None = None,
        ledger: ScriptedLedger | None = None,
        on_invalid: OnInvalidMap | None = None,
        poll_s: float = HOUR,
        clock: ManualClock | None = None,
        pipeline_depth: int = 64,
    ) -> None:
        self.clock = clock or ManualClock()
        self.store = store if store is not None else MemoryStore(clock=self.clock)
        self.ledger = ledger or ScriptedLedger()
        self.sleeps = Sleeps()
        self.notified: list[str] = []
        self.completer = Completer(self.store)
        self.producer = Producer(
            self.store,
            self.completer,
            self.ledger,
            PipelineSettings(
                submitter=SubmitterSettings(
                    slots=slots,
                    max_retries=max_retries,
                    backoff_initial_ms=10,
                    poll_timeout_s=poll_s,
                ),
                follower=FollowSettings(
                    poll_interval_s=HOUR, wait_s=HOUR, min_poll_interval_s=0, backoff_initial_ms=1
                ),
                delay_window_ms=15_000,
                pipeline_depth=pipeline_depth,
            ),
            strategies=strategies,
            on_invalid=on_invalid or OnInvalidMap(),
            claims=claims,
            notify=self.notified.append,
            clock=self.clock,
            sleep=self.sleeps,
            jitter=no_jitter,
        )
        self.task: asyncio.Task[None] | None = None

    async def add(self, *batches: TrackingBatch) -> list[TrackingBatch]:
        stored = await self.store.add_batches(list(batches))
        for service_id in {b.service_id for b in batches}:
            self.producer.wake(service_id)
        return stored

    async def __aenter__(self) -> Rig:
        self.task = asyncio.create_task(self.producer.run())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self.producer.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, 5)

    async def get(self, b: TrackingBatch) -> TrackingBatch:
        got = await self.store.get_batch(b.batch_id, b.service_id)
        assert got is not None
        return got

    async def status(self, b: TrackingBatch) -> BatchStatusName | None:
        return (await self.get(b)).status_name


async def until(cond: Callable[[], bool]) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0)
    # Real time only if the loop has nothing left to run (a read parked in a fake).
    for _ in range(400):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def until_status(rig: Rig, b: TrackingBatch, name: BatchStatusName | None) -> None:
    seen: list[BatchStatusName | None] = []

    async def look() -> None:
        seen.append(await rig.status(b))

    for _ in range(400):
        await look()
        if seen[-1] is name:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{b.batch_id} stayed {seen[-1]}, not {name}")


async def test_each_outcome_is_recorded_as_the_table_says() -> None:
    ok, busy, gone, bad = (batch(s, 1) for s in "abcd")
    rig = Rig()
    rig.ledger.script = {
        busy.batch_id: [Busy(503)] * 10,
        gone.batch_id: [Unreachable("refused")] * 10,
        bad.batch_id: [Rejected(400, "bad signature")],
    }
    await rig.add(ok, busy, gone, bad)
    async with rig:
        await until(lambda: rig.producer.submitted_total == 4)
    assert await rig.status(ok) is BatchStatusName.PENDING and (await rig.get(ok)).submitted
    for delayed in (busy, gone):
        got = await rig.get(delayed)
        assert got.status_name is BatchStatusName.DELAYED and not got.submitted
        assert got.submission_error is not None and got.submission_error.error_type == "busy"
    invalid = (await rig.get(bad)).batch_status
    assert isinstance(invalid, Invalid)
    assert invalid.transactions[0].external_error_message == "bad signature"
    assert invalid.transactions[0].external_error_status == "400"
    assert rig.ledger.sent.count(busy.batch_id) == 3  # 1 + 2 retries, then the delay window
    assert rig.ledger.sent.count(bad.batch_id) == 1
    # A final status and Delayed free their services: the queue and the readers hear it.
    assert sorted(rig.notified) == ["b", "c", "d"]


@pytest.mark.parametrize(
    ("answer", "after", "sent"),
    [(Pending(), BatchStatusName.PENDING, 1), (Unknown(), None, 2)],
)
async def test_an_ambiguous_batch_is_asked_about_and_only_an_unknown_resends_it(
    answer: Pending | Unknown, after: BatchStatusName | None, sent: int
) -> None:
    first, second = batch("s", 1), batch("s", 2)
    rig = Rig()
    rig.ledger.script = {first.batch_id: [Ambiguous("connection reset after sending")]}
    # The ledger cannot be asked at first: nothing moves meanwhile.
    rig.ledger.read_errors = [LedgerError("down") for _ in range(3)]
    await rig.add(first, second)
    async with rig:
        await until(lambda: len(rig.ledger.status_requests) >= 3)
        got = await rig.get(first)
        assert got.submitted and got.batch_status is None
        assert got.submission_error is not None
        assert got.submission_error.error_type == "ambiguous"
        assert rig.ledger.sent == [first.batch_id]
        assert rig.ledger.waits[0] == 0  # an ask, not a parked read
        if isinstance(answer, Pending):
            rig.ledger.statuses[first.batch_id] = answer
        await until(lambda: len(rig.ledger.status_requests) >= 4)
        await until(lambda: rig.ledger.sent.count(first.batch_id) == sent)
        if after is not None:
            await until_status(rig, first, after)
    # Never a second batch of the service while the first may be at the ledger.
    assert second.batch_id not in rig.ledger.sent


class OrderJudge(ScriptedLedger):
    """Accepts a batch only once every earlier one of its service committed."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        earlier = [i for i in self.sent if i.startswith(service_id + "-")]
        if any(not isinstance(self.statuses.get(i), Committed) for i in earlier):
            self.violations.append(batch_id)
        result = await super().submit(service_id, batch_id, serialized_batch)
        # Committed at once: the parked read answers.
        await self.decide(batch_id, Committed())
        return result


async def test_a_serial_service_drains_in_order_one_batch_at_a_time() -> None:
    ledger = OrderJudge()
    rig = Rig(ledger=ledger)
    batches = [batch(s, n) for n in range(1, 5) for s in ("a", "b")]
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.sent) == 8)
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    assert ledger.violations == []
    for service in "ab":
        order = [i for i in ledger.sent if i.startswith(service)]
        assert order == sorted(order) and len(order) == 4
    # After the first of each service, every next one went with its
    # predecessor's final status (one transaction), not through the queue.
    assert rig.producer.taken_with_final == 6
    assert rig.producer.follower.scans == 1


async def test_a_delayed_service_waits_out_its_window_while_the_others_go_on() -> None:
    ledger = OrderJudge()
    rig = Rig(ledger=ledger, max_retries=1)
    services = ["s1", "s2", "s3", "s4"]
    batches = [batch(s, n) for n in range(1, 6) for s in services]
    first_of_s2 = batches[1]
    ledger.script = {first_of_s2.batch_id: [Busy(503)] * 2}  # Delayed once
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.sent) == 2 + 15)
        assert await rig.status(first_of_s2) is BatchStatusName.DELAYED
        assert not [i for i in ledger.sent if i.startswith("s2-") and i != first_of_s2.batch_id]
        rig.clock.advance(15_000)
        rig.producer.wake()  # what the poll interval would do
        await until(lambda: len(ledger.sent) == 2 + 20)
    assert ledger.violations == []
    repeats = {i for i in ledger.sent if ledger.sent.count(i) > 1}
    assert repeats == {first_of_s2.batch_id}


async def test_stop_drains_the_submissions_in_progress() -> None:
    rig = Rig()
    rig.ledger.gate = asyncio.Event()
    a, b = batch("a", 1), batch("b", 1)
    await rig.add(a, b)
    await rig.__aenter__()
    await until(lambda: len(rig.ledger.sent) == 2)
    rig.producer.stop()
    await asyncio.sleep(0.01)
    assert rig.task is not None and not rig.task.done()  # waiting for the two POSTs
    rig.ledger.gate.set()
    await asyncio.wait_for(rig.task, 5)
    assert [await rig.status(x) for x in (a, b)] == [BatchStatusName.PENDING] * 2
    assert rig.producer.in_flight == {}


async def test_slots_bound_the_submissions_in_progress() -> None:
    rig = Rig(slots=3)
    rig.ledger.gate = asyncio.Event()
    await rig.add(*(batch(f"s{i}", 1) for i in range(10)))
    async with rig:
        await until(lambda: len(rig.ledger.sent) == 3)
        await asyncio.sleep(0.01)
        assert len(rig.ledger.sent) == 3 and rig.producer.submitting == 3
        rig.ledger.gate.set()
        await until(lambda: len(rig.ledger.sent) == 10)


async def test_every_write_carries_the_fence_its_submission_was_taken_under() -> None:
    clock = ManualClock()
    store = FencingStore(clock)
    before, after = Fence("me", 1), Fence("me", 2)
    claims = Claims({"s": before})
    rig = Rig(store=store, claims=claims)
    rig.ledger.gate = asyncio.Event()
    a = batch("s", 1)
    await rig.add(a)
    async with rig:
        await until(lambda: len(rig.ledger.sent) == 1)
        # The claim moved to a new epoch while the POST was out: the outcome
        # is still written under the fence the batch was taken under (which
        # a store with claims refuses).
        claims.fences["s"] = after
        rig.ledger.gate.set()
        await until_status(rig, a, BatchStatusName.PENDING)
    assert store.fences == [(a.batch_id, True, before), (a.batch_id, False, before)]


async def test_a_service_not_held_is_neither_written_nor_posted_and_that_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Under HA an instance that lost a service's claim (paused, cut off) has
    # its writes refused: expected, the new holder carries on.
    rig = Rig(claims=Claims({}))
    b = batch("moved", 1)
    await rig.add(b)
    with caplog.at_level(logging.INFO, logger="ledgerq.pipeline.producer"):
        async with rig:
            await until(lambda: any("not recorded" in r.getMessage() for r in caplog.records))
    (line,) = [r for r in caplog.records if "not recorded" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "holds no valid claim on service 'moved'" in line.getMessage()
    assert not (await rig.get(b)).submitted
    assert rig.ledger.sent == []


async def test_an_accepted_batch_is_followed_before_its_pending_write_lands() -> None:
    # Were the batch still posting when its read goes out, an answer coming
    # back before the Pending write landed would be dropped as one that
    # predates the submission.
    rig = Rig()
    a = batch("a", 1)
    followed: list[bool] = []
    accepted = rig.producer.follower.accepted

    def spy(batch_id: str, service_id: str) -> None:
        followed.append(batch_id in rig.producer.posting)
        accepted(batch_id, service_id)

    rig.producer.follower.accepted = spy  # type: ignore[method-assign]
    await rig.add(a)
    async with rig:
        await until(lambda: bool(followed))
        await until_status(rig, a, BatchStatusName.PENDING)
    assert followed == [False]


class SlowStore(MemoryStore):
    """Groups holding a Pending write wait for ``release``; landed writes are logged."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.release = asyncio.Event()
        self.landed: list[str] = []

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        if any(isinstance(w.status, Pending) for w in writes):
            await self.release.wait()
        self.landed += [f"{'take' if w.attempt else w.status} {w.id}" for w in writes]
        return await super().apply_writes(writes)


async def test_an_answer_back_before_the_pending_write_waits_for_it() -> None:
    # The status read goes out as the ledger accepts the batch, not once the
    # Pending write landed: on a ledger committing soon after accepting, the
    # read is there before the commit. Its answer is recorded after that write.
    clock = ManualClock()
    store = SlowStore(clock)
    rig = Rig(store=store)
    a = batch("a", 1)
    await rig.add(a)
    async with rig:
        await until(lambda: rig.ledger.parked == 1)
        await rig.ledger.decide(a.batch_id, Committed())
        await asyncio.sleep(0.01)
        assert store.landed == [f"take {a.batch_id}"]
        store.release.set()
        await until_status(rig, a, BatchStatusName.COMMITTED)
    pending, committed = Pending(), Committed()
    assert store.landed == [
        f"take {a.batch_id}",
        f"{pending} {a.batch_id}",
        f"{committed} {a.batch_id}",
    ]


class FreeingStore(MemoryStore):
    """The reference store, taking what a final status frees where asked
    (``take_freed``) as PostgreSQL does: the service's batches eligible once
    the status landed, recorded taken in the same call."""

    takes_freed = True

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        results = await super().apply_writes(writes)
        for w, error in zip(writes, results, strict=True):
            if error is not None or not w.take_freed or w.freed is None:
                continue
            picks = await self.parallel_round(
                now=w.now or 0, delay_window_ms=0, services={w.service_id}, per_service=99
            )
            for p in picks[: w.take_freed]:
                await super().apply_writes([BatchWrite(p.service_id, p.batch_id, attempt=True)])
                got = await self.get_batch(p.batch_id, p.service_id)
                assert got is not None
                w.freed.append(got)
        return results


async def test_a_parallel_final_status_takes_what_it_frees_where_the_store_can() -> None:
    clock = ManualClock()
    ledger = ScriptedLedger()
    rig = Rig(
        store=FreeingStore(clock=clock),
        ledger=ledger,
        strategies=StrategyMap.parse("parallel"),
    )
    first = batch("p", 1, inputs=["k"], outputs=["k"])
    blocked = batch("p", 2, inputs=["k"], outputs=["k"])
    await rig.add(first, blocked)
    async with rig:
        await until(lambda: ledger.sent == [first.batch_id] and ledger.parked == 1)
        await asyncio.sleep(0.01)
        assert ledger.sent == [first.batch_id]  # the second conflicts with it
        await ledger.decide(first.batch_id, Committed())
        await until(lambda: len(ledger.sent) == 2)
        await until_status(rig, blocked, BatchStatusName.PENDING)
    assert rig.producer.taken_freed == rig.producer.taken_with_final == 1
    assert (await rig.get(blocked)).attempts == 1  # taken once, in the final's transaction


async def test_a_final_status_after_the_run_ended_takes_and_posts_nothing() -> None:
    rig = Rig()
    first, second = batch("s", 1), batch("s", 2)
    await rig.add(first, second)
    async with rig:
        await until(lambda: rig.ledger.parked == 1)
    # The follower is stopped; an answer recorded now goes alone.
    await rig.producer.ledger_status("s", LedgerBatchStatus(first.batch_id, Committed()))
    assert await rig.status(first) is BatchStatusName.COMMITTED
    assert not (await rig.get(second)).submitted
    assert rig.ledger.sent == [first.batch_id]
    assert rig.producer.in_flight == {}


async def test_ambiguous_outcomes_with_every_result_type_are_written() -> None:
    # A result that is not a submission result is a bug, not a state.
    from ledgerq.record import writes

    with pytest.raises(TypeError):
        writes.outcome(batch("a", 1), object(), 1, now=0, fence=None)  # type: ignore[arg-type]
    assert writes.outcome(batch("a", 1), Accepted(), 1, now=0, fence=None).status == Pending()
