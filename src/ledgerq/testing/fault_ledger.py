"""A Sawtooth-shaped REST ledger that judges what it receives and injects faults.

It answers what a Sawtooth validator's REST API (or a proxy in front of one,
or a hosted endpoint) answers, over real HTTP on loopback:

* ``POST /batches`` (a ``BatchList``, ``application/octet-stream``) → ``202``
  with a status link; ``400`` with Sawtooth's error codes (30 invalid, 34
  empty, 35 not decodable, 42 wrong content type); ``429`` (code 31) beyond
  ``max_pending`` pending batches.
* ``GET /batch_statuses?id=a,b&wait=N`` and ``POST /batch_statuses?wait=N``
  (a JSON array of ids): ``{"data": [{"id", "status", "invalid_transactions"}],
  "link"}``; with ``wait`` the answer comes when none of the ids is
  ``PENDING`` any more (as Sawtooth's), or after N seconds (at most 300).
* ``GET /transactions/{id}``: a committed transaction, ``{"data": {"header",
  "header_signature", "payload"}, "link"}``; ``404`` (code 72) for any other,
  as Sawtooth's REST API (it knows committed transactions only); ``400`` (code
  60) for an id that is not 128 lower-case hex digits.
* No ``/events``, no ``/subscriptions``: ``404``, as on a plain validator.

Each accepted batch is committed ``commit_delay_ms`` after it was accepted
(with equal delays: in acceptance order) by executing its intkey transactions
(:mod:`ledgerq.testing.intkey`): a batch out of order is ``INVALID``.

**Dependencies** (a transaction header's ``dependencies``), as a Sawtooth
validator treats them (its completer, block publisher and batch tracker):

* A batch is accepted only when every transaction its transactions depend on
  has been *seen* — it is in a batch the ledger accepted (pending, committed,
  or judged) — or is committed. Otherwise the ledger *holds* it: status reads
  answer ``held_status`` (``UNKNOWN`` by default, as Sawtooth's REST API does:
  a held batch has not reached the validator's batch tracker; ``PENDING`` on
  request), ``wait`` does not wait for it (unless ``PENDING``), and it counts
  for neither ``max_pending`` nor ``peak_pending``. A dependency on a
  transaction of the same batch is never seen first (the validator checks a
  batch before it counts the batch's own transactions as seen): such a batch
  is held until dropped.
* A held batch is accepted as soon as the batches it waits for are (one
  acceptance releasing the next in turn), and then committed as any other.
* A held batch is dropped silently ``dependency_hold_s`` after its last POST
  (a POST of it restarts the time, as it refreshes the validator's cache):
  status reads answer ``UNKNOWN``, and a POST of it is a new start.
* An accepted batch is committed only after every transaction it depends on
  is committed: one due before its dependency waits for it.
* A batch that depends on a transaction the ledger judged ``INVALID`` is
  never committed and never judged: the validator's scheduler fails it
  without asking a transaction processor, so nothing tells its batch tracker,
  and status reads answer ``PENDING`` for as long as the ledger runs (it is
  *stuck*; :meth:`FaultLedger.forget_pending`, a restart, forgets it).

**Judging.** A POST of a batch the ledger knows as ``PENDING``, ``COMMITTED``
or ``INVALID``, holds for its dependencies, or has stuck, is recorded as a
:class:`Violation` (a real validator would tolerate it; ledgerq's rule is to
ask before any resend). The batch is answered ``202`` as a validator would. A
batch the ledger forgot (``UNKNOWN``) may be sent again, and so may a held
batch once a status read answered ``UNKNOWN`` about it since its last POST
(what the ledger told the client is what the client may act on), also when
the ledger has released it from its hold since without saying so (its
dependency arrived): a client resending what it was told is lost races that
release, and cannot know. A later read answering anything else withdraws the
leave; each answer allows one POST.

**Judging overlaps** (``judge_overlaps=True``). A batch accepted while
another batch the ledger knows as ``PENDING`` conflicts with it — one writes
(declared ``outputs``) an address or prefix the other reads or writes, prefixes
overlapping when one begins the other — is recorded as an :class:`Overlap`:
the two were in flight together, which the per-key parallel queuer must never
allow within a service (batches of different services are not judged apart:
give each service its own keys). :attr:`FaultLedger.peak_pending` is the most
batches the ledger had pending at once, which shows whether anything was in
flight together at all.

**Faults** (:class:`FaultPlan`, replaceable at any time, drawn from a seeded
random generator): ``503``/``429`` before accepting; the connection dropped,
or a ``500``, *after* accepting; accepted batches forgotten before they
commit (or all pending, held and stuck ones at once, as a restarted
validator: :meth:`FaultLedger.forget_pending`);
every route answering ``404`` for a while; status reads answered ``503``, or
with malformed bodies for a while.

**Report.** :meth:`FaultLedger.report` (and ``GET /_fault/report``) gives the
violations, the fault and dependency counts (``held``, ``released_from_hold``,
``dropped_after_hold``, ``stuck_on_invalid_dependency``), per batch its state
(``HELD`` and ``STUCK`` beside the Sawtooth statuses), POST count, times (ms
since the ledger started: first POST, first held, accepted, final) and place
in the commit order (``commit_seq``), and the per-key commit order; ``GET
/_fault/progress`` just how many batches are final, held and stuck. ``PUT
/_fault/plan`` (JSON fields of :class:`FaultPlan`) and ``POST /_fault/forget``
steer a ledger running in another process; ``/_fault/`` routes never fail.

Run it alone: ``python -m ledgerq.testing.fault_ledger --commit-delay-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import heapq
import json
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ledgerq.codec import ParsedBatch, decode_batch_list
from ledgerq.errors import InvalidBatchError
from ledgerq.testing.dependencies import DependencyBook
from ledgerq.testing.intkey import IntkeyState, TxFailure, names_of

PENDING, COMMITTED, INVALID, UNKNOWN = "PENDING", "COMMITTED", "INVALID", "UNKNOWN"
#: The ledger's own states beyond Sawtooth's statuses: waiting for dependencies
#: to be seen (read as ``FaultPlan.held_status``), and never to be committed
#: for a dependency judged INVALID (read as PENDING).
HELD, STUCK = "HELD", "STUCK"
#: How long Sawtooth's completer keeps a batch with missing dependencies.
SAWTOOTH_HOLD_S = 1200.0
MAX_WAIT_S = 300.0
#: Status bodies served, in turn, while ``malformed_statuses`` is on.
MALFORMED_KINDS = (
    "invalid_transaction_not_object",
    "data_not_a_list",
    "truncated",
    "entry_without_status",
    "html",
    "unknown_status",
    # Arrays nested past any parser's recursion limit (json.loads raises
    # RecursionError, not ValueError, for these).
    "nested_too_deep",
)


#: A block, batch or transaction id as Sawtooth's REST API checks it.
_RESOURCE_ID = re.compile(r"[0-9a-f]{128}")
#: What status reads may answer about a batch held for its dependencies.
HELD_STATUSES = (UNKNOWN, PENDING)
#: The plan's fields that are times, not probabilities.
_DURATIONS = ("commit_delay_ms", "dependency_hold_s")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What the ledger does; probabilities are per request (POST) or per batch (forget)."""

    commit_delay_ms: float = 20.0
    #: A POST answered 503 / 429 before anything is accepted.
    busy_503: float = 0.0
    busy_429: float = 0.0
    #: A POST accepted, then its connection closed without an answer.
    drop_after_accept: float = 0.0
    #: A POST accepted, then answered 500.
    error_500_after_accept: float = 0.0
    #: An accepted batch forgotten before it commits (UNKNOWN afterwards).
    forget: float = 0.0
    #: A status read answered 503.
    status_503: float = 0.0
    #: Every route answers 404 (a wrong URL, a proxy without the route).
    not_found: bool = False
    #: Status reads answer 200 with a malformed body.
    malformed_statuses: bool = False
    #: More pending batches than this: 429, code 31 (0: no limit).
    max_pending: int = 0
    #: A batch held for dependencies not seen is dropped this long after its
    #: last POST (Sawtooth's completer: 1,200 s).
    dependency_hold_s: float = SAWTOOTH_HOLD_S
    #: What status reads answer about a held batch: UNKNOWN (Sawtooth's batch
    #: tracker has not seen it) or PENDING.
    held_status: str = UNKNOWN

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and f.name not in _DURATIONS and not 0.0 <= value <= 1.0:
                raise ValueError(f"{f.name} is a probability, between 0 and 1; got {value}")
        if self.commit_delay_ms < 0 or self.max_pending < 0 or self.dependency_hold_s < 0:
            raise ValueError(
                "commit_delay_ms, max_pending and dependency_hold_s must not be negative"
            )
        if self.held_status not in HELD_STATUSES:
            raise ValueError(
                f"held_status is one of {', '.join(HELD_STATUSES)}; got {self.held_status!r}"
            )

    def updated(self, changes: dict[str, Any]) -> FaultPlan:
        """This plan with ``changes`` (field name → value); ``ValueError`` on unknown fields."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown plan fields {unknown}; known: {sorted(known)}")
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Violation:
    """A POST of a batch the ledger already had: a resend made without asking."""

    batch_id: str
    #: The status the ledger had it in.
    known_as: str
    at_ms: float


@dataclass(frozen=True, slots=True)
class Overlap:
    """A batch accepted while a conflicting batch was pending: in flight together."""

    batch_id: str
    pending_id: str
    #: The entry of the pending batch that conflicts.
    entry: str
    at_ms: float


def _access(batch: ParsedBatch) -> tuple[frozenset[str], frozenset[str]]:
    """The batch's declared reads and writes, lower case."""
    reads = {a.lower() for tx in batch.transactions for a in tx.header.inputs}
    writes = {a.lower() for tx in batch.transactions for a in tx.header.outputs}
    return frozenset(reads), frozenset(writes)


