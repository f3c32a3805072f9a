"""The pipelined strategy: chained batches of one service in flight together,
their order kept by a ledger that enforces declared dependencies."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq.clock import ManualClock
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError, StoreError
from ledgerq.ledgers.base import Ambiguous, SubmitResult
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    Committed,
    Invalid,
    InvalidTransaction,
    Pending,
    TrackingBatch,
    Unknown,
)
from ledgerq.pipeline.dependencies import DependencyCheck
from ledgerq.pipeline.pipelined import Pipelines, Take
from ledgerq.queue.strategy import OnInvalidMap, StrategyMap
from ledgerq.store import MemoryStore, open_store
from tests.factories import tracking_batch
from tests.ledger_fakes import ScriptedLedger
from tests.unit.test_producer import Rig, until, until_status

PIPELINED = StrategyMap.parse("pipelined")


def chain(service: str, n: int, *, first: int = 1) -> list[TrackingBatch]:
    """``n`` batches, each depending on the one before (as ``intkey load`` makes them)."""
    out: list[TrackingBatch] = []
    for i in range(first, first + n):
        deps = [out[-1].transactions[0].transaction_header] if out else []
        out.append(tracking_batch(service, i, dependencies=deps))
    return out


class Ordering(ScriptedLedger):
    """A ledger that enforces declared dependencies: a batch it holds commits
    (on :meth:`commit`) once every batch it depends on committed, in the
    order they arrived; it records a POST of a batch it holds or committed."""

    def __init__(self, batches: list[TrackingBatch]) -> None:
        super().__init__()
        self.arrived: list[str] = []
        self.committed: list[str] = []
        self.violations: list[str] = []
        self.most_pending = 0
        #: Batch ids it judges INVALID when their turn comes.
        self.invalid: set[str] = set()
        self._needs = {b.batch_id: set(b.transactions[0].dependencies) for b in batches}
        self._tx = {b.batch_id: b.transactions[0].transaction_header for b in batches}

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        if isinstance(self.statuses.get(batch_id), Pending | Committed | Invalid):
            self.violations.append(batch_id)
        result = await super().submit(service_id, batch_id, serialized_batch)
        self.statuses[batch_id] = Pending()  # held until its dependencies commit
        self.arrived.append(batch_id)
        pending = [b for b, s in self.statuses.items() if isinstance(s, Pending)]
        self.most_pending = max(self.most_pending, len(pending))
        return result

    def _done(self, batch_id: str) -> bool:
        txs = {self._tx[b] for b in self.committed}
        return self._needs.get(batch_id, set()) <= txs

    async def commit(self) -> None:
        """A block: every held batch whose dependencies committed, in order."""
        progress = True
        while progress:
            progress = False
            for batch_id in list(dict.fromkeys(self.arrived)):
                if not isinstance(self.statuses.get(batch_id), Pending):
                    continue
                if batch_id in self.invalid:
                    bad = InvalidTransaction(self._tx[batch_id], error_message="no such key")
                    await self.decide(batch_id, Invalid((bad,)))
                elif self._done(batch_id):
                    self.committed.append(batch_id)
                    await self.decide(batch_id, Committed())
                    progress = True

    async def forget(self, ids: list[str]) -> None:
        for batch_id in ids:
            await self.decide(batch_id, Unknown())

    def status(self, batch_id: str) -> BatchStatus | None:
        return self.statuses.get(batch_id)


async def test_a_chain_is_in_flight_together_and_committed_in_order() -> None:
    batches = chain("s", 10)
    ledger = Ordering(batches)
    rig = Rig(ledger=ledger, strategies=PIPELINED)
    await rig.add(*batches)
    async with rig:
        # Before anything commits, the whole chain is at the ledger.
        await until(lambda: len(ledger.arrived) == 10)
        assert ledger.committed == []
        await ledger.commit()
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    assert ledger.committed == [b.batch_id for b in batches]
    assert ledger.arrived == ledger.committed  # each once, in order
    assert ledger.violations == [] and ledger.most_pending == 10


async def test_batches_accepted_while_others_are_in_flight_go_before_a_commit() -> None:
    batches = chain("s", 6)
    ledger = Ordering(batches)
    rig = Rig(ledger=ledger, strategies=PIPELINED)
    await rig.add(*batches[:3])
    async with rig:
        await until(lambda: len(ledger.arrived) == 3 and not rig.producer.submitting)
        await asyncio.sleep(0.02)  # the walk the last acceptance started found nothing
        await rig.add(*batches[3:])  # the API's insert wakes the service
        await until(lambda: len(ledger.arrived) == 6)
        assert ledger.committed == []
        await ledger.commit()
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    assert ledger.arrived == ledger.committed == [b.batch_id for b in batches]
    assert ledger.violations == []


async def test_the_depth_bounds_what_is_in_flight() -> None:
    batches = chain("s", 6)
    ledger = Ordering(batches)
    rig = Rig(ledger=ledger, strategies=PIPELINED, pipeline_depth=2)
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.arrived) == 2)
        await asyncio.sleep(0.02)
        assert len(ledger.arrived) == 2
        for _ in range(6):
            await ledger.commit()
            await asyncio.sleep(0.01)
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
            await ledger.commit()
    assert ledger.most_pending == 2 and ledger.violations == []


async def test_a_batch_that_does_not_declare_its_predecessor_waits_for_it() -> None:
    first, loose, last = tracking_batch("s", 1), tracking_batch("s", 2), tracking_batch("s", 3)
    ledger = Ordering([first, loose, last])
    rig = Rig(ledger=ledger, strategies=PIPELINED)
    await rig.add(first, loose, last)
    async with rig:
        await until(lambda: ledger.arrived == [first.batch_id] and ledger.parked == 1)
        await asyncio.sleep(0.02)
        assert ledger.arrived == [first.batch_id]  # as serial
        await ledger.commit()
        await until(lambda: len(ledger.arrived) == 2)
        await ledger.commit()
        await until(lambda: len(ledger.arrived) == 3)
    assert ledger.arrived == [first.batch_id, loose.batch_id, last.batch_id]


@pytest.mark.parametrize("halt", [False, True])
async def test_an_invalid_batch_mid_chain_fails_what_follows_it_at_once(halt: bool) -> None:
    batches = chain("s", 5)
    ledger = Ordering(batches)
    ledger.invalid = {batches[2].batch_id}
    on_invalid = OnInvalidMap.parse("halt" if halt else "continue")
    rig = Rig(ledger=ledger, strategies=PIPELINED, on_invalid=on_invalid)
    await rig.add(*batches[:4])
    async with rig:
        await until(lambda: len(ledger.arrived) == 4)
        await ledger.commit()
        await until_status(rig, batches[2], BatchStatusName.INVALID)
        # The one in flight after it failed without waiting for the ledger.
        await until_status(rig, batches[3], BatchStatusName.INVALID)
        await rig.add(batches[4])  # accepted after the failure
        if halt:
            await asyncio.sleep(0.02)
            assert (await rig.get(batches[4])).batch_status is None  # halted: untouched
        else:
            await until_status(rig, batches[4], BatchStatusName.INVALID)
        controls = await rig.store.service_controls()
    assert ledger.committed == [b.batch_id for b in batches[:2]]
    assert ledger.arrived == [b.batch_id for b in batches[:4]]  # none sent after
    status = (await rig.get(batches[3])).batch_status
    assert isinstance(status, Invalid)
    assert batches[2].batch_id in (status.transactions[0].external_error_message or "")
    assert ("s" in controls) is halt


@pytest.mark.parametrize("first", [0, 1])
async def test_batches_the_ledger_lost_are_sent_again_in_order_and_only_those(first: int) -> None:
    batches = chain("s", 5)
    ledger = Ordering(batches)
    rig = Rig(ledger=ledger, strategies=PIPELINED)
    await rig.add(*batches)
    lost = batches[first : first + 3]
    async with rig:
        await until(lambda: len(ledger.arrived) == 5)
        await ledger.forget([b.batch_id for b in lost])
        for b in lost:
            await until(lambda b=b: ledger.arrived.count(b.batch_id) == 2)
        await ledger.commit()
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    resent = ledger.arrived[5:]
    assert resent == [b.batch_id for b in lost]  # in order, each once
    assert ledger.committed == [b.batch_id for b in batches]
    assert ledger.violations == []


class GatedOrdering(Ordering):
    """An :class:`Ordering` ledger that answers the POST of ``gated`` only once
    ``gate`` is set."""

    def __init__(self, batches: list[TrackingBatch], gated: str) -> None:
        super().__init__(batches)
        self.gated = gated
        self.open = asyncio.Event()

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        if batch_id == self.gated:
            await self.open.wait()
        return await super().submit(service_id, batch_id, serialized_batch)


class SlowReads(MemoryStore):
    """A store whose reads of batches by id open the ledger's gate, then take a while."""

    ledger: GatedOrdering

    async def get_batches_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        self.ledger.open.set()
        await asyncio.sleep(0.05)
        return await super().get_batches_by_id(batch_ids)


