"""The parallel strategy's final status → freed batches merge in the recorder:
a parallel service's final status takes the batches it frees along (when the
store can) and hands them to the submitter; the queue is woken only when more
may be free."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pipeline_fakes import MemoryPipelineStore, batch

from ledgerq.clock import ManualClock
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import BatchStatus, Committed, Fence, Pending, TrackingBatch
from ledgerq.record.recorder import FREED_TAKE, Recorder


@dataclass
class FakeTake:
    slots: int
    started: list[list[TrackingBatch]] = field(default_factory=list)
    cancelled: bool = False

    def start(self, batches: list[TrackingBatch]) -> None:
        self.started.append(batches)

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeTaker:
    slots: int = FREED_TAKE
    takes: list[FakeTake] = field(default_factory=list)

    def reserve(self, service_id: str) -> None:
        return None

    def takes_next(self, service_id: str) -> bool:
        return False

    def reserve_freed(self, service_id: str, most: int) -> FakeTake | None:
        if not self.slots:
            return None
        take = FakeTake(min(most, self.slots))
        self.takes.append(take)
        return take


@dataclass
class FakeWriter:
    frees: list[TrackingBatch]
    takes_freed: bool = True
    calls: list[tuple[str, BatchStatus, int, Fence | None]] = field(default_factory=list)
    store: MemoryPipelineStore = field(default_factory=MemoryPipelineStore)

    async def next_open_batch(self, service_id: str, after: str) -> TrackingBatch | None:
        raise AssertionError("a parallel service reads nothing ahead")

    async def status_then_take(self, *args: object, **kwargs: object) -> bool:
        raise AssertionError("a parallel service's next batch is not the serial merge's")

    async def status_then_take_freed(
        self,
        id: str,
        service_id: str,
        status: BatchStatus,
        receipts: object,
        take: int,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> list[TrackingBatch]:
        self.calls.append((id, status, take, fence))
        await self.store.update_batch_status(id, service_id, status, now=now)
        return self.frees[:take]


@pytest.mark.parametrize(("freed", "woken"), [(0, True), (1, False), (FREED_TAKE, True)])
async def test_a_final_status_takes_what_it_frees(freed: int, woken: bool) -> None:
    a = batch("p", 1)
    frees = [batch("p", n) for n in range(2, 2 + FREED_TAKE + 1)]
    writer = FakeWriter(frees[:freed])
    writer.store.add(a, *frees)
    fence = Fence("me", 3)
    recorder = Recorder(writer.store, clock=ManualClock(), fences=lambda _s: fence)
    taker = FakeTaker()
    recorder.set_next_taker(taker, writer)  # type: ignore[arg-type]
    unlocked: list[str] = []
    moved: list[str] = []
    recorder.add_unlock_listener(unlocked.append)
    recorder.add_moved_on_listener(moved.append)
    await recorder.ledger_status("p", LedgerBatchStatus(a.batch_id, Committed()))
    assert writer.calls == [(a.batch_id, Committed(), FREED_TAKE, fence)]
    [take] = taker.takes
    assert take.started == [frees[:freed]] and not take.cancelled
    # Taken under the final status's fence: their outcomes are written under it.
    for b in frees[:freed]:
        assert recorder.fence_of("p", b.batch_id) == fence
    assert (unlocked, moved) == ((["p"], []) if woken else ([], ["p"]))


async def test_without_the_store_or_a_slot_the_final_status_goes_alone() -> None:
    a = batch("p", 1)
    for writer, taker in [
        (FakeWriter([], takes_freed=False), FakeTaker()),
        (FakeWriter([]), FakeTaker(slots=0)),
    ]:
        writer.store.add(a)
        recorder = Recorder(writer.store, clock=ManualClock())
        recorder.set_next_taker(taker, writer)  # type: ignore[arg-type]
        unlocked: list[str] = []
        recorder.add_unlock_listener(unlocked.append)
        await recorder.ledger_status("p", LedgerBatchStatus(a.batch_id, Committed()))
        assert writer.calls == [] and unlocked == ["p"]
        assert writer.store.batches[a.batch_id].is_final
        writer.store.batches.clear()


async def test_a_pending_status_takes_nothing() -> None:
    a = batch("p", 1)
    writer = FakeWriter([batch("p", 2)])
    writer.store.add(a)
    recorder = Recorder(writer.store, clock=ManualClock())
    taker = FakeTaker()
    recorder.set_next_taker(taker, writer)  # type: ignore[arg-type]
    await recorder.ledger_status("p", LedgerBatchStatus(a.batch_id, Pending()))
    assert writer.calls == [] and taker.takes == []
