"""TakeOverAsks: the reads start where the claim cycle runs (the claim thread,
with a client of its own), the answers are applied on the gateway's loop
for the services actually taken, in one go."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence

from ledgerq.gateway.takeover import TakeOverAsks
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import BatchStatus, Committed, Unknown


class FakeLedger:
    description = "fake"

    def __init__(self) -> None:
        self.reads: list[tuple[str, tuple[str, ...]]] = []
        self.closed = False

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        self.reads.append((threading.current_thread().name, tuple(batch_ids)))
        return tuple(
            LedgerBatchStatus(b, Committed() if b.startswith("c") else Unknown()) for b in batch_ids
        )

    async def close(self) -> None:
        self.closed = True


class FakeFollower:
    def __init__(self) -> None:
        self.adopted: list[tuple[str, str]] = []
        self.answers: list[tuple[list[str], dict[str, BatchStatus]]] = []

    def adopt(self, pairs: Sequence[tuple[str, str]]) -> list[str]:
        self.adopted += pairs
        return [b for b, _ in pairs]

    async def answered(self, entries: Sequence[str], answers: Mapping[str, BatchStatus]) -> None:
        self.answers.append((list(entries), dict(answers)))


async def test_reads_run_on_the_claim_thread_and_answers_apply_to_the_services_taken() -> None:
    gateway_ledger, own = FakeLedger(), FakeLedger()
    follower = FakeFollower()
    asks = TakeOverAsks(gateway_ledger, follower, reader=lambda: own)  # type: ignore[arg-type]
    asks._span = True  # a ledger with one status route (Sawtooth's)
    batches = {"s1": ("c1",), "s2": ("u2", "c2"), "s3": ("c3",)}

    def claim_thread() -> None:
        async def cycle() -> None:
            asks.asking(batches)
            await asyncio.sleep(0.05)  # the claim thread's loop runs the read

        asyncio.run(cycle())

    thread = threading.Thread(target=claim_thread, name="claims-test")
    thread.start()
    await asyncio.to_thread(thread.join)
    await asyncio.sleep(0)  # the gateway's loop notes the read
    asks.taken(frozenset({"s1", "s2"}))  # s3 went to another instance
    for _ in range(100):
        if follower.answers:
            break
        await asyncio.sleep(0.01)
    # One read for every service's batches, on the claim thread, its own client closed.
    assert own.reads == [("claims-test", ("c1", "u2", "c2", "c3"))]
    assert gateway_ledger.reads == [] and own.closed
    # Only the services taken are followed and answered.
    assert follower.adopted == [("c1", "s1"), ("u2", "s2"), ("c2", "s2")]
    ((entries, answers),) = follower.answers
    assert entries == ["c1", "u2", "c2"]
    assert answers == {"c1": Committed(), "u2": Unknown(), "c2": Committed()}
    assert asks.asked == 4 and asks.applied == 3


async def test_without_a_reader_the_reads_run_on_the_gateways_loop_per_service() -> None:
    ledger = FakeLedger()
    follower = FakeFollower()
    asks = TakeOverAsks(ledger, follower)  # type: ignore[arg-type]
    asks.asking({"s1": ("c1",), "s2": ("u2",)})  # not a one-route ledger: per service
    asks.taken(frozenset({"s1", "s2"}))
    for _ in range(100):
        if follower.answers:
            break
        await asyncio.sleep(0.01)
    assert sorted(ids for _, ids in ledger.reads) == [("c1",), ("u2",)]
    assert follower.answers[0][1] == {"c1": Committed(), "u2": Unknown()}