async def test_nothing_is_taken_after_an_invalid_batch_while_its_successors_are_failed() -> None:
    # The INVALID verdict arrives while the batch after it is being posted;
    # that POST is accepted while the failure of what follows is under way:
    # the walk it starts must not send the next batch (it would depend on
    # the INVALID one, and nothing would ever fail it).
    batches = chain("s", 6)
    ledger = GatedOrdering(batches, gated=batches[3].batch_id)
    ledger.invalid = {batches[2].batch_id}
    clock = ManualClock()
    store = SlowReads(clock=clock)
    store.ledger = ledger
    rig = Rig(ledger=ledger, strategies=PIPELINED, store=store, clock=clock)
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.arrived) == 3)
        await ledger.commit()
        for b in batches[2:]:
            await until_status(rig, b, BatchStatusName.INVALID)
    assert ledger.arrived == [b.batch_id for b in batches[:4]]
    assert ledger.committed == [b.batch_id for b in batches[:2]]


class SlowWalks(MemoryStore):
    """A store whose reads of the next batch and of dependencies take a
    while: walks overlap."""

    async def batches_following(
        self, service_id: str, after: str | None, *, limit: int
    ) -> list[TrackingBatch]:
        await asyncio.sleep(0.05)
        return await super().batches_following(service_id, after, limit=limit)

    async def dependency_states(self, transaction_ids: Collection[str]) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return dict(await super().dependency_states(transaction_ids))


