"""Monitor: polling by service, id checks, Unknown clears submitted, stale recovery, events."""

from __future__ import annotations

import asyncio

from pipeline_fakes import MemoryPipelineStore, ScriptedLedger, batch

from ledgerq.clock import ManualClock
from ledgerq.dlt.base import CommitEvent
from ledgerq.model import BatchStatusName, Committed, Invalid, InvalidTransaction, Pending
from ledgerq.monitor import Monitor, MonitorSettings
from ledgerq.recorder import Recorder


def setup(
    *batches_: object, held: set[str] | None = None, **settings: int | float
) -> tuple[MemoryPipelineStore, ScriptedLedger, Recorder, Monitor, ManualClock]:
    store = MemoryPipelineStore()
    clock = ManualClock()
    ledger = ScriptedLedger()
    recorder = Recorder(store, clock=clock)
    monitor = Monitor(
        store,
        ledger,
        recorder,
        MonitorSettings(**settings),
        clock=clock,
        held=held,  # type: ignore[arg-type]
    )
    return store, ledger, recorder, monitor, clock


async def test_poll_groups_by_service_and_applies_statuses() -> None:
    store, ledger, recorder, monitor, _ = setup(max_ids=2)
    bs = [batch("a", 1), batch("b", 1), batch("c", 1), batch("c2", 1), batch("c3", 1)]
    store.add(*bs)
    for b in bs:
        await recorder.submitting(b)
        await recorder.accepted(b)
    a, b_, c, c2, c3 = (x.batch_id for x in bs)
    ledger.statuses = {
        a: Committed(),
        b_: Invalid((InvalidTransaction("t", error_message="no such key"),)),
        c: Pending(),
        # c2 unknown to the ledger: it lost it
    }
    ledger.statuses.pop(c2, None)
    ledger.statuses[c3] = Committed()
    applied = await monitor.poll_once()
    assert applied == 4  # c stays Pending: nothing to write
    assert {s for s, _ in ledger.status_requests} == {"a", "b", "c", "c2", "c3"}
    st = store.batches
    assert st[a].status_name is BatchStatusName.COMMITTED
    assert st[b_].status_name is BatchStatusName.INVALID
    assert st[c].status_name is BatchStatusName.PENDING and st[c].submitted
    assert st[c2].status_name is BatchStatusName.UNKNOWN and not st[c2].submitted
    # Only pending batches are asked next time.
    ledger.status_requests.clear()
    await monitor.poll_once()
    assert ledger.status_requests == [("c", (c,))]


async def test_chunks_respect_max_ids() -> None:
    store, ledger, recorder, monitor, _ = setup(max_ids=2)
    bs = [batch("a", n) for n in range(5)]
    store.add(*bs)
    for b in bs:
        await recorder.submitting(b)
        await recorder.accepted(b)
    await monitor.poll_once()
    assert sorted(len(ids) for _, ids in ledger.status_requests) == [1, 2, 2]


async def test_answers_about_other_ids_are_ignored() -> None:
    store, ledger, recorder, monitor, _ = setup()
    b = batch("a", 1)
    store.add(b)
    await recorder.submitting(b)
    await recorder.accepted(b)

    async def liar(service_id: str, ids: object, *, wait_s: float = 0.0) -> tuple[object, ...]:
        return ()  # the ledger answered nothing about our id

    ledger.batch_statuses = liar  # type: ignore[assignment,method-assign]
    assert await monitor.poll_once() == 0
    assert store.batches[b.batch_id].status_name is BatchStatusName.PENDING


async def test_stale_submission_is_recovered_after_asking_the_ledger() -> None:
    held: set[str] = set()
    store, ledger, recorder, monitor, clock = setup(held=held, stale_after_ms=30_000)
    taken, lost, mine = batch("a", 1), batch("b", 1), batch("c", 1)
    store.add(taken, lost, mine)
    for b in (taken, lost, mine):
        await recorder.submitting(b)  # {submitted, None}: the submitter died here
    held.add(mine.batch_id)  # ...except this one, still being submitted here
    ledger.statuses = {taken.batch_id: Pending()}
    assert await monitor.poll_once() == 0  # too recent to be stale
    clock.advance(30_001)
    assert await monitor.poll_once() == 2
    assert store.batches[taken.batch_id].status_name is BatchStatusName.PENDING
    assert store.batches[lost.batch_id].status_name is BatchStatusName.UNKNOWN
    assert not store.batches[lost.batch_id].submitted
    assert store.batches[mine.batch_id].batch_status is None
    asked = {i for _, ids in ledger.status_requests for i in ids}
    assert mine.batch_id not in asked


