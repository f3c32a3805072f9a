"""Services that take nothing now, and when they look again.

A service *rests* while it is:

* **stopped** — paused by an operator, or halted at an ``Invalid`` batch
  (``on_invalid = halt``). The store says so (``service_controls``): read
  at start, every poll interval (an operator acted on another instance), at
  once after an action here (:meth:`Resting.refresh`), and set here when
  this process halts it. The store refuses a take of a stopped service in
  the take's own transaction, so a stale view here costs a refused take,
  never a POST.
* **waiting** — its next batch declares a dependency it may not go before
  (``docs/queuer.md``, "Declared dependencies"). It looks again when the
  batch it waits for is final here (:meth:`Resting.finished`), when the
  service holding a dependency it must take first has nothing in flight
  (:meth:`Resting.idle`), or when its wait is due (half a second at first,
  doubling to ten: a dependency ledgerq does not track is asked about
  again then, and one finished by another instance is seen).

:attr:`Resting.services` is the queue source's live view: none of their
batches is handed out; a service that stops resting is woken (``wake``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from ledgerq.clock import Clock
from ledgerq.errors import LedgerqError

log = logging.getLogger(__name__)

#: A waiting service looks again after this long at first, then twice as
#: long each time, up to the second figure (ms).
WAIT_FIRST_MS = 500
WAIT_MOST_MS = 10_000


class ServiceControl(Protocol):
    """A service's control (``ledgerq.store.base.ServiceControl``)."""

    @property
    def stopped(self) -> bool: ...


class ControlsStore(Protocol):
    async def service_controls(
        self, service_ids: Collection[str] | None = None
    ) -> Mapping[str, ServiceControl]:
        """The controls of these services (``None``: of every stopped one)."""
        ...


@dataclass(slots=True)
class _Waiting:
    batch_id: str
    reason: str
    #: The tracked batch waited for, if any.
    on: str | None
    #: When it looks again (ms), and how many waits of this batch in a row.
    due: int
    times: int


class Resting:
    def __init__(self, store: ControlsStore, *, wake: Callable[[str], None], clock: Clock) -> None:
        self._store = store
        self._wake = wake
        self._clock = clock
        #: Every resting service (stopped or waiting): the queue's live view.
        self.services: set[str] = set()
        self._stopped: set[str] = set()
        self._waiting: dict[str, _Waiting] = {}
        #: Per tracked batch waited for, the services waiting for it.
        self._on_batch: dict[str, set[str]] = {}
        #: Per service, the services waiting until it has nothing in flight.
        self._on_idle: dict[str, set[str]] = {}

    def stopped(self, service_id: str) -> bool:
        return service_id in self._stopped

    def stop(self, service_id: str) -> None:
        """The service is paused or halted: it takes nothing more."""
        self._stopped.add(service_id)
        self.services.add(service_id)

    async def refresh(self, service_ids: Collection[str] | None = None) -> None:
        """Read the services' controls again (``None``: every service's)."""
        try:
            controls = await self._store.service_controls(service_ids)
        except LedgerqError as exc:
            log.warning("cannot read which services are paused or halted: %s", exc)
            return
        stopped = {s for s, c in controls.items() if c.stopped}
        looked = self._stopped if service_ids is None else set(service_ids)
        for service_id in sorted(looked - stopped):
            if service_id in self._stopped:
                self._stopped.discard(service_id)
                self._release(service_id)
        for service_id in stopped:
            self.stop(service_id)

    def wait(self, service_id: str, batch_id: str, reason: str, on: str | None) -> bool:
        """The service waits (its next batch ``batch_id``, for ``reason``;
        ``on``: the tracked batch it waits for). Returns whether the reason
        changed since the batch last waited (then it is to be recorded)."""
        now = self._clock()
        before = self._waiting.get(service_id)
        again = before is not None and before.batch_id == batch_id
        times = before.times + 1 if again and before is not None else 1
        delay = min(WAIT_FIRST_MS * 2 ** min(times - 1, 16), WAIT_MOST_MS)
        self._waiting[service_id] = _Waiting(batch_id, reason, on, now + delay, times)
        if on is not None:
            self._on_batch.setdefault(on, set()).add(service_id)
        self.services.add(service_id)
        return not (again and before is not None and before.reason == reason)

    def wait_for_idle(self, service_id: str, waiting: str) -> None:
        """``waiting`` looks again once ``service_id`` has nothing in flight."""
        self._on_idle.setdefault(service_id, set()).add(waiting)

    def end_wait(self, service_id: str, *, wake: bool = True) -> None:
        waiting = self._waiting.pop(service_id, None)
        if waiting is None:
            return
        if waiting.on is not None:
            services = self._on_batch.get(waiting.on)
            if services is not None:
                services.discard(service_id)
                if not services:
                    del self._on_batch[waiting.on]
        if wake:
            self._release(service_id)
        elif service_id not in self._stopped:
            self.services.discard(service_id)

    def finished(self, batch_id: str) -> None:
        """Batch ``batch_id`` is final here: the services waiting for it look again."""
        for service_id in sorted(self._on_batch.pop(batch_id, ())):
            self.end_wait(service_id)

    def idle(self, service_id: str) -> None:
        """``service_id`` has nothing in flight here any more."""
        for waiting in sorted(self._on_idle.pop(service_id, ())):
            self.end_wait(waiting)

    def due(self) -> None:
        """End the waits that are due (the services look again)."""
        now = self._clock()
        for service_id in [s for s, w in self._waiting.items() if w.due <= now]:
            self.end_wait(service_id)

    def _release(self, service_id: str) -> None:
        if service_id not in self._stopped and service_id not in self._waiting:
            self.services.discard(service_id)
            self._wake(service_id)