async def test_two_walks_at_once_never_take_one_batch_twice() -> None:
    # Two walks from a committed batch (a final status and an acceptance each
    # start one) find the next batch and read its dependencies at the same
    # time: one of them takes it.
    batches = chain("s", 3)
    ledger = Ordering(batches)
    clock = ManualClock()
    store = SlowWalks(clock=clock)
    rig = Rig(ledger=ledger, strategies=PIPELINED, store=store, clock=clock)
    await rig.add(batches[0])
    async with rig:
        await until(lambda: len(ledger.arrived) == 1)
        await ledger.commit()
        await until_status(rig, batches[0], BatchStatusName.COMMITTED)
        await store.add_batches(batches[1:])  # not woken: only the walks take them
        walk = rig.producer._pipeline_next
        await asyncio.gather(walk("s", batches[0].batch_id), walk("s", batches[0].batch_id))
        await until(lambda: len(ledger.arrived) == 3)
        await asyncio.sleep(0.2)
        for _ in range(3):
            await ledger.commit()
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    assert ledger.arrived == [b.batch_id for b in batches]  # each once
    assert ledger.violations == []


class CountedReads(MemoryStore):
    """A store that counts the walks' reads of a service's next batch."""

    reads = 0

    async def batches_following(
        self, service_id: str, after: str | None, *, limit: int
    ) -> list[TrackingBatch]:
        self.reads += 1
        return await super().batches_following(service_id, after, limit=limit)


async def test_a_commit_does_not_walk_again_past_every_batch_in_flight() -> None:
    # Each final status may free a place in the lane: it looks after the
    # last batch in flight, not at each of those in flight one by one.
    batches = chain("s", 20)
    ledger = Ordering(batches)
    clock = ManualClock()
    store = CountedReads(clock=clock)
    rig = Rig(ledger=ledger, strategies=PIPELINED, store=store, clock=clock)
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.arrived) == 20)
        await ledger.commit()
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    assert ledger.arrived == ledger.committed == [b.batch_id for b in batches]
    assert store.reads <= 3 * len(batches), store.reads


async def test_a_batch_sent_again_that_is_invalid_fails_every_batch_after_it() -> None:
    # Lost and sent again, the second and third batches are taken after the
    # fourth and fifth; the second's INVALID still fails all three behind it.
    batches = chain("s", 5)
    ledger = Ordering(batches)
    rig = Rig(ledger=ledger, strategies=PIPELINED)
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.arrived) == 5)
        await ledger.forget([b.batch_id for b in batches[1:3]])
        await until(lambda: len(ledger.arrived) == 7)
        ledger.invalid = {batches[1].batch_id}
        await ledger.commit()
        for b in batches[1:]:
            await until_status(rig, b, BatchStatusName.INVALID)
    assert ledger.committed == [batches[0].batch_id]
    assert ledger.violations == []


