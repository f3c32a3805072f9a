"""Where long-polling status requests wait (``/batch_statuses?wait=N``).

What a caller relies on — Sawtooth's rule: a request with ``wait`` is
answered as soon as none of its ids is ``PENDING`` (every batch it names is
final, or unknown to the gateway), and at the latest when its wait is over;
the answer then is what the store holds at that moment.

* A batch id unknown when the request arrived may be accepted while it
  waits, on this instance or another: it is not followed (its service is not
  known), but read again — for every request in that situation together, in
  one query — when the request's other batches are all final; if it is
  ``PENDING`` by then, the request waits for it too.
* When a wait ends without every batch final, the ids not final are read
  again (one query), so a wake-up lost on the way costs latency, never a
  stale answer.

What it costs — nothing while nothing changes (no periodic re-read):

* Parked requests are indexed by service and batch id. A change to a
  service (:meth:`Changes.notify`: this instance's pipeline, or another
  instance's through the wake-up relay — PostgreSQL ``LISTEN``/``NOTIFY`` or
  the worker bus) marks it dirty; one refresher reads the batches waited for
  in the dirty services, once for every parked request together, at most
  once per :data:`REFRESH_INTERVAL_S` (changes arriving meanwhile are folded
  into the next read), and hands a batch only to the requests waiting for
  it, and only once it is final. The read asks for the final ones only
  (:attr:`Changes.final_reader`): most watched batches are pending at any
  moment, and one still pending costs the read no row, the gateway no
  batch built from it and no pass over its requests. A request is woken
  only when its last batch is final. A pass yields to the event loop every
  :data:`DELIVER_SLICE` batches.
* Bounded whatever the number of parked requests: after a read of ``n``
  ids the next waits ``n /`` :data:`REFRESH_IDS_PER_S` seconds if that is
  longer (a few hundred watched batches changing all the time are read a
  few times a second, not twenty).
* Final answers (``Committed``, ``Invalid``: they never change) are kept in
  a bounded cache shared by every request (:class:`FinalCache`): a request
  asking again for batches it saw final costs no read.
* At most ``max_waiters`` requests are parked (:meth:`Changes.park` raises
  :class:`TooManyWaitersError` beyond), shared fairly among tenants
  (:class:`~ledgerq.ingest.fairness.Shares`: one token's parked requests
  never take another's guaranteed places).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from ledgerq.errors import StoreError
from ledgerq.ingest.fairness import Shares
from ledgerq.model import BatchStatusName, TrackingBatch
from ledgerq.scopes import FULL, Scope
from ledgerq.store.base import DATA_CHANGE_PREFIX

log = logging.getLogger(__name__)

#: Least time between two reads for parked status requests.
REFRESH_INTERVAL_S = 0.05
#: Batch ids the refresher reads per second at most, on average: after a
#: read of n ids, the next waits n / REFRESH_IDS_PER_S seconds if that is
#: longer than REFRESH_INTERVAL_S (a read of up to 100 ids is not slowed).
REFRESH_IDS_PER_S = 2_000
#: Batches handed to their waiters, and waiters re-checked, between two
#: yields to the event loop: a pass over a thousand batches watched by a
#: thousand requests does not hold the loop (and a POST waiting on it) for
#: its whole length.
DELIVER_SLICE = 100
RECHECK_SLICE = 50
#: Final batches the answer cache holds (about 300 bytes each, bodies left out).
FINAL_CACHE_SIZE = 100_000

BatchReader = Callable[[Collection[str]], Awaitable[list[TrackingBatch]]]

#: States that never change once reached (Splinter's ``Valid`` still
#: becomes ``Committed``, so it is not among them).
_SETTLED = frozenset({BatchStatusName.COMMITTED, BatchStatusName.INVALID})


def refresh_pause(ids_read: int) -> float:
    """Seconds from the start of a refresh that read ``ids_read`` ids to the
    next: :data:`REFRESH_INTERVAL_S`, longer for a large read, so that the
    refresher reads at most about :data:`REFRESH_IDS_PER_S` ids a second."""
    return max(REFRESH_INTERVAL_S, ids_read / REFRESH_IDS_PER_S)


class TooManyWaitersError(Exception):
    """Every long-poll slot is taken."""


class FinalCache:
    """Batches in a state that never changes, by batch id, the least recently
    used dropped beyond ``size``; kept without their bodies (a status answer
    does not need them), with their status entry once encoded."""

    def __init__(self, size: int = FINAL_CACHE_SIZE) -> None:
        self.size = size
        #: Batch id → [batch, its encoded status entry or None].
        self._entries: OrderedDict[str, list[Any]] = OrderedDict()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def settled(batch: TrackingBatch) -> bool:
        return batch.status_name in _SETTLED

    def add(self, batch: TrackingBatch) -> None:
        if batch.status_name not in _SETTLED or batch.batch_id in self._entries:
            return
        if batch.serialized_batch or batch.transactions:
            batch = dataclasses.replace(batch, serialized_batch=b"", transactions=())
        self._entries[batch.batch_id] = [batch, None]
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def add_all(self, batches: Iterable[TrackingBatch]) -> None:
        for b in batches:
            self.add(b)

    def get(self, batch_id: str) -> TrackingBatch | None:
        entry = self._entries.get(batch_id)
        if entry is None:
            return None
        self._entries.move_to_end(batch_id)
        self.hits += 1
        batch: TrackingBatch = entry[0]
        return batch

    def encoded(self, batch_id: str) -> str | None:
        """The batch's status entry as the API encoded it, if it did."""
        entry = self._entries.get(batch_id)
        return None if entry is None else entry[1]

    def keep_encoded(self, batch_id: str, encoded: str) -> None:
        entry = self._entries.get(batch_id)
        if entry is not None:
            entry[1] = encoded


