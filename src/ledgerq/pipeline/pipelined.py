"""The pipelined strategy's lanes: which batches of a service may go next while
those before them are in flight (``docs/queuer.md``, "The pipelined strategy").

:class:`Pipelines` decides and keeps count; the producer takes and posts.
Per pipelined service it keeps the batches this process has in flight (from
their take until final, ``Unknown`` or ``Delayed``) in the service's order,
the store's acceptance sequence — not the order they were taken in: a batch
the ledger lost is taken again after those behind it.

:meth:`Pipelines.next` walks the service's open batches after a given one
(read a page at a time), past those in flight, and gathers a *run*: each
batch that is not in flight (new, ``Unknown``, or ``Delayed`` past its
window) may go if it declares a dependency on the batch just before it and
each of its dependencies is committed, in flight here, or earlier in the
run — the ledger then keeps the order. The run ends at the first batch that
may not go, at one being posted (its acceptance walks on) or taken and not
posted, or when ``depth`` batches would be in flight (a lost batch before
the lane's last goes again whatever the depth: those after it wait for it
at the ledger); the producer takes it in one store write and posts it. A
batch lost (``Unknown``) whose predecessor is in flight here goes again
only once the ledger says it still has that predecessor: a ledger that lost
several says so in its own time, and the first of them goes again first.

One walk of a service at a time (:meth:`Pipelines.lock`): two would both
find its next batches; and a walk during whose awaits a batch of the service
was taken another way reads again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledgerq.clock import Clock
from ledgerq.errors import LedgerError
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import BatchStatusName, TrackingBatch
from ledgerq.pipeline.dependencies import DependencyCheck, DependencyStore, dependencies_of
from ledgerq.queue.strategy import Strategy, StrategyMap


class StatusLedger(Protocol):
    """The ledger role of the walk (a :class:`~ledgerq.ledgers.LedgerClient`)."""

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]: ...


class PipelineStore(DependencyStore, Protocol):
    async def batches_following(
        self, service_id: str, after: str | None, *, limit: int
    ) -> list[TrackingBatch]:
        """The service's first ``limit`` non-final batches after ``after``
        (``None``: from its first), in its order, whatever their state."""
        ...


#: Batches the first read of a walk reads at most (each next read twice as
#: many): most walks stop at the next batch (being posted, or one that does
#: not declare the batch before it), and a batch read is a row with its blob.
_FIRST_PAGE = 4


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A batch in a lane: its place in the service's order, its transactions,
    the number of its take; ``unsent``: taken but not posted (the ledger is
    asked about it)."""

    seq: int
    transactions: frozenset[str]
    take: int
    unsent: bool = False