class CountedWrites(MemoryStore):
    """A store that keeps the batch ids each of its writes took."""

    takes: list[list[str]]

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        self.takes.append([w.id for w in writes if w.attempt])
        return await super().apply_writes(writes)


class OnePostAtATime(Ordering):
    """An :class:`Ordering` ledger that counts the POSTs it answers at once."""

    def __init__(self, batches: list[TrackingBatch]) -> None:
        super().__init__(batches)
        self.posting = 0
        self.most_posting = 0

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        self.posting += 1
        self.most_posting = max(self.most_posting, self.posting)
        try:
            await asyncio.sleep(0.001)
            return await super().submit(service_id, batch_id, serialized_batch)
        finally:
            self.posting -= 1


async def test_a_run_is_taken_in_one_store_write_and_posted_in_order() -> None:
    # Once the first batch is at the ledger, the nine after it are taken
    # together (one transaction), then posted one after the other, each once
    # the ledger accepted the one before it.
    batches = chain("s", 10)
    ledger = OnePostAtATime(batches)
    clock = ManualClock()
    store = CountedWrites(clock=clock)
    store.takes = []
    rig = Rig(ledger=ledger, strategies=PIPELINED, store=store, clock=clock)
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.arrived) == 10)
        await ledger.commit()
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    ids = [b.batch_id for b in batches]
    assert [t for t in store.takes if t] == [ids[:1], ids[1:]]
    assert ledger.arrived == ids and ledger.most_posting == 1
    assert ledger.most_pending == 10 and ledger.violations == []


async def test_the_batches_after_one_the_ledger_did_not_accept_are_asked_about_first() -> None:
    # The third batch's POST is ambiguous (the ledger has it after all): the
    # two after it in its run are not posted; the ledger is asked about them
    # (it never saw them), then they go, once each, in order.
    batches = chain("s", 5)
    ledger = Ordering(batches)
    ledger.script = {batches[2].batch_id: [Ambiguous("connection dropped after the POST")]}
    rig = Rig(ledger=ledger, strategies=PIPELINED)
    await rig.add(*batches)
    async with rig:
        await until(lambda: len(ledger.arrived) == 5)
        await ledger.commit()
        for b in batches:
            await until_status(rig, b, BatchStatusName.COMMITTED)
    assert ledger.arrived == ledger.committed == [b.batch_id for b in batches]
    assert ledger.violations == []
    asked = {i for _, ids in ledger.status_requests for i in ids}
    assert {batches[3].batch_id, batches[4].batch_id} <= asked


async def test_a_lost_batch_goes_again_once_the_ledger_says_it_has_the_one_before() -> None:
    # The ledger said it lost the second batch; the first, in flight here,
    # it lost too but has not said so yet: the second waits (asked, not
    # guessed), and goes once the ledger has the first again.
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    ledger = ScriptedLedger()
    batches = await store.add_batches(chain("s", 3))
    first, lost, _ = batches
    await store.apply_writes([BatchWrite("s", b.batch_id, attempt=True) for b in batches])
    await store.apply_writes([BatchWrite("s", lost.batch_id, Unknown())])
    pipelines = Pipelines(
        store,
        ledger,
        PIPELINED,
        DependencyCheck(store, ledger),
        depth=8,
        delay_window_ms=0,
        clock=clock,
    )
    for b in batches:
        pipelines.taken(b)
    pipelines.leave("s", lost.batch_id)
    assert await pipelines.next("s", None, ()) is None
    assert ledger.status_requests == [("s", (first.batch_id,))]
    assert pipelines.lost_behind("s")  # the next walk starts from the first batch
    ledger.statuses[first.batch_id] = Pending()
    found = await pipelines.next("s", None, ())
    assert isinstance(found, Take) and [b.batch_id for b in found.batches] == [lost.batch_id]
    assert not pipelines.lost_behind("s")


