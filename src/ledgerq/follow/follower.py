"""The follower: every batch the ledger has, or may have, followed on its own until final.

There are no rounds. Each batch is followed from the moment it may be at the
ledger, and its answer is handed to the :class:`StatusSink` (the producer,
which records it) the moment it comes, whatever happens to any other batch.
The follower reads the ledger and writes nothing itself:

* **Parked long-polls.** A batch the ledger accepted (:meth:`Follower.accepted`,
  called before its ``Pending`` write lands) gets a status read
  with ``wait`` in flight at once:
  ``batch_statuses(service, [id], wait_s)``, one id per request, because a
  Sawtooth ``wait`` answers only when *every* id of the request is final —
  grouping would make one batch's commit wait for another's. ``COMMITTED`` /
  ``INVALID`` are recorded (the service's next batch goes out at once);
  ``UNKNOWN`` is recorded (the ledger lost it: the queue resends it);
  ``PENDING`` parks the read again. At most ``max_parked`` reads are parked
  at once; beyond it batches queue for a slot in order, and a read that comes
  back ``PENDING`` queues again behind them, so every batch is read in turn.
* **Asks.** A batch that is ``submitted`` but not known pending — recorded
  ambiguous (:meth:`Follower.ask`), left by a submitter that died,
  adopted with a service from another instance — is asked without ``wait``:
  asks are grouped per service (``max_ids`` per request; no batch waits for
  another there). ``PENDING`` records it pending and parks a read for it;
  final and ``UNKNOWN`` are recorded. Only that ``UNKNOWN`` ever frees a
  batch for resending.
* **Splinter's ``Valid``** (validated, not committed) is not final: recorded
  ``Pending`` and followed until ``Committed`` or ``Invalid``. A non-final
  answer that comes back long before its ``wait`` ran out (a ledger that
  ignores ``wait``) is read again after a delay doubling from
  ``min_poll_interval_s``, never in a tight loop.
* **Failures.** A read that fails (transport, an HTTP error, a malformed
  body: :class:`~ledgerq.errors.LedgerError`) or a write the store refuses
  changes nothing; that batch is read again after a jittered exponential
  backoff (``backoff_initial_ms`` … ``backoff_max_ms``). Problems are
  reported to the :class:`~ledgerq.ledgers.health.LedgerHealth` (logged once
  per burst, shown per service).
* **Scans.** At start-up and every ``poll_interval_s`` as a safety net, the
  store's in-flight batches are read; on :meth:`Follower.scan_now` (services
  adopted from another instance), those services' only (what this process
  took it follows already, so the claims it gains need no read of every
  other service): a ``Pending`` batch not followed gets a parked
  read, any other ``submitted`` one an ask — unless a submission of this
  process is posting it (``posting``): its outcome follows it, or its
  answer is being recorded here (a final or ``Unknown`` status queued or
  being written, or written while the scan read): the store shows it as it
  was until that write lands, and reading it again would only write the
  same answer again.
* **Accelerators.** Where the ledger has an event stream (the ledgerq node),
  a final-status event of a followed batch is applied at once (its parked
  read then comes back and is ignored); an event that arrives before its
  batch is recorded accepted is kept for ``early_grace_s`` and applied when
  it is. Where it announces blocks (a validator's ``/subscriptions``), each
  announcement asks, grouped, about the followed batches not parked right
  now (waiting for a slot or backing off), at most once per
  ``min_poll_interval_s``. Neither is needed for correctness or speed.

An answer for a batch that a submission of this process holds again (it was
resent meanwhile) is dropped: that submission's outcome follows it. So is an
answer to a read made before such a submission took the batch, even if it
comes back after that submission ended (:meth:`Follower.resending`): an
``UNKNOWN`` from before a resend says nothing of the resent batch, and
recording it would free the batch for a second, unasked resend.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledgerq.backoff import Backoff, Jitter, equal_jitter
from ledgerq.errors import ConfigError, LedgerError, LedgerqError, StoreOutageError
from ledgerq.ledgers.base import CommitEvent, LedgerBatchStatus, LedgerClient
from ledgerq.ledgers.health import LedgerHealth
from ledgerq.model import BatchStatus, BatchStatusName, Pending, TrackingBatch

log = logging.getLogger(__name__)


class StatusSink(Protocol):
    """Where the ledger's answers go (the producer, which records them)."""

    async def ledger_status(self, service_id: str, status: LedgerBatchStatus) -> None:
        """Record what the ledger said of one batch; raises
        :class:`~ledgerq.errors.LedgerqError` if it was not recorded."""
        ...


