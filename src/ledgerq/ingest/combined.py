"""Store reads for status requests, combined.

At most ``slots`` reads run at once, so the store's connections stay free for
the pipeline whatever the number of status requests. Requests arriving while
the slots are taken wait, and are then read together: one query for all
their ids. Under a flood of status requests the per-query cost (the driver's
and PostgreSQL's) is paid once for many requests; a lone request is read at
once, as before. Beyond ``max_queued`` requests waiting for a read,
shared fairly among tenants (:class:`~ledgerq.ingest.fairness.Shares`),
:meth:`read` raises :class:`StatusQueueFull` (the API answers ``429``).

A failed read fails every request it served (each answers as it would
have alone); a request whose caller went away is dropped from its read's
answer, not from the read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection

from ledgerq.ingest.fairness import Shares
from ledgerq.model import TrackingBatch

BatchReader = Callable[[Collection[str]], Awaitable[list[TrackingBatch]]]
#: The ids asked, the answer's future, the tenant asking.
_Request = tuple[Collection[str], "asyncio.Future[dict[str, TrackingBatch]]", str]


class StatusQueueFull(Exception):
    """``max_queued`` status requests are waiting for a store read already."""


class CombinedReads:
    def __init__(self, reader: BatchReader, *, slots: int = 2, max_queued: int = 1_000) -> None:
        self.reader = reader
        self.slots = slots
        self.max_queued = max_queued
        #: Places of requests waiting for a read, by tenant.
        self.shares = Shares(max_queued)
        #: Queries made, and requests they served.
        self.reads = 0
        self.requests = 0
        self._waiting: list[_Request] = []
        self._running: set[asyncio.Task[None]] = set()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def read(self, ids: Collection[str], tenant: str = "") -> dict[str, TrackingBatch]:
        """The tracked batches among ``ids``, by batch id (possibly with
        others: do not change the dict), for ``tenant``."""
        if len(self._waiting) >= self.max_queued or not self.shares.take(tenant):
            raise StatusQueueFull
        future: asyncio.Future[dict[str, TrackingBatch]] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting.append((ids, future, tenant))
        self._start()
        return await future

    def _start(self) -> None:
        while len(self._running) < self.slots and self._waiting:
            requests, self._waiting = self._waiting, []
            for _ids, _future, tenant in requests:
                self.shares.give_back(tenant)  # waiting no more
            task = asyncio.get_running_loop().create_task(self._read(requests))
            self._running.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _read(self, requests: list[_Request]) -> None:
        live = [(ids, f) for ids, f, _tenant in requests if not f.done()]
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
        for _, f, tenant in self._waiting:
            f.cancel()
            self.shares.give_back(tenant)
        self._waiting = []
