"""TakeOverAsks: the reads start where the claim cycle runs (the claim thread,
with a client of its own); the answers are recorded there too, with a store
of its own, under the new claims' fences (or, without one, applied on the
gateway's loop), for the services actually taken, in one go."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence

from ledgerq.errors import FencedOffError, StoreError
from ledgerq.gateway.takeover import TakeOverAsks
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import BatchStatus, BatchWrite, Committed, Fence, Pending, Unknown


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
            LedgerBatchStatus(
                b,
                Committed() if b.startswith("c") else Pending() if b.startswith("p") else Unknown(),
            )
            for b in batch_ids
        )

    async def close(self) -> None:
        self.closed = True


class Entry(str):
    """A followed batch as the fake follower hands it out: its id."""

    @property
    def batch_id(self) -> str:
        return str(self)


class FakeFollower:
    def __init__(self) -> None:
        self.adopted: list[tuple[str, str]] = []
        self.answers: list[tuple[list[str], dict[str, BatchStatus]]] = []

    def adopt(self, pairs: Sequence[tuple[str, str]]) -> list[Entry]:
        self.adopted += pairs
        return [Entry(b) for b, _ in pairs]

    async def answered(self, entries: Sequence[str], answers: Mapping[str, BatchStatus]) -> None:
        self.answers.append((list(entries), dict(answers)))

    def settled(self, entries: Sequence[str], recorded: Mapping[str, BatchStatus]) -> None:
        self.answers.append((list(entries), dict(recorded)))


class FakeStore:
    """The claim thread's own store: notes where and what it writes; refuses
    the writes of batch ids starting with "x" (fenced off)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.writes: list[tuple[str, list[BatchWrite]]] = []
        self.closed: list[str] = []
        self.fail = fail

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        self.writes.append((threading.current_thread().name, list(writes)))
        if self.fail:
            raise StoreError("the database went away")
        return [FencedOffError("moved on") if w.id.startswith("x") else None for w in writes]

    async def close(self) -> None:
        self.closed.append(threading.current_thread().name)


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


def _on_claim_thread(
    asks: TakeOverAsks,
    home: asyncio.AbstractEventLoop,
    won: dict[str, Fence],
    batches: dict[str, tuple[str, ...]],
) -> None:
    """One take-over where the claim cycle runs, as the claim manager makes
    it: asking, then (the claims committed) taken sent to the gateway's
    loop and won called here; then the thread ends."""

    def claim_thread() -> None:
        async def cycle() -> None:
            asks.started()
            asks.asking(batches)
            await asyncio.sleep(0.02)  # the take-over's second statement
            home.call_soon_threadsafe(asks.taken, frozenset(won))
            asks.won(won)
            await asyncio.sleep(0.05)  # the answers are recorded meanwhile
            await asks.ended()

        asyncio.run(cycle())

    thread = threading.Thread(target=claim_thread, name="claims-test")
    thread.start()
    thread.join()


async def _settled(follower: FakeFollower) -> None:
    for _ in range(100):
        if follower.answers:
            return
        await asyncio.sleep(0.01)


async def test_with_a_store_of_its_own_the_claim_thread_records_the_answers_itself() -> None:
    gateway_ledger, own = FakeLedger(), FakeLedger()
    follower = FakeFollower()
    store = FakeStore()
    woken: list[str] = []

    async def opener() -> FakeStore:
        return store

    asks = TakeOverAsks(
        gateway_ledger,
        follower,  # type: ignore[arg-type]
        reader=lambda: own,  # type: ignore[arg-type,return-value]
        opener=opener,  # type: ignore[arg-type]
        wake=woken.append,
    )
    asks._span = True
    batches = {"s1": ("c1",), "s2": ("u2",), "s3": ("p3",), "s4": ("x4",), "s5": ("c5",)}
    fences = {s: Fence("me", n) for n, s in enumerate(("s1", "s2", "s3", "s4"), 10)}
    # s5 went to another instance.
    home = asks._home = asyncio.get_running_loop()
    await asyncio.to_thread(_on_claim_thread, asks, home, fences, batches)
    await _settled(follower)
    # Read and recorded on the claim thread, one write per batch of the
    # services won, each under its service's new fence; the store closed there.
    assert own.reads == [("claims-test", ("c1", "u2", "p3", "x4", "c5"))]
    ((where, writes),) = store.writes
    assert where == "claims-test" and store.closed == ["claims-test"]
    assert [(w.service_id, w.id, w.status, w.fence) for w in writes] == [
        ("s1", "c1", Committed(), fences["s1"]),
        ("s2", "u2", Unknown(), fences["s2"]),
        ("s3", "p3", Pending(), fences["s3"]),
        ("s4", "x4", Unknown(), fences["s4"]),
    ]
    assert not any(w.attempt for w in writes)
    # The gateway's loop settles what landed (x4 was refused: asked again by
    # the follower) and wakes the services it freed; nothing went through it.
    ((entries, recorded),) = follower.answers
    assert entries == ["c1", "u2", "p3", "x4"]
    assert recorded == {"c1": Committed(), "u2": Unknown(), "p3": Pending()}
    assert woken == ["s1", "s2"]
    assert gateway_ledger.reads == [] and asks.applied == 3


async def test_a_failed_write_on_the_claim_thread_leaves_every_answer_to_the_follower() -> None:
    own = FakeLedger()
    follower = FakeFollower()
    store = FakeStore(fail=True)

    async def opener() -> FakeStore:
        return store

    asks = TakeOverAsks(
        FakeLedger(),  # type: ignore[arg-type]
        follower,  # type: ignore[arg-type]
        reader=lambda: own,  # type: ignore[arg-type,return-value]
        opener=opener,  # type: ignore[arg-type]
    )
    home = asks._home = asyncio.get_running_loop()
    await asyncio.to_thread(_on_claim_thread, asks, home, {"s1": Fence("me", 1)}, {"s1": ("c1",)})
    await _settled(follower)
    assert follower.answers == [(["c1"], {})]
    assert asks.applied == 0
