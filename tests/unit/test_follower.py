"""Follower: every batch followed on its own — parked reads, asks, backoff, scans, events.

The follower reads the ledger and hands each answer to its sink; here the
sink records it in the reference store (:class:`~ledgerq.store.MemoryStore`)
as the producer would. Time is never waited out: tests wait on what the
follower does (the ledger's requests, the store's writes), with intervals set
to an hour so that nothing a test sees can come from a poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import pytest

from ledgerq.backoff import no_jitter
from ledgerq.errors import ConfigError, LedgerError
from ledgerq.follow.follower import Follower, FollowSettings
from ledgerq.follow.in_flight import StoreMonitorSource
from ledgerq.ledgers.base import CommitEvent, LedgerBatchStatus
from ledgerq.model import (
    BatchStatusName,
    BatchWrite,
    Committed,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TrackingBatch,
    Unknown,
    Valid,
)
from ledgerq.record import writes
from ledgerq.store import MemoryStore
from tests.factories import tracking_batch as batch
from tests.ledger_fakes import ScriptedLedger

HOUR = 3600.0


class Rig:
    """A follower over the reference store; its sink records what it hears."""

    def __init__(self, posting: set[str] | None = None, **settings: float) -> None:
        self.store = MemoryStore()
        self.ledger = ScriptedLedger()
        self.posting: set[str] = posting if posting is not None else set()
        #: Every write, as (batch id, status name), and each batch as last read.
        self.writes: list[tuple[str, BatchStatusName | None]] = []
        self.batches: dict[str, TrackingBatch] = {}
        opts = {"poll_interval_s": HOUR, "wait_s": HOUR, "min_poll_interval_s": 0, **settings}
        #: When set, status writes wait for it (a group commit under way).
        self.hold: asyncio.Event | None = None
        self.holding = 0
        #: When set, a scan's read of the store returns only once it is set.
        self.scan_gate: asyncio.Event | None = None
        self.scan_reads = 0
        #: Each scan's services (``None``: every service).
        self.scanned: list[frozenset[str] | None] = []
        self.follower = Follower(
            self,
            self.ledger,
            self,
            FollowSettings(**opts),  # type: ignore[arg-type]
            posting=self.posting,
            jitter=no_jitter,
        )
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Rig:
        self.task = asyncio.create_task(self.follower.run())
        await until(lambda: self.follower.scans >= 1)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.follower.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, 5)

    async def monitored_batches(
        self, *, limit: int, services: Collection[str] | None = None
    ) -> list[TrackingBatch]:
        """The follower's source: the store's, its answer held by ``scan_gate``."""
        self.scanned.append(None if services is None else frozenset(services))
        source = StoreMonitorSource(self.store)
        found = await source.monitored_batches(limit=limit, services=services)
        self.scan_reads += 1
        if self.scan_gate is not None:
            await self.scan_gate.wait()
        return list(found)

    async def ledger_status(self, service_id: str, status: LedgerBatchStatus) -> None:
        """The sink: recorded as the producer records it."""
        write = writes.ledger_status(
            service_id, status.batch_id, status.status, now=None, fence=None
        )
        if self.hold is not None:
            self.holding += 1
            try:
                await self.hold.wait()
            finally:
                self.holding -= 1
        await self.write(write)

    async def write(self, write: BatchWrite) -> None:
        [error] = await self.store.apply_writes([write])
        if error is not None:
            raise error
        status = write.status
        name = status if status is None or isinstance(status, BatchStatusName) else status.name
        self.writes.append((write.id, name))
        got = await self.store.get_batch(write.id, write.service_id)
        assert got is not None
        self.batches[write.id] = got

    async def add(self, *bs: TrackingBatch) -> None:
        for b in await self.store.add_batches(list(bs)):
            self.batches[b.batch_id] = b

    async def taken(self, *bs: TrackingBatch) -> None:
        """Added and taken for submission (``{submitted, None}``)."""
        await self.add(*(b for b in bs if b.batch_id not in self.batches))
        for b in bs:
            await self.write(BatchWrite(b.service_id, b.batch_id, attempt=True))

    async def accepted(self, *bs: TrackingBatch) -> None:
        """As the producer records an accepted batch: followed, then Pending."""
        for b in bs:
            await self.taken(b)
            await self.ledger.decide(b.batch_id, Pending())
            self.follower.accepted(b.batch_id, b.service_id)
            await self.write(BatchWrite(b.service_id, b.batch_id, Pending()))

    async def ambiguous(self, b: TrackingBatch, message: str) -> None:
        """As the producer records an ambiguous outcome: kept, then asked."""
        error = SubmissionError("ambiguous", message)
        await self.write(BatchWrite(b.service_id, b.batch_id, None, (), error))
        self.follower.ask(b.batch_id, b.service_id)

    def status(self, b: TrackingBatch) -> BatchStatusName | None:
        return self.batches[b.batch_id].status_name

    def submitted(self, b: TrackingBatch) -> bool:
        return self.batches[b.batch_id].submitted

    async def queued(self) -> list[str]:
        picks = await self.store.queue_round(now=10**13, delay_window_ms=0)
        return [p.batch_id for p in picks]


async def until(cond: Callable[[], bool], steps: int = 2000) -> None:
    for _ in range(steps):
        if cond():
            return
        await asyncio.sleep(0)
    # Real time only if the loop has nothing left to run (a read parked in a fake).
    for _ in range(200):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_each_accepted_batch_gets_its_own_parked_read_and_is_recorded_when_final() -> None:
    async with Rig() as rig:
        a, b = batch("a", 1), batch("b", 1)
        await rig.accepted(a, b)
        await until(lambda: rig.ledger.parked == 2)
        # One id per read: Sawtooth's wait answers only when every id is final.
        assert sorted(ids for _, ids in rig.ledger.status_requests) == [
            (a.batch_id,),
            (b.batch_id,),
        ]
        assert set(rig.ledger.waits) == {HOUR}
        await rig.ledger.decide(b.batch_id, Committed())
        await until(lambda: rig.status(b) is BatchStatusName.COMMITTED)
        # b's answer did not wait for a's.
        assert rig.status(a) is BatchStatusName.PENDING
        assert rig.ledger.parked == 1
        await rig.ledger.decide(
            a.batch_id, Invalid((InvalidTransaction("t", error_message="no such key"),))
        )
        await until(lambda: rig.status(a) is BatchStatusName.INVALID)
        assert rig.follower.followed == {}


async def test_a_forgotten_pending_batch_becomes_unknown_and_resendable() -> None:
    async with Rig() as rig:
        a = batch("a", 1)
        await rig.accepted(a)
        await until(lambda: rig.ledger.parked == 1)
        await rig.ledger.decide(a.batch_id, Unknown())
        await until(lambda: rig.status(a) is BatchStatusName.UNKNOWN)
        assert not rig.submitted(a)
        assert await rig.queued() == [a.batch_id]


async def test_a_read_that_times_out_pending_parks_again() -> None:
    async with Rig(wait_s=0.01) as rig:
        a = batch("a", 1)
        await rig.accepted(a)
        await until(lambda: len(rig.ledger.status_requests) >= 3)
        assert rig.status(a) is BatchStatusName.PENDING
        assert all(w == 0.01 for w in rig.ledger.waits)


async def test_ambiguous_batches_are_asked_at_once_grouped_per_service() -> None:
    async with Rig(max_ids=2) as rig:
        bs = [batch("a", n) for n in range(1, 4)] + [batch("b", 1)]
        got = bs[0]
        await rig.ledger.decide(got.batch_id, Pending())  # the ledger has it; the 202 was lost
        await rig.taken(*bs)
        for b in bs:
            await rig.ambiguous(b, "connection reset after sending")
            assert rig.submitted(b)  # nothing resent before asking
        await until(lambda: all(rig.status(b) is not None for b in bs))
        reads = zip(rig.ledger.status_requests, rig.ledger.waits, strict=True)
        asks = [(s, ids) for (s, ids), w in reads if w == 0]
        assert sorted(len(ids) for _, ids in asks) == [1, 1, 2]  # a: 2 + 1, b: 1
        assert rig.status(got) is BatchStatusName.PENDING and rig.submitted(got)
        for lost in bs[1:]:
            assert rig.status(lost) is BatchStatusName.UNKNOWN
            assert not rig.submitted(lost)
        # The one the ledger has is now followed with a parked read.
        await until(lambda: rig.ledger.parked == 1)
        await rig.ledger.decide(got.batch_id, Committed())
        await until(lambda: rig.status(got) is BatchStatusName.COMMITTED)


async def test_a_ledger_that_cannot_be_asked_is_asked_again_with_backoff_never_resent() -> None:
    async with Rig(backoff_initial_ms=1, backoff_max_ms=4) as rig:
        a = batch("a", 1)
        rig.ledger.read_errors = [LedgerError("answered 404") for _ in range(4)]
        await rig.taken(a)
        await rig.ambiguous(a, "timeout")
        await until(lambda: rig.status(a) is BatchStatusName.UNKNOWN)
        assert len(rig.ledger.status_requests) == 5  # four failures, then the answer
        assert rig.writes.count((a.batch_id, BatchStatusName.UNKNOWN)) == 1
        problems = rig.follower.health.problems_total["status"]
        assert problems == 4
        assert rig.follower.health.for_service("a") is None  # cleared by the answer


async def test_failed_parked_reads_back_off_and_report_once_per_burst(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Rig(backoff_initial_ms=1, backoff_max_ms=2) as rig:
        a = batch("a", 1)
        rig.ledger.read_errors = [LedgerError("answered 503") for _ in range(6)]
        with caplog.at_level("INFO", logger="ledgerq.ledgers"):
            await rig.accepted(a)
            await until(lambda: rig.ledger.parked == 1)
            problem = rig.follower.health.for_service("a")
            await rig.ledger.decide(a.batch_id, Committed())
            await until(lambda: rig.status(a) is BatchStatusName.COMMITTED)
        # Shown for the service while the burst lasts, cleared by the good answer.
        assert problem is not None and problem.count == 6 and "503" in problem.message
        assert rig.follower.health.for_service("a") is None
        # Logged once at the burst's start, once at its end: not six times.
        lines = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
        assert "503" in lines[0][1] and "6 problems" in lines[1][1]


async def test_scan_at_start_follows_what_a_dead_submitter_left_never_what_is_posting() -> None:
    posting: set[str] = set()
    rig = Rig(posting=posting)
    taken, lost, mine, pending = batch("a", 1), batch("b", 1), batch("c", 1), batch("d", 1)
    # {submitted, None}: the previous process died here.
    await rig.taken(taken, lost, mine, pending)
    await rig.write(BatchWrite("d", pending.batch_id, Pending()))
    posting.add(mine.batch_id)  # ...except this one, being posted here
    await rig.ledger.decide(taken.batch_id, Pending())
    await rig.ledger.decide(pending.batch_id, Pending())
    async with rig:
        await until(lambda: rig.status(lost) is BatchStatusName.UNKNOWN)
        await until(lambda: rig.ledger.parked == 2)  # taken (found pending) and pending
        assert rig.status(taken) is BatchStatusName.PENDING
        assert rig.batches[mine.batch_id].batch_status is None
        asked = {i for _, ids in rig.ledger.status_requests for i in ids}
        assert mine.batch_id not in asked
        assert rig.follower.scans == 1  # all of it from the start-up scan


async def test_an_answer_for_a_batch_resent_meanwhile_is_dropped() -> None:
    posting: set[str] = set()
    async with Rig(posting=posting) as rig:
        a = batch("a", 1)
        await rig.accepted(a)
        await until(lambda: rig.ledger.parked == 1)
        posting.add(a.batch_id)  # (as if forgotten, found Unknown and taken again)
        written = len(rig.writes)
        await rig.ledger.decide(a.batch_id, Unknown())
        await until(lambda: rig.ledger.parked == 0)
        await until(lambda: not rig.follower.followed)
        assert len(rig.writes) == written


async def test_an_answer_to_a_read_made_before_a_resend_is_dropped_even_after_it() -> None:
    """A read out before a submission took the batch again answers for the
    batch as it was: its UNKNOWN, recorded after that submission ended, would
    free the resent (and now pending) batch for a second, unasked resend."""
    posting: set[str] = set()
    async with Rig(posting=posting) as rig:
        a = batch("a", 1)
        await rig.accepted(a)
        await until(lambda: rig.ledger.parked == 1)
        # A submission takes the batch (as if the ledger had forgotten it) and
        # ends before the old read answers.
        posting.add(a.batch_id)
        rig.follower.resending(a.batch_id)
        posting.discard(a.batch_id)
        written = len(rig.writes)
        await rig.ledger.decide(a.batch_id, Unknown())
        await until(lambda: rig.ledger.parked == 0)
        assert not rig.follower.followed
        assert len(rig.writes) == written
        assert rig.status(a) is BatchStatusName.PENDING


async def test_parked_reads_are_bounded_and_every_batch_gets_its_turn() -> None:
    async with Rig(max_parked=2, wait_s=0.01) as rig:
        bs = [batch(f"s{i}", 1) for i in range(5)]
        await rig.accepted(*bs)
        await until(
            lambda: (
                {i for _, ids in rig.ledger.status_requests for i in ids}
                >= {b.batch_id for b in bs}
            )
        )
        assert rig.ledger.most_parked == 2
        for b in bs:
            await rig.ledger.decide(b.batch_id, Committed())
        await until(lambda: all(rig.status(b) is BatchStatusName.COMMITTED for b in bs))
        assert rig.follower.waiting_for_slot == 0


async def test_events_are_applied_at_once_and_an_early_one_when_its_batch_is_accepted() -> None:
    rig = Rig()
    rig.ledger.event_queue = asyncio.Queue()
    async with rig:
        a, b = batch("a", 1), batch("b", 1)
        await rig.accepted(a)
        rig.ledger.event_queue.put_nowait(CommitEvent(a.batch_id, Committed(), "1"))
        await until(lambda: rig.status(a) is BatchStatusName.COMMITTED)
        # b commits before its submitter recorded the 202.
        await rig.taken(b)
        rig.ledger.event_queue.put_nowait(CommitEvent(b.batch_id, Committed(), "2"))
        await until(lambda: rig.ledger.event_queue.empty())  # type: ignore[union-attr]
        for _ in range(20):
            await asyncio.sleep(0)
        assert rig.batches[b.batch_id].batch_status is None
        await rig.accepted(b)
        await until(lambda: rig.status(b) is BatchStatusName.COMMITTED)
        assert [w for w in rig.writes if w[0] == b.batch_id][-2:] == [
            (b.batch_id, BatchStatusName.PENDING),
            (b.batch_id, BatchStatusName.COMMITTED),
        ]
        assert rig.follower.applied_from_events == 2


async def test_a_trigger_asks_about_batches_not_parked() -> None:
    rig = Rig(max_parked=1)
    rig.ledger.trigger_queue = asyncio.Queue()
    async with rig:
        a, b = batch("a", 1), batch("b", 1)
        await rig.accepted(a, b)
        await until(lambda: rig.ledger.parked == 1)  # the other waits for the slot
        waiting = b if rig.ledger.status_requests[0][1] == (a.batch_id,) else a
        rig.ledger.statuses[waiting.batch_id] = Committed()  # no notification: only a read sees it
        rig.ledger.trigger_queue.put_nowait(None)
        await until(lambda: rig.status(waiting) is BatchStatusName.COMMITTED)
        assert rig.follower.triggers_received == 1


async def test_dropped_services_are_no_longer_followed() -> None:
    async with Rig() as rig:
        a, b = batch("a", 1), batch("b", 1)
        await rig.accepted(a, b)
        await until(lambda: rig.ledger.parked == 2)
        rig.follower.drop_services({"a"})
        await until(lambda: rig.ledger.parked == 1)
        assert set(rig.follower.followed) == {b.batch_id}


async def test_splinter_valid_is_followed_until_committed_without_spinning() -> None:
    """Scabbard may answer Valid at once, whatever the wait: not final, and no tight loop."""
    async with Rig(min_poll_interval_s=0.001, backoff_initial_ms=1, backoff_max_ms=8) as rig:
        a = batch("a", 1)
        await rig.accepted(a)
        await rig.ledger.decide(a.batch_id, Valid())
        await until(lambda: len(rig.ledger.status_requests) >= 5)
        assert rig.status(a) is BatchStatusName.PENDING  # clients see PENDING
        assert rig.submitted(a)
        # Read again after growing delays (1, 2, 4, 8, 8 ms ...), not back to back.
        entry = rig.follower.followed[a.batch_id]
        assert entry.failures >= 3
        await rig.ledger.decide(a.batch_id, Committed())
        await until(lambda: rig.status(a) is BatchStatusName.COMMITTED)


async def test_an_ask_answered_valid_is_recorded_pending_and_followed() -> None:
    async with Rig() as rig:
        a = batch("a", 1)
        await rig.taken(a)
        await rig.ledger.decide(a.batch_id, Valid())
        await rig.ambiguous(a, "timeout")
        await until(lambda: rig.status(a) is BatchStatusName.PENDING)
        await rig.ledger.decide(a.batch_id, Committed())
        await until(lambda: rig.status(a) is BatchStatusName.COMMITTED)


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_ids"):
        FollowSettings(max_ids=0)
    with pytest.raises(ConfigError, match=r"monitor\.backoff_max_ms \(5\)"):
        FollowSettings(backoff_initial_ms=10, backoff_max_ms=5)


async def test_answers_recorded_elsewhere_settle_what_is_followed() -> None:
    # A take-over records the answers about the batches it adopted itself (on
    # the claim thread): the follower parks a read for a pending one, stops
    # following a final one without writing it again, and asks about one
    # left without an answer as about any other.
    async with Rig() as rig:
        p, f, n = batch("p", 1), batch("f", 1), batch("n", 1)
        await rig.taken(p, f, n)
        entries = rig.follower.adopt([(b.batch_id, b.service_id) for b in (p, f, n)])
        await rig.ledger.decide(p.batch_id, Pending())
        await rig.ledger.decide(n.batch_id, Committed())
        rig.follower.settled(entries, {p.batch_id: Pending(), f.batch_id: Committed()})
        await until(lambda: rig.status(n) is BatchStatusName.COMMITTED)
        assert f.batch_id not in rig.follower.followed
        assert rig.status(f) is None  # not written here
        await until(lambda: rig.ledger.parked == 1)  # the pending one's parked read
        await rig.ledger.decide(p.batch_id, Committed())
        await until(lambda: rig.status(p) is BatchStatusName.COMMITTED)
        asked = {i for _, ids in rig.ledger.status_requests for i in ids}
        assert f.batch_id not in asked


async def test_a_batch_whose_final_answer_is_being_recorded_is_not_read_again() -> None:
    """A scan while a final status waits for its group commit finds the batch
    still pending in the store: it is neither read nor written again."""
    async with Rig() as rig:
        a = batch("a", 1)
        await rig.accepted(a)
        await until(lambda: rig.ledger.parked == 1)
        rig.hold = asyncio.Event()
        await rig.ledger.decide(a.batch_id, Committed())
        await until(lambda: rig.holding == 1)
        assert rig.status(a) is BatchStatusName.PENDING
        assert await rig.follower.scan() == 0
        assert a.batch_id not in rig.follower.followed
        rig.hold.set()
        await until(lambda: rig.status(a) is BatchStatusName.COMMITTED)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(rig.ledger.status_requests) == 1
        assert rig.writes.count((a.batch_id, BatchStatusName.COMMITTED)) == 1


async def test_a_scan_read_before_a_final_answer_landed_does_not_follow_the_batch_again() -> None:
    """A scan that read the store before the final write landed, and comes
    back after, holds a stale state: the batch is not followed again."""
    async with Rig() as rig:
        a = batch("a", 1)
        await rig.accepted(a)
        await until(lambda: rig.ledger.parked == 1)
        rig.hold = asyncio.Event()
        await rig.ledger.decide(a.batch_id, Committed())
        await until(lambda: rig.holding == 1)
        rig.scan_gate = asyncio.Event()
        reads = rig.scan_reads
        scan = asyncio.create_task(rig.follower.scan())
        await until(lambda: rig.scan_reads == reads + 1)  # read: a still Pending
        rig.hold.set()
        await until(lambda: rig.status(a) is BatchStatusName.COMMITTED)
        for _ in range(20):
            await asyncio.sleep(0)
        rig.scan_gate.set()
        assert await scan == 0
        assert a.batch_id not in rig.follower.followed
        assert len(rig.ledger.status_requests) == 1
        assert rig.writes.count((a.batch_id, BatchStatusName.COMMITTED)) == 1


async def test_a_scan_asked_for_some_services_reads_only_theirs() -> None:
    """Services gained with work: their batches are read, not every service's."""
    rig = Rig()
    left, other = batch("gained", 1), batch("other", 1)
    async with rig:
        await rig.taken(left, other)  # {submitted, None}: as a dead instance left them
        await rig.ledger.decide(left.batch_id, Pending())
        rig.follower.scan_now(["gained"])
        await until(lambda: rig.ledger.parked == 1)
        assert rig.scanned == [None, frozenset({"gained"})]
        assert set(rig.follower.followed) == {left.batch_id}


async def test_scans_of_some_services_do_not_put_the_full_scan_off() -> None:
    """The safety net reads every service each poll interval, whatever the
    scans of a few services asked for in between."""
    rig = Rig(poll_interval_s=0.2)
    async with rig:
        for _ in range(1000):
            if rig.scanned.count(None) >= 2:
                break
            rig.follower.scan_now(["busy"])
            await asyncio.sleep(0.01)
        assert rig.scanned.count(None) >= 2
        assert frozenset({"busy"}) in rig.scanned
