"""The batch lifecycle under the parallel rules, driven by random steps (Hypothesis).

As ``test_queuer_lifecycle.py`` for the serial rules, with what makes the
parallel strategy different: batches read and write random keys (full
addresses and namespace prefixes) and sometimes depend on an earlier batch's
transaction; the queue hands out a service's pick and asks again with it
excluded until the store records it as taken (as the queue source does), so
several batches of one service are out at once; the ledger decides what it
holds in any order, and commits apply to a key-value state.

Checked after every step: never two conflicting batches of a service in
flight (held by the submitter, submitted, ``Pending``, or held by the ledger);
a batch reaches the ledger only after every earlier conflicting batch of its
service has been decided; nothing final is queued or posted again. Checked at
the end: once the ledger answers everything every service drains, and the
state the ledger reached equals applying the committed batches one at a time
in acceptance order.
"""

from __future__ import annotations

import dataclasses
import hashlib
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
    TrackingTransaction,
    Unknown,
)
from ledgerq.queue.parallel import BatchAccess, select_parallel_round

SERVICES = ["s0", "s1", "s2"]
NAMESPACE = "1cf126"
KEYS = [NAMESPACE + c * 64 for c in "0123"]
#: Entries a batch may declare: a key, or the namespace prefix (every key).
ENTRIES = [*KEYS, NAMESPACE]

accesses = st.tuples(
    st.lists(st.sampled_from(ENTRIES), max_size=2),  # reads
    st.lists(st.sampled_from(ENTRIES), max_size=2),  # writes
    st.booleans(),  # depends on the service's previous batch
)


def touches(batch: TrackingBatch) -> tuple[set[str], set[str]]:
    """The keys a batch reads and writes, from its transactions as declared."""
    reads: set[str] = set()
    writes: set[str] = set()
    for t in batch.transactions:
        reads |= {k for k in KEYS for e in t.inputs or () if k.startswith(e)}
        writes |= {k for k in KEYS for e in t.outputs or () if k.startswith(e)}
    return reads, writes


def must_follow(earlier: TrackingBatch, later: TrackingBatch) -> bool:
    """The model's own statement of the rule (independent of the queuer's code):
    ``later`` must not be in flight before ``earlier`` is decided."""
    r1, w1 = touches(earlier)
    r2, w2 = touches(later)
    ids = {t.transaction_header for t in earlier.transactions}
    depends = any(d in ids for t in later.transactions for d in t.dependencies)
    return bool(w1 & (r2 | w2) or r1 & w2 or depends)


class Ledger:
    """Undecided batches, decisions, and the state committed batches produced."""

    def __init__(self) -> None:
        self.pending: dict[str, TrackingBatch] = {}
        self.decided: dict[str, str] = {}  # batch id -> "committed" | "invalid"
        self.state: dict[str, dict[str, str]] = {}

    def status(self, batch_id: str) -> str | None:
        if batch_id in self.pending:
            return "pending"
        return self.decided.get(batch_id)


def apply(state: dict[str, dict[str, str]], batch: TrackingBatch) -> None:
    """A batch's effect: every key it writes becomes a digest of what it read.

    Services are separate scopes (the queuer never orders one against
    another), so each has its own keys.
    """
    access = BatchAccess.of(batch)
    keys = state.setdefault(batch.service_id, {})
    seen = "|".join(
        f"{k}={keys.get(k)}"
        for k in KEYS
        if any(k.startswith(r) for r in access.reads + access.writes)
    )
    value = hashlib.sha256(f"{batch.batch_id}:{seen}".encode()).hexdigest()[:12]
    for key in KEYS:
        if any(key.startswith(w) for w in access.writes):
            keys[key] = value


class ParallelLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_700_000_000_000
        self.window = 15_000
        self.seq = 0
        self.store: dict[str, TrackingBatch] = {}
        #: Handed out by the queue; the store does not show them as taken yet.
        self.handed: dict[str, TrackingBatch] = {}
        #: Taken (submitted = true), not yet posted.
        self.taken: dict[str, TrackingBatch] = {}
        self.ledger = Ledger()

    # -- helpers -------------------------------------------------------------

    def _set(self, batch_id: str, **changes: object) -> None:
        self.store[batch_id] = dataclasses.replace(self.store[batch_id], **changes)  # type: ignore[arg-type]

    def _of_service(self, service: str) -> list[TrackingBatch]:
        return sorted(
            (b for b in self.store.values() if b.service_id == service), key=lambda b: b.seq or 0
        )

    def _round(self) -> list[TrackingBatch]:
        exclude = {b.seq for b in self.handed.values() if b.seq is not None}
        chosen = select_parallel_round(
            self.store.values(), now=self.now, delay_window_ms=self.window, exclude=exclude
        )
        for batch in chosen:
            assert not batch.is_final, f"final batch queued: {batch}"
            assert batch.batch_id not in self.handed and batch.batch_id not in self.taken
        return chosen

    def _earlier_conflicting(self, batch: TrackingBatch) -> list[TrackingBatch]:
        return [
            b
            for b in self._of_service(batch.service_id)
            if (b.seq or 0) < (batch.seq or 0) and must_follow(b, batch)
        ]

    def _post(self, batch_id: str, outcome: str) -> None:
        batch = self.taken.pop(batch_id)
        if outcome in ("accepted", "rejected", "ambiguous-received"):
            assert batch_id not in self.ledger.decided, "a decided batch reached the ledger again"
            for prior in self._earlier_conflicting(batch):
                assert prior.batch_id in self.ledger.decided, (
                    f"{batch_id} reached the ledger before {prior.batch_id}, which it "
                    "conflicts with, was decided"
                )
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
                self.ledger.pending[batch_id] = batch
                self._set(batch_id, attempts=attempt)
            case "ambiguous-lost":
                self._set(batch_id, attempts=attempt)

    def _decide(self, batch_id: str, commit: bool) -> None:
        batch = self.ledger.pending.pop(batch_id)
        if commit:
            apply(self.ledger.state, batch)
        self.ledger.decided[batch_id] = "committed" if commit else "invalid"

    def _monitor(self) -> None:
        for batch in list(self.store.values()):
            if batch.is_final or batch.batch_id in self.taken or batch.batch_id in self.handed:
                continue
            if not (batch.submitted or batch.status_name is not None):
                continue
            if batch.status_name in ("Delayed", "Unknown") and not batch.submitted:
                continue
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
                    self._set(batch.batch_id, batch_status=Unknown(), submitted=False)

    # -- steps ---------------------------------------------------------------

    @initialize(counts=st.lists(st.integers(0, 4), min_size=len(SERVICES), max_size=len(SERVICES)))
    def start(self, counts: list[int]) -> None:
        for service, count in zip(SERVICES, counts, strict=True):
            for _ in range(count):
                self._accept(service, ([KEYS[0]], [KEYS[0]], False))

    @rule(service=st.sampled_from(SERVICES), specs=st.lists(accesses, min_size=1, max_size=3))
    def accept(self, service: str, specs: list[tuple[list[str], list[str], bool]]) -> None:
        for spec in specs:
            self._accept(service, spec)

    def _accept(self, service: str, spec: tuple[list[str], list[str], bool]) -> None:
        reads, writes, depends = spec
        previous = self._of_service(service)
        deps = (previous[-1].transactions[0].transaction_header,) if depends and previous else ()
        self.seq += 1
        batch_id = f"{service}-{self.seq:04d}"
        self.store[batch_id] = TrackingBatch(
            service_id=service,
            batch_header=batch_id,
            data_change_id=None,
            signer_public_key="02",
            trace=False,
            serialized_batch=b"",
            created_at=self.now // 1000 * 1000,
            seq=self.seq,
            transactions=(
                TrackingTransaction(
                    "intkey",
                    "1.0",
                    f"t-{batch_id}",
                    b"",
                    "03",
                    service,
                    inputs=tuple(reads),
                    outputs=tuple(writes),
                    dependencies=deps,
                ),
            ),
        )

    @rule(data=st.data())
    def queue_hands_out(self, data: st.DataObject) -> None:
        chosen = self._round()
        if chosen:
            for batch in data.draw(st.lists(st.sampled_from(chosen), unique=True)):
                self.handed[batch.batch_id] = batch

    @precondition(lambda self: bool(self.handed))
    @rule(data=st.data())
    def submitter_takes(self, data: st.DataObject) -> None:
        batch_id = data.draw(st.sampled_from(sorted(self.handed)))
        del self.handed[batch_id]
        self._set(batch_id, submitted=True)
        self.taken[batch_id] = self.store[batch_id]

    @precondition(lambda self: bool(self.taken))
    @rule(
        data=st.data(),
        outcome=st.sampled_from(
            ["accepted", "accepted", "rejected", "busy", "ambiguous-received", "ambiguous-lost"]
        ),
    )
    def post(self, data: st.DataObject, outcome: str) -> None:
        self._post(data.draw(st.sampled_from(sorted(self.taken))), outcome)

    @precondition(lambda self: bool(self.ledger.pending))
    @rule(data=st.data(), commit=st.booleans())
    def ledger_decides(self, data: st.DataObject, commit: bool) -> None:
        self._decide(data.draw(st.sampled_from(sorted(self.ledger.pending))), commit)

    @rule()
    def ledger_restarts(self) -> None:
        self.ledger.pending.clear()

    @rule()
    def monitor_polls(self) -> None:
        self._monitor()

    @rule(ms=st.sampled_from([1, 999, 14_999, 15_000, 60_000]))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    # -- invariants ----------------------------------------------------------

    @invariant()
    def never_two_conflicting_in_flight(self) -> None:
        flying: dict[str, list[TrackingBatch]] = defaultdict(list)
        for batch in self.store.values():
            held = (
                batch.batch_id in self.handed
                or batch.batch_id in self.taken
                or batch.batch_id in self.ledger.pending
                or (not batch.is_final and (batch.submitted or batch.status_name == "Pending"))
            )
            if held:
                flying[batch.service_id].append(batch)
        for service, batches in flying.items():
            batches.sort(key=lambda b: b.seq or 0)
            for i, later in enumerate(batches):
                for earlier in batches[:i]:
                    assert not must_follow(earlier, later), (
                        f"{service}: {earlier.batch_id} and {later.batch_id} conflict "
                        "and are in flight together"
                    )

    def teardown(self) -> None:
        """Once the ledger answers everything, every service drains, in a
        state equal to applying the committed batches in acceptance order."""
        for _ in range(3 * len(self.store) + 5):
            if all(b.is_final for b in self.store.values()):
                break
            for batch_id in sorted(self.handed):
                del self.handed[batch_id]
                self._set(batch_id, submitted=True)
                self.taken[batch_id] = self.store[batch_id]
            for batch_id in sorted(self.taken):
                self._post(batch_id, "accepted")
            for batch_id in sorted(self.ledger.pending):
                self._decide(batch_id, commit=True)
            self._monitor()
            self.now += self.window
            # Hand out everything the queue offers, asking again as the source does.
            while chosen := self._round():
                for batch in chosen:
                    self.handed[batch.batch_id] = batch
            self.never_two_conflicting_in_flight()
        stuck = sorted(b.batch_id for b in self.store.values() if not b.is_final)
        assert not stuck, f"locked for ever: {stuck}"
        serial: dict[str, dict[str, str]] = {}
        for batch in sorted(self.store.values(), key=lambda b: b.seq or 0):
            expected = "committed" if batch.status_name == "Committed" else "invalid"
            assert self.ledger.decided.get(batch.batch_id) == expected
            if expected == "committed":
                apply(serial, batch)
        assert self.ledger.state == serial


ParallelLifecycle.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestParallelLifecycle = ParallelLifecycle.TestCase
