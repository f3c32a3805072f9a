"""QueueSource under the parallel strategy: several batches of a service handed
out together, never two that conflict, never one twice; strategies by pattern."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ledgerq.clock import ManualClock
from ledgerq.model import Committed, TrackingBatch, TrackingTransaction
from ledgerq.queue.source import QueueSource
from ledgerq.queue.strategy import Strategy, StrategyMap
from ledgerq.store import MemoryStore

A, B, C = (f"1cf126{c * 64}" for c in "abc")
PARALLEL = StrategyMap(Strategy.PARALLEL)


def batch(service: str, n: int, *keys: str) -> TrackingBatch:
    bid = f"{service}-{n:04d}".ljust(128, "0")
    return TrackingBatch(
        service_id=service,
        batch_header=bid,
        data_change_id=None,
        signer_public_key="02" + "ab" * 32,
        trace=False,
        serialized_batch=b"x",
        transactions=(
            TrackingTransaction(
                "intkey", "1.0", f"t{bid}"[:128], b"p", "03", service, inputs=keys, outputs=keys
            ),
        ),
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000_000)


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock=clock)


async def pull_all(
    src: QueueSource, exclude: frozenset[str] = frozenset(), **kw: frozenset[str]
) -> list[str]:
    """What the submitter gets by asking until nothing more comes."""
    out: list[str] = []
    while got := await src.next_batches(10, exclude=exclude, timeout_s=0, **kw):
        out += [b.service_id + ":" + b.batch_id[: len(b.service_id) + 5] for b in got]
    return out


def names(batches: Sequence[TrackingBatch]) -> list[str]:
    return [b.service_id + ":" + b.batch_id[: len(b.service_id) + 5] for b in batches]


async def test_independent_batches_of_a_service_are_handed_out_together(
    store: MemoryStore, clock: ManualClock
) -> None:
    added = await store.add_batches([batch("s", 1, A), batch("s", 2, B), batch("s", 3, C)])
    src = QueueSource(store, clock=clock, strategies=PARALLEL)
    assert await pull_all(src) == names(added)
    # Nothing was recorded as taken: each stays handed out, none handed out twice.
    assert await pull_all(src) == []
    assert src.handed_out == 3


async def test_a_conflicting_batch_waits_for_the_earlier_one_to_be_final(
    store: MemoryStore, clock: ManualClock
) -> None:
    first, second, other = await store.add_batches(
        [batch("s", 1, A), batch("s", 2, A), batch("s", 3, B)]
    )
    src = QueueSource(store, clock=clock, strategies=PARALLEL)
    assert await pull_all(src) == names([first, other])
    await store.change_batch_to_submitted(first.batch_id, "s", now=clock())
    src.taken(first)
    assert await pull_all(src) == []
    await store.update_batch_status(first.batch_id, "s", Committed(), now=clock())
    src.wake("s")
    assert await pull_all(src) == names([second])


async def test_taken_ends_the_hand_out_and_the_store_keeps_the_batch_from_the_rounds(
    store: MemoryStore, clock: ManualClock
) -> None:
    [first, second] = await store.add_batches([batch("s", 1, A), batch("s", 2, B)])
    src = QueueSource(store, clock=clock, strategies=PARALLEL)
    assert await pull_all(src) == names([first, second])
    for b in (first, second):
        await store.change_batch_to_submitted(b.batch_id, "s", now=clock())
        src.taken(b)
    assert src.handed_out == 0
    src.wake(None)
    assert await pull_all(src) == []


async def test_a_hand_out_excludes_its_batch_until_handout_ms_passes(
    store: MemoryStore, clock: ManualClock
) -> None:
    [only] = await store.add_batches([batch("s", 1, A)])
    src = QueueSource(store, clock=clock, strategies=PARALLEL, handout_ms=1_000)
    assert await pull_all(src) == names([only])
    src.wake(None)  # a full round: the batch is excluded, so its silence means nothing
    assert await pull_all(src) == []
    assert src.handed_out == 1
    clock.advance(1_000)  # the submitter died before recording it: handed out again
    assert await pull_all(src) == names([only])


async def test_excluded_services_hold_back_only_serial_services(
    store: MemoryStore, clock: ManualClock
) -> None:
    added = await store.add_batches(
        [batch("par", 1, A), batch("par", 2, B), batch("ser", 1, A), batch("ser", 2, B)]
    )
    strategies = StrategyMap.parse("serial", "par*=parallel")
    src = QueueSource(store, clock=clock, strategies=strategies)
    got = await pull_all(src, exclude=frozenset({"par", "ser"}))
    assert got == names([added[0], added[1]])
    got = await pull_all(src)
    assert got == names([added[2]])  # serial: one at a time, the next after it is final


async def test_a_pick_of_a_batch_the_caller_still_works_on_is_dropped_not_kept(
    store: MemoryStore, clock: ManualClock
) -> None:
    [only] = await store.add_batches([batch("s", 1, A)])
    src = QueueSource(store, clock=clock, strategies=PARALLEL, handout_ms=1_000)
    assert await pull_all(src) == names([only])
    # The store is slow to record the hand-out: the hand-out runs out and the
    # store offers the batch again while the submitter still works on it.
    clock.advance(1_000)
    working = frozenset({only.batch_id})
    assert await pull_all(src, exclude_batches=working) == []
    await store.change_batch_to_submitted(only.batch_id, "s", dlt_status="Pending", now=clock())
    # Done with it: the stale pick is not handed out again.
    assert await pull_all(src) == []


async def test_a_released_batch_is_decided_again_at_once(
    store: MemoryStore, clock: ManualClock
) -> None:
    [only] = await store.add_batches([batch("s", 1, A)])
    src = QueueSource(store, clock=clock, strategies=PARALLEL)
    assert await pull_all(src) == names([only])
    src.released(only)  # the submitter could not record it
    assert await pull_all(src) == names([only])


async def test_mixed_strategies_share_one_full_round_in_round_order(
    store: MemoryStore, clock: ManualClock
) -> None:
    added = await store.add_batches(
        [batch("ser", 1, A), batch("par", 1, A), batch("ser", 2, B), batch("par", 2, B)]
    )
    src = QueueSource(
        store, clock=clock, strategies=StrategyMap.parse("parallel", "ser=serial"), narrow=True
    )
    first = await src.next_batches(10, exclude=frozenset(), timeout_s=0)
    assert names(first) == names([added[0], added[1]])
    assert await pull_all(src) == names([added[3]])


class CountingStore(MemoryStore):
    """Counts the parallel rounds asked for and how many picks per service."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.asked: list[int] = []

    async def parallel_round(self, **kw: Any) -> list[TrackingBatch]:
        self.asked.append(kw.get("per_service", 1))
        return await super().parallel_round(**kw)


