"""A model of the whole batch lifecycle driven by random steps (Hypothesis).

The store is a dict of ``TrackingBatch``; the submitter takes what
``select_round`` queues (``submitted = true``) and later posts it with a
random outcome; the ledger accepts, is busy (503/429 → ``Delayed``),
rejects (``Invalid``), answers ambiguously (the submitter cannot tell whether
the ledger got it), decides pending batches, or restarts and forgets them;
the monitor records what the ledger says, setting ``Unknown`` and clearing
``submitted`` for a batch the ledger does not know. Time moves by steps.

Checked after every step: never two batches of one service in flight, every
batch reaches the ledger only after all earlier batches of its service were
decided, nothing final is ever queued or posted again. Checked at the end:
once the ledger answers everything, every service drains (nothing is locked
for ever).
"""

from __future__ import annotations

import dataclasses
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

from ledgerq.model import (
    BatchStatus,
    Committed,
    Delayed,
    Invalid,
    Pending,
    TrackingBatch,
    Unknown,
)
from ledgerq.queuer import select_round

SERVICES = ["s0", "s1", "s2", "s3"]


class Ledger:
    """What the ledger knows: undecided batches and the decisions it made."""

    def __init__(self) -> None:
        self.pending: dict[str, TrackingBatch] = {}
        self.decided: dict[str, str] = {}  # batch id -> "committed" | "invalid"
        self.received: list[str] = []

    def status(self, batch_id: str) -> str | None:
        if batch_id in self.pending:
            return "pending"
        return self.decided.get(batch_id)


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_700_000_000_000
        self.window = 15_000
        self.seq = 0
        self.store: dict[str, TrackingBatch] = {}
        self.taken: dict[str, TrackingBatch] = {}  # held by the submitter, not yet posted
        self.ledger = Ledger()

    # -- helpers -------------------------------------------------------------

    def _set(self, batch_id: str, **changes: object) -> None:
        self.store[batch_id] = dataclasses.replace(self.store[batch_id], **changes)  # type: ignore[arg-type]

    def _of_service(self, service: str) -> list[TrackingBatch]:
        return sorted(
            (b for b in self.store.values() if b.service_id == service),
            key=lambda b: b.seq or 0,
        )

    def _round(self) -> list[TrackingBatch]:
        chosen = select_round(self.store.values(), now=self.now, delay_window_ms=self.window)
        for batch in chosen:
            assert not batch.is_final, f"final batch queued: {batch}"
            assert batch.batch_id not in self.taken
        return chosen

    def _take(self, batch: TrackingBatch) -> None:
        # The submitter's in-progress notification: submitted = true.
        self._set(batch.batch_id, submitted=True)
        self.taken[batch.batch_id] = self.store[batch.batch_id]

    def _post(self, batch_id: str, outcome: str) -> None:
        batch = self.taken.pop(batch_id)
        earlier = [b for b in self._of_service(batch.service_id) if (b.seq or 0) < (batch.seq or 0)]
        if outcome in ("accepted", "rejected", "ambiguous-received"):
            assert batch_id not in self.ledger.decided, "a decided batch reached the ledger again"
            for prior in earlier:
                assert prior.batch_id in self.ledger.decided, (
                    f"{batch_id} reached the ledger before {prior.batch_id} was decided"
                )
            self.ledger.received.append(batch_id)
        attempt = self.store[batch_id].attempts + 1
        match outcome:
            case "accepted":
                self.ledger.pending[batch_id] = batch
                self._set(batch_id, batch_status=Pending(), attempts=attempt)
            case "rejected":
                self.ledger.decided[batch_id] = "invalid"
                self._set(batch_id, batch_status=Invalid(), attempts=attempt)
            case "busy":
                self._set(
                    batch_id,
                    batch_status=Delayed(),
                    submitted=False,
                    last_attempt_at=self.now,
                    attempts=attempt,
                )
            case "ambiguous-received":
                # Timeout after sending: the ledger has it, the submitter cannot tell.
                self.ledger.pending[batch_id] = batch
                self._set(batch_id, attempts=attempt)
            case "ambiguous-lost":
                self._set(batch_id, attempts=attempt)

    def _monitor(self) -> None:
        """Record what the ledger says about every submitted, non-final batch."""
        for batch in list(self.store.values()):
            if batch.is_final or batch.batch_id in self.taken:
                continue
            if not (batch.submitted or batch.status_name is not None):
                continue
            if batch.status_name in ("Delayed", "Unknown") and not batch.submitted:
                continue  # waits for the queuer, not the ledger
            status: BatchStatus
            match self.ledger.status(batch.batch_id):
                case "pending":
                    status = Pending()
                    self._set(batch.batch_id, batch_status=status)
                case "committed":
                    self._set(batch.batch_id, batch_status=Committed())
                case "invalid":
                    self._set(batch.batch_id, batch_status=Invalid())
                case None:
                    # The ledger does not know it: Unknown, and submitted cleared.
                    self._set(batch.batch_id, batch_status=Unknown(), submitted=False)

    # -- steps ---------------------------------------------------------------

    @initialize(counts=st.lists(st.integers(0, 4), min_size=len(SERVICES), max_size=len(SERVICES)))
    def start(self, counts: list[int]) -> None:
        for service, count in zip(SERVICES, counts, strict=True):
            self.accept(service, count)

    @rule(service=st.sampled_from(SERVICES), count=st.integers(1, 3))
    def accept(self, service: str, count: int) -> None:
        for _ in range(count):
            self.seq += 1
            batch_id = f"{service}-{self.seq:04d}"
            self.store[batch_id] = TrackingBatch(
                service_id=service,
                batch_header=batch_id,
                data_change_id=None,
                signer_public_key="02",
                trace=False,
                serialized_batch=b"",
                # Whole seconds, as the seed stored them: ties are common.
                created_at=self.now // 1000 * 1000,
                seq=self.seq,
            )

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
        del self.ledger.pending[batch_id]
        self.ledger.decided[batch_id] = "committed" if commit else "invalid"

    @rule()
    def ledger_restarts(self) -> None:
        self.ledger.pending.clear()

    @rule()
    def monitor_polls(self) -> None:
        self._monitor()

    @rule(ms=st.sampled_from([1, 999, 1_000, 14_999, 15_000, 60_000]))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    # -- invariants ----------------------------------------------------------

    @invariant()
    def never_two_in_flight(self) -> None:
        holders: dict[str, set[str]] = defaultdict(set)
        for batch in self.store.values():
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
        for _ in range(3 * len(self.store) + 5):
            if all(b.is_final for b in self.store.values()):
                break
            for batch_id in sorted(self.taken):
                self._post(batch_id, "accepted")
            for batch_id in sorted(self.ledger.pending):
                del self.ledger.pending[batch_id]
                self.ledger.decided[batch_id] = "committed"
            self._monitor()
            self.now += self.window
            for batch in self._round():
                self._take(batch)
            self.never_two_in_flight()
        stuck = sorted(b.batch_id for b in self.store.values() if not b.is_final)
        assert not stuck, f"locked for ever: {stuck}"
        for batch in self.store.values():
            expected = "committed" if batch.status_name == "Committed" else "invalid"
            assert self.ledger.decided.get(batch.batch_id) == expected


Lifecycle.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLifecycle = Lifecycle.TestCase
