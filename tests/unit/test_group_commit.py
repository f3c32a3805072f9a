"""Group commit: the completer's writes and the API's inserts. Writes that
arrive while a group commits form the next group; each caller gets its own
outcome; a database failure reaches everyone of the group; a batch's writes
land in the order they were made. And the read-ahead of a service's next batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ledgerq.errors import (
    DuplicateBatchError,
    FencedOffError,
    StoreError,
    StoreInputError,
    StoreUnavailableError,
)
from ledgerq.model import BatchStatusName, Committed, Pending, TrackingBatch, Unknown
from ledgerq.queue.ahead import NextReader, Successors
from ledgerq.record.completer import Completer, urgent
from ledgerq.store import BatchWrite, MemoryStore
from ledgerq.store.group import GroupInserter
from tests.store.conftest import make_batch


async def status_then_take(
    writer: Completer,
    id: str,
    service_id: str,
    status: Committed | Pending,
    _r: list[object],
    nxt: str,
) -> bool:
    """A final status and the next batch's conditional take, together, as the
    producer writes them: the status's refusal raised, whether the take landed."""
    done, take = await writer.apply_together(
        [
            BatchWrite(service_id, id, status),
            BatchWrite(service_id, nxt, attempt=True, after=id),
        ]
    )
    if done is not None:
        raise done
    return take is None


class SlowStore:
    """Records each group; commits when released; refuses ids starting with 'x'."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        self.groups.append([w.id for w in writes])
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [FencedOffError(f"not {w.id}") if w.id.startswith("x") else None for w in writes]


async def test_writes_arriving_during_a_commit_form_the_next_group() -> None:
    store = SlowStore()
    writer = Completer(store)
    first = asyncio.create_task(writer.apply(BatchWrite("s", "a", Pending())))
    await asyncio.sleep(0)
    later = [
        asyncio.create_task(writer.apply(BatchWrite("s", bid, attempt=True)))
        for bid in ("b", "c", "d")
    ]
    await asyncio.sleep(0)
    assert store.groups == [["a"]]  # an idle writer flushes at once
    store.release.set()
    await asyncio.gather(first, *later)
    assert store.groups == [["a"], ["b", "c", "d"]]
    assert (writer.groups, writer.writes) == (2, 4)


async def test_each_caller_gets_its_own_refusal() -> None:
    store = SlowStore()
    store.release.set()
    writer = Completer(store)
    ok = asyncio.create_task(writer.apply(BatchWrite("s", "a", Pending())))
    refused = asyncio.create_task(writer.apply(BatchWrite("s", "x1", Pending())))
    await ok
    with pytest.raises(FencedOffError, match="not x1"):
        await refused


async def test_a_database_failure_reaches_every_caller_of_the_group() -> None:
    store = SlowStore()
    store.fail = StoreUnavailableError("down")
    writer = Completer(store)
    calls = [asyncio.create_task(writer.apply(BatchWrite("s", bid, Pending()))) for bid in "abc"]
    await asyncio.sleep(0)
    store.release.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, StoreUnavailableError) for r in results)
    # The writer recovers: the next write is flushed again.
    store.fail = None
    await writer.apply(BatchWrite("s", "d", Pending()))


async def test_groups_are_capped() -> None:
    store = SlowStore()
    writer = Completer(store, max_group=2)
    calls = [asyncio.create_task(writer.apply(BatchWrite("s", bid, Pending()))) for bid in "abcde"]
    await asyncio.sleep(0)
    store.release.set()
    await asyncio.gather(*calls)
    assert store.groups == [["a", "b"], ["c", "d"], ["e"]]


class GatedStore(MemoryStore):
    """A memory store whose inserts wait for a gate, counting calls."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.calls: list[int] = []

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        self.calls.append(len(batches))
        await self.gate.wait()
        return await super().add_batches(batches, now=now)


async def test_requests_arriving_during_an_insert_are_inserted_together_in_order() -> None:
    store = GatedStore()
    inserter = GroupInserter(store)
    first = asyncio.create_task(inserter.add_batches([make_batch("s1")], now=1))
    await asyncio.sleep(0)
    later = [
        asyncio.create_task(inserter.add_batches([make_batch("s1"), make_batch("s2")], now=2)),
        asyncio.create_task(inserter.add_batches([make_batch("s1")], now=3)),
    ]
    await asyncio.sleep(0)
    store.gate.set()
    results = await asyncio.gather(first, *later)
    assert store.calls == [1, 3]  # one insert at once, then the two that waited together
    seqs = [b.seq for r in results for b in r]
    assert seqs == sorted(seqs)  # acceptance order is arrival order
    assert [b.created_at for b in results[1]] == [2, 2] and results[2][0].created_at == 3


