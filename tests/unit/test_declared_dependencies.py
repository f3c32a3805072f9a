"""Declared dependencies, halting on an invalid batch and operator control,
as the producer applies them (docs/queuer.md), on the reference store."""

from __future__ import annotations

import asyncio

from ledgerq.clock import ManualClock
from ledgerq.ledgers.base import Rejected, SubmitResult
from ledgerq.model import BatchStatusName, Committed, Invalid, TrackingBatch
from ledgerq.queue.strategy import OnInvalidMap
from tests.factories import tracking_batch
from tests.ledger_fakes import ScriptedLedger
from tests.unit.test_producer import Rig, until, until_status


def batch(service: str, n: int, *depends_on: TrackingBatch | str) -> TrackingBatch:
    """Batch ``n`` of ``service``, its transaction depending on the
    transactions of ``depends_on`` (batches, or bare transaction ids)."""
    ids = [d if isinstance(d, str) else d.transactions[0].transaction_header for d in depends_on]
    return tracking_batch(service, n, dependencies=ids)


class Judge(ScriptedLedger):
    """Commits at once what it accepts, and records a batch sent before the
    batches it depends on were committed (a validator would hold it)."""

    def __init__(self, batches: list[TrackingBatch]) -> None:
        super().__init__()
        self.early: list[str] = []
        #: Batches it accepts but leaves pending (the test decides them).
        self.hold: set[str] = set()
        self._needs = {b.batch_id: b.transactions[0].dependencies for b in batches}
        self._tx_of = {b.transactions[0].transaction_header: b.batch_id for b in batches}

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        for tx in self._needs.get(batch_id, ()):
            dep = self._tx_of.get(tx)
            if dep is not None and not isinstance(self.statuses.get(dep), Committed):
                self.early.append(batch_id)
        result = await super().submit(service_id, batch_id, serialized_batch)
        if batch_id not in self.hold and not isinstance(result, Rejected):
            await self.decide(batch_id, Committed())
        return result


async def test_a_dependency_queued_behind_in_its_service_goes_first() -> None:
    b3 = batch("s", 3)
    b1 = batch("s", 1, b3)
    b2 = batch("s", 2)
    ledger = Judge([b1, b2, b3])
    rig = Rig(ledger=ledger)
    await rig.add(b1, b2, b3)
    async with rig:
        await until(lambda: len(ledger.sent) == 3)
        for b in (b1, b2, b3):
            await until_status(rig, b, BatchStatusName.COMMITTED)
    # The dependency jumped the queue; the rest kept acceptance order.
    assert ledger.sent == [b3.batch_id, b1.batch_id, b2.batch_id]
    assert ledger.early == []


async def test_a_dependency_in_another_service_is_waited_for_visibly() -> None:
    t0 = tracking_batch("t", 1)
    t1 = tracking_batch("t", 2)
    s1 = batch("s", 3, t1)
    ledger = Judge([t0, t1, s1])
    ledger.hold = {t0.batch_id}
    rig = Rig(ledger=ledger)
    await rig.add(t0, t1, s1)
    async with rig:
        await until(lambda: ledger.sent == [t0.batch_id] and ledger.parked == 1)
        # s waits for t's second batch, which waits behind t0 (pending at the ledger).
        waiting = await rig.get(s1)
        assert not waiting.submitted and waiting.submission_error is not None
        assert waiting.submission_error.error_type == "dependency"
        assert t1.batch_id in waiting.submission_error.error_message
        assert "service 't'" in waiting.submission_error.error_message
        await ledger.decide(t0.batch_id, Committed())
        # t1 goes, commits, and s is woken by it: no poll (an hour) in between.
        await until(lambda: len(ledger.sent) == 3)
        await until_status(rig, s1, BatchStatusName.COMMITTED)
    assert ledger.sent == [t0.batch_id, t1.batch_id, s1.batch_id]
    assert ledger.early == []


async def test_a_dependency_judged_invalid_fails_its_dependents_without_a_post() -> None:
    a1 = tracking_batch("s", 1)
    a2 = batch("s", 2, a1)
    a3 = batch("s", 3, a2)
    ledger = Judge([a1, a2, a3])
    ledger.script = {a1.batch_id: [Rejected(400, "Verb must be set, inc, or dec")]}
    rig = Rig(ledger=ledger)
    await rig.add(a1, a2, a3)
    async with rig:
        for b in (a1, a2, a3):
            await until_status(rig, b, BatchStatusName.INVALID)
    assert ledger.sent == [a1.batch_id]
    status = (await rig.get(a2)).batch_status
    assert isinstance(status, Invalid)
    [tx] = status.transactions
    assert tx.external_error_status == "dependency"
    assert tx.external_error_message is not None
    assert a1.batch_id in tx.external_error_message
    assert "the ledger judged INVALID" in tx.external_error_message
    # And in turn a3, which depended on a2.
    status3 = (await rig.get(a3)).batch_status
    assert isinstance(status3, Invalid)
    assert a2.batch_id in (status3.transactions[0].external_error_message or "")


