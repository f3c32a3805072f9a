"""The declared-dependency rule against its reference statement (Hypothesis):
random dependency graphs, random acceptance orders, every strategy.

The reference (docs/queuer.md, "Declared dependencies"), for one service
under the serial strategy: the next batch sent is the service's first open
batch in acceptance order, unless it depends on a batch not committed yet —
then that batch (the first such of its declared dependencies), resolved the
same way. Checked against the producer on the reference store with a ledger
that commits what it accepts and records anything sent before the batches it
depends on were committed:

* one service, serial: the batches go in exactly the reference's order;
* several services, every strategy, dependencies across services: nothing
  is sent before its dependencies committed, every batch commits (no
  deadlock), each once, and a serial service never has two in flight; so
  too when the checks' store reads interleave (checks run together).
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq.clock import ManualClock
from ledgerq.ledgers.base import SubmitResult
from ledgerq.model import BatchStatusName, Committed, Pending, TrackingBatch
from ledgerq.queue.strategy import StrategyMap
from ledgerq.store.base import DependencyPath
from ledgerq.store.memory import MemoryStore
from tests.factories import tracking_batch
from tests.ledger_fakes import ScriptedLedger
from tests.unit.test_producer import Rig


class Judge(ScriptedLedger):
    def __init__(self, batches: list[TrackingBatch]) -> None:
        super().__init__()
        self.early: list[str] = []
        self.twice: list[str] = []
        self.most_in_flight: dict[str, int] = {}
        self._needs = {b.batch_id: b.transactions[0].dependencies for b in batches}
        self._of_tx = {b.transactions[0].transaction_header: b.batch_id for b in batches}
        self._service = {b.batch_id: b.service_id for b in batches}

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        if batch_id in self.sent:
            self.twice.append(batch_id)
        for tx in self._needs[batch_id]:
            if not isinstance(self.statuses.get(self._of_tx[tx]), Committed):
                self.early.append(batch_id)
        pending = [
            b
            for b, s in self.statuses.items()
            if isinstance(s, Pending) and self._service[b] == service_id
        ]
        self.most_in_flight[service_id] = max(
            self.most_in_flight.get(service_id, 0), len(pending) + 1
        )
        result = await super().submit(service_id, batch_id, serialized_batch)
        await self.decide(batch_id, Committed())
        return result


@st.composite
def graphs(draw: st.DrawFn, services: int) -> list[TrackingBatch]:
    """Batches over ``services`` services, each depending on 0-2 batches
    earlier in a random dependency order (so the graph has no cycle),
    accepted in another random order."""
    n = draw(st.integers(1, 9))
    owner = [draw(st.integers(0, services - 1)) for _ in range(n)]
    deps: list[list[int]] = []
    for i in range(n):
        earlier = st.lists(st.integers(0, i - 1), max_size=2, unique=True) if i else st.just([])
        deps.append(draw(earlier))
    accepted = draw(st.permutations(range(n)))
    txs = [f"tx-{i:04d}".ljust(16, "0") for i in range(n)]
    return [
        tracking_batch(
            f"s{owner[i]}",
            100 + i,
            dependencies=[txs[d] for d in deps[i]],
            transaction_id=txs[i],
            created_at=0,
            seq=place + 1,
        )
        for place, i in enumerate(accepted)
    ]


def reference_order(batches: list[TrackingBatch]) -> list[str]:
    """The reference rule for one serial service (module docstring)."""
    of_tx = {b.transactions[0].transaction_header: b for b in batches}
    done: set[str] = set()
    order: list[str] = []
    open_ = list(batches)  # acceptance order

    def first_to_send(b: TrackingBatch) -> TrackingBatch:
        for tx in b.transactions[0].dependencies:
            dep = of_tx[tx]
            if dep.batch_id not in done:
                return first_to_send(dep)
        return b

    while open_:
        pick = first_to_send(open_[0])
        order.append(pick.batch_id)
        done.add(pick.batch_id)
        open_.remove(pick)
    return order


class InterleavedReads(MemoryStore):
    """A store whose dependency reads yield to the loop a few times (how
    many depends on the batch): checks made together interleave."""

    async def dependency_path(
        self, service_id: str, batch_id: str, max_steps: int
    ) -> DependencyPath | None:
        for _ in range(sum(batch_id.encode()) % 5):
            await asyncio.sleep(0)
        return await super().dependency_path(service_id, batch_id, max_steps)


async def _run(
    batches: list[TrackingBatch], strategies: StrategyMap, *, interleaved: bool = False
) -> Judge:
    ledger = Judge(batches)
    clock = ManualClock()
    store = InterleavedReads(clock=clock) if interleaved else MemoryStore(clock=clock)
    rig = Rig(ledger=ledger, strategies=strategies, store=store, clock=clock)
    await rig.store.add_batches(batches)
    async with rig:
        for _ in range(2000):
            if len(set(ledger.sent)) == len(batches):
                break
            await asyncio.sleep(0.002)
        for b in batches:
            for _ in range(200):
                if await rig.status(b) is BatchStatusName.COMMITTED:
                    break
                await asyncio.sleep(0.002)
            assert await rig.status(b) is BatchStatusName.COMMITTED, f"{b.batch_id} stuck"
    return ledger


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(services=1))
async def test_one_serial_service_sends_in_the_reference_order(
    batches: list[TrackingBatch],
) -> None:
    ledger = await _run(batches, StrategyMap())
    assert ledger.sent == reference_order(batches)
    assert ledger.early == [] and ledger.twice == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(2, 3).flatmap(graphs),
    st.sampled_from(["serial", "parallel", "pipelined"]),
)
async def test_dependencies_across_services_commit_everything_never_early(
    batches: list[TrackingBatch], strategy: str
) -> None:
    ledger = await _run(batches, StrategyMap.parse(strategy))
    assert sorted(ledger.sent) == sorted(b.batch_id for b in batches)
    assert ledger.early == [] and ledger.twice == []
    if strategy == "serial":
        assert all(n == 1 for n in ledger.most_in_flight.values())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(2, 3).flatmap(graphs),
    st.sampled_from(["serial", "parallel", "pipelined"]),
)
async def test_checks_whose_reads_interleave_commit_everything_never_early(
    batches: list[TrackingBatch], strategy: str
) -> None:
    ledger = await _run(batches, StrategyMap.parse(strategy), interleaved=True)
    assert sorted(ledger.sent) == sorted(b.batch_id for b in batches)
    assert ledger.early == [] and ledger.twice == []
    if strategy == "serial":
        assert all(n == 1 for n in ledger.most_in_flight.values())