class Waiter:
    """One parked request."""

    __slots__ = ("event", "found", "pending", "scope", "sees_all", "service_id", "unknown")

    def __init__(self, service_id: str | None = None, scope: Scope = FULL) -> None:
        self.event = asyncio.Event()
        #: Asked id → batch, updated in place as the batches change.
        self.found: dict[str, TrackingBatch] = {}
        #: Batch id → the id it was asked by, for the batches not final yet.
        self.pending: dict[str, str] = {}
        #: Asked batch ids unknown when last read (``dc:`` ids left out).
        self.unknown: list[str] = []
        #: What the request sees: a batch of another service or outside its
        #: token's scope is unknown to it.
        self.service_id = service_id
        self.scope = scope
        #: Every batch (the common case: no service asked, a full token);
        #: spares the scope's pattern match per batch when re-checking.
        self.sees_all = service_id is None and scope.sees_everything

    def sees(self, batch: TrackingBatch) -> bool:
        if self.sees_all:
            return True
        return (
            self.service_id is None or batch.service_id == self.service_id
        ) and self.scope.covers(batch.service_id)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("refreshing parked status requests failed", exc_info=task.exception())


class Changes:
    """Where long-polling status requests wait for their batches (module notes)."""

    def __init__(self, max_waiters: int = 1_000, final_cache_size: int = FINAL_CACHE_SIZE) -> None:
        self.max_waiters = max_waiters
        #: The parking places, by tenant (the scope's name).
        self.shares = Shares(max_waiters)
        #: Reads batches by id (set by the API to its store's).
        self.reader: BatchReader | None = None
        #: Reads, among batch ids, only the batches in a final state (the
        #: refresher's reads); None: :attr:`reader`'s answer, filtered.
        self.final_reader: BatchReader | None = None
        #: Batches in a state that never changes, shared by every request.
        self.final = FinalCache(final_cache_size)
        #: Queries made to refresh parked requests (changes and re-checks),
        #: and the batch ids they asked for.
        self.reads = 0
        self.ids_read = 0
        #: Requests woken (their wait over: no batch pending any more).
        self.woken = 0
        self._parked: set[Waiter] = set()
        self._by_service: dict[str, dict[str, set[Waiter]]] = {}
        self._dirty: set[str] = set()
        #: Requests whose tracked batches are all final, whose unknown ids
        #: are to be read again before they are woken.
        self._recheck: set[Waiter] = set()
        self._refresher: asyncio.Task[None] | None = None
        #: The loop time before which the refresher does not read again.
        self._next_read = 0.0

    @property
    def parked(self) -> int:
        return len(self._parked)

    def notify(self, service_id: str | None = None) -> None:
        """A batch of ``service_id`` changed (``None``: any service)."""
        if service_id is None:
            self._dirty.update(self._by_service)
        elif service_id in self._by_service:
            self._dirty.add(service_id)
        if self._dirty:
            self._start_refresher()

    def _start_refresher(self) -> None:
        if self.reader is not None and self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())
            self._refresher.add_done_callback(_log_failure)

    @contextlib.contextmanager
    def park(self, service_id: str | None = None, scope: Scope = FULL) -> Iterator[Waiter]:
        """A slot for one request seeing ``service_id``'s batches (all when
        None) within ``scope``; :class:`TooManyWaitersError` when none is free
        to the scope's tenant."""
        if len(self._parked) >= self.max_waiters or not self.shares.take(scope.name):
            raise TooManyWaitersError
        waiter = Waiter(service_id, scope)
        self._parked.add(waiter)
        try:
            yield waiter
        finally:
            for batch_id in list(waiter.pending):
                self._unwatch(waiter, waiter.found[waiter.pending[batch_id]])
            self._recheck.discard(waiter)
            self._parked.discard(waiter)
            self.shares.give_back(scope.name)

    def has_room(self, scope: Scope = FULL) -> bool:
        """Whether :meth:`park` would find a place for ``scope``'s tenant now."""
        return len(self._parked) < self.max_waiters and self.shares.has_room(scope.name)

    def watch(
        self,
        waiter: Waiter,
        found: dict[str, TrackingBatch],
        ids: Sequence[str],
        unknown: Sequence[str] = (),
    ) -> None:
        """Wait for the batches ``found[i]`` of ``ids``, and re-check the
        ``unknown`` ids (not in ``found``) when those are final; ``found`` is
        kept up to date. The services of ``ids`` are read again at once:
        nothing changed since ``found`` was read is missed."""
        waiter.found = found
        waiter.unknown = [i for i in unknown if not i.startswith(DATA_CHANGE_PREFIX)]
        for i in ids:
            self._watch(waiter, i, found[i])
        if not waiter.pending and waiter.unknown:
            self._recheck.add(waiter)
            self._start_refresher()

    def _watch(self, waiter: Waiter, asked: str, batch: TrackingBatch) -> None:
        waiter.pending[batch.batch_id] = asked
        by_batch = self._by_service.setdefault(batch.service_id, {})
        by_batch.setdefault(batch.batch_id, set()).add(waiter)
        self.notify(batch.service_id)

    def _unwatch(self, waiter: Waiter, batch: TrackingBatch) -> None:
        waiter.pending.pop(batch.batch_id, None)
        by_batch = self._by_service.get(batch.service_id)
        if by_batch is None:
            return
        waiters = by_batch.get(batch.batch_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del by_batch[batch.batch_id]
        if not by_batch:
            del self._by_service[batch.service_id]

    async def wait(self, waiter: Waiter, timeout_s: float) -> bool:
        """Until no batch of ``waiter`` is pending (True), or ``timeout_s`` (False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.event.wait(), timeout_s)
        return waiter.event.is_set()

    async def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (self._dirty or self._recheck) and self.reader is not None:
                # Changes arriving meanwhile are folded into the next read.
                await asyncio.sleep(max(0.0, self._next_read - loop.time()))
                began = loop.time()
                services, self._dirty = self._dirty, set()
                ids = [b for s in services for b in self._by_service.get(s, {})]
                read = len(ids)
                if ids:
                    batches = await self._read(ids, final_only=True) or ()
                    for n, batch in enumerate(batches, 1):
                        self._deliver(batch)
                        if n % DELIVER_SLICE == 0:
                            await asyncio.sleep(0)  # let requests and the pipeline in
                if self._recheck:
                    read += await self._recheck_unknown()
                self._next_read = began + refresh_pause(read)
        finally:
            self._refresher = None

    async def _read(
        self, ids: Collection[str], *, final_only: bool = False
    ) -> list[TrackingBatch] | None:
        """The batches of ``ids`` the store holds (only the final ones when
        ``final_only``); None when the store failed."""
        assert self.reader is not None
        self.reads += 1
        self.ids_read += len(ids)
        try:
            if not final_only:
                batches = await self.reader(ids)
            elif self.final_reader is not None:
                batches = await self.final_reader(ids)
            else:
                batches = [b for b in await self.reader(ids) if b.is_final]
        except StoreError as exc:
            # Parked requests are read again when their wait ends.
            log.warning("cannot read batches for parked status requests: %s", exc)
            return None
        self.final.add_all(batches)
        return batches

    def _deliver(self, batch: TrackingBatch) -> None:
        if not batch.is_final:
            # A waiter needs its batches' final states only: it is answered
            # when all are final, and a wait that runs out reads its open
            # ids again. A pending batch read again costs no pass over the
            # requests watching it.
            return
        waiting = self._by_service.get(batch.service_id, {}).get(batch.batch_id)
        if not waiting:
            return
        for waiter in list(waiting):
            waiter.found[waiter.pending[batch.batch_id]] = batch
            # Final: no longer watched by anyone once this loop is done.
            self._unwatch(waiter, batch)
            if not waiter.pending:
                self._done_or_recheck(waiter)

    def _done_or_recheck(self, waiter: Waiter) -> None:
        if waiter.unknown:
            self._recheck.add(waiter)
        else:
            self._wake(waiter)

    def _wake(self, waiter: Waiter) -> None:
        self.woken += 1
        waiter.event.set()

    async def _recheck_unknown(self) -> int:
        """Read the unknown ids of the requests whose tracked batches are all
        final: those now pending are waited for, the others are woken.
        Returns the number of ids read."""
        waiters, self._recheck = self._recheck, set()
        ids = {i for w in waiters for i in w.unknown}
        batches = await self._read(ids)
        if batches is None:
            for w in waiters:
                self._wake(w)  # answers what it has; read again as its wait ends
            return len(ids)
        by_id = {b.batch_id: b for b in batches}
        for n, w in enumerate(waiters, 1):
            if n % RECHECK_SLICE == 0:
                await asyncio.sleep(0)  # let requests and the pipeline in
            if w not in self._parked:
                continue  # gone meanwhile
            still: list[str] = []
            for i in w.unknown:
                b = by_id.get(i)
                if b is None or not w.sees(b):
                    still.append(i)
                    continue
                w.found[i] = b
                if not b.is_final:
                    self._watch(w, i, b)
            w.unknown = still
            if not w.pending:
                self._wake(w)
        return len(ids)

    async def aclose(self) -> None:
        refresher = self._refresher
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