async def test_a_refused_request_fails_alone_and_the_others_land() -> None:
    store = GatedStore()
    inserter = GroupInserter(store)
    store.gate.set()
    (known,) = await store.add_batches([make_batch("s1")])
    store.gate.clear()
    first = asyncio.create_task(inserter.add_batches([make_batch("s1")]))
    await asyncio.sleep(0)
    dup = asyncio.create_task(inserter.add_batches([make_batch("s2"), known]))
    fine = asyncio.create_task(inserter.add_batches([make_batch("s3")]))
    await asyncio.sleep(0)
    store.gate.set()
    await first
    with pytest.raises(DuplicateBatchError, match=known.batch_id):
        await dup
    (landed,) = await fine
    assert await store.get_batch(landed.batch_id, "s3") is not None
    assert (await store.list_batches(service_id="s2")).batches == ()  # nothing of the refused


async def test_a_refused_request_among_many_goes_alone_the_others_together() -> None:
    store = GatedStore()
    inserter = GroupInserter(store)
    store.gate.set()
    (known,) = await store.add_batches([make_batch("s0")])
    store.gate.clear()
    first = asyncio.create_task(inserter.add_batches([make_batch("s0")]))
    await asyncio.sleep(0)
    # Sixteen requests wait together; the eleventh re-posts a batch already held.
    waiting = [
        asyncio.create_task(
            inserter.add_batches([known] if i == 10 else [make_batch(f"s{i + 1}")], now=i + 2)
        )
        for i in range(16)
    ]
    await asyncio.sleep(0)
    store.calls.clear()
    store.gate.set()
    await first
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(results[10], DuplicateBatchError)
    landed = [r for i, r in enumerate(results) if i != 10]
    assert all(isinstance(r, list) and len(r) == 1 for r in landed)
    seqs = [b.seq for r in landed for b in r]  # type: ignore[union-attr]
    assert seqs == sorted(seqs)  # still in arrival order
    # All 16 refused, naming the re-posted batch; the ten before it land
    # together, it alone is refused, the five after it land together: four
    # inserts instead of the seventeen (all, then each alone) it used to cost.
    assert store.calls == [16, 10, 1, 5]


async def test_a_refusal_naming_no_batch_splits_the_group_in_halves() -> None:
    class Refusing(GatedStore):
        async def add_batches(
            self, batches: list[TrackingBatch], *, now: int | None = None
        ) -> list[TrackingBatch]:
            if any(b.service_id == "bad" for b in batches):
                self.calls.append(len(batches))
                raise StoreInputError("a value the store cannot hold")
            return await super().add_batches(batches, now=now)

    store = Refusing()
    inserter = GroupInserter(store)
    first = asyncio.create_task(inserter.add_batches([make_batch("s0")]))
    await asyncio.sleep(0)
    waiting = [
        asyncio.create_task(inserter.add_batches([make_batch("bad" if i == 5 else f"s{i}")]))
        for i in range(8)
    ]
    await asyncio.sleep(0)
    store.calls.clear()
    store.gate.set()
    await first
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(results[5], StoreInputError)
    assert all(isinstance(r, list) for i, r in enumerate(results) if i != 5)
    # 8 refused; 0-3 land; 4-7 refused; 4-5 refused; 4 lands, 5 refused; 6-7 land.
    assert store.calls == [8, 4, 4, 2, 1, 1, 2]


class Unavailable(GatedStore):
    """Every insert waits for the gate, then fails as a database without a
    primary does; counts the inserts asked for."""

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        self.calls.append(len(batches))
        await self.gate.wait()
        raise StoreUnavailableError("no PostgreSQL primary answers")


