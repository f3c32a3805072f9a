"""QueueSource feeding the real Submitter: ordered, one in flight, driven by wake-ups."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from pipeline_fakes import MemoryPipelineStore, ScriptedLedger, batch

from ledgerq.clock import ManualClock
from ledgerq.ledgers.base import Busy, LedgerBatchStatus
from ledgerq.model import BatchStatusName, Committed, TrackingBatch
from ledgerq.queue.serial import select_round
from ledgerq.queue.source import QueueSource
from ledgerq.record.recorder import Recorder
from ledgerq.submit.submitter import Submitter, SubmitterSettings


class RoundsStore(MemoryPipelineStore):
    """The pipeline's memory store, with rounds computed by the reference rules."""

    async def queue_round(
        self,
        *,
        now: int,
        delay_window_ms: int,
        services: Collection[str] | None = None,
        limit: int | None = None,
    ) -> list[TrackingBatch]:
        picks = select_round(
            self.batches.values(), now=now, delay_window_ms=delay_window_ms, services=services
        )
        return picks if limit is None else picks[:limit]


async def test_the_submitter_drains_every_service_in_order_without_polling() -> None:
    store = RoundsStore()
    services = ["s1", "s2", "s3", "s4"]
    n = 0
    for _ in range(5):
        for service in services:
            n += 1
            store.add(batch(service, n))
    ledger = ScriptedLedger()
    first_of_s2 = next(b for b in store.batches.values() if b.service_id == "s2")
    ledger.script = {first_of_s2.batch_id: [Busy(503)] * 3}  # Delayed once
    clock = ManualClock()
    recorder = Recorder(store, clock=clock)
    # An hour of polling interval and delay window: only wake-ups can move
    # things along, and the Delayed batch waits for the clock to move.
    source = QueueSource(store, clock=clock, poll_interval=3_600, delay_window_ms=15_000)
    recorder.add_unlock_listener(source.wake)
    accepted: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    recorder.add_accept_listener(lambda b, s: accepted.put_nowait((b, s)))
    settings = SubmitterSettings(slots=8, max_retries=1, poll_timeout_s=3_600)

    async def no_sleep(_: float) -> None:
        return None

    submitter = Submitter(source, ledger, recorder, settings, sleep=no_sleep)

    async def ledger_commits() -> None:
        while True:
            batch_id, service_id = await accepted.get()
            await recorder.ledger_status(service_id, LedgerBatchStatus(batch_id, Committed()))

    def done() -> bool:
        return all(b.status_name is BatchStatusName.COMMITTED for b in store.batches.values())

    async with asyncio.TaskGroup() as tasks:
        run = tasks.create_task(submitter.run())
        committer = tasks.create_task(ledger_commits())
        for _ in range(5_000):
            if store.batches[first_of_s2.batch_id].status_name is BatchStatusName.DELAYED:
                break
            await asyncio.sleep(0)
        for _ in range(200):
            await asyncio.sleep(0)  # the other services carry on meanwhile
        assert not done()
        clock.advance(15_000)
        source.wake()  # what the poll interval would do after an hour
        for _ in range(20_000):
            if done():
                break
            await asyncio.sleep(0)
        submitter.stop()
        source.wake()
        committer.cancel()
        await asyncio.wait_for(run, 10)

    assert done()
    for service in services:
        sent = [i for i in ledger.sent if i.startswith(service + "-")]
        deduped = list(dict.fromkeys(sent))
        assert deduped == sorted(deduped), f"{service} out of order: {sent}"
    # Only s2's first batch was sent more than once (busy, then delayed, then sent).
    repeats = {i for i in ledger.sent if ledger.sent.count(i) > 1}
    assert repeats == {first_of_s2.batch_id}