async def test_a_woken_service_gets_every_freed_batch_in_one_query(clock: ManualClock) -> None:
    store = CountingStore(clock)
    firsts = await store.add_batches([batch("s", n, key) for n, key in enumerate((A, B, C))])
    seconds = await store.add_batches(
        [batch("s", n, key) for n, key in enumerate((A, B, C), start=3)]
    )
    others = await store.add_batches([batch("t", 1, A), batch("t", 2, B)])
    src = QueueSource(store, clock=clock, strategies=PARALLEL)
    # A full round (one pick per service), then one of the woken services
    # (every service's first pick before any second one).
    assert await pull_all(src) == names([firsts[0], others[0], firsts[1], others[1], firsts[2]])
    for b in [*firsts, *others]:
        await store.change_batch_to_submitted(b.batch_id, b.service_id, now=clock())
        src.taken(b)
    store.asked.clear()
    # The three earlier batches final together (one group write): the three
    # they held come back in one query, the service woken once.
    for b in firsts:
        await store.update_batch_status(b.batch_id, "s", Committed(), [], None, now=clock())
    src.wake("s")
    assert names(await src.next_batches(10, exclude=frozenset(), timeout_s=0)) == names(seconds)
    assert store.asked == [16]


def test_strategy_map_parses_and_refuses_what_it_cannot_read() -> None:
    m = StrategyMap.parse(" Parallel ", "legacy-*=serial, circuit-0?::*=parallel")
    assert m.of("legacy-7") is Strategy.SERIAL
    assert m.of("circuit-01::a") is Strategy.PARALLEL
    assert m.of("other") is Strategy.PARALLEL
    assert m.uniform is None and StrategyMap.parse("serial", "x=serial").uniform is Strategy.SERIAL
    assert m.describe() == "parallel; legacy-*=serial, circuit-0?::*=parallel"
    with pytest.raises(ValueError, match="not a strategy"):
        StrategyMap.parse("fast")
    with pytest.raises(ValueError, match="PATTERN=STRATEGY"):
        StrategyMap.parse("serial", "circuit-1")