async def test_event_for_watched_batch_is_applied_and_unlocks_service() -> None:
    store, _ledger, recorder, monitor, _ = setup()
    unlocked: list[str] = []
    recorder.add_unlock_listener(unlocked.append)
    b = batch("a", 1)
    store.add(b)
    await recorder.submitting(b)
    await recorder.accepted(b)
    await monitor.handle_event(CommitEvent(b.batch_id, Committed(), "1"))
    assert store.batches[b.batch_id].status_name is BatchStatusName.COMMITTED
    assert unlocked == ["a"]
    assert monitor.applied_from_events == 1


async def test_event_before_accept_is_held_until_accepted() -> None:
    store, ledger, recorder, monitor, _ = setup(poll_interval_s=30)
    ledger.event_queue = asyncio.Queue()
    b = batch("a", 1)
    store.add(b)
    task = asyncio.create_task(monitor.run())
    await recorder.submitting(b)
    # The ledger commits before the submitter records the 202.
    ledger.event_queue.put_nowait(CommitEvent(b.batch_id, Committed(), "7"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert store.batches[b.batch_id].batch_status is None
    await recorder.accepted(b)
    for _ in range(50):
        await asyncio.sleep(0)
        if store.batches[b.batch_id].status_name is BatchStatusName.COMMITTED:
            break
    # Pending was written first, then the held event: final wins.
    assert store.batches[b.batch_id].status_name is BatchStatusName.COMMITTED
    assert [w[1] for w in store.writes if w[0] == b.batch_id] == [
        None,
        BatchStatusName.PENDING,
        BatchStatusName.COMMITTED,
    ]
    monitor.stop()
    await asyncio.wait_for(task, 5)


async def test_unwatched_event_triggers_a_poll_after_its_grace() -> None:
    _store, ledger, _recorder, monitor, _ = setup(
        poll_interval_s=30, min_poll_interval_s=0, early_grace_s=0.05
    )
    ledger.event_queue = asyncio.Queue()
    task = asyncio.create_task(monitor.run())
    for _ in range(20):
        await asyncio.sleep(0)
    polls = monitor.polls
    ledger.event_queue.put_nowait(CommitEvent("someone-else", Committed(), "1"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert monitor.polls == polls  # within the grace: it may be ours, being recorded
    for _ in range(100):
        await asyncio.sleep(0.01)
        if monitor.polls > polls:
            break
    assert monitor.polls > polls
    monitor.stop()
    await asyncio.wait_for(task, 5)


async def test_a_trigger_from_the_ledger_polls_early() -> None:
    store, ledger, recorder, monitor, _ = setup(poll_interval_s=3600, min_poll_interval_s=0)
    ledger.trigger_queue = asyncio.Queue()
    b = batch("a", 1)
    store.add(b)
    await recorder.submitting(b)
    await recorder.accepted(b)
    ledger.statuses[b.batch_id] = Pending()
    task = asyncio.create_task(monitor.run())
    for _ in range(50):
        await asyncio.sleep(0)
    assert monitor.polls == 1  # at start; the next one is an hour away
    ledger.statuses[b.batch_id] = Committed()
    ledger.trigger_queue.put_nowait(None)
    for _ in range(50):
        await asyncio.sleep(0)
        if store.batches[b.batch_id].status_name is BatchStatusName.COMMITTED:
            break
    assert store.batches[b.batch_id].status_name is BatchStatusName.COMMITTED
    assert (monitor.polls, monitor.triggers_received) == (2, 1)
    monitor.stop()
    await asyncio.wait_for(task, 5)
