"""QueueSource: rounds served one batch at a time, fair, woken, never twice."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection

import pytest

from ledgerq.clock import ManualClock
from ledgerq.errors import StoreError
from ledgerq.model import Committed, Delayed, TrackingBatch, Unknown
from ledgerq.queue.serial import select_round
from ledgerq.queue.source import QueueSource


class MemoryRounds:
    """A RoundStore over a dict, computing rounds with the reference rules."""

    def __init__(self) -> None:
        self.batches: dict[str, TrackingBatch] = {}
        self.seq = 0
        self.queries: list[tuple[frozenset[str] | None, int | None]] = []

    def add(self, service: str, count: int = 1) -> list[str]:
        ids = []
        for _ in range(count):
            self.seq += 1
            batch_id = f"{service}-{self.seq:05d}"
            self.batches[batch_id] = TrackingBatch(
                service_id=service,
                batch_header=batch_id,
                data_change_id=None,
                signer_public_key="02",
                trace=False,
                serialized_batch=b"",
                created_at=0,
                seq=self.seq,
            )
            ids.append(batch_id)
        return ids

    def update(self, batch_id: str, **changes: object) -> None:
        self.batches[batch_id] = dataclasses.replace(self.batches[batch_id], **changes)  # type: ignore[arg-type]

    async def queue_round(
        self,
        *,
        now: int,
        delay_window_ms: int,
        services: Collection[str] | None = None,
        limit: int | None = None,
    ) -> list[TrackingBatch]:
        self.queries.append((None if services is None else frozenset(services), limit))
        picks = select_round(
            self.batches.values(), now=now, delay_window_ms=delay_window_ms, services=services
        )
        return picks if limit is None else picks[:limit]


@pytest.fixture
def store() -> MemoryRounds:
    return MemoryRounds()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def source(store: MemoryRounds, clock: ManualClock, **kwargs: object) -> QueueSource:
    return QueueSource(store, clock=clock, **kwargs)  # type: ignore[arg-type]


async def ids(src: QueueSource, n: int) -> list[str | None]:
    out: list[str | None] = []
    for _ in range(n):
        batch = await src.next()
        out.append(None if batch is None else batch.batch_id)
    return out


async def test_serves_one_round_then_asks_for_the_next(
    store: MemoryRounds, clock: ManualClock
) -> None:
    a = store.add("a", 3)
    b = store.add("b", 2)
    src = source(store, clock)
    assert await ids(src, 2) == [a[0], b[0]]
    assert src.rounds == 1
    assert await src.next() is None  # both services have a batch handed out
    store.update(a[0], submitted=True, batch_status=Committed())
    store.update(b[0], submitted=True, batch_status=Committed())
    src.wake()
    assert await ids(src, 3) == [a[1], b[1], None]
    assert src.handed_out == 2
    assert src.rounds == 2


async def test_without_a_wake_up_the_next_full_round_waits_for_the_poll_interval(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (a,) = store.add("a")
    src = source(store, clock, poll_interval=1.0)
    assert await src.next() is not None
    store.update(a, submitted=True, batch_status=Committed())
    (b,) = store.add("b")  # nobody announces it
    assert await src.next() is None
    assert src.rounds == 1  # no query over every service for nothing
    clock.advance(999)
    assert await src.next() is None
    clock.advance(1)
    assert await ids(src, 1) == [b]
    assert src.rounds == 2


async def test_never_hands_out_a_batch_twice_before_the_store_records_it(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (first, _) = store.add("a", 2)
    src = source(store, clock)
    assert await ids(src, 1) == [first]
    # The store still queues it (submitted not recorded yet): not again.
    src.wake("a")
    src.wake()
    assert await ids(src, 2) == [None, None]
    store.update(first, submitted=True)
    src.wake("a")
    assert await src.next() is None
    assert src.handed_out == 0  # the store caught up, the hand-out is gone


async def test_a_pick_of_a_service_whose_next_batch_was_taken_elsewhere_is_dropped(
    store: MemoryRounds, clock: ManualClock
) -> None:
    # The round holds b's next batch, left there (the pull's limit), when
    # that batch is recorded taken with its predecessor's final status
    # outside the source: the pick is stale and must never be handed out.
    a = store.add("a", 2)
    b = store.add("b", 2)
    src = source(store, clock)
    assert await ids(src, 1) == [a[0]]
    assert not src.idle("b")  # b's pick waits in the round
    store.update(b[0], submitted=True)
    src.taken_elsewhere(store.batches[b[0]])
    assert src.idle("b") and src.queued == 0
    assert await src.next() is None
    store.update(b[0], batch_status=Committed())
    src.wake("b")
    assert await ids(src, 1) == [b[1]]


class SlowRounds(MemoryRounds):
    """Rounds read as of their start, answered after ``during`` ran: a take
    landing while a round is read."""

    def __init__(self) -> None:
        super().__init__()
        self.during: list[object] = []

    async def queue_round(self, **kwargs: object) -> list[TrackingBatch]:
        picks = await super().queue_round(**kwargs)  # type: ignore[arg-type]
        while self.during:
            self.during.pop(0)()  # type: ignore[operator]
        return picks


async def test_a_batch_taken_ahead_of_its_service_while_a_round_is_read_is_not_offered(
    clock: ManualClock,
) -> None:
    # A batch another service's batch depends on is taken ahead of its
    # service's order (not handed out by the source); a round read before
    # its take landed offers it as free. Handed out once that submission
    # ended, it would be posted twice.
    store = SlowRounds()
    (a,) = store.add("a")
    src = source(store, clock)

    def take_ahead() -> None:
        store.update(a, submitted=True)
        src.taken(store.batches[a])

    store.during.append(take_ahead)
    assert await src.next() is None
    store.update(a, submitted=False, batch_status=Committed())
    src.wake("a")
    assert await src.next() is None
    assert src.handed_out == 0


async def test_a_batch_taken_ahead_leaves_the_round_it_waits_in(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (a0,) = store.add("a")
    (b0,) = store.add("b")
    src = source(store, clock)
    assert await ids(src, 1) == [a0]
    assert src.queued == 1  # b's pick waits in the round
    store.update(b0, submitted=True)
    src.taken(store.batches[b0])
    assert src.queued == 0 and src.idle("b")
    assert await src.next() is None


async def test_hands_out_again_once_the_store_records_a_new_attempt(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (first,) = store.add("a")
    src = source(store, clock)
    assert await ids(src, 1) == [first]
    # Posted, ambiguous; the monitor found the ledger does not know it.
    store.update(first, batch_status=Unknown(), submitted=False, attempts=1)
    src.wake("a")
    assert await ids(src, 1) == [first]


async def test_a_hand_out_expires_when_the_store_never_records_the_hand_out(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (first,) = store.add("a")
    src = source(store, clock, handout_ms=5_000)
    assert await ids(src, 1) == [first]
    clock.advance(4_999)
    assert await src.next() is None
    clock.advance(1)
    assert await ids(src, 1) == [first]


async def test_hand_outs_made_at_different_times_each_expire_after_handout_ms(
    store: MemoryRounds, clock: ManualClock
) -> None:
    """Holds are looked through only once the oldest may have expired; a
    later one still expires on time after an earlier one did."""
    (first,) = store.add("a")
    src = source(store, clock, handout_ms=5_000)
    assert await ids(src, 1) == [first]
    clock.advance(2_000)
    (second,) = store.add("b")
    src.wake("b")
    assert await ids(src, 1) == [second]
    clock.advance(3_000)  # the first hand-out is 5 s old, the second 3 s
    assert await ids(src, 1) == [first]
    assert await src.next() is None
    clock.advance(1_999)
    assert await src.next() is None
    clock.advance(1)  # the second hand-out is 5 s old now
    assert await ids(src, 1) == [second]


async def test_handout_ms_defaults_to_the_delay_window(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (first,) = store.add("a")
    src = source(store, clock, delay_window_ms=2_000)
    assert await ids(src, 1) == [first]
    clock.advance(1_999)
    assert await src.next() is None
    clock.advance(1)
    assert await ids(src, 1) == [first]


async def test_a_delayed_batch_comes_back_when_its_window_passes(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (first,) = store.add("a")
    store.update(first, batch_status=Delayed(), last_attempt_at=clock(), attempts=1)
    src = source(store, clock, delay_window_ms=15_000)
    assert await src.next() is None
    clock.advance(15_000)
    assert await ids(src, 1) == [first]


async def test_a_busy_service_delays_a_quiet_one_by_at_most_one_round(
    store: MemoryRounds, clock: ManualClock
) -> None:
    store.add("busy", 10_000)
    quiet = [store.add(f"quiet{i}")[0] for i in range(5)]
    src = source(store, clock)
    handed: list[str] = []

    async def pull_and_commit() -> None:
        batch = await src.next()
        assert batch is not None
        handed.append(batch.batch_id)
        # The ledger commits at once and the monitor wakes the service.
        store.update(batch.batch_id, submitted=True, batch_status=Committed())
        src.wake(batch.service_id)

    for _ in range(3):
        await pull_and_commit()
    # A service with one batch arrives while the busy one keeps committing.
    (late,) = store.add("late")
    src.wake("late")
    for _ in range(7):
        await pull_and_commit()
    # Round one: busy and all five quiet ones, each once, in acceptance order;
    # the busy service's next batch queues behind them, and the late one
    # behind that: nobody waits more than one round.
    assert handed == [
        "busy-00001",
        *quiet,
        "busy-00002",
        late,
        "busy-00003",
        "busy-00004",
    ]


async def test_a_woken_service_already_in_the_round_is_not_added_twice(
    store: MemoryRounds, clock: ManualClock
) -> None:
    a = store.add("a", 2)
    (b,) = store.add("b")
    src = source(store, clock)
    assert await ids(src, 1) == [a[0]]
    src.wake("b")
    assert src.queued == 1
    store.update(a[0], submitted=True, batch_status=Committed())
    src.wake("a")
    assert await ids(src, 3) == [b, a[1], None]


async def test_get_returns_when_woken_not_when_the_poll_interval_passes(
    store: MemoryRounds, clock: ManualClock
) -> None:
    src = source(store, clock, poll_interval=3_600)
    waiter = asyncio.create_task(src.get(max_wait=3_600))
    for _ in range(5):
        await asyncio.sleep(0)  # let the waiter find nothing and wait
    assert not waiter.done()
    (first,) = store.add("a")
    src.wake("a")
    batch = await asyncio.wait_for(waiter, 10)
    assert batch is not None and batch.batch_id == first


async def test_get_gives_up_after_max_wait(store: MemoryRounds, clock: ManualClock) -> None:
    src = source(store, clock)
    assert await src.get(max_wait=0) is None


async def test_services_restricts_what_is_served(store: MemoryRounds, clock: ManualClock) -> None:
    (mine,) = store.add("mine")
    store.add("theirs")
    claimed = {"mine"}
    src = source(store, clock, services=lambda: claimed)
    assert await ids(src, 2) == [mine, None]
    src.wake("theirs")
    assert await src.next() is None
    assert all(q[0] == frozenset({"mine"}) for q in store.queries)


class ClaimRounds(MemoryRounds):
    """Rounds restricted by a claims table the store keeps (PostgreSQL's role)."""

    def __init__(self, claims: dict[str, str]) -> None:
        super().__init__()
        self.claims = claims
        self.claimants: list[str | None] = []

    async def queue_round(  # type: ignore[override]
        self,
        *,
        now: int,
        delay_window_ms: int,
        services: Collection[str] | None = None,
        limit: int | None = None,
        claimant: str | None = None,
    ) -> list[TrackingBatch]:
        self.claimants.append(claimant)
        if claimant is not None:
            assert services is None
            services = {s for s, holder in self.claims.items() if holder == claimant}
        return await super().queue_round(
            now=now, delay_window_ms=delay_window_ms, services=services, limit=limit
        )


async def test_full_rounds_of_a_claimant_come_from_the_store_s_claims(
    clock: ManualClock,
) -> None:
    # The store says gw-1 holds a, b and c; this instance's memory says a and
    # d (c not read back yet, b lost, d voided in the store meanwhile).
    store = ClaimRounds({"a": "gw-1", "b": "gw-1", "c": "gw-1", "d": "gw-2"})
    (a,) = store.add("a")
    store.add("b")
    store.add("c")
    store.add("d")
    claimed = {"a", "d"}
    src = QueueSource(store, clock=clock, services=lambda: claimed, claimant="gw-1")  # type: ignore[arg-type]
    # Only what both say this instance holds is handed out.
    assert await ids(src, 2) == [a, None]
    assert store.claimants[0] == "gw-1"
    assert store.queries[0][0] == frozenset({"a", "b", "c"})
    # A round of woken services still lists them.
    (a2,) = store.add("a")
    store.update(a, batch_status=Committed())
    src.wake("a")
    assert await ids(src, 1) == [a2]
    assert store.claimants[-1] is None and store.queries[-1][0] == frozenset({"a"})


async def test_round_limit_keeps_the_first_picks_and_the_hand_outs(
    store: MemoryRounds, clock: ManualClock
) -> None:
    a, b, c = (store.add(s)[0] for s in "abc")
    src = source(store, clock, round_limit=2)
    assert await ids(src, 2) == [a, b]
    assert store.queries[-1] == (None, 2)
    # The next round is cut short at two picks (a and b, still unrecorded),
    # so it proves nothing about them: they stay handed out.
    assert await src.next() is None
    assert src.handed_out == 2
    store.update(a, submitted=True)
    store.update(b, submitted=True)
    src.wake()
    assert await ids(src, 1) == [c]


async def test_concurrent_pulls_never_share_a_batch(
    store: MemoryRounds, clock: ManualClock
) -> None:
    for service in "abcd":
        store.add(service)
    src = source(store, clock)
    got = await asyncio.gather(*(src.next() for _ in range(6)))
    handed = [b.batch_id for b in got if b is not None]
    assert len(handed) == 4 == len(set(handed))


async def test_a_store_that_hangs_raises_a_store_error(clock: ManualClock) -> None:
    class Hanging:
        async def queue_round(self, **_: object) -> list[TrackingBatch]:
            await asyncio.Event().wait()
            return []

    src = QueueSource(Hanging(), clock=clock, query_timeout=0.01)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="did not return a round"):
        await src.next()


