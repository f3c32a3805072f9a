"""A model of the whole batch lifecycle driven by random steps (Hypothesis).

The pipeline's real parts do the bookkeeping: an in-memory store
(:class:`~ledgerq.store.memory.MemoryStore`, the contract suite's third
backend) computes the rounds, and every state change is the real
:mod:`~ledgerq.record.writes` write the producer makes of each event,
applied through the store's one write verb. The model plays the rest: the
submitter takes what a round queues and later posts it with a random
outcome; the ledger accepts, is busy (503/429), rejects, answers ambiguously
(it got the batch, or not, and the submitter cannot tell), decides pending
batches, or restarts and forgets them; the follower asks the ledger about
every batch it may hold that no submission is working on. Time moves by
steps.

Checked after every step: never two batches of one service in flight; every
batch reaches the ledger only after all earlier batches of its service were
decided; **no POST of a batch the ledger holds** (pending or decided) — the
ask-before-resend rule, which fails if an ambiguous batch is handed out
again before the ledger said UNKNOWN; nothing final is queued. Checked at
the end: once the ledger answers everything, every service drains.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ledgerq.ledgers.base import Accepted, Ambiguous, Busy, Rejected
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    Committed,
    Invalid,
    Pending,
    TrackingBatch,
    TrackingTransaction,
    Unknown,
)
from ledgerq.record import writes
from ledgerq.store.memory import MemoryStore

SERVICES = ["s0", "s1", "s2", "s3"]


class Ledger:
    """What the ledger knows: undecided batches and the decisions it made."""

    def __init__(self) -> None:
        self.pending: set[str] = set()
        self.decided: dict[str, str] = {}  # batch id -> "committed" | "invalid"
        self.received: list[str] = []

    def status(self, batch_id: str) -> BatchStatus:
        if batch_id in self.pending:
            return Pending()
        match self.decided.get(batch_id):
            case "committed":
                return Committed()
            case "invalid":
                return Invalid()
        return Unknown()


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_700_000_000_000
        self.window = 15_000
        self.n = 0
        self.loop = asyncio.new_event_loop()
        self.store = MemoryStore(clock=lambda: self.now)
        self.taken: dict[str, TrackingBatch] = {}  # held by the submitter, not yet posted
        self.ledger = Ledger()

    # -- helpers -------------------------------------------------------------

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def _write(self, write: BatchWrite) -> None:
        [error] = self._run(self.store.apply_writes([write]))
        if error is not None:
            raise error

    def _outcome(self, batch: TrackingBatch, result: object) -> None:
        self._write(writes.outcome(batch, result, 1, now=self.now, fence=None))  # type: ignore[arg-type]

    def _all(self) -> list[TrackingBatch]:
        return list(self._run(self.store.list_batches(limit=10_000)).batches)

    def _of_service(self, service: str) -> list[TrackingBatch]:
        return [b for b in self._all() if b.service_id == service]

    def _round(self) -> list[TrackingBatch]:
        chosen = self._run(self.store.queue_round(now=self.now, delay_window_ms=self.window))
        for batch in chosen:
            assert not batch.is_final, f"final batch queued: {batch}"
            assert batch.batch_id not in self.taken
        return chosen

    def _take(self, batch: TrackingBatch) -> None:
        self._write(writes.taken(batch, now=self.now, fence=None))
        self.taken[batch.batch_id] = batch

    def _post(self, batch_id: str, outcome: str) -> None:
        batch = self.taken.pop(batch_id)
        # The judge: a POST of a batch the ledger holds was sent without asking.
        assert batch_id not in self.ledger.pending, f"{batch_id} re-posted while pending"
        assert batch_id not in self.ledger.decided, f"{batch_id} re-posted once decided"
        if outcome in ("accepted", "rejected", "ambiguous-received"):
            earlier = [b for b in self._of_service(batch.service_id) if b.seq < batch.seq]  # type: ignore[operator]
            for prior in earlier:
                assert prior.batch_id in self.ledger.decided, (
                    f"{batch_id} reached the ledger before {prior.batch_id} was decided"
                )
            self.ledger.received.append(batch_id)
        match outcome:
            case "accepted":
                self.ledger.pending.add(batch_id)
                self._outcome(batch, Accepted())
            case "rejected":
                self.ledger.decided[batch_id] = "invalid"
                self._outcome(batch, Rejected(400, "bad batch"))
            case "busy":
                self._outcome(batch, Busy(503, "busy"))
            case "ambiguous-received":
                # Timeout after sending: the ledger has it, the submitter cannot tell.
                self.ledger.pending.add(batch_id)
                self._outcome(batch, Ambiguous("timeout"))
            case "ambiguous-lost":
                self._outcome(batch, Ambiguous("reset"))

    def _follow(self) -> None:
        """Ask the ledger about every batch it may hold that no submission works on."""
        for batch in self._all():
            if batch.is_final or batch.batch_id in self.taken:
                continue
            if not (batch.submitted or batch.status_name is BatchStatusName.PENDING):
                continue  # not submitted, Unknown or Delayed: waits for the queue
            status = self.ledger.status(batch.batch_id)
            self._write(
                writes.ledger_status(
                    batch.service_id, batch.batch_id, status, now=self.now, fence=None
                )
            )

    # -- steps ---------------------------------------------------------------

    @initialize(counts=st.lists(st.integers(0, 4), min_size=len(SERVICES), max_size=len(SERVICES)))
    def start(self, counts: list[int]) -> None:
        for service, count in zip(SERVICES, counts, strict=True):
            self.accept(service, count)

    @rule(service=st.sampled_from(SERVICES), count=st.integers(1, 3))
    def accept(self, service: str, count: int) -> None:
        batches = []
        for _ in range(count):
            self.n += 1
            batch_id = f"{service}-{self.n:04d}"
            batches.append(
                TrackingBatch(
                    service_id=service,
                    batch_header=batch_id,
                    data_change_id=None,
                    signer_public_key="02",
                    trace=False,
                    serialized_batch=b"",
                    # Whole seconds, as the seed stored them: ties are common.
                    created_at=self.now // 1000 * 1000,
                    transactions=(
                        TrackingTransaction("intkey", "1.0", f"t-{batch_id}", b"", "02", service),
                    ),
                )
            )
        self._run(self.store.add_batches(batches))

    @rule(data=st.data())
    def queue_and_take(self, data: st.DataObject) -> None:
        chosen = self._round()
        if chosen:
            subset = data.draw(st.lists(st.sampled_from(chosen), unique=True, max_size=len(chosen)))
            for batch in subset:
                self._take(batch)

    @precondition(lambda self: bool(self.taken))
    @rule(
        data=st.data(),
        outcome=st.sampled_from(
            ["accepted", "accepted", "rejected", "busy", "ambiguous-received", "ambiguous-lost"]
        ),
    )
    def post(self, data: st.DataObject, outcome: str) -> None:
        batch_id = data.draw(st.sampled_from(sorted(self.taken)))
        self._post(batch_id, outcome)

    @precondition(lambda self: bool(self.ledger.pending))
    @rule(data=st.data(), commit=st.booleans())
    def ledger_decides(self, data: st.DataObject, commit: bool) -> None:
        batch_id = data.draw(st.sampled_from(sorted(self.ledger.pending)))
        self.ledger.pending.discard(batch_id)
        self.ledger.decided[batch_id] = "committed" if commit else "invalid"

    @rule()
    def ledger_restarts(self) -> None:
        self.ledger.pending.clear()

    @rule()
    def follower_asks(self) -> None:
        self._follow()

    @rule(ms=st.sampled_from([1, 999, 1_000, 14_999, 15_000, 60_000]))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    # -- invariants ----------------------------------------------------------

    @invariant()
    def never_two_in_flight(self) -> None:
        holders: dict[str, set[str]] = defaultdict(set)
        for batch in self._all():
            maybe_at_ledger = batch.batch_id in self.ledger.pending
            held = batch.batch_id in self.taken or (batch.submitted and not batch.is_final)
            if maybe_at_ledger or held or batch.status_name == "Pending":
                holders[batch.service_id].add(batch.batch_id)
        for service, ids in holders.items():
            assert len(ids) <= 1, f"{service} has {sorted(ids)} in flight at once"

    @invariant()
    def ledger_decisions_are_recorded_in_order(self) -> None:
        for service in SERVICES:
            seen_undecided = False
            for batch in self._of_service(service):
                decided = batch.batch_id in self.ledger.decided
                assert not (decided and seen_undecided), f"{service} decided out of order"
                seen_undecided = seen_undecided or not decided

    def teardown(self) -> None:
        """Once the ledger answers everything, every service drains."""
        for _ in range(3 * len(self._all()) + 5):
            if all(b.is_final for b in self._all()):
                break
            for batch_id in sorted(self.taken):
                self._post(batch_id, "accepted")
            for batch_id in sorted(self.ledger.pending):
                self.ledger.pending.discard(batch_id)
                self.ledger.decided[batch_id] = "committed"
            self._follow()
            self.now += self.window
            for batch in self._round():
                self._take(batch)
            self.never_two_in_flight()
        every = self._all()
        self.loop.close()
        stuck = sorted(b.batch_id for b in every if not b.is_final)
        assert not stuck, f"locked for ever: {stuck}"
        for batch in every:
            expected = "committed" if batch.status_name == "Committed" else "invalid"
            assert self.ledger.decided.get(batch.batch_id) == expected


Lifecycle.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLifecycle = Lifecycle.TestCase