@dataclass(frozen=True, slots=True)
class Take:
    """Take ``batches`` now, together, in this order (the service's)."""

    batches: tuple[TrackingBatch, ...]


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
        ledger: StatusLedger,
        strategies: StrategyMap,
        dependencies: DependencyCheck,
        *,
        depth: int,
        delay_window_ms: int,
        clock: Clock,
        answering: Collection[str] = (),
    ) -> None:
        """``answering``: the batches with a ledger status being recorded
        (a live view)."""
        self._store = store
        self._ledger = ledger
        self._answering = answering
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
        #: Services with a lost batch perhaps left behind by a walk (the batch
        #: before it lost too, or not known; or the walk stopped at a batch
        #: being posted): their next walk starts from the first.
        self._lost_behind: set[str] = set()

    def pipelined(self, service_id: str) -> bool:
        return self._any and self._strategies.of(service_id) is Strategy.PIPELINED

    def taken(self, batch: TrackingBatch) -> None:
        if self.pipelined(batch.service_id):
            self._counted += 1
            place = _InFlight(
                batch.seq or 0,
                frozenset(t.transaction_header for t in batch.transactions),
                self._counted,
            )
            self._lanes.setdefault(batch.service_id, {})[batch.batch_id] = place
            self._takes[batch.service_id] = self._counted

    def take_of(self, service_id: str, batch_id: str) -> int | None:
        """The number of the take that put ``batch_id`` in its lane (``None``:
        not in flight here)."""
        place = self._lanes.get(service_id, {}).get(batch_id)
        return None if place is None else place.take

    def leave_take(
        self, service_id: str, batch_id: str, take: int | None
    ) -> tuple[str | None, list[str]]:
        """:meth:`leave`, if take ``take`` (:meth:`take_of`; ``None``: none)
        put ``batch_id`` in its lane: a write about an earlier take does not
        end one made since."""
        if take is None or self.take_of(service_id, batch_id) != take:
            return None, []
        return self.leave(service_id, batch_id)

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

    def holds(self, service_id: str, batch_id: str) -> bool:
        """Whether ``batch_id`` is in flight here (in its service's lane)."""
        return batch_id in self._lanes.get(service_id, ())

    def unsent(self, service_id: str, batch_id: str) -> None:
        """``batch_id``, in its lane, was taken but not posted: no walk goes
        past it until it leaves the lane (the ledger's answer about it)."""
        lane = self._lanes.get(service_id, {})
        place = lane.get(batch_id)
        if place is not None:
            lane[batch_id] = dataclasses.replace(place, unsent=True)

    def blocks(self, service_id: str, batch_id: str, in_flight: Collection[str]) -> bool:
        """Whether a walk stops at ``batch_id``: it is being posted, or was
        taken and not posted."""
        if batch_id in in_flight:
            return True
        place = self._lanes.get(service_id, {}).get(batch_id)
        return place is not None and place.unsent

    def last(self, service_id: str) -> str | None:
        """The service's last batch in flight here, in its order (``None``: none)."""
        lane = self._lanes.get(service_id)
        return max(lane, key=lambda b: lane[b].seq) if lane else None

    def lost_behind(self, service_id: str) -> bool:
        """Whether a walk left a lost batch of the service behind: the next
        walks from the service's first batch."""
        return service_id in self._lost_behind

    def lock(self, service_id: str) -> asyncio.Lock:
        return self._walking.setdefault(service_id, asyncio.Lock())

    def unlocked(self, service_id: str, lock: asyncio.Lock) -> None:
        if not lock.locked() and self._walking.get(service_id) is lock:
            del self._walking[service_id]

    async def next(
        self, service_id: str, after: str | None, in_flight: Collection[str]
    ) -> Take | Later | None:
        """What the service's walk from ``after`` finds (hold :meth:`lock`);
        ``in_flight``: the batches being posted here."""
        # Batches looked at, at most: the lane's, those lost among them, and
        # the run's, one more from the service's first.
        origin = after  # accepted or final: no walk stops at it
        if service_id in self._lost_behind:
            after = None  # a lost batch may wait before the lane's last
            self._lost_behind.discard(service_id)
        steps = self.depth + 2 * len(self._lanes.get(service_id, ())) + 1 + (after is None)
        while steps > 0:
            takes = self._takes.get(service_id, 0)
            found = await self._walk(service_id, after, origin, in_flight, steps)
            steps -= max(found.looked, 1)
            if self._takes.get(service_id, 0) == takes:
                return found.what
            # A batch of the service was taken another way meanwhile: read again.
        return None

    async def _walk(
        self,
        service_id: str,
        after: str | None,
        origin: str | None,
        in_flight: Collection[str],
        steps: int,
    ) -> _Walked:
        lane = self._lanes.get(service_id, {})
        # The depth bounds the batches sent after the lane's last; one lost
        # before it goes again whatever the depth (those after it wait for it).
        last_seq = max((p.seq for p in lane.values()), default=-1)
        room = self.depth - len(lane)
        beyond = 0
        previous = after
        run: list[TrackingBatch] = []
        looked = 0
        page_size = _FIRST_PAGE
        while looked < steps:
            # The page: what the run may still take, and the lane's batches
            # after ``previous``, which are looked past; at most _FIRST_PAGE,
            # then twice as many each read.
            ahead = self._in_lane_after(service_id, previous, run)
            limit = min(steps - looked, max(room - beyond, 0) + ahead)
            if limit <= 0:
                break
            limit = min(limit, page_size)
            page_size *= 2
            page = await self._store.batches_following(service_id, previous, limit=limit)
            for nxt in page:
                looked += 1
                new = (nxt.seq or 0) > last_seq
                if new and beyond >= room:
                    return _Walked(_take(run), looked)
                if nxt.batch_id != origin and self.blocks(service_id, nxt.batch_id, in_flight):
                    if after is None:
                        # Looking for lost batches: any after this one are
                        # looked for again by the next walk.
                        self._lost_behind.add(service_id)
                    return _Walked(_take(run), looked)
                if nxt.submitted or nxt.status_name is BatchStatusName.PENDING:
                    previous = nxt.batch_id  # in flight (here or elsewhere): look past it
                    continue
                if nxt.status_name is BatchStatusName.DELAYED:
                    due = (nxt.last_attempt_at or 0) + self._delay_window_ms - self._clock()
                    if due > 0:
                        return _Walked(_take(run) or Later(previous, due), looked)
                if nxt.status_name is BatchStatusName.UNKNOWN and not await self._behind_kept(
                    nxt, previous, run
                ):
                    self._lost_behind.add(service_id)
                    return _Walked(_take(run), looked)
                if not await self._may_go(nxt, previous, run):
                    return _Walked(_take(run), looked)
                run.append(nxt)
                previous = nxt.batch_id
                beyond += new
            if len(page) < limit:
                break  # the service's last open batch was read
        return _Walked(_take(run), looked)

    async def _behind_kept(
        self, lost: TrackingBatch, previous: str | None, run: Sequence[TrackingBatch]
    ) -> bool:
        """Whether ``lost`` (``Unknown``: the ledger lost it) may be sent
        again now as far as the batch before it goes: ``previous`` is not in
        flight here, is in ``run``, or the ledger still has it. A ledger that
        lost a batch may have lost those before it too, and says so in their
        own time: the first of them goes again first, the others after it,
        in order (asked here, not guessed; the answer is the follower's to
        record; not while it records one of its own)."""
        lane = self._lanes.get(lost.service_id, {})
        if previous is None or previous not in lane or any(b.batch_id == previous for b in run):
            return True
        if previous in self._answering:
            # The follower has an answer about it being recorded: asked now,
            # the ledger could contradict it before it lands (a batch it
            # held, then took). That write walks on (from the service's
            # first, when final or lost).
            return False
        try:
            answers = await self._ledger.batch_statuses(lost.service_id, [previous])
        except LedgerError:
            return False  # not known: the next walk looks again (lost_behind)
        said = next((a.status for a in answers if a.batch_id == previous), None)
        return said is not None and said.name is not BatchStatusName.UNKNOWN

    def _in_lane_after(
        self, service_id: str, after: str | None, run: Sequence[TrackingBatch]
    ) -> int:
        """The batches in flight here after ``after`` in the service's order
        (all of them when its place is not known)."""
        lane = self._lanes.get(service_id, {})
        if not lane:
            return 0
        at = lane.get(after or "")
        if at is not None:
            return sum(1 for p in lane.values() if p.seq > at.seq)
        if run and run[-1].batch_id == after:
            return sum(1 for p in lane.values() if p.seq > (run[-1].seq or 0))
        return len(lane)

    async def _may_go(
        self, batch: TrackingBatch, previous: str | None, run: Sequence[TrackingBatch]
    ) -> bool:
        """Whether ``batch`` may go while the batches before it are in
        flight: it declares a dependency on ``previous`` (the batch just
        before it; ``None``: none is open), and each of its dependencies is
        committed, in flight here, or in ``run`` (taken with it)."""
        deps = dependencies_of(batch)
        if not deps:
            # Declares nothing: it waits for those before it, if any.
            return previous is None
        here = self._lanes.get(batch.service_id, {})
        before = here.get(previous or "")
        if before is not None:
            transactions = before.transactions
        elif run and run[-1].batch_id == previous:
            transactions = frozenset(t.transaction_header for t in run[-1].transactions)
        else:
            transactions = frozenset()
        if transactions.issuperset(deps):
            return True  # depends on the batch before it alone, in flight here: nothing to read
        states = await self._store.dependency_states(deps)
        if previous is not None and not any(s.batch_id == previous for s in states.values()):
            return False  # does not follow the batch before it
        taken = {b.batch_id for b in run}
        for d in deps:
            state = states.get(d)
            if state is None:
                if not self._dependencies.known(d):
                    return False  # the queue's path asks the ledger
            elif not state.committed and state.batch_id not in here and state.batch_id not in taken:
                return False
        return True


@dataclass(frozen=True, slots=True)
class _Walked:
    """What one read of a walk found, and how many batches it looked at."""

    what: Take | Later | None
    looked: int


def _take(run: Sequence[TrackingBatch]) -> Take | None:
    return Take(tuple(run)) if run else None