def test_negative_delay_window_is_refused(store: MemoryRounds) -> None:
    with pytest.raises(ValueError, match="delay_window_ms"):
        QueueSource(store, delay_window_ms=-1)


async def test_next_batches_serves_up_to_limit_keeping_excluded_picks_for_later(
    store: MemoryRounds, clock: ManualClock
) -> None:
    a, b, c, d = (store.add(s)[0] for s in "abcd")
    src = source(store, clock)
    got = await src.next_batches(2, exclude=frozenset({"b"}), timeout_s=0)
    assert [x.batch_id for x in got] == [a, c]
    # The caller was still finishing b's previous batch; now it is free.
    got = await src.next_batches(5, exclude=frozenset(), timeout_s=0)
    assert [x.batch_id for x in got] == [b, d]


async def test_a_wake_up_for_an_excluded_service_is_kept_until_it_is_free(
    store: MemoryRounds, clock: ManualClock
) -> None:
    (first, second) = store.add("a", 2)
    src = source(store, clock, poll_interval=3_600)
    assert await ids(src, 1) == [first]
    # Committed and announced before the caller forgot about it.
    store.update(first, submitted=True, batch_status=Committed())
    src.wake("a")
    got = await src.next_batches(5, exclude=frozenset({"a"}), timeout_s=3_600)
    assert got == []  # handed back at once, not after the hour
    got = await src.next_batches(5, exclude=frozenset(), timeout_s=0)
    assert [x.batch_id for x in got] == [second]