async def test_a_cancelled_dependency_fails_its_dependents() -> None:
    a1 = tracking_batch("s", 1)
    b1 = batch("t", 2, a1)
    ledger = Judge([a1, b1])
    rig = Rig(ledger=ledger)
    await rig.store.add_batches([a1, b1])
    await rig.store.control_service("s", "cancel", actor="ops", batch_ids=[a1.batch_id])
    async with rig:
        await until_status(rig, b1, BatchStatusName.INVALID)
    assert ledger.sent == []
    status = (await rig.get(b1)).batch_status
    assert isinstance(status, Invalid)
    assert "was cancelled" in (status.transactions[0].external_error_message or "")


async def test_an_untracked_dependency_is_asked_of_the_ledger_and_waited_for() -> None:
    clock = ManualClock()
    outside = "e" * 128
    a1 = batch("s", 1, outside)
    ledger = Judge([a1])
    rig = Rig(ledger=ledger, poll_s=0.01, clock=clock)
    await rig.add(a1)
    async with rig:
        await until(lambda: len(ledger.transaction_asks) == 1)
        await asyncio.sleep(0.05)
        # Not seen: the batch waits, visibly; no timer makes it INVALID.
        assert ledger.sent == [] and len(ledger.transaction_asks) == 1
        got = await rig.get(a1)
        assert got.batch_status is None and got.submission_error is not None
        assert got.submission_error.error_message == (
            f"waits for transaction {outside}, not seen on the ledger"
        )
        clock.advance(600)  # its wait is due: asked again
        await until(lambda: len(ledger.transaction_asks) == 2)
        ledger.committed_transactions.add(outside)
        clock.advance(2_000)
        await until_status(rig, a1, BatchStatusName.COMMITTED)
    assert ledger.sent == [a1.batch_id]


async def test_halt_on_invalid_stops_the_service_until_resumed_past_the_batch() -> None:
    a1, a2, a3 = (tracking_batch("s", n) for n in (1, 2, 3))
    other = tracking_batch("t", 4)
    ledger = Judge([a1, a2, a3, other])
    ledger.script = {a2.batch_id: [Rejected(400, "no such key")]}
    rig = Rig(ledger=ledger, on_invalid=OnInvalidMap.parse("continue", "s=halt"))
    await rig.add(a1, a2, a3, other)
    async with rig:
        await until_status(rig, a2, BatchStatusName.INVALID)
        await until_status(rig, other, BatchStatusName.COMMITTED)  # t goes on
        await asyncio.sleep(0.02)
        assert a3.batch_id not in ledger.sent
        control = (await rig.store.service_controls())["s"]
        assert (control.halted_batch_id, control.halted_reason) == (a2.batch_id, "no such key")
    # It holds across a restart: a new producer on the same store sends nothing.
    again = Rig(ledger=ledger, store=rig.store, on_invalid=OnInvalidMap.parse("halt"))
    async with again:
        await asyncio.sleep(0.05)
        assert a3.batch_id not in ledger.sent
        await rig.store.control_service("s", "skip", actor="ops", batch_ids=[a2.batch_id])
        await again.producer.refresh_controls(["s"])
        await until_status(again, a3, BatchStatusName.COMMITTED)
    assert ledger.sent.count(a2.batch_id) == 1


async def test_a_paused_service_sends_nothing_new_and_follows_what_is_in_flight() -> None:
    a1, a2 = tracking_batch("s", 1), tracking_batch("s", 2)
    ledger = ScriptedLedger()
    rig = Rig(ledger=ledger)
    await rig.add(a1, a2)
    async with rig:
        await until(lambda: ledger.sent == [a1.batch_id] and ledger.parked == 1)
        await rig.store.control_service("s", "pause", actor="ops")
        await rig.producer.refresh_controls(["s"])
        await ledger.decide(a1.batch_id, Committed())
        await until_status(rig, a1, BatchStatusName.COMMITTED)  # followed to its end
        await asyncio.sleep(0.02)
        assert ledger.sent == [a1.batch_id]
        await rig.store.control_service("s", "resume", actor="ops")
        await rig.producer.refresh_controls(["s"])
        await until(lambda: ledger.sent == [a1.batch_id, a2.batch_id])


async def test_a_pause_made_elsewhere_is_refused_by_the_store_at_the_take() -> None:
    # Another instance paused the service after this producer last read the
    # controls (its next read is an hour away): the store refuses the take.
    a1 = tracking_batch("s", 1)
    ledger = ScriptedLedger()
    rig = Rig(ledger=ledger)
    async with rig:
        await asyncio.sleep(0.01)
        await rig.store.add_batches([a1])
        await rig.store.control_service("s", "pause", actor="ops")
        rig.producer.wake("s")
        await asyncio.sleep(0.05)
    assert ledger.sent == []
    assert not (await rig.get(a1)).submitted


async def test_batches_an_operator_cancelled_are_never_sent() -> None:
    a1, a2, a3 = (tracking_batch("s", n) for n in (1, 2, 3))
    ledger = Judge([a1, a2, a3])
    rig = Rig(ledger=ledger)
    await rig.store.add_batches([a1, a2, a3])
    await rig.store.control_service("s", "cancel", actor="ops", batch_ids=[a2.batch_id])
    async with rig:
        await until_status(rig, a3, BatchStatusName.COMMITTED)
    assert ledger.sent == [a1.batch_id, a3.batch_id]
    got = await rig.get(a2)
    assert got.submission_error is not None
    assert got.submission_error.error_type == "cancelled"
