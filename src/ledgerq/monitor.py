"""The DLT monitor (Grid's ``dlt_polling_monitor.md`` + ``dlt_event_monitor.md``).

It follows every batch the ledger has, or may have, until it is final:

* **Polling.** Each round reads from the store the batches to follow —
  ``{submitted, Pending}``, and other ``submitted`` batches (no status, or
  ``Unknown``/``Delayed`` being resubmitted) older than ``stale_after_ms``
  that no submitter of this process holds (their submitter died) — groups
  them by service, asks the ledger for their statuses (chunks of
  ``max_ids``, ``wait_s`` long-poll, at most ``connections`` requests at
  once), keeps only answers about ids it asked
  for, and applies each through the :class:`~ledgerq.recorder.Recorder`:
  ``COMMITTED`` and ``INVALID`` are final, ``PENDING`` marks a recovered
  batch pending, ``UNKNOWN`` clears ``submitted`` so the queuer sends the
  batch again before anything else of its service.
* **Events.** Where the ledger has an event stream (the ledgerq node's
  ``/events``), a final-status event for a batch this process submitted is
  applied at once — no poll stands between a commit and the next batch of
  the service. An event that arrives before the submitter has recorded the
  batch as accepted is held until it has (so ``Pending`` never overwrites a
  final status). An event still unmatched after ``early_grace_s`` (a batch
  submitted by another process or an earlier run) triggers an early poll,
  rate limited to one per ``min_poll_interval_s``.
* **Triggers.** Where the ledger announces commits without their batches
  (a Sawtooth validator's ``/subscriptions`` websocket, see
  :meth:`~ledgerq.dlt.base.LedgerClient.triggers`), each announcement asks
  for an early poll, rate limited the same way.
* Otherwise, a poll runs every ``poll_interval_s``.

A failed status read is logged and retried next round; it never changes a
batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledgerq.clock import Clock, now_ms
from ledgerq.dlt.base import CommitEvent, LedgerBatchStatus, LedgerClient
from ledgerq.errors import ConfigError, LedgerError, LedgerqError
from ledgerq.model import BatchStatusName, TrackingBatch
from ledgerq.recorder import Recorder

log = logging.getLogger(__name__)


class MonitoredSource(Protocol):
    """The store role the monitor needs."""

    async def monitored_batches(
        self, *, now: int, stale_before: int, limit: int
    ) -> Sequence[TrackingBatch]:
        """``{submitted, Pending}`` batches, and other ``submitted`` batches
        taken for submission before ``stale_before``; oldest first."""
        ...


@dataclass(frozen=True, slots=True)
class MonitorSettings:
    poll_interval_s: float = 1.0
    min_poll_interval_s: float = 0.05
    wait_s: float = 1.0
    max_ids: int = 100
    connections: int = 8
    stale_after_ms: int = 60_000
    batch_limit: int = 10_000
    #: Events that arrived before their batch was recorded accepted, kept at most.
    early_events: int = 10_000
    #: Events applied at once (their writes share group commits).
    event_concurrency: int = 1024
    #: How long such an event waits for its batch to be recorded accepted
    #: before it triggers a poll instead.
    early_grace_s: float = 0.5

    def __post_init__(self) -> None:
        for key in ("poll_interval_s", "min_poll_interval_s", "wait_s", "early_grace_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"monitor.{key} must not be negative")
        for key in ("max_ids", "connections", "stale_after_ms", "batch_limit", "event_concurrency"):
            if getattr(self, key) < 1:
                raise ConfigError(f"monitor.{key} must be at least 1")


class Monitor:
    def __init__(
        self,
        source: MonitoredSource,
        ledger: LedgerClient,
        recorder: Recorder,
        settings: MonitorSettings | None = None,
        *,
        clock: Clock = now_ms,
        held: Collection[str] | None = None,
    ) -> None:
        """``held``: batch ids a submitter of this process is working on (live view)."""
        self._source = source
        self._ledger = ledger
        self._recorder = recorder
        self.settings = settings or MonitorSettings()
        self._clock = clock
        self._held: Collection[str] = held if held is not None else ()
        self._trigger = asyncio.Event()
        self._stopping = asyncio.Event()
        self._watched: dict[str, str] = {}  # batch id -> service id, recorded Pending here
        self._early: OrderedDict[str, CommitEvent] = OrderedDict()
        self._inbox: asyncio.Queue[CommitEvent] = asyncio.Queue()
        self._limit = asyncio.Semaphore(self.settings.connections)
        self._known_pending: set[str] = set()
        self.polls = 0
        self.applied_from_events = 0
        self.triggers_received = 0
        recorder.add_accept_listener(self._on_accepted)

    def trigger(self) -> None:
        """Poll now (rate limited)."""
        self._trigger.set()

    def stop(self) -> None:
        self._stopping.set()
        self._trigger.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            events = self._ledger.events()
            triggers = self._ledger.triggers()
            followers = []
            if events is not None:
                followers.append(tasks.create_task(self._follow(events)))
            if triggers is not None:
                followers.append(tasks.create_task(self._follow_triggers(triggers)))
            try:
                await self._poll_loop()
            finally:
                for follower in followers:
                    follower.cancel()

    async def _poll_loop(self) -> None:
        s = self.settings
        while not self._stopping.is_set():
            self._trigger.clear()
            try:
                await self.poll_once()
            except LedgerqError as exc:
                log.warning("monitor poll failed: %s; retrying next round", exc)
            await asyncio.sleep(s.min_poll_interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._trigger.wait(), s.poll_interval_s)

    async def poll_once(self) -> int:
        """One polling round; returns how many statuses were applied."""
        now = self._clock()
        batches = await self._source.monitored_batches(
            now=now,
            stale_before=now - self.settings.stale_after_ms,
            limit=self.settings.batch_limit,
        )
        held = self._held
        groups: dict[str, list[str]] = defaultdict(list)
        self._known_pending = set()
        for b in batches:
            if b.batch_id not in held:
                groups[b.service_id].append(b.batch_id)
                if b.status_name is BatchStatusName.PENDING:
                    self._known_pending.add(b.batch_id)
        self.polls += 1
        if not groups:
            return 0
        step = self.settings.max_ids
        requests = [
            (service_id, ids[i : i + step])
            for service_id, ids in groups.items()
            for i in range(0, len(ids), step)
        ]
        results = await asyncio.gather(*(self._check(s, ids) for s, ids in requests))
        return sum(results)

    async def _check(self, service_id: str, ids: list[str]) -> int:
        async with self._limit:
            try:
                statuses = await self._ledger.batch_statuses(
                    service_id, ids, wait_s=self.settings.wait_s
                )
            except LedgerError as exc:
                log.warning("status read for service %s failed: %s", service_id, exc)
                return 0
        news = [
            status
            for status in statuses
            # A known Pending is nothing new; and an event may have made it final meanwhile.
            if not (
                status.status.name is BatchStatusName.PENDING
                and status.batch_id in self._known_pending
            )
        ]
        await asyncio.gather(*(self._apply(service_id, status) for status in news))
        return len(news)

    async def _apply(self, service_id: str, status: LedgerBatchStatus) -> None:
        if status.status.is_final or status.status.name is BatchStatusName.UNKNOWN:
            self._watched.pop(status.batch_id, None)
        await self._recorder.ledger_status(service_id, status)

    # -- events --------------------------------------------------------------

    def _on_accepted(self, batch_id: str, service_id: str) -> None:
        self._watched[batch_id] = service_id
        early = self._early.pop(batch_id, None)
        if early is not None:
            self._inbox.put_nowait(early)

    def _unclaimed_event(self, batch_id: str) -> None:
        if batch_id in self._early:
            self.trigger()  # not ours after all: let a poll find its batch

    async def _follow(self, events: AsyncIterator[CommitEvent]) -> None:
        async with asyncio.TaskGroup() as tasks:
            apply = tasks.create_task(self._apply_inbox())
            try:
                async for event in events:
                    self._inbox.put_nowait(event)
            finally:
                apply.cancel()

    async def _follow_triggers(self, triggers: AsyncIterator[None]) -> None:
        async for _ in triggers:
            self.triggers_received += 1
            self.trigger()

    async def _apply_inbox(self) -> None:
        # Concurrently (a batch has one final event), so the writes of many
        # events share a group commit instead of queueing one behind another.
        limit = asyncio.Semaphore(self.settings.event_concurrency)
        async with asyncio.TaskGroup() as tasks:
            while True:
                event = await self._inbox.get()
                await limit.acquire()
                task = tasks.create_task(self.handle_event(event))
                task.add_done_callback(lambda _t: limit.release())

    async def handle_event(self, event: CommitEvent) -> None:
        """Apply a final-status event for a watched batch; otherwise hold it and poll."""
        if not event.status.is_final:
            return
        service_id = self._watched.pop(event.batch_id, None)
        if service_id is None:
            # Usually the submitter has not recorded it accepted yet: applied
            # when it has. If not within the grace, a poll looks for it.
            self._early[event.batch_id] = event
            while len(self._early) > self.settings.early_events:
                self._early.popitem(last=False)
            asyncio.get_running_loop().call_later(
                self.settings.early_grace_s, self._unclaimed_event, event.batch_id
            )
            return
        self.applied_from_events += 1
        try:
            await self._recorder.ledger_status(
                service_id, LedgerBatchStatus(event.batch_id, event.status)
            )
        except LedgerqError as exc:
            log.warning("cannot apply event for batch %s: %s", event.batch_id[:16], exc)
            self.trigger()