async def test_next_batches_waits_for_a_wake_up_then_gives_up(
    store: MemoryRounds, clock: ManualClock
) -> None:
    src = source(store, clock, poll_interval=3_600)
    assert await src.next_batches(3, exclude=frozenset(), timeout_s=0) == []
    waiter = asyncio.create_task(src.next_batches(3, exclude=frozenset(), timeout_s=3_600))
    for _ in range(5):
        await asyncio.sleep(0)
    (first,) = store.add("a")
    src.wake("a")
    got = await asyncio.wait_for(waiter, 10)
    assert [x.batch_id for x in got] == [first]


async def test_a_cancelled_wait_leaves_nothing_behind_and_wakes_still_reach_others(
    store: MemoryRounds, clock: ManualClock
) -> None:
    src = source(store, clock, poll_interval=3_600)
    gone = asyncio.create_task(src.get(max_wait=3_600))
    kept = asyncio.create_task(src.get(max_wait=3_600))
    for _ in range(5):
        await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    (first,) = store.add("a")
    src.wake("a")
    batch = await asyncio.wait_for(kept, 10)
    assert batch is not None and batch.batch_id == first
    assert not src._waiters  # every wait took its future and timer away


async def test_offered_picks_are_queued_without_a_round(
    store: MemoryRounds, clock: ManualClock
) -> None:
    # A take-over's picks, read on the claim thread, are queued as a round
    # of those services would put them, with no query.
    a = store.add("a", 2)
    src = source(store, clock)
    assert await ids(src, 1) == [a[0]]
    t = store.add("t", 2)  # taken over: no wake-up
    queries = len(store.queries)
    picks = select_round(store.batches.values(), now=clock(), delay_window_ms=0, services={"t"})
    waiter = asyncio.ensure_future(src.get(max_wait=30))
    await asyncio.sleep(0)
    src.offer(picks, frozenset({"t", "n"}))  # n: nothing to queue
    got = await asyncio.wait_for(waiter, 5)
    assert got is not None and got.batch_id == t[0]
    assert len(store.queries) == queries
    # Offered again (a second take-over's stale read): queued once only.
    src.offer(picks, frozenset({"t"}))
    assert src.queued == 0


