"""The pipelined strategy's lanes: which batch of a service may go next while
those before it are in flight (``docs/queuer.md``, "The pipelined strategy").

:class:`Pipelines` decides and keeps count; the producer takes and posts.
Per pipelined service it keeps the batches this process has in flight (from
their take until final, ``Unknown`` or ``Delayed``) in the service's order,
the store's acceptance sequence — not the order they were taken in: a batch
the ledger lost is taken again after those behind it — and
:meth:`Pipelines.next` walks the service's open batches
after a given one, past those in flight: the first that is not (new,
``Unknown``, or ``Delayed`` past its window) may go if it declares a
dependency on the batch just before it and each of its dependencies is
committed or in flight here — the ledger then keeps the order. At most
``depth`` in flight. One walk of a service at a time (:meth:`Pipelines.lock`):
two would both find its next batch; and a walk during whose awaits a batch of
the service was taken another way reads its step again.
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
class _InFlight:
    """A batch in a lane: its place in the service's order, its transactions."""

    seq: int
    transactions: frozenset[str]


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
        #: Per service, its batches in flight here.
        self._lanes: dict[str, dict[str, _InFlight]] = {}
        self._walking: dict[str, asyncio.Lock] = {}
        #: Per service with a lane, the number of its latest take (counted
        #: over every service, never reused): a walk that finds it changed
        #: after its awaits reads again (a take by another path meanwhile).
        self._takes: dict[str, int] = {}
        self._counted = 0

    def pipelined(self, service_id: str) -> bool:
        return self._any and self._strategies.of(service_id) is Strategy.PIPELINED

    def taken(self, batch: TrackingBatch) -> None:
        if self.pipelined(batch.service_id):
            place = _InFlight(
                batch.seq or 0, frozenset(t.transaction_header for t in batch.transactions)
            )
            self._lanes.setdefault(batch.service_id, {})[batch.batch_id] = place
            self._counted += 1
            self._takes[batch.service_id] = self._counted

    def leave(self, service_id: str, batch_id: str) -> tuple[str | None, list[str]]:
        """``batch_id`` is no longer in flight here: the batch of its service
        in flight here just before it, and those after it, in the service's
        order."""
        lane = self._lanes.get(service_id)
        if lane is None or batch_id not in lane:
            return None, []
        ids = sorted(lane, key=lambda b: lane[b].seq)
        del lane[batch_id]
        if not lane:
            del self._lanes[service_id]
            del self._takes[service_id]
        at = ids.index(batch_id)
        return (ids[at - 1] if at else None), ids[at + 1 :]

    def last(self, service_id: str) -> str | None:
        """The service's last batch in flight here, in its order (``None``: none)."""
        lane = self._lanes.get(service_id)
        return max(lane, key=lambda b: lane[b].seq) if lane else None

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
        passed: list[str] = []
        for _ in range(depth + 1):
            if len(self._lanes.get(service_id, ())) >= self.depth:
                return None
            takes = self._takes.get(service_id, 0)
            nxt = await self._store.batch_following(service_id, previous)
            if nxt is None or nxt.batch_id in in_flight:
                return None
            if nxt.submitted or nxt.status_name is BatchStatusName.PENDING:
                previous = nxt.batch_id  # in flight (here or elsewhere): look past it
                passed.append(previous)
                continue
            if nxt.status_name is BatchStatusName.DELAYED:
                due = (nxt.last_attempt_at or 0) + self._delay_window_ms - self._clock()
                if due > 0:
                    return Later(previous, due)
            if not await self._may_go(nxt, previous):
                return None
            if self._takes.get(service_id, 0) != takes:
                continue  # a batch of the service was taken meanwhile: read this one again
            if any(b in in_flight for b in passed):
                # One looked past as in flight was read before this process
                # took it (a batch the ledger lost, sent again): being posted
                # or checked, it may step aside, and the ledger would hold
                # this one for ever. Its submission's end walks on.
                return None
            return Take(nxt)
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
        before = self._lanes.get(batch.service_id, {}).get(previous or "")
        if before is not None and before.transactions.issuperset(deps):
            return True  # depends on the batch before it alone, in flight here: nothing to read
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