async def test_a_database_failure_fails_the_group_and_its_queue_at_once() -> None:
    """No request of a group the database failed is tried again alone (each
    would wait for the database in turn), and the requests queued behind it
    hear the same failure without an insert of their own."""
    store = Unavailable()
    inserter = GroupInserter(store)
    first = asyncio.create_task(inserter.add_batches([make_batch("s0")]))
    await asyncio.sleep(0)
    group = [asyncio.create_task(inserter.add_batches([make_batch(f"s{i}")])) for i in range(1, 6)]
    await asyncio.sleep(0)
    store.gate.set()
    with pytest.raises(StoreUnavailableError):
        await first
    results = await asyncio.gather(*group, return_exceptions=True)
    assert all(isinstance(r, StoreUnavailableError) for r in results), results
    # The first alone; the five queued behind it fail with it, never inserted.
    assert store.calls == [1]


async def test_a_group_the_database_fails_takes_the_requests_queued_behind_it_along() -> None:
    class FailingLater(GatedStore):
        """The first insert lands (at the gate); every later one fails (at the second)."""

        def __init__(self) -> None:
            super().__init__()
            self.second_gate = asyncio.Event()

        async def add_batches(
            self, batches: list[TrackingBatch], *, now: int | None = None
        ) -> list[TrackingBatch]:
            if not self.calls:
                return await super().add_batches(batches, now=now)
            self.calls.append(len(batches))
            await self.second_gate.wait()
            raise StoreUnavailableError("the connection broke")

    store = FailingLater()
    inserter = GroupInserter(store)
    first = asyncio.create_task(inserter.add_batches([make_batch("s0")]))
    await asyncio.sleep(0)
    group = [asyncio.create_task(inserter.add_batches([make_batch(f"s{i}")])) for i in range(1, 4)]
    await asyncio.sleep(0)
    store.gate.set()
    await first
    await asyncio.sleep(0)
    assert store.calls == [1, 3]  # the three together, under way
    behind = [asyncio.create_task(inserter.add_batches([make_batch(f"t{i}")])) for i in range(3)]
    await asyncio.sleep(0)
    store.second_gate.set()
    results = await asyncio.gather(*group, *behind, return_exceptions=True)
    assert all(isinstance(r, StoreUnavailableError) for r in results), results
    assert store.calls == [1, 3]  # none tried again alone; those behind not tried
    # Nothing is left queued or running: the next request is inserted at once.
    with pytest.raises(StoreUnavailableError):
        await inserter.add_batches([make_batch("v")])
    assert store.calls == [1, 3, 1]


async def test_a_group_failing_otherwise_still_tries_each_request_alone() -> None:
    """A failure that is neither the database's absence nor a refusal naming
    its batch may concern one request: each is tried alone and hears its own."""

    class Failing(GatedStore):
        async def add_batches(
            self, batches: list[TrackingBatch], *, now: int | None = None
        ) -> list[TrackingBatch]:
            if any(b.service_id == "odd" for b in batches):
                self.calls.append(len(batches))
                raise StoreError("PostgreSQL failed: something about this list")
            return await super().add_batches(batches, now=now)

    store = Failing()
    inserter = GroupInserter(store)
    first = asyncio.create_task(inserter.add_batches([make_batch("s0")]))
    await asyncio.sleep(0)
    waiting = [
        asyncio.create_task(inserter.add_batches([make_batch("odd" if i == 1 else f"s{i}")]))
        for i in range(3)
    ]
    await asyncio.sleep(0)
    store.calls.clear()
    store.gate.set()
    await first
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(results[1], StoreError)
    assert isinstance(results[0], list) and isinstance(results[2], list)
    assert store.calls == [3, 1, 1, 1]


async def test_urgent_writes_form_a_group_of_their_own_beside_the_one_under_way() -> None:
    store = SlowStore()
    writer = Completer(store)
    busy = asyncio.create_task(writer.apply(BatchWrite("s", "a", Pending())))
    await asyncio.sleep(0)
    queued = asyncio.create_task(writer.apply(BatchWrite("s", "b", Pending())))

    async def answers() -> None:
        async def one(bid: str) -> None:
            await writer.apply(BatchWrite("s", bid, Pending()))
            # The task's next write queues as usual.
            await writer.apply(BatchWrite("s", bid + "2", Pending()))

        with urgent():
            await asyncio.gather(one("u"), one("v"))

    took = asyncio.create_task(answers())
    await asyncio.sleep(0.01)
    # Not behind "a" (committing) and "b" (waiting for it): flushed at once, together.
    assert store.groups == [["a"], ["u", "v"]]
    store.release.set()
    await asyncio.gather(busy, queued, took)
    assert store.groups[2:] == [["b"], ["u2", "v2"]]


