"""Group commit of the API's inserts (``add_batches``).

The requests that arrive while one insert commits are inserted together, in
arrival order, in one transaction (:class:`GroupInserter`). The pipeline's
writes are group-committed by :class:`ledgerq.record.completer.Completer`.
"""

from __future__ import annotations

import asyncio

from ledgerq.errors import (
    DuplicateBatchError,
    StoreError,
    StoreInputError,
    StoreUnavailableError,
)
from ledgerq.model import TrackingBatch
from ledgerq.queue.ahead import Successors
from ledgerq.store import common
from ledgerq.store.base import BatchAcceptor

_Request = tuple[list[TrackingBatch], int | None, "asyncio.Future[list[TrackingBatch]]"]


def _named_request(group: list[_Request], refusal: StoreError) -> int | None:
    """The index of the first request holding the batch ``refusal`` names, if any."""
    named = getattr(refusal, "batch_id", None)
    if named is None:
        return None
    for index, (batches, _, _) in enumerate(group):
        if any(b.batch_id == named for b in batches):
            return index
    return None


class GroupInserter:
    """Group commit of ``add_batches``: the requests that arrive while one
    insert commits are inserted together, in arrival order, in one
    transaction.

    If the combined insert is refused (a duplicate, a value the schema cannot
    hold), the request holding the batch the refusal names is inserted alone
    and the requests before and after it together, each part the same way, in
    order (halves when no batch is named): the refusal ends up with the
    request it concerns alone, naming its offender, and the others land as if
    alone. A client re-posting a list it already sent (a retry) costs its
    group three or four inserts, not one per request.

    A database failure is no refusal of the input: when an insert fails
    with :class:`~ledgerq.errors.StoreUnavailableError` (no primary
    answers, the connection broke), every request of its group, and every
    request queued behind it, fails with it at once. Trying them again one
    by one, each waiting for the database in turn, would keep their
    clients, and every POST arriving meanwhile, waiting that many times
    longer for the same 503. Whether the failed insert committed is
    unknown: a client posting the same list again is answered as for a
    retry (the batches are held, or they are inserted now).
    """

    def __init__(
        self,
        store: BatchAcceptor,
        *,
        max_batches: int = 10_000,
        successors: Successors | None = None,
    ) -> None:
        """``successors``: told of every batch inserted (the guesses of the
        pipeline's read-ahead, :class:`ledgerq.queue.ahead.NextReader`)."""
        self._store = store
        self._max_batches = max_batches
        self._successors = successors
        self._queue: list[
            tuple[list[TrackingBatch], int | None, asyncio.Future[list[TrackingBatch]]]
        ]
        self._queue = []
        self._running = False
        self.groups = 0

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        if not self._running and not self._queue:
            # Nothing in progress: insert at once, without a task in between.
            self._running = True
            try:
                self.groups += 1
                return self._added(await self._store.add_batches(batches, now=now))
            except StoreUnavailableError as exc:
                self._fail_queued(exc)
                raise
            finally:
                self._running = False
                self._start()
        future: asyncio.Future[list[TrackingBatch]] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queue.append((batches, now, future))
        self._start()
        return await asyncio.shield(future)

    def _start(self) -> None:
        if self._queue and not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._queue:
                group = [self._queue.pop(0)]
                size = len(group[0][0])
                while self._queue and size + len(self._queue[0][0]) <= self._max_batches:
                    size += len(self._queue[0][0])
                    group.append(self._queue.pop(0))
                await self._insert(group)
        finally:
            self._running = False

    async def _insert(self, group: list[_Request]) -> None:
        self.groups += 1
        try:
            await self._insert_part(group)
        except StoreUnavailableError as exc:
            for _, _, future in group:
                if not future.done():
                    future.set_exception(exc)
            self._fail_queued(exc)

    def _fail_queued(self, exc: StoreUnavailableError) -> None:
        """Every request queued behind an insert the database failed fails with it."""
        queued, self._queue = self._queue, []
        for _, _, future in queued:
            if not future.done():
                future.set_exception(exc)

    async def _insert_part(self, group: list[_Request]) -> None:
        if len(group) == 1:
            batches, now, future = group[0]
            try:
                result = await self._store.add_batches(batches, now=now)
            except StoreUnavailableError:
                raise  # every request waiting hears it (_insert)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
            else:
                self._added(result)
                if not future.done():
                    future.set_result(result)
            return
        # Each request keeps its own acceptance time.
        combined = [
            b if now is None else common.with_defaults(b, now)
            for batches, now, _ in group
            for b in batches
        ]
        try:
            stored = await self._store.add_batches(combined)
        except (DuplicateBatchError, StoreInputError) as exc:
            # The request the refusal names goes alone, those before and after it
            # together; unnamed, halves. In order either way, until the refusal
            # reaches the request it concerns.
            at = _named_request(group, exc)
            if at is None:
                half = len(group) // 2
                parts = [group[:half], group[half:]]
            else:
                parts = [group[:at], group[at : at + 1], group[at + 1 :]]
            for part in parts:
                if part:
                    await self._insert_part(part)
            return
        except StoreUnavailableError:
            raise  # the database, not the input: every request waiting hears it (_insert)
        except StoreError:
            # Neither the database nor a refusal it names: each request tries
            # alone and hears its own outcome.
            for request in group:
                await self._insert_part([request])
            return
        self._added(stored)
        at = 0
        for batches, _, future in group:
            if not future.done():
                future.set_result(stored[at : at + len(batches)])
            at += len(batches)

    def _added(self, stored: list[TrackingBatch]) -> list[TrackingBatch]:
        if self._successors is not None:
            self._successors.added(stored)
        return stored
