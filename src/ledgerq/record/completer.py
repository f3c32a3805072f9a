"""The completer: every pipeline write, group-committed through one verb.

:class:`Completer` applies :class:`~ledgerq.model.BatchWrite` s (built by
:mod:`ledgerq.record.writes`) with the store's ``apply_writes``: each call
queues its writes and waits for them; a flusher takes everything queued and
applies it in one transaction. With nothing in progress a write is flushed
at once (no added latency when idle); under load, the writes that arrive
while a group commits form the next group, so the number of commits per
second stays bounded whatever the number of batches.

Guarantees a caller relies on:

* **One outcome per write.** The refusal its single write would get (unknown
  batch, fenced off, final status: :data:`~ledgerq.errors.WRITE_REFUSALS`)
  is raised to that caller only; a database failure to every caller of the
  group. A write a caller stops waiting for (cancelled) still lands.
* **A batch's writes land in the order they were made.** A write waits for
  the writes of its batches made before it (taken without yielding when
  free, so the order is the order of the calls): an ``UNKNOWN`` answer still
  in flight when the batch is taken again lands before that take, not after
  it, where it would clear ``submitted`` on a batch the ledger now holds.
* **Writes made together land together** (:meth:`Completer.apply_together`):
  one transaction, in their order.
* **Urgent writes** (:func:`urgent`) form a group of their own, flushed at
  once beside the groups under way: a take-over's recorded answers, which
  hold a dead instance's services up, do not wait for a thousand other
  services' writes.

Under high availability every write carries its claim's
:class:`~ledgerq.model.Fence`; the store refuses it once the claim moved on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, Protocol

from ledgerq.errors import WRITE_REFUSALS, StoreError
from ledgerq.model import BatchWrite

#: Writes applied in one transaction at most.
DEFAULT_MAX_GROUP = 512

#: Set by :func:`urgent`: the next write of the task skips the queue.
_URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("ledgerq_urgent", default=False)


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """Writes started in this context — the first of each task (tasks
    created inside it inherit it) — form a group of their own, flushed at
    once beside the groups under way rather than queued behind them."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


class WriteStore(Protocol):
    """The store role of the completer: its one write verb."""

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]: ...


_Queued = tuple[BatchWrite, "asyncio.Future[None]"]


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class _Order:
    """Per batch, the last write made of it that has not landed yet."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, asyncio.Future[None]] = {}

    def before(self, batch_ids: Sequence[str]) -> list[asyncio.Future[None]]:
        return [f for b in batch_ids if (f := self._last.get(b)) is not None and not f.done()]

    def made(self, batch_ids: Sequence[str], done: asyncio.Future[None]) -> None:
        for b in batch_ids:
            self._last[b] = done
        done.add_done_callback(lambda f: self._forget(batch_ids, f))

    def _forget(self, batch_ids: Sequence[str], done: asyncio.Future[None]) -> None:
        for b in batch_ids:
            if self._last.get(b) is done:
                del self._last[b]


class Completer:
    def __init__(
        self, store: WriteStore, *, max_group: int = DEFAULT_MAX_GROUP, flushers: int = 1
    ) -> None:
        """``flushers``: groups committing at once (more than one suits a
        server database with a connection pool; SQLite has one writer)."""
        if max_group < 1 or flushers < 1:
            raise ValueError("max_group and flushers must be at least 1")
        self._store = store
        self._max_group = max_group
        self._flushers = flushers
        self._queue: list[_Queued] = []
        self._urgent: list[_Queued] = []
        self._urgent_running = False
        #: Writes that must share a group with the write queued after them.
        self._linked: set[int] = set()
        self._order = _Order()
        self._running = 0
        self._flushing: set[asyncio.Task[None]] = set()
        self.groups = 0
        self.writes = 0

    async def apply(self, write: BatchWrite) -> None:
        """Apply ``write``; return once its group committed (or raise its refusal)."""
        [error] = await self.apply_together([write])
        if error is not None:
            raise error

    async def apply_together(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        """Apply ``writes`` in one group (one transaction, in this order);
        return each one's refusal or ``None`` once it committed. A failure of
        the whole group is raised."""
        batch_ids = sorted({w.id for w in writes})
        earlier = self._order.before(batch_ids)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._order.made(batch_ids, done)
        try:
            if earlier:
                # Waited for, never cancelled from here: they are other callers'.
                await asyncio.wait(earlier)
            return await self._queue_writes(writes)
        finally:
            done.set_result(None)

    async def _queue_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        loop = asyncio.get_running_loop()
        urgent_now = _URGENT.get()
        if urgent_now:
            # This task's later writes (and tasks it creates from now on) queue as usual.
            _URGENT.set(False)
        queue = self._urgent if urgent_now else self._queue
        futures: list[asyncio.Future[None]] = []
        for w in writes:
            future: asyncio.Future[None] = loop.create_future()
            if futures:
                # Not awaited below (the last one is): retrieved here, so a
                # caller that stopped waiting leaves no warning.
                futures[-1].add_done_callback(_retrieve)
                self._linked.add(id(futures[-1]))
            futures.append(future)
            queue.append((w, future))
        if urgent_now and not self._urgent_running:
            self._urgent_running = True
            self._start(self._flush_urgent())
        elif not urgent_now and self._running < self._flushers:
            self._running += 1
            self._start(self._flush())
        # They land in one group, whose outcomes are set in order: once the
        # last is done, all are. A caller that stops waiting cancels only the
        # last future; every write still lands.
        with contextlib.suppress(Exception):  # each outcome is looked at below
            await futures[-1]
        errors: list[StoreError | None] = []
        for f in futures:
            error = f.exception()
            if error is not None and not isinstance(error, WRITE_REFUSALS):
                raise error
            errors.append(error if isinstance(error, StoreError) else None)
        return errors

    def _start(self, flush: Coroutine[Any, Any, None]) -> None:
        # Kept until done: a flusher ends once its queue is empty.
        task = asyncio.get_running_loop().create_task(flush)
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    def _next_group(self, queue: list[_Queued]) -> list[_Queued]:
        size = self._max_group
        if self._linked:
            # Linked writes stay in one group, past the limit if need be.
            while size < len(queue) and id(queue[size - 1][1]) in self._linked:
                size += 1
        group = queue[:size]
        del queue[:size]
        if self._linked:
            for _, future in group:
                self._linked.discard(id(future))
        return group

    async def _flush(self) -> None:
        try:
            while self._queue:
                await self._apply(self._next_group(self._queue))
                if self._queue:
                    # The writers of the group just committed run first (a
                    # next batch's POST among them), then the next group: on
                    # SQLite its statements run on the event loop, and would
                    # otherwise hold those writers up.
                    await asyncio.sleep(0)
        finally:
            self._running -= 1

    async def _flush_urgent(self) -> None:
        try:
            while self._urgent:
                await self._apply(self._next_group(self._urgent))
        finally:
            self._urgent_running = False

    async def _apply(self, group: Sequence[_Queued]) -> None:
        self.groups += 1
        self.writes += len(group)
        try:
            results = await self._store.apply_writes([w for w, _ in group])
        except BaseException as exc:
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), error in zip(group, results, strict=True):
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