async def test_a_final_status_and_its_take_are_never_split_across_groups() -> None:
    store = SlowStore()
    writer = Completer(store, max_group=2)
    first = asyncio.create_task(writer.apply(BatchWrite("s", "a", Pending())))
    await asyncio.sleep(0)
    # "b" fills the next group; the pair after it must not be cut in two.
    later = asyncio.create_task(writer.apply(BatchWrite("t", "b", Pending())))
    pair = asyncio.create_task(status_then_take(writer, "c", "u", Pending(), [], "d"))
    await asyncio.sleep(0)
    store.release.set()
    await asyncio.gather(first, later)
    assert await pair is True
    assert store.groups == [["a"], ["b", "c", "d"]]


class ReadStore:
    """Records each next_open_batches call; answers when released."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []
        self.release = asyncio.Event()

    async def next_open_batches(self, pairs: Sequence[tuple[str, str]]) -> dict[str, TrackingBatch]:
        self.calls.append(list(pairs))
        await self.release.wait()
        return {s: make_batch(s) for s, _ in pairs if s != "none"}


async def test_reads_ahead_arriving_during_a_read_are_read_together() -> None:
    store = ReadStore()
    reader = NextReader(store)
    first = asyncio.create_task(reader.next_open_batch("s1", "a"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert store.calls == [[("s1", "a")]]  # an idle reader reads at once
    later = [
        asyncio.create_task(reader.next_open_batch(s, after))
        for s, after in (("s2", "b"), ("none", "c"), ("s2", "d"))
    ]
    await asyncio.sleep(0)
    store.release.set()
    got = await asyncio.gather(first, *later)
    # One query for the waiting ones, one pair per service: s2's second waits.
    assert store.calls == [[("s1", "a")], [("s2", "b"), ("none", "c")], [("s2", "d")]]
    assert [None if b is None else b.service_id for b in got] == ["s1", "s2", None, "s2"]


async def test_the_writers_of_a_committed_group_run_before_the_next_group() -> None:
    # A next batch's POST waits on its group: it must not also wait for the
    # statements of the group after it (run on the event loop on SQLite).
    store = SlowStore()
    writer = Completer(store)
    seen: list[str] = []

    async def write(batch_id: str) -> None:
        await writer.apply(BatchWrite("s", batch_id, Pending()))
        seen.append(f"{batch_id} written, {len(store.groups)} groups begun")

    first = asyncio.create_task(write("a"))
    await asyncio.sleep(0)
    second = asyncio.create_task(write("b"))
    await asyncio.sleep(0)
    store.release.set()
    await asyncio.gather(first, second)
    assert store.groups == [["a"], ["b"]]
    assert seen == ["a written, 1 groups begun", "b written, 2 groups begun"]


async def test_a_pair_written_together_reports_each_outcome() -> None:
    store = SlowStore()
    store.release.set()
    writer = Completer(store)
    assert await status_then_take(writer, "c", "u", Pending(), [], "d") is True
    # The take refused: reported, not raised; the status refused: raised.
    assert await status_then_take(writer, "e", "u", Pending(), [], "xf") is False
    with pytest.raises(FencedOffError, match="not xg"):
        await status_then_take(writer, "xg", "u", Pending(), [], "h")
    # A failure of the whole group: raised.
    store.fail = StoreUnavailableError("down")
    with pytest.raises(StoreUnavailableError):
        await status_then_take(writer, "i", "u", Pending(), [], "j")


async def test_a_pair_whose_caller_stopped_waiting_still_lands() -> None:
    store = SlowStore()
    writer = Completer(store)
    first = asyncio.create_task(writer.apply(BatchWrite("s", "a", Pending())))
    await asyncio.sleep(0)
    pair = asyncio.create_task(status_then_take(writer, "b", "s", Pending(), [], "xc"))
    await asyncio.sleep(0)
    pair.cancel()
    store.release.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await pair
    await writer.apply(BatchWrite("s", "d", Pending()))
    assert store.groups == [["a"], ["b", "xc"], ["d"]]


async def test_the_inserter_tells_each_batch_the_one_inserted_after_it_in_its_service() -> None:
    successors = Successors()
    inserter = GroupInserter(MemoryStore(), successors=successors)
    a1, b1, a2 = await inserter.add_batches([make_batch("a"), make_batch("b"), make_batch("a")])
    (a3,) = await inserter.add_batches([make_batch("a")])  # a later request links on
    assert successors.pop(a1.batch_id) == a2
    assert successors.pop(a2.batch_id) == a3
    assert successors.pop(a1.batch_id) is None  # once
    assert successors.pop(b1.batch_id) is None and successors.pop(a3.batch_id) is None


async def test_successors_forget_everything_at_their_bound() -> None:
    successors = Successors(max_size=3)
    store = MemoryStore()
    first = await store.add_batches([make_batch("a") for _ in range(3)])
    successors.added(first)
    assert len(successors) == 2
    more = await store.add_batches([make_batch("a") for _ in range(2)])
    successors.added(more)  # 2 + 2 > 3: starts again
    assert successors.pop(first[0].batch_id) is None
    assert successors.pop(more[0].batch_id) == more[1]


class NoReads(MemoryStore):
    async def next_open_batches(self, pairs: Sequence[tuple[str, str]]) -> dict[str, TrackingBatch]:
        raise AssertionError("read the store")


async def test_a_guessed_next_batch_is_taken_only_if_the_store_finds_it_next() -> None:
    store = NoReads()
    writer = Completer(store)
    reader = NextReader(store)
    inserter = GroupInserter(store, successors=reader.successors)
    b1, b2, b3 = await inserter.add_batches([make_batch("s") for _ in range(3)])
    await writer.apply(BatchWrite("s", b1.batch_id, attempt=True))
    # The guess comes without a read...
    assert await reader.next_open_batch("s", b1.batch_id) == b2
    # ... and is checked by the take: b2 waits for a resubmission (Delayed), so
    # taking it along with b1's final status is refused; the status lands.
    await writer.apply(BatchWrite("s", b2.batch_id, BatchStatusName.DELAYED, attempt=True))
    landed = await status_then_take(writer, b1.batch_id, "s", Committed(), [], b2.batch_id)
    assert not landed
    after = await store.get_batch(b2.batch_id, "s")
    assert after is not None and after.attempts == 1
    first = await store.get_batch(b1.batch_id, "s")
    assert first is not None and first.status_name == BatchStatusName.COMMITTED
    # A guess that holds lands as the store's own pick would.
    await writer.apply(BatchWrite("s", b2.batch_id, Committed()))
    assert await reader.next_open_batch("s", b2.batch_id) == b3


async def test_successors_forget_everything_past_their_bytes() -> None:
    store = MemoryStore()
    b0, b1, b2, b3 = await store.add_batches([make_batch("a") for _ in range(4)])

    def size(b: TrackingBatch) -> int:
        return len(b.serialized_batch) + sum(len(t.payload) for t in b.transactions)

    successors = Successors(max_bytes=size(b0) + size(b1) + size(b2) - 1)
    successors.added([b0, b1])
    assert successors.pop(b0.batch_id) == b1  # within the bound
    successors.added([b2, b3])  # past it: starts again, from them
    assert successors.pop(b1.batch_id) is None  # b1 -> b2 forgotten
    assert successors.pop(b2.batch_id) == b3
    assert len(successors) == 0


class OrderStore:
    """Groups holding an Unknown wait for ``release``; landed writes are logged."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.landed: list[str] = []

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        if any(w.status == Unknown() for w in writes):
            await self.release.wait()
        self.landed += [f"{'take' if w.attempt else w.status} {w.id}" for w in writes]
        return [None] * len(writes)


async def test_an_unknown_still_in_flight_lands_before_the_next_take_of_its_batch() -> None:
    # The follower's UNKNOWN is recorded; before that write lands, the queue
    # hands the batch out again and its take is written. Landing after the
    # take, the UNKNOWN would clear `submitted` on a batch the ledger is about
    # to hold, and free it for a second, unasked resend.
    store = OrderStore()
    writer = Completer(store, flushers=2)
    unknown = asyncio.create_task(writer.apply(BatchWrite("a", "A", Unknown())))
    await asyncio.sleep(0)
    take = asyncio.create_task(writer.apply(BatchWrite("a", "A", attempt=True)))
    other = asyncio.create_task(writer.apply(BatchWrite("b", "B", attempt=True)))
    await asyncio.wait_for(other, 5)  # another batch does not wait
    assert store.landed == ["take B"]
    await asyncio.sleep(0.01)
    assert not take.done()
    store.release.set()
    await asyncio.wait_for(asyncio.gather(unknown, take), 5)
    assert store.landed[1:] == [f"{Unknown()} A", "take A"]
