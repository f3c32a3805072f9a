"""The pipelined strategy's lanes: which batch of a service may go next while
those before it are in flight (``docs/queuer.md``, "The pipelined strategy").

:class:`Pipelines` decides and keeps count; the producer takes and posts.
Per pipelined service it keeps the batches this process has in flight, in
the order they were taken (from their take until final, ``Unknown`` or
``Delayed``), and :meth:`Pipelines.next` walks the service's open batches
after a given one, past those in flight: the first that is not (new,
``Unknown``, or ``Delayed`` past its window) may go if it declares a
dependency on the batch just before it and each of its dependencies is
committed or in flight here — the ledger then keeps the order. At most
``depth`` in flight. One walk of a service at a time (:meth:`Pipelines.lock`):
two would both find its next batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from ledgerq.clock import Clock
from ledgerq.model import BatchStatusName, TrackingBatch
from ledgerq.pipeline.dependencies import DependencyCheck, DependencyStore, dependencies_of
from ledgerq.queue.strategy import Strategy, StrategyMap


class PipelineStore(DependencyStore, Protocol):
    async def batch_following(self, service_id: str, after: str | None) -> TrackingBatch | None:
        """The service's first non-final batch after ``after`` (``None``: its
        first), whatever its state."""
        ...


@dataclass(frozen=True, slots=True)
class Take:
    """Take ``batch`` now."""

    batch: TrackingBatch


@dataclass(frozen=True, slots=True)
class Later:
    """Look again, from ``after``, once ``delay_ms`` passed (a ``Delayed``
    batch whose window is not over)."""

    after: str | None
    delay_ms: int


class Pipelines:
    def __init__(
        self,
        store: PipelineStore,
        strategies: StrategyMap,
        dependencies: DependencyCheck,
        *,
        depth: int,
        delay_window_ms: int,
        clock: Clock,
    ) -> None:
        self._store = store
        self._strategies = strategies
        self._any = Strategy.PIPELINED in strategies.kinds()
        self._dependencies = dependencies
        self.depth = depth
        self._delay_window_ms = delay_window_ms
        self._clock = clock
        #: Per service, its batches in flight here, in the order taken.
        self._lanes: dict[str, dict[str, None]] = {}
        self._walking: dict[str, asyncio.Lock] = {}

    def pipelined(self, service_id: str) -> bool:
        return self._any and self._strategies.of(service_id) is Strategy.PIPELINED

    def taken(self, batch: TrackingBatch) -> None:
        if self.pipelined(batch.service_id):
            self._lanes.setdefault(batch.service_id, {})[batch.batch_id] = None

    def leave(self, service_id: str, batch_id: str) -> tuple[str | None, list[str]]:
        """``batch_id`` is no longer in flight here: the batch of its service
        in flight here just before it, and those after it, in order."""
        lane = self._lanes.get(service_id)
        if lane is None or batch_id not in lane:
            return None, []
        ids = list(lane)
        del lane[batch_id]
        if not lane:
            del self._lanes[service_id]
        at = ids.index(batch_id)
        return (ids[at - 1] if at else None), ids[at + 1 :]

    def lock(self, service_id: str) -> asyncio.Lock:
        return self._walking.setdefault(service_id, asyncio.Lock())

    def unlocked(self, service_id: str, lock: asyncio.Lock) -> None:
        if not lock.locked() and self._walking.get(service_id) is lock:
            del self._walking[service_id]

    async def next(
        self, service_id: str, after: str | None, in_flight: Collection[str]
    ) -> Take | Later | None:
        """What the service's walk from ``after`` finds (hold :meth:`lock`)."""
        depth = self.depth + (after is None)  # from its first batch: one more step
        previous = after
        for _ in range(depth + 1):
            if len(self._lanes.get(service_id, ())) >= self.depth:
                return None
            nxt = await self._store.batch_following(service_id, previous)
            if nxt is None or nxt.batch_id in in_flight:
                return None
            if nxt.submitted or nxt.status_name is BatchStatusName.PENDING:
                previous = nxt.batch_id  # in flight (here or elsewhere): look past it
                continue
            if nxt.status_name is BatchStatusName.DELAYED:
                due = (nxt.last_attempt_at or 0) + self._delay_window_ms - self._clock()
                if due > 0:
                    return Later(previous, due)
            return Take(nxt) if await self._may_go(nxt, previous) else None
        return None

    async def _may_go(self, batch: TrackingBatch, previous: str | None) -> bool:
        """Whether ``batch`` may go while the batches before it are in
        flight: it declares a dependency on ``previous`` (the batch just
        before it; ``None``: none is open), and each of its dependencies is
        committed or in flight here."""
        deps = dependencies_of(batch)
        if not deps:
            # Declares nothing: it waits for those before it, if any.
            return previous is None
        states = await self._store.dependency_states(deps)
        if previous is not None and not any(s.batch_id == previous for s in states.values()):
            return False  # does not follow the batch before it
        here = self._lanes.get(batch.service_id, {})
        for d in deps:
            state = states.get(d)
            if state is None:
                if not self._dependencies.known(d):
                    return False  # the queue's path asks the ledger
            elif not state.committed and state.batch_id not in here:
                return False
        return True