async def test_offered_picks_go_before_the_rest_of_the_current_round(
    store: MemoryRounds, clock: ManualClock
) -> None:
    # Their services' work waited since the previous holder stopped: ahead of
    # the round this instance's own services were given meanwhile, in the
    # order the take-over's round gave them; each service once per round.
    own = {s: store.add(s, 2) for s in ("a", "b", "c")}
    src = source(store, clock)
    assert await ids(src, 1) == [own["a"][0]]  # a round of a, b, c is under way
    taken = {s: store.add(s, 2) for s in ("u", "t")}
    picks = select_round(
        store.batches.values(), now=clock(), delay_window_ms=0, services={"t", "u"}
    )
    src.offer(picks, frozenset({"t", "u"}))
    src.offer(picks, frozenset({"t", "u"}))  # a stale second read: queued once
    in_order = [b.batch_id for b in picks]
    assert in_order == [taken["u"][0], taken["t"][0]]  # the store's round order
    assert await ids(src, 4) == [*in_order, own["b"][0], own["c"][0]]


async def test_an_offered_pick_of_a_service_handed_out_lately_is_a_wake_up(
    store: MemoryRounds, clock: ManualClock
) -> None:
    # The pick may have been read before that hand-out was recorded: a round
    # decides instead, once the hand-out is gone.
    t = store.add("t", 2)
    src = source(store, clock, handout_ms=1_000)
    stale = select_round(store.batches.values(), now=clock(), delay_window_ms=0, services={"t"})
    assert await ids(src, 1) == [t[0]]
    store.update(t[0], submitted=True)
    src.taken(store.batches[t[0]])
    src.offer(stale, frozenset({"t"}))
    assert src.queued == 0
    assert await src.next() is None  # the round asked for t: t[0] is in flight
    store.update(t[0], batch_status=Committed())
    clock.advance(1_000)
    src.offer(
        select_round(store.batches.values(), now=clock(), delay_window_ms=0, services={"t"}),
        frozenset({"t"}),
    )
    assert src.queued == 1
    assert await ids(src, 1) == [t[1]]


async def test_offered_picks_of_services_not_claimed_are_wake_ups(
    store: MemoryRounds, clock: ManualClock
) -> None:
    claimed = {"t"}
    t = store.add("t", 1)
    u = store.add("u", 1)
    src = source(store, clock, services=lambda: claimed)
    picks = select_round(store.batches.values(), now=clock(), delay_window_ms=0)
    src.offer(picks, frozenset({"t", "u"}))
    assert src.queued == 1
    claimed.add("u")
    # u was woken, not queued: a round over it (now claimed) gives its pick.
    assert await ids(src, 3) == [t[0], u[0], None]
