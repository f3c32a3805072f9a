"""Store reads for status requests, combined.

At most ``slots`` reads run at once, so the store's connections stay free for
the pipeline whatever the number of status requests. Requests arriving while
the slots are taken wait, and are then read together: one query for all
their ids. Under a flood of status requests the per-query cost (the driver's
and PostgreSQL's) is paid once for many requests; a lone request is read at
once, as before. Beyond ``max_queued`` requests waiting, :meth:`read`
raises :class:`StatusQueueFull` (the API answers ``429``).

A failed read fails every request it served (each answers as it would
have alone); a request whose caller went away is dropped from its read's
answer, not from the read.

Status reads yield to posted batches (:class:`WritesFirst`): while the
gateway is storing a posted list, a status read about to start — a new
request's first read or a refresh of parked requests — waits until that
insert is done, at most ``max_defer_s``. A flood of status requests then
does not sit between a ``POST /batches`` and its insert's round trips to
the store (measured under hostile load: docs/BENCHMARKS.md, "Hostile
clients"); a status read is never held longer than ``max_defer_s`` per
read, whatever the posting rate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Iterator

from ledgerq.model import TrackingBatch

BatchReader = Callable[[Collection[str]], Awaitable[list[TrackingBatch]]]
_Request = tuple[Collection[str], "asyncio.Future[dict[str, TrackingBatch]]"]


#: Longest a status read waits for posted batches being stored.
MAX_DEFER_S = 0.1


class StatusQueueFull(Exception):
    """``max_queued`` status requests are waiting for a store read already."""


class WritesFirst:
    """Status reads wait while posted batches are being stored (module notes)."""

    def __init__(self, max_defer_s: float = MAX_DEFER_S) -> None:
        self.max_defer_s = max_defer_s
        #: Inserts of posted batches under way.
        self.writing = 0
        #: Status reads that waited for an insert, and those that waited the
        #: most (``max_defer_s``) and went ahead anyway.
        self.deferred = 0
        self.overdue = 0
        self._done: asyncio.Event | None = None

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """Around the insert of a posted list."""
        self.writing += 1
        try:
            yield
        finally:
            self.writing -= 1
            if self.writing == 0 and self._done is not None:
                self._done.set()
                self._done = None

    async def turn(self) -> None:
        """Return once no insert is under way, or ``max_defer_s`` later."""
        if self.writing == 0:
            return
        self.deferred += 1
        if self._done is None:
            self._done = asyncio.Event()
        try:
            await asyncio.wait_for(self._done.wait(), self.max_defer_s)
        except TimeoutError:
            self.overdue += 1


class CombinedReads:
    def __init__(
        self,
        reader: BatchReader,
        *,
        slots: int = 2,
        max_queued: int = 1_000,
        writes: WritesFirst | None = None,
    ) -> None:
        self.reader = reader
        #: What status reads give way to (nothing by default).
        self.writes = writes or WritesFirst(max_defer_s=0.0)
        self.slots = slots
        self.max_queued = max_queued
        #: Queries made, and requests they served.
        self.reads = 0
        self.requests = 0
        self._waiting: list[_Request] = []
        self._running: set[asyncio.Task[None]] = set()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def read(self, ids: Collection[str]) -> dict[str, TrackingBatch]:
        """The tracked batches among ``ids``, by batch id (possibly with
        others: do not change the dict)."""
        if len(self._waiting) >= self.max_queued:
            raise StatusQueueFull
        future: asyncio.Future[dict[str, TrackingBatch]] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting.append((ids, future))
        self._start()
        return await future

    def _start(self) -> None:
        while len(self._running) < self.slots and self._waiting:
            requests, self._waiting = self._waiting, []
            task = asyncio.get_running_loop().create_task(self._read(requests))
            self._running.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _read(self, requests: list[_Request]) -> None:
        # Requests arriving while this one gives way to an insert wait for
        # the next read (the slot is taken): they are combined there.
        await self.writes.turn()
        live = [(ids, f) for ids, f in requests if not f.done()]
        if not live:
            return
        wanted: set[str] = set()
        for ids, _ in live:
            wanted.update(ids)
        self.reads += 1
        self.requests += len(live)
        try:
            batches = await self.reader(wanted)
        except asyncio.CancelledError:
            for _, f in live:
                f.cancel()
            raise
        except Exception as exc:  # handed to each request, which answers it
            for _, f in live:
                if not f.done():
                    f.set_exception(exc)
            return
        by_id = {b.batch_id: b for b in batches}
        for _, f in live:
            if not f.done():
                f.set_result(by_id)

    async def aclose(self) -> None:
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        for _, f in self._waiting:
            f.cancel()
        self._waiting = []