class InFlightSource(Protocol):
    """The store role the follower needs (see :mod:`ledgerq.follow.in_flight`)."""

    async def monitored_batches(
        self, *, limit: int, services: Collection[str] | None = None
    ) -> Sequence[TrackingBatch]:
        """``Pending`` and ``submitted`` non-final batches of this instance's
        services (with ``services``, of those only)."""
        ...


@dataclass(frozen=True)
class FollowSettings:
    """The follower's settings: the ``monitor.*`` keys, with their defaults
    (:mod:`ledgerq.config` checks each value), and tuning that is no key."""

    #: Safety-net scan of the store's in-flight batches (s).
    poll_interval_s: float = 1.0
    #: Fewest seconds between two trigger-driven asks.
    min_poll_interval_s: float = 0.05
    #: ``wait`` of a parked status read (s).
    wait_s: float = 5.0
    #: Status reads parked at once (each one connection).
    max_parked: int = 1024
    #: Ids per grouped ask.
    max_ids: int = 100
    #: Grouped asks in flight at once. An instance taking over a dead one's
    #: services asks about every batch that one left mid-submission (up to
    #: its submission slots), one ask per service, all within the failover
    #: target: a few asks at once would queue them one behind another.
    connections: int = 64
    #: Batches read from the store per scan.
    batch_limit: int = 10_000
    backoff_initial_ms: int = 50
    backoff_max_ms: int = 5_000
    #: Events that arrived before their batch was recorded accepted, kept at most.
    early_events: int = 10_000
    #: How long such an event is kept (s).
    early_grace_s: float = 2.0

    def __post_init__(self) -> None:
        # The fields that are keys are checked one by one where keys are read.
        for key in ("min_poll_interval_s", "early_grace_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must not be negative")
        for key in ("max_ids", "connections", "batch_limit", "early_events"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1")
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise ConfigError(
                f"monitor.backoff_max_ms ({self.backoff_max_ms}) must not be below "
                f"monitor.backoff_initial_ms ({self.backoff_initial_ms})"
            )


#: Answers that keep a batch followed: Splinter's Valid is not final either.
_NOT_FINAL = frozenset({BatchStatusName.PENDING, BatchStatusName.VALID})


class Mode(enum.Enum):
    #: The ledger may have it: ask for an answer now.
    ASK = "ask"
    #: The ledger has it pending: a parked read until it is final.
    PARK = "park"


@dataclass(slots=True, eq=False)
class _Entry:
    batch_id: str
    service_id: str
    mode: Mode
    failures: int = 0
    #: Loop time before which it is not read again (backoff).
    due: float = 0.0
    parked: bool = False
    task: asyncio.Task[None] | None = None


#: A batch the follower follows (what :meth:`Follower.adopt` returns).
Followed = _Entry


class Follower:
    def __init__(
        self,
        source: InFlightSource,
        ledger: LedgerClient,
        sink: StatusSink,
        settings: FollowSettings | None = None,
        *,
        posting: Collection[str] = (),
        health: LedgerHealth | None = None,
        jitter: Jitter = equal_jitter,
    ) -> None:
        """``posting``: batch ids a submission of this process is working on (a live view)."""
        self._source = source
        self._ledger = ledger
        self._sink = sink
        self.settings = s = settings or FollowSettings()
        self._posting = posting
        self.health = health or LedgerHealth(ledger.description)
        self._backoff = Backoff(s.backoff_initial_ms / 1000, s.backoff_max_ms / 1000, jitter)
        self.followed: dict[str, _Entry] = {}
        self._asks: dict[str, _Entry] = {}
        self._ask_event = asyncio.Event()
        self._scan_event = asyncio.Event()
        #: What the next scan asked for reads: these services, or every one.
        self._scan_services: set[str] = set()
        self._scan_all = False
        self._stopping = asyncio.Event()
        self._slots = asyncio.Semaphore(s.max_parked)
        self._ask_limit = asyncio.Semaphore(s.connections)
        self._early: OrderedDict[str, CommitEvent] = OrderedDict()
        self._tasks: asyncio.TaskGroup | None = None
        # Every parked-read task, followed or not (a dropped batch's read may
        # still be out): all are cancelled at stop.
        self._park_tasks: set[asyncio.Task[None]] = set()
        #: Batches whose final (or ``Unknown``) answer is being recorded.
        self._recording: set[str] = set()
        #: Per scan under way, the batches whose answer landed while it read.
        self._landed_during: list[set[str]] = []
        self._last_trigger = 0.0
        self.parked = 0
        self.scans = 0
        self.asked = 0
        self.applied_from_events = 0
        self.triggers_received = 0

    # -- what is followed ----------------------------------------------------

    @property
    def waiting_for_slot(self) -> int:
        return sum(1 for e in self.followed.values() if e.mode is Mode.PARK and not e.parked)

    def follow(self, batch_id: str, service_id: str, mode: Mode) -> None:
        """Follow a batch (idempotent: an ask already under way is kept)."""
        entry = self.followed.get(batch_id)
        if entry is not None:
            if mode is Mode.PARK and entry.mode is Mode.ASK:
                self._to_park(entry)  # recorded accepted meanwhile: it is pending
            return
        entry = _Entry(batch_id, service_id, mode)
        self.followed[batch_id] = entry
        self._start(entry)

    def drop_services(self, service_ids: Iterable[str]) -> None:
        """Stop following these services' batches (their claims moved on)."""
        gone = frozenset(service_ids)
        for entry in [e for e in self.followed.values() if e.service_id in gone]:
            self._drop(entry)
            if entry.task is not None:
                entry.task.cancel()

    def resending(self, batch_id: str) -> None:
        """A submission of this process takes ``batch_id``: reads of it already
        under way answer for the batch as it was before, so they are dropped
        (their answers are ignored); the submission's outcome follows it."""
        entry = self.followed.get(batch_id)
        if entry is None:
            return
        self._drop(entry)
        if entry.task is not None:
            entry.task.cancel()

    def adopt(self, batches: Iterable[tuple[str, str]]) -> list[_Entry]:
        """Follow ``(batch_id, service_id)`` pairs whose ledger answers are
        read elsewhere (a take-over asks while it claims): not asked here
        unless :meth:`answered` finds no answer. Returns the entries new here."""
        entries = []
        for batch_id, service_id in batches:
            if batch_id in self.followed or batch_id in self._posting:
                continue
            entry = self.followed[batch_id] = _Entry(batch_id, service_id, Mode.ASK)
            entries.append(entry)
        return entries

    async def answered(self, entries: Sequence[_Entry], answers: Mapping[str, BatchStatus]) -> None:
        """Apply the answers read for :meth:`adopt`'s entries, all at once (the
        writes go out together: one group commit); an entry without an answer
        is asked as any other."""
        self.asked += len(entries)
        applies = []
        for entry in entries:
            answer = answers.get(entry.batch_id)
            if answer is not None:
                applies.append(self._apply(entry, answer))
            elif self._is_followed(entry):
                self._start(entry)
        await asyncio.gather(*applies)

    def settled(self, entries: Sequence[_Entry], recorded: Mapping[str, BatchStatus]) -> None:
        """:meth:`adopt`'s entries whose answers were recorded elsewhere (a
        take-over records them where its claims moved): a pending one gets a
        parked read, a final or ``Unknown`` one is no longer followed, one
        without a recorded answer is asked as any other."""
        self.asked += len(entries)
        for entry in entries:
            if not self._is_followed(entry):
                continue
            status = recorded.get(entry.batch_id)
            if status is None:
                self._start(entry)
            elif status.name in _NOT_FINAL:
                self._to_park(entry)
            else:
                self._drop(entry)

    def scan_now(self, services: Iterable[str] | None = None) -> None:
        """Read the store's in-flight batches now: of ``services`` (adopted,
        say), or of every service."""
        if services is None:
            self._scan_all = True
        else:
            self._scan_services.update(services)
        self._scan_event.set()

    def trigger(self) -> None:
        """The ledger may have news (a block committed): ask what is not parked."""
        self.triggers_received += 1
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_trigger < self.settings.min_poll_interval_s:
            return
        self._last_trigger = loop.time()
        for entry in self.followed.values():
            if entry.mode is Mode.PARK and not entry.parked and entry.batch_id not in self._asks:
                self._asks[entry.batch_id] = entry
        self._ask_event.set()

    def stop(self) -> None:
        self._stopping.set()
        self._scan_event.set()

    def accepted(self, batch_id: str, service_id: str) -> None:
        """The ledger accepted the batch (its ``Pending`` write is under way):
        a parked read for it now, or an event that came first applied."""
        early = self._early.pop(batch_id, None)
        if early is not None and self._tasks is not None:
            self._tasks.create_task(self._apply_event(batch_id, service_id, early))
            return
        self.follow(batch_id, service_id, Mode.PARK)

    def ask(self, batch_id: str, service_id: str) -> None:
        """The batch may be at the ledger (recorded ambiguous): ask at once."""
        self.follow(batch_id, service_id, Mode.ASK)

    def _start(self, entry: _Entry) -> None:
        if entry.mode is Mode.ASK:
            self._asks[entry.batch_id] = entry
            self._ask_event.set()
        elif self._tasks is not None and entry.task is None:
            task = entry.task = self._tasks.create_task(self._park(entry))
            self._park_tasks.add(task)
            task.add_done_callback(self._park_tasks.discard)

    def _to_park(self, entry: _Entry) -> None:
        entry.mode = Mode.PARK
        entry.failures = 0
        entry.due = 0.0
        self._asks.pop(entry.batch_id, None)
        self._start(entry)

    def _drop(self, entry: _Entry) -> None:
        if self.followed.get(entry.batch_id) is entry:
            del self.followed[entry.batch_id]
        if self._asks.get(entry.batch_id) is entry:
            del self._asks[entry.batch_id]

    def _is_followed(self, entry: _Entry) -> bool:
        return self.followed.get(entry.batch_id) is entry

    # -- running -------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            for entry in list(self.followed.values()):
                self._start(entry)
            helpers = [tasks.create_task(self._ask_loop())]
            events = self._ledger.events()
            if events is not None:
                helpers.append(tasks.create_task(self._follow_events(events)))
            triggers = self._ledger.triggers()
            if triggers is not None:
                helpers.append(tasks.create_task(self._follow_triggers(triggers)))
            try:
                await self._scan_loop()
            finally:
                self._tasks = None
                for task in [*helpers, *self._park_tasks]:
                    task.cancel()

    async def _scan_loop(self) -> None:
        loop = asyncio.get_running_loop()
        full = True  # the first scan reads every service
        full_due = 0.0
        while not self._stopping.is_set():
            self._scan_event.clear()
            if full:
                full_due = loop.time() + self.settings.poll_interval_s
            services = None if full else frozenset(self._scan_services)
            self._scan_services.clear()
            self._scan_all = False
            failed = False
            try:
                await self.scan(services)
            except LedgerqError as exc:
                # A store outage is logged once, by the store.
                (log.debug if isinstance(exc, StoreOutageError) else log.warning)(
                    "cannot read the batches in flight: %s; retrying", exc
                )
                failed = True
            # The safety net's full scan is due every poll interval, however
            # many scans of a few services come in between.
            try:
                await asyncio.wait_for(self._scan_event.wait(), max(0.0, full_due - loop.time()))
            except TimeoutError:
                full = True
            else:
                full = failed or self._scan_all or not self._scan_services

    async def scan(self, services: Collection[str] | None = None) -> int:
        """Follow every in-flight batch of the store (of ``services``) nobody
        here follows; returns how many."""
        self.scans += 1
        landed: set[str] = set()
        self._landed_during.append(landed)
        try:
            limit = self.settings.batch_limit
            if services is None:
                batches = await self._source.monitored_batches(limit=limit)
            else:
                batches = await self._source.monitored_batches(limit=limit, services=services)
        finally:
            self._landed_during.remove(landed)
        found = 0
        for b in batches:
            if b.is_final or b.batch_id in self.followed or b.batch_id in self._posting:
                continue
            if b.batch_id in self._recording or b.batch_id in landed:
                continue  # its answer is (being) recorded: the read is older
            pending = b.status_name is BatchStatusName.PENDING
            if not (pending or b.submitted):
                continue
            self.follow(b.batch_id, b.service_id, Mode.PARK if pending else Mode.ASK)
            found += 1
        return found

    # -- parked reads ----------------------------------------------------------

    async def _park(self, entry: _Entry) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._is_followed(entry) and entry.mode is Mode.PARK:
                wait = entry.due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                async with self._slots:
                    if not self._is_followed(entry):
                        return
                    entry.parked = True
                    self.parked += 1
                    started = loop.time()
                    try:
                        answers = await self._read_many([entry], self.settings.wait_s)
                    finally:
                        entry.parked = False
                        self.parked -= 1
                answer = answers.get(entry.batch_id)
                if answer is None:
                    continue  # failed: backed off in _read_many
                if answer.name not in _NOT_FINAL:
                    entry.failures = 0
                elif loop.time() - started < self.settings.wait_s / 2:
                    # Not final, and back long before its wait ran out: a ledger
                    # that ignores wait (or answers Valid at once). Do not spin.
                    self._early_answer(entry)
                else:
                    entry.failures = 0
                await self._apply(entry, answer)
        finally:
            entry.task = None

    async def _read_many(self, entries: Sequence[_Entry], wait_s: float) -> dict[str, BatchStatus]:
        """The ledger's answers by batch id; entries it failed for are backed off."""
        service_id = entries[0].service_id
        ids = [e.batch_id for e in entries]
        try:
            statuses = await self._ledger.batch_statuses(service_id, ids, wait_s=wait_s)
        except LedgerError as exc:
            for e in entries:
                self._failed(e, _cause(exc), str(exc))
            return {}
        self.health.ok("status", service_id)
        answers = {s.batch_id: s.status for s in statuses}
        for e in entries:
            if e.batch_id not in answers:
                self._failed(e, "no answer", f"the ledger left batch {e.batch_id[:16]} out")
        return answers

    def _failed(self, entry: _Entry, cause: str, message: str) -> None:
        self._back_off(entry)
        self.health.problem("status", entry.service_id, cause, message)

    def _early_answer(self, entry: _Entry) -> None:
        entry.failures += 1
        delay = self.settings.min_poll_interval_s * 2 ** min(entry.failures - 1, 20)
        wait = min(self.settings.backoff_max_ms / 1000, delay)
        entry.due = asyncio.get_running_loop().time() + self._backoff.jitter(wait)

    def _back_off(self, entry: _Entry) -> None:
        entry.failures += 1
        entry.due = asyncio.get_running_loop().time() + self._backoff.delay(entry.failures)

    # -- asks -------------------------------------------------------------------

    async def _ask_loop(self) -> None:
        assert self._tasks is not None
        loop = asyncio.get_running_loop()
        while True:
            self._ask_event.clear()
            now = loop.time()
            due = [e for e in self._asks.values() if e.due <= now]
            if not due:
                later = [e.due for e in self._asks.values()]
                timeout = None if not later else max(0.0, min(later) - now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ask_event.wait(), timeout)
                continue
            groups: dict[str, list[_Entry]] = defaultdict(list)
            for entry in due:
                del self._asks[entry.batch_id]
                groups[entry.service_id].append(entry)
            step = self.settings.max_ids
            for entries in groups.values():
                for i in range(0, len(entries), step):
                    self._tasks.create_task(self._ask(entries[i : i + step]))

    async def _ask(self, entries: list[_Entry]) -> None:
        async with self._ask_limit:
            live = [e for e in entries if self._is_followed(e)]
            if not live:
                return
            self.asked += len(live)
            answers = await self._read_many(live, 0.0)
        for entry in live:
            answer = answers.get(entry.batch_id)
            if answer is not None:
                await self._apply(entry, answer)
            elif entry.mode is Mode.ASK and self._is_followed(entry):
                self._asks[entry.batch_id] = entry  # failed: asked again after its backoff
                self._ask_event.set()

    # -- answers ------------------------------------------------------------------

    async def _apply(self, entry: _Entry, status: BatchStatus) -> None:
        if not self._is_followed(entry):
            return
        if entry.batch_id in self._posting:
            # Resent meanwhile: that submission's outcome follows it.
            self._drop(entry)
            return
        if status.name in _NOT_FINAL:
            if entry.mode is Mode.ASK:
                if await self._record(entry, Pending()):
                    self._to_park(entry)
                else:
                    self._start(entry)  # asked again after its backoff
            return
        # Dropped before the write, so a listener it wakes may follow the batch
        # afresh (a resend after Unknown); scans leave it alone meanwhile.
        self._drop(entry)
        batch_id = entry.batch_id
        self._recording.add(batch_id)
        try:
            written = await self._record(entry, status)
        finally:
            self._recording.discard(batch_id)
        if written:
            for landed in self._landed_during:
                landed.add(batch_id)
        elif batch_id not in self.followed:
            # Not written: read it again after its backoff.
            self.followed[batch_id] = entry
            self._start(entry)

    async def _record(self, entry: _Entry, status: BatchStatus) -> bool:
        try:
            await self._sink.ledger_status(
                entry.service_id, LedgerBatchStatus(entry.batch_id, status)
            )
        except LedgerqError as exc:
            (log.debug if isinstance(exc, StoreOutageError) else log.warning)(
                "status of batch %s not recorded: %s", entry.batch_id[:16], exc
            )
            self._back_off(entry)
            return False
        return True

    # -- accelerators -------------------------------------------------------------

    async def _follow_events(self, events: AsyncIterator[CommitEvent]) -> None:
        assert self._tasks is not None
        async for event in events:
            if not event.status.is_final:
                continue
            entry = self.followed.get(event.batch_id)
            if entry is None:
                self._keep_early(event)
                continue
            self._tasks.create_task(self._apply_event(event.batch_id, entry.service_id, event))

    def _keep_early(self, event: CommitEvent) -> None:
        # Usually its submitter has not recorded it accepted yet: applied when it has.
        self._early[event.batch_id] = event
        while len(self._early) > self.settings.early_events:
            self._early.popitem(last=False)
        asyncio.get_running_loop().call_later(
            self.settings.early_grace_s, self._early.pop, event.batch_id, None
        )

    async def _apply_event(self, batch_id: str, service_id: str, event: CommitEvent) -> None:
        if batch_id in self._recording:
            return  # a read's answer came first and is being recorded
        entry = self.followed.get(batch_id)
        if entry is None:
            entry = _Entry(batch_id, service_id, Mode.PARK)
            self.followed[batch_id] = entry
        self.applied_from_events += 1
        await self._apply(entry, event.status)

    async def _follow_triggers(self, triggers: AsyncIterator[None]) -> None:
        async for _ in triggers:
            self.trigger()


def _cause(exc: LedgerError) -> str:
    """A short, stable cause for a failed read (for bursts of problems)."""
    return exc.cause