def _conflict(
    pending: tuple[frozenset[str], frozenset[str]], new: tuple[frozenset[str], frozenset[str]]
) -> str | None:
    """The entry of ``pending`` that conflicts with ``new``, if any."""

    def overlaps(a: str, b: str) -> bool:
        return a.startswith(b) or b.startswith(a)

    (pending_reads, pending_writes), (new_reads, new_writes) = pending, new
    for entry in pending_writes:
        if any(overlaps(entry, x) for x in new_reads | new_writes):
            return entry
    for entry in pending_reads:
        if any(overlaps(entry, x) for x in new_writes):
            return entry
    return None


@dataclass
class BatchRecord:
    batch_id: str
    batch: ParsedBatch
    names: tuple[str, ...]
    status: str = UNKNOWN
    posts: int = 0
    first_post_ms: float | None = None
    accepted_ms: float | None = None
    final_ms: float | None = None
    failure: TxFailure | None = None
    forget: bool = False
    #: How many times it was accepted (a forgotten batch may be accepted again).
    acceptances: int = 0
    #: The transactions its transactions depend on, each once, in order.
    dependencies: tuple[str, ...] = ()
    #: When it was first held for its dependencies (ms, as ``first_post_ms``).
    held_ms: float | None = None
    #: While held: the dependencies not seen yet; when it is dropped (monotonic
    #: seconds); how many times its hold began or was restarted.
    missing: tuple[str, ...] = ()
    hold_until: float = 0.0
    holds: int = 0
    #: A status read answered UNKNOWN about it while held, since its last POST
    #: (and no read answered otherwise since): one POST of it is excused.
    told_unknown: bool = False
    #: The dependency judged INVALID that keeps it from ever committing.
    stuck_on: str | None = None
    #: Its place in the ledger's commit order (0 first).
    commit_seq: int | None = None

    def report(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "names": list(self.names),
            "posts": self.posts,
            "first_post_ms": self.first_post_ms,
            "held_ms": self.held_ms,
            "accepted_ms": self.accepted_ms,
            "final_ms": self.final_ms,
            "commit_seq": self.commit_seq,
            "stuck_on": self.stuck_on,
        }