async def _lane(depth: int, n: int) -> tuple[Pipelines, MemoryStore, list[TrackingBatch]]:
    """A lane of ``n`` chained batches, all taken (``submitted``)."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    ledger = ScriptedLedger()
    batches = await store.add_batches(chain("s", n))
    await store.apply_writes([BatchWrite("s", b.batch_id, attempt=True) for b in batches])
    pipelines = Pipelines(
        store,
        ledger,
        PIPELINED,
        DependencyCheck(store, ledger),
        depth=depth,
        delay_window_ms=0,
        clock=clock,
    )
    for b in batches:
        pipelines.taken(b)
    return pipelines, store, batches


async def test_a_lost_batch_before_a_full_lane_goes_again_whatever_the_depth() -> None:
    # The batches after it wait at the ledger for it: it must go.
    pipelines, store, batches = await _lane(depth=2, n=3)
    await store.apply_writes([BatchWrite("s", batches[0].batch_id, Unknown())])
    pipelines.leave("s", batches[0].batch_id)
    found = await pipelines.next("s", None, ())
    assert isinstance(found, Take) and [b.batch_id for b in found.batches] == [batches[0].batch_id]


async def test_a_write_about_an_earlier_take_does_not_end_a_take_made_since() -> None:
    pipelines, _, [b] = await _lane(depth=8, n=1)
    first = pipelines.take_of("s", b.batch_id)
    pipelines.leave("s", b.batch_id)  # lost
    pipelines.taken(b)  # taken again before the writer of "lost" moved on
    assert pipelines.leave_take("s", b.batch_id, first) == (None, [])
    assert pipelines.leave_take("s", b.batch_id, None) == (None, [])
    assert pipelines.holds("s", b.batch_id)
    pipelines.leave_take("s", b.batch_id, pipelines.take_of("s", b.batch_id))
    assert not pipelines.holds("s", b.batch_id)


class _CheckedLate:
    """Slows two reads of ``store``: its dependency checks' reads about
    ``gated`` (a batch) wait for :attr:`gate`; and a walk's read of the
    batches after :attr:`slow` answers only once the producer took the
    first of them (again)."""

    def __init__(self, store: Any, gated: str) -> None:
        self.gate = asyncio.Event()
        self.slow: str | None = None
        self.producer: Any = None
        path, following = store.dependency_path, store.batches_following

        async def dependency_path(service_id: str, batch_id: str, max_steps: int) -> Any:
            if batch_id == gated:
                await self.gate.wait()
            return await path(service_id, batch_id, max_steps)

        async def batches_following(
            service_id: str, after: str | None, *, limit: int
        ) -> list[TrackingBatch]:
            found = await following(service_id, after, limit=limit)
            if after is not None and after == self.slow:
                self.slow = None
                await until(lambda: after in self.producer.in_flight)
            return found

        store.dependency_path = dependency_path
        store.batches_following = batches_following


async def _left_by_another(
    store: Any, ledger: Ordering, first: TrackingBatch, lost: TrackingBatch, *, asked: bool
) -> None:
    """``first`` committed; ``lost`` taken by an instance that died before its
    POST reached the ledger: still ``submitted`` (``asked``: the ledger was
    asked since, and said UNKNOWN)."""
    for b in (first, lost):
        await store.change_batch_to_submitted(b.batch_id, b.service_id)
    await store.update_batch_status(first.batch_id, first.service_id, Committed())
    if asked:
        await store.update_batch_status(lost.batch_id, lost.service_id, Unknown())
    ledger.arrived.append(first.batch_id)
    ledger.committed.append(first.batch_id)
    ledger.statuses[first.batch_id] = Committed()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("walk_from", ["before", "lost"])
async def test_a_walk_never_takes_a_batch_past_one_sent_again_before_the_ledger_has_it(
    walk_from: str, kind: str, tmp_path: Path
) -> None:
    # The second batch never reached the ledger (its taker died); the queue
    # sends it again, and its dependency check is under way when a walk runs:
    # * "before": the walk, from the first batch, read the second while it
    #   was still in flight elsewhere and looks past it;
    # * "lost": the walk is from the second batch itself (started while it
    #   was the last in flight here, run once it was lost and taken again).
    # Either way the third must not go first: the ledger would hold it, the
    # second's check would step aside for it, and the service would stall
    # with the second Unknown and the third Pending for ever.
    batches = chain("s", 4)
    first, lost = batches[:2]
    ledger = Ordering(batches)
    clock = ManualClock()
    if kind == "memory":
        store: Any = MemoryStore(clock=clock)
    else:
        store = await open_store(f"sqlite:///{tmp_path / 'store.sqlite3'}", clock=clock)
    late = _CheckedLate(store, gated=lost.batch_id)
    await store.add_batches(batches)
    await _left_by_another(store, ledger, first, lost, asked=walk_from == "lost")
    rig = Rig(ledger=ledger, strategies=PIPELINED, store=store, clock=clock)
    late.producer = rig.producer
    walk = rig.producer._pipeline_next
    try:
        if walk_from == "before":
            late.slow = lost.batch_id
            walking = asyncio.create_task(walk("s", first.batch_id))
            await asyncio.sleep(0)  # it read the second in flight elsewhere, and looks past it
        async with rig:
            await until(lambda: lost.batch_id in rig.producer.in_flight)
            if walk_from == "before":
                await walking
            else:
                await walk("s", lost.batch_id)
            late.gate.set()
            for b in batches[1:]:
                await until(lambda b=b: b.batch_id in ledger.arrived)
                await ledger.commit()
                await until_status(rig, b, BatchStatusName.COMMITTED)
    finally:
        await store.close()
    assert ledger.arrived == [b.batch_id for b in batches]  # in order, each once
    assert ledger.committed == ledger.arrived
    assert ledger.violations == []


def test_a_ledger_that_does_not_enforce_dependencies_is_refused() -> None:
    with pytest.raises(ConfigError, match="pipelined needs a ledger"):
        load_settings(
            {
                "ledger": "splinter+http://127.0.0.1:8085",
                "queuer.strategy_by_service": "a*=pipelined",
            },
            environ={},
        )
    load_settings(
        {"ledger": "sawtooth+http://127.0.0.1:8008", "queuer.strategy": "pipelined"}, environ={}
    )


# -- the property: a pipelined run commits what a serial run commits ----------

_EVENTS = st.lists(
    st.one_of(
        st.just(("commit", [])),
        # The ledger forgets some of the batches it holds then: these
        # numbers pick them (modulo how many it holds), drawn beforehand.
        st.tuples(st.just("forget"), st.lists(st.integers(0, 99), min_size=1, max_size=3)),
        st.just(("wait", [])),
    ),
    max_size=8,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=2),
    invalid_at=st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=2, max_size=2),
    depth=st.integers(1, 4),
    events=_EVENTS,
)
async def test_a_pipelined_run_commits_what_a_serial_run_commits(
    lengths: list[int],
    invalid_at: list[int | None],
    depth: int,
    events: list[tuple[str, list[int]]],
) -> None:
    # Random chains (each batch depends on the one before), an INVALID batch
    # somewhere in some of them, and the ledger committing and forgetting
    # held batches at random points: every batch ends as a serial run ends
    # it — the chain up to its INVALID batch committed, in order, that batch
    # and those after it INVALID — no batch the ledger held or committed is
    # posted again, and nothing arrives ahead of the batch it depends on.
    chains = [chain(f"s{n}", length) for n, length in enumerate(lengths)]
    batches = [b for c in chains for b in c]
    ledger = Ordering(batches)
    expected: dict[str, BatchStatusName] = {}
    for c, bad in zip(chains, invalid_at, strict=False):
        cut = len(c) if bad is None or bad >= len(c) else bad
        if cut < len(c):
            ledger.invalid.add(c[cut].batch_id)
        for i, b in enumerate(c):
            expected[b.batch_id] = BatchStatusName.COMMITTED if i < cut else BatchStatusName.INVALID
    rig = Rig(ledger=ledger, strategies=PIPELINED, pipeline_depth=depth)
    await rig.add(*batches)
    async with rig:
        for kind, picks in events:
            if kind == "commit":
                await ledger.commit()
            elif kind == "forget":
                held = [b for b, s in ledger.statuses.items() if isinstance(s, Pending)]
                if held:
                    await ledger.forget(sorted({held[p % len(held)] for p in picks}))
            await asyncio.sleep(0.002)  # the producer's turn, however far it gets
        # Then the ledger commits until every batch is final in the store.
        for _ in range(200):
            await ledger.commit()
            seen = {b.batch_id: await rig.status(b) for b in batches}
            if all(
                s in (BatchStatusName.COMMITTED, BatchStatusName.INVALID) for s in seen.values()
            ):
                break
            await asyncio.sleep(0.01)
    assert seen == expected
    for c in chains:
        ids = [b.batch_id for b in c]
        assert [b for b in ledger.committed if b in ids] == [
            b for b in ids if expected[b] is BatchStatusName.COMMITTED
        ]
        # Each batch arrived (every time) only after the one before it had.
        for before, after in itertools.pairwise(ids):
            if after in ledger.arrived:
                assert ledger.arrived.index(before) < ledger.arrived.index(after)
    assert ledger.violations == []