def _dependencies(batch: ParsedBatch) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for tx in batch.transactions:
        out.update(dict.fromkeys(tx.header.dependencies))
    return tuple(out)


@dataclass
class FaultLedger:
    plan: FaultPlan = field(default_factory=FaultPlan)
    seed: int = 0
    #: Verify signatures as a validator does (a benchmark may skip it to spare CPU).
    verify: bool = True
    host: str = "127.0.0.1"
    port: int = 0
    #: Record batches accepted while a conflicting one is pending (:class:`Overlap`).
    judge_overlaps: bool = False
    #: Every fault the plan makes possible happens at least once, at its first
    #: chance, before the random rolls decide: a test can count on each.
    each_fault_once: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.batches: dict[str, BatchRecord] = {}
        self.state = IntkeyState()
        self.violations: list[Violation] = []
        #: Per batch id, when a status read first answered about it (ms, as
        #: ``now_ms``): a batch taken but never posted must be asked about
        #: before it is posted (its first POST comes after this).
        self.first_answer_ms: dict[str, float] = {}
        self.overlaps: list[Overlap] = []
        #: The most batches pending at once.
        self.peak_pending = 0
        # Pending batch id -> its declared (reads, writes), while judging overlaps.
        self._pending_access: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        self.counts: Counter[str] = Counter()
        self.url = ""
        self._t0 = time.monotonic()
        # Heap of (due, order pushed, batch id, what is due, its turn): what is
        # due is a commit (turn: the batch's acceptance number) or the end of a
        # hold (turn: its hold number); an entry whose turn has passed is skipped.
        self._queue: list[tuple[float, int, str, str, int]] = []
        self._pushed = 0
        self._queued = asyncio.Event()
        self._finals: dict[str, asyncio.Event] = {}
        self._pending = 0
        self._final = 0
        self._held = 0
        self._stuck = 0
        self._committed_total = 0
        self.dependencies = DependencyBook(lambda b: self._state_of(b))
        self._malformed_turn = 0
        self._forget_forced = False
        # Requests still to answer 404 / status reads still to answer malformed
        # (fault_next), whatever the plan says.
        self._next_not_found = 0
        self._next_malformed = 0
        self._runner: web.AppRunner | None = None
        self._committer: asyncio.Task[None] | None = None

    # -- life ---------------------------------------------------------------

    async def start(self) -> str:
        self._t0 = time.monotonic()
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{self.port}"
        self._committer = asyncio.create_task(self._commit_loop())
        return self.url

    async def close(self) -> None:
        if self._committer is not None:
            self._committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._committer
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FaultLedger:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._not_found])
        app.router.add_post("/batches", self._post_batches)
        app.router.add_get("/batch_statuses", self._get_statuses)
        app.router.add_post("/batch_statuses", self._post_statuses)
        app.router.add_get("/transactions/{transaction_id}", self._get_transaction)
        app.router.add_get("/_fault/report", self._report)
        app.router.add_get("/_fault/progress", self._progress)
        app.router.add_put("/_fault/plan", self._put_plan)
        app.router.add_post("/_fault/forget", self._forget)
        return app

    # -- what the ledger knows ----------------------------------------------

    def now_ms(self) -> float:
        return (time.monotonic() - self._t0) * 1000

    def status_of(self, batch_id: str) -> str:
        """What a status read answers about ``batch_id``."""
        state = self._state_of(batch_id)
        if state == HELD:
            return self.plan.held_status
        return PENDING if state == STUCK else state

    def _state_of(self, batch_id: str) -> str:
        record = self.batches.get(batch_id)
        return UNKNOWN if record is None else record.status

    def fault_next(self, *, not_found: int = 0, malformed_statuses: int = 0) -> None:
        """Answer the next ``not_found`` requests 404 and the next
        ``malformed_statuses`` status reads with malformed bodies, whatever
        the plan says: faults counted in requests, not in time."""
        self._next_not_found += not_found
        self._next_malformed += malformed_statuses

    def forget_pending(self) -> int:
        """Forget every pending, held and stuck batch at once (a validator
        restarted); returns how many."""
        forgotten = [r for r in self.batches.values() if r.status in (PENDING, HELD, STUCK)]
        for record in forgotten:
            self._settle(record, UNKNOWN)
        self.counts["forgotten"] += len(forgotten)
        return len(forgotten)

    def report(self) -> dict[str, Any]:
        return {
            "violations": [dataclasses.asdict(v) for v in self.violations],
            "overlaps": [dataclasses.asdict(o) for o in self.overlaps],
            "peak_pending": self.peak_pending,
            "counts": dict(self.counts),
            "batches": {bid: r.report() for bid, r in self.batches.items()},
            "order": {name: list(ids) for name, ids in self.state.order.items()},
            "values": dict(self.state.values),
            "plan": dataclasses.asdict(self.plan),
            "now_ms": self.now_ms(),
            # Times above are ms after this moment of time.monotonic() (the
            # system-wide monotonic clock: comparable across processes).
            "t0_monotonic": self._t0,
        }

    def progress(self) -> dict[str, int]:
        """How many batches it has, how many are final, pending, held and stuck
        (cheap: no per-batch data)."""
        return {
            "batches": len(self.batches),
            "final": self._final,
            "pending": self._pending,
            "held": self._held,
            "stuck": self._stuck,
        }

    # -- committing ---------------------------------------------------------

    def _admit(self, record: BatchRecord, now: float) -> None:
        """A POST of a batch the ledger does not know: accept it, or hold it
        until the transactions it depends on are seen."""
        missing = self.dependencies.missing(record.dependencies)
        if missing:
            self._hold(record, missing, now)
            return
        self._accept(record, now)
        self._release(record, now)

    def _accept(self, record: BatchRecord, now: float) -> None:
        record.status = PENDING
        record.accepted_ms = now
        record.forget = self.rng.random() < self.plan.forget
        if self.each_fault_once and self.plan.forget > 0 and not self._forget_forced:
            record.forget = self._forget_forced = True
        record.acceptances += 1
        self._pending += 1
        self.peak_pending = max(self.peak_pending, self._pending)
        if self.judge_overlaps:
            access = _access(record.batch)
            for other, pending in self._pending_access.items():
                entry = _conflict(pending, access)
                if entry is not None:
                    self.overlaps.append(Overlap(record.batch_id, other, entry, now))
            self._pending_access[record.batch_id] = access
        self._push(self.plan.commit_delay_ms / 1000, record.batch_id, "commit", record.acceptances)

    def _push(self, delay_s: float, batch_id: str, what: str, turn: int) -> None:
        self._pushed += 1
        heapq.heappush(
            self._queue, (time.monotonic() + delay_s, self._pushed, batch_id, what, turn)
        )
        self._queued.set()

    def _hold(self, record: BatchRecord, missing: tuple[str, ...], now: float) -> None:
        record.status = HELD
        record.missing = missing
        if record.held_ms is None:
            record.held_ms = now
        self._held += 1
        self.counts["held"] += 1
        self.dependencies.hold(record.batch_id, missing)
        self._restart_hold(record)

    def _restart_hold(self, record: BatchRecord) -> None:
        record.holds += 1
        record.told_unknown = False
        self._push(self.plan.dependency_hold_s, record.batch_id, "drop", record.holds)

    def _release(self, accepted: BatchRecord, now: float) -> None:
        """Accept the held batches that ``accepted`` makes complete, and the ones
        those make complete in turn."""
        todo = [accepted]
        while todo:
            carrier = todo.pop(0)
            for batch_id in self.dependencies.held_on(carrier.batch.transaction_ids):
                record = self.batches[batch_id]
                if record.status != HELD:
                    continue
                missing = self.dependencies.missing(record.dependencies)
                self.dependencies.unhold(batch_id, record.missing)
                record.missing = missing
                if missing:
                    self.dependencies.hold(batch_id, missing)
                    continue
                self._held -= 1
                self.counts["released_from_hold"] += 1
                self._accept(record, now)
                todo.append(record)

    async def _commit_loop(self) -> None:
        while True:
            if not self._queue:
                self._queued.clear()
                await self._queued.wait()
                continue
            due, _, batch_id, what, turn = self._queue[0]
            delay = due - time.monotonic()
            if delay > 0:
                # An entry due sooner (the delay was shortened) wakes us.
                self._queued.clear()
                # asyncio.timeout, not wait_for: on Python 3.11 a wait_for whose
                # event is set as the task is cancelled can leave close() waiting.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._queued.wait()
                continue
            heapq.heappop(self._queue)
            record = self.batches[batch_id]
            if what == "drop":
                if record.status == HELD and record.holds == turn:
                    self.counts["dropped_after_hold"] += 1
                    self._settle(record, UNKNOWN)
                continue
            if record.status != PENDING or record.acceptances != turn:
                continue  # forgotten (and perhaps accepted again since)
            if record.forget:
                self.counts["forgotten"] += 1
                self._settle(record, UNKNOWN)
                continue
            blocker = self.dependencies.blocker(record.dependencies)
            if blocker is None:
                record.failure = self.state.apply(record.batch)
                self._settle(record, INVALID if record.failure else COMMITTED)
            elif blocker[0] == "invalid":
                self._stick(record, blocker[1])
            else:
                self.dependencies.park(batch_id, blocker[1])

    def _stick(self, record: BatchRecord, dependency: str) -> None:
        """Never to be committed nor judged: read PENDING for ever."""
        self._pending -= 1
        self._pending_access.pop(record.batch_id, None)
        record.status = STUCK
        record.stuck_on = dependency
        self._stuck += 1
        self.counts["stuck_on_invalid_dependency"] += 1

    def _settle(self, record: BatchRecord, status: str) -> None:
        if record.status == PENDING:
            self._pending -= 1
            self._pending_access.pop(record.batch_id, None)
        elif record.status == HELD:
            self._held -= 1
            self.dependencies.unhold(record.batch_id, record.missing)
        elif record.status == STUCK:
            self._stuck -= 1
        record.status = status
        if status != UNKNOWN:
            record.final_ms = self.now_ms()
            self._final += 1
        if status == COMMITTED:
            record.commit_seq = self._committed_total
            self._committed_total += 1
            self.dependencies.committed(record.batch.transaction_ids)
        # Batches parked on these transactions check their dependencies again
        # (committed: perhaps free; judged: stuck; forgotten: parked again).
        for batch_id in self.dependencies.parked_on(record.batch.transaction_ids):
            parked = self.batches[batch_id]
            if parked.status == PENDING:
                self._push(0.0, batch_id, "commit", parked.acceptances)
        event = self._finals.pop(record.batch_id, None)
        if event is not None:
            event.set()

    # -- HTTP ---------------------------------------------------------------

    @web.middleware
    async def _not_found(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith("/_fault/"):
            return await handler(request)
        if self._next_not_found > 0 or self.plan.not_found:
            self._next_not_found = max(0, self._next_not_found - 1)
            self.counts["not_found"] += 1
            return web.Response(status=404, text="404: Not Found")
        return await handler(request)

    async def _post_batches(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/octet-stream":
            return _error(400, 42, "Wrong Content Type", "send application/octet-stream")
        body = await request.read()
        try:
            parsed = decode_batch_list(body, verify=self.verify)
        except InvalidBatchError as exc:
            code = {"empty_batch_list": 34, "malformed_protobuf": 35}.get(exc.rule, 30)
            return _error(400, code, "Submitted Batches Invalid", str(exc))
        now = self.now_ms()
        records = [self._record(b, now) for b in parsed]
        plan, roll = self.plan, self.rng.random()
        forced = self._first_due(("busy_503", "busy_429"))
        if forced is not None:
            roll = 0.0 if forced == "busy_503" else plan.busy_503
        if roll < plan.busy_503:
            self.counts["busy_503"] += 1
            return _error(503, 15, "Validator Not Ready", "try again later")
        if roll < plan.busy_503 + plan.busy_429 or (
            plan.max_pending and self._pending + len(records) > plan.max_pending
        ):
            self.counts["busy_429"] += 1
            return _error(429, 31, "Unable to Accept Batches", "the queue is full")
        for record in records:
            excused, record.told_unknown = record.told_unknown, False
            if record.status == UNKNOWN:
                self._admit(record, now)
                continue
            if not excused:
                self.violations.append(Violation(record.batch_id, record.status, now))
            if record.status == HELD:
                self._restart_hold(record)  # as the validator's cache is refreshed
        roll = self.rng.random()
        forced = self._first_due(("drop_after_accept", "error_500_after_accept"))
        if forced is not None:
            roll = 0.0 if forced == "drop_after_accept" else plan.drop_after_accept
        if roll < plan.drop_after_accept:
            self.counts["dropped_after_accept"] += 1
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)
        if roll < plan.drop_after_accept + plan.error_500_after_accept:
            self.counts["error_500_after_accept"] += 1
            return _error(500, 10, "Unknown Validator Error", "an internal error occurred")
        self.counts["accepted_posts"] += 1
        ids = ",".join(r.batch_id for r in records)
        return web.json_response({"link": f"{self.url}/batch_statuses?id={ids}"}, status=202)

    def _first_due(self, faults: tuple[str, ...]) -> str | None:
        """With ``each_fault_once``: the first of ``faults`` the plan makes
        possible that has not happened yet."""
        if not self.each_fault_once:
            return None
        counter = {"drop_after_accept": "dropped_after_accept"}
        return next(
            (f for f in faults if getattr(self.plan, f) > 0 and not self.counts[counter.get(f, f)]),
            None,
        )

    def _record(self, batch: ParsedBatch, now: float) -> BatchRecord:
        record = self.batches.get(batch.header_signature)
        if record is None:
            record = BatchRecord(
                batch.header_signature, batch, names_of(batch), dependencies=_dependencies(batch)
            )
            self.batches[record.batch_id] = record
            self.dependencies.carried(record.batch_id, batch.transaction_ids)
        record.posts += 1
        if record.first_post_ms is None:
            record.first_post_ms = now
        return record

    async def _get_statuses(self, request: web.Request) -> web.StreamResponse:
        ids = [i for i in request.query.get("id", "").split(",") if i]
        if not ids:
            return _error(400, 66, "Id Query Invalid or Missing", "give ?id=a,b")
        return await self._statuses(request, ids)

    async def _post_statuses(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            return _error(400, 43, "Wrong Content Type", "send application/json")
        try:
            ids = json.loads(await request.read())
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            return _error(400, 46, "Bad Status Request", "send a JSON array of batch ids")
        return await self._statuses(request, ids)

    async def _statuses(self, request: web.Request, ids: list[str]) -> web.StreamResponse:
        self.counts["status_reads"] += 1
        if self.rng.random() < self.plan.status_503 or self._first_due(("status_503",)):
            self.counts["status_503"] += 1
            return _error(503, 17, "Validator Timed Out", "the validator did not answer")
        wait = _wait_s(request.query.get("wait"))
        if wait > 0:
            await self._wait_final(ids, wait)
        if self._next_malformed > 0 or self.plan.malformed_statuses:
            self._next_malformed = max(0, self._next_malformed - 1)
            return self._malformed(ids)
        now = self.now_ms()
        for i in ids:
            self.first_answer_ms.setdefault(i, now)
            record = self.batches.get(i)
            if record is not None and record.status == HELD and self.status_of(i) == UNKNOWN:
                record.told_unknown = True
            elif record is not None and self.status_of(i) != UNKNOWN:
                record.told_unknown = False  # the client now knows the ledger has it
        data = [self._entry(i) for i in ids]
        return web.json_response({"data": data, "link": str(request.url)})

    async def _wait_final(self, ids: Sequence[str], wait_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            pending = [i for i in ids if self.status_of(i) == PENDING]
            remaining = deadline - loop.time()
            if not pending or remaining <= 0:
                return
            event = self._finals.setdefault(pending[0], asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def _get_transaction(self, request: web.Request) -> web.StreamResponse:
        txn_id = request.match_info["transaction_id"]
        if not _RESOURCE_ID.fullmatch(txn_id):
            return _error(400, 60, "Invalid Resource Id", f"not a transaction id: {txn_id!r}")
        self.counts["transaction_reads"] += 1
        if self.dependencies.is_committed(txn_id):
            for batch_id in self.dependencies.carriers(txn_id):
                record = self.batches[batch_id]
                if record.status != COMMITTED:
                    continue
                tx = next(t for t in record.batch.transactions if t.header_signature == txn_id)
                data = {
                    "header": dataclasses.asdict(tx.header),
                    "header_signature": txn_id,
                    "payload": base64.b64encode(tx.payload).decode(),
                }
                return web.json_response({"data": data, "link": str(request.url)})
        return _error(
            404,
            72,
            "Transaction Not Found",
            "There is no transaction with the id specified in the blockchain.",
        )

    def _entry(self, batch_id: str) -> dict[str, Any]:
        record = self.batches.get(batch_id)
        invalid = []
        if record is not None and record.status == INVALID and record.failure is not None:
            invalid = [
                {
                    "id": record.failure.transaction_id,
                    "message": record.failure.message,
                    "extended_data": "",
                }
            ]
        return {"id": batch_id, "status": self.status_of(batch_id), "invalid_transactions": invalid}

    def _malformed(self, ids: Sequence[str]) -> web.Response:
        kind = MALFORMED_KINDS[self._malformed_turn % len(MALFORMED_KINDS)]
        self._malformed_turn += 1
        self.counts[f"malformed_{kind}"] += 1
        first = ids[0]
        bodies: dict[str, Any] = {
            "invalid_transaction_not_object": {
                "data": [{"id": i, "status": INVALID, "invalid_transactions": ["bad"]} for i in ids]
            },
            "data_not_a_list": {"data": {"id": first, "status": COMMITTED}},
            "entry_without_status": {"data": [{"id": i} for i in ids]},
            "unknown_status": {"data": [{"id": i, "status": "MAYBE"} for i in ids]},
        }
        if kind == "truncated":
            return web.Response(text='{"data": [{"id": "', content_type="application/json")
        if kind == "nested_too_deep":
            return web.Response(text='{"data": ' + "[" * 100_000, content_type="application/json")
        if kind == "html":
            return web.Response(text="<html><body>gateway</body></html>", content_type="text/html")
        return web.json_response(bodies[kind])

    async def _report(self, request: web.Request) -> web.Response:
        return web.json_response(self.report())

    async def _progress(self, request: web.Request) -> web.Response:
        return web.json_response(self.progress())

    async def _put_plan(self, request: web.Request) -> web.Response:
        try:
            changes = json.loads(await request.read())
            if not isinstance(changes, dict):
                raise ValueError("send a JSON object of plan fields")
            self.plan = self.plan.updated(changes)
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(dataclasses.asdict(self.plan))

    async def _forget(self, request: web.Request) -> web.Response:
        return web.json_response({"forgotten": self.forget_pending()})


def _error(status: int, code: int, title: str, message: str) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "title": title, "message": message}}, status=status
    )


def _wait_s(raw: str | None) -> float:
    if raw is None:
        return 0.0
    if raw.strip().lower() in ("", "true"):
        return MAX_WAIT_S
    try:
        return max(0.0, min(float(raw), MAX_WAIT_S))
    except ValueError:
        return 0.0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ledgerq.testing.fault_ledger",
        description="A Sawtooth-shaped REST ledger without events that judges what it receives.",
    )
    parser.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT (default: a free port)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-verify", action="store_true", help="skip signature checks")
    parser.add_argument(
        "--judge-overlaps",
        action="store_true",
        help="record batches accepted while a conflicting one is pending",
    )
    for f in dataclasses.fields(FaultPlan):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true")
        elif f.name == "held_status":
            parser.add_argument(flag, choices=HELD_STATUSES, default=f.default)
        else:
            kind = int if f.type == "int" else float
            parser.add_argument(flag, type=kind, default=f.default)
    args = parser.parse_args(argv)
    host, _, port = args.bind.rpartition(":")
    plan = FaultPlan(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FaultPlan)})

    async def serve() -> None:
        ledger = FaultLedger(
            plan,
            seed=args.seed,
            verify=not args.no_verify,
            host=host,
            judge_overlaps=args.judge_overlaps,
        )
        ledger.port = int(port)
        url = await ledger.start()
        print(f"fault ledger listening on {url}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await ledger.close()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
