"""Group commit of the pipeline's writes, and of the API's inserts.

:class:`GroupCommitWriter` offers the recorder's store role
(``change_batch_to_submitted``, ``update_batch_status``) on top of a store's
:meth:`~ledgerq.store.base.GroupWriter.apply_writes`: every call queues its
write and waits for it; a flusher takes everything queued and applies it in
one transaction. With nothing in progress a write is flushed at once (no
added latency when idle); under load, the writes that arrive while a group
commits form the next group, so the number of commits per second stays
bounded whatever the number of batches.

Each caller still gets its own outcome: the error its single call would have
raised (unknown batch, fenced off, final status) is raised to that caller
only; a database failure is raised to every caller of the group. A write a
caller stops waiting for (cancelled) still lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator, Sequence

from ledgerq.errors import WRITE_REFUSALS, DuplicateBatchError, StoreError, StoreInputError
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    Fence,
    SubmissionError,
    TrackingBatch,
    TransactionReceipt,
)
from ledgerq.store import common
from ledgerq.store.base import BatchAcceptor, GroupWriter

#: Writes applied in one transaction at most.
DEFAULT_MAX_GROUP = 512

#: Set by :func:`urgent`: the next write of the task skips the queue.
_URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("ledgerq_urgent", default=False)


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """Writes started in this context — the first of each task (tasks
    created inside it inherit it) — form a group of their own, flushed at
    once beside the groups under way rather than queued behind them: a
    take-over's recorded answers, which hold a dead instance's services up,
    do not wait for the writes of a thousand other services."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


#: Batches :class:`Successors` holds at most, and their bytes (the signed
#: batch and the payloads); past either, it starts again empty.
MAX_SUCCESSORS = 10_000
MAX_SUCCESSOR_BYTES = 64 * 1024 * 1024


def _size(batch: TrackingBatch) -> int:
    return len(batch.serialized_batch) + sum(len(t.payload) for t in batch.transactions)


class Successors:
    """Per batch inserted through this process, the batch of its service
    inserted right after it, as stored (filled by :class:`GroupInserter`).

    The guess :meth:`GroupCommitWriter.next_open_batch` tries before reading
    the store: after batch *n* of a serial service was taken, the next open
    batch is usually the one inserted after it. A guess is never trusted: a
    conditional take of it (``BatchWrite.after``) lands only if the store,
    in the take's own transaction, finds it the service's next batch
    (``next_open_checks``); otherwise the take is refused and the usual path
    runs. A stored batch never changes but for its state, which the check
    reads. Bounded: at ``max_size`` batches (or services), or ``max_bytes``,
    it forgets everything.
    """

    def __init__(
        self, max_size: int = MAX_SUCCESSORS, max_bytes: int = MAX_SUCCESSOR_BYTES
    ) -> None:
        self._max_size = max_size
        self._max_bytes = max_bytes
        self._after: dict[str, TrackingBatch] = {}
        self._last: dict[str, str] = {}
        self._bytes = 0

    def added(self, batches: Sequence[TrackingBatch]) -> None:
        """``batches`` were inserted (committed), in this order."""
        size = sum(_size(b) for b in batches)
        if (
            len(self._after) + len(batches) > self._max_size
            or len(self._last) + len(batches) > self._max_size
            or self._bytes + size > self._max_bytes
        ):
            self._after.clear()
            self._last.clear()
            self._bytes = 0
            if len(batches) > self._max_size or size > self._max_bytes:
                return
        last = self._last
        after = self._after
        for b in batches:
            before = last.get(b.service_id)
            if before is not None:
                after[before] = b
            last[b.service_id] = b.batch_header
        # Counted whole (a first batch of a service holds nothing yet): an
        # upper bound of what is held until the next start again.
        self._bytes += size

    def pop(self, batch_id: str) -> TrackingBatch | None:
        """The batch inserted after ``batch_id`` in its service, if known (once)."""
        found = self._after.pop(batch_id, None)
        if found is not None:
            self._bytes -= _size(found)
        return found

    def __len__(self) -> int:
        return len(self._after)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class GroupCommitWriter:
    def __init__(
        self, store: GroupWriter, *, max_group: int = DEFAULT_MAX_GROUP, flushers: int = 1
    ) -> None:
        """``flushers``: groups committing at once (more than one suits a
        server database with a connection pool; SQLite has one writer)."""
        if max_group < 1 or flushers < 1:
            raise ValueError("max_group and flushers must be at least 1")
        self._store = store
        self._max_group = max_group
        self._flushers = flushers
        self._queue: list[tuple[BatchWrite, asyncio.Future[None]]] = []
        self._urgent: list[tuple[BatchWrite, asyncio.Future[None]]] = []
        self._urgent_running = False
        #: Writes that must share a group with the write queued after them.
        self._linked: set[int] = set()
        #: next_open_batch calls waiting for a read, and whether one is under way.
        self._reads: list[tuple[str, str, asyncio.Future[TrackingBatch | None]]] = []
        self._reading = False
        self._running = 0
        self.groups = 0
        self.writes = 0
        #: Guesses for next_open_batch, filled by a GroupInserter given them.
        self.successors = Successors()
        self.guessed = 0

    async def change_batch_to_submitted(
        self,
        batch_id: str,
        service_id: str,
        transaction_receipts: list[TransactionReceipt] | None = None,
        dlt_status: str | BatchStatusName | None = None,
        submission_error: SubmissionError | None = None,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        status = None if dlt_status is None else common.status_name_of(dlt_status)
        await self.write(
            BatchWrite(
                service_id,
                batch_id,
                status,
                tuple(transaction_receipts or ()),
                submission_error,
                attempt=True,
                now=now,
                fence=fence,
            )
        )

    async def update_batch_status(
        self,
        id: str,
        service_id: str,
        status: BatchStatus | None,
        transaction_receipts: list[TransactionReceipt] | None = None,
        submission_error: SubmissionError | None = None,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        await self.write(
            BatchWrite(
                service_id,
                id,
                status,
                tuple(transaction_receipts or ()),
                submission_error,
                now=now,
                fence=fence,
            )
        )

    async def write(self, write: BatchWrite) -> None:
        """Queue ``write``; return once its group committed (or raise its error)."""
        # Awaited directly, not shielded: a caller that stops waiting cancels
        # its future, which the group then skips (its write still lands), and
        # the caller wakes one loop step sooner once its group committed.
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if _URGENT.get():
            # This task's later writes (and tasks it creates from now on) queue as usual.
            _URGENT.set(False)
            self._urgent.append((write, future))
            if not self._urgent_running:
                self._urgent_running = True
                asyncio.get_running_loop().create_task(self._flush_urgent())
            await future
            return
        self._queue.append((write, future))
        if self._running < self._flushers:
            self._running += 1
            asyncio.get_running_loop().create_task(self._flush())
        await future

    async def next_open_batch(self, service_id: str, after: str) -> TrackingBatch | None:
        """The store's :meth:`~ledgerq.store.base.GroupWriter.next_open_batch`,
        read together with the other calls that arrive while one read is
        under way (``next_open_batches``: one query for all, one pair per
        service; a second pair of a service waits for the next read).

        First, without a read, the batch inserted after ``after`` in its
        service (:attr:`successors`), when known: a guess, which the
        conditional take of :meth:`status_then_take` checks in its own
        transaction before it lands."""
        guess = self.successors.pop(after)
        if guess is not None and guess.service_id == service_id:
            # Checked by the take itself (Successors): no read.
            self.guessed += 1
            return guess
        future: asyncio.Future[TrackingBatch | None] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._reads.append((service_id, after, future))
        if not self._reading:
            self._reading = True
            asyncio.get_running_loop().create_task(self._read_loop())
        return await asyncio.shield(future)

    async def _read_loop(self) -> None:
        try:
            while self._reads:
                group: dict[str, tuple[str, asyncio.Future[TrackingBatch | None]]] = {}
                later = []
                for service_id, after, future in self._reads:
                    if service_id in group or len(group) >= self._max_group:
                        later.append((service_id, after, future))
                    else:
                        group[service_id] = (after, future)
                self._reads = later
                try:
                    found = await self._store.next_open_batches(
                        [(service_id, after) for service_id, (after, _) in group.items()]
                    )
                except Exception as exc:
                    for _, future in group.values():
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for service_id, (_, future) in group.items():
                    if not future.done():
                        future.set_result(found.get(service_id))
        finally:
            self._reading = False

    async def status_then_take(
        self,
        id: str,
        service_id: str,
        status: BatchStatus,
        transaction_receipts: list[TransactionReceipt],
        next_batch_id: str,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> bool:
        """``update_batch_status`` of a final status, and batch ``next_batch_id``
        recorded taken (an attempt) in the same group, if the store still finds
        it the service's next batch then (``BatchWrite.after``). Raises what
        the status write would; returns whether the take landed."""
        first, take = await self.write_together(
            [
                BatchWrite(
                    service_id,
                    id,
                    status,
                    tuple(transaction_receipts),
                    now=now,
                    fence=fence,
                ),
                BatchWrite(service_id, next_batch_id, attempt=True, now=now, fence=fence, after=id),
            ]
        )
        if first is not None:
            raise first
        return take is None

    @property
    def takes_freed(self) -> bool:
        """Whether :meth:`status_then_take_freed` can take anything (the
        store's ``takes_freed``: PostgreSQL)."""
        return bool(getattr(self._store, "takes_freed", False))

    async def status_then_take_freed(
        self,
        id: str,
        service_id: str,
        status: BatchStatus,
        transaction_receipts: list[TransactionReceipt],
        take: int,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> list[TrackingBatch]:
        """``update_batch_status`` of a final status, and in the same group up
        to ``take`` of the batches it frees recorded taken
        (``BatchWrite.take_freed``); returns those, fully loaded, in
        acceptance order. Raises what the status write would."""
        freed: list[TrackingBatch] = []
        await self.write(
            BatchWrite(
                service_id,
                id,
                status,
                tuple(transaction_receipts),
                now=now,
                fence=fence,
                take_freed=take,
                freed=freed,
            )
        )
        return freed

    async def write_together(self, writes: Sequence[BatchWrite]) -> list[BaseException | None]:
        """Queue ``writes`` into one group (one transaction, in this order among
        themselves); return each one's error or ``None`` once it committed. A
        failure of the whole group is raised."""
        loop = asyncio.get_running_loop()
        urgent = _URGENT.get()
        if urgent:
            _URGENT.set(False)
        queue = self._urgent if urgent else self._queue
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
        if urgent and not self._urgent_running:
            self._urgent_running = True
            asyncio.get_running_loop().create_task(self._flush_urgent())
        elif not urgent and self._running < self._flushers:
            self._running += 1
            asyncio.get_running_loop().create_task(self._flush())
        # They land in one group, whose outcomes are set in order: once the
        # last is done, all are. A caller that stops waiting cancels only the
        # last future; every write still lands.
        with contextlib.suppress(Exception):  # each outcome is looked at below
            await futures[-1]
        errors: list[BaseException | None] = []
        for f in futures:
            error = f.exception()
            if error is not None and not isinstance(error, WRITE_REFUSALS):
                raise error
            errors.append(error)
        return errors

    def _next_group(
        self, queue: list[tuple[BatchWrite, asyncio.Future[None]]]
    ) -> list[tuple[BatchWrite, asyncio.Future[None]]]:
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

    async def _apply(self, group: Sequence[tuple[BatchWrite, asyncio.Future[None]]]) -> None:
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
    """

    def __init__(
        self,
        store: BatchAcceptor,
        *,
        max_batches: int = 10_000,
        successors: Successors | None = None,
    ) -> None:
        """``successors``: told of every batch inserted (a
        :attr:`GroupCommitWriter.successors`)."""
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
        await self._insert_part(group)

    async def _insert_part(self, group: list[_Request]) -> None:
        if len(group) == 1:
            batches, now, future = group[0]
            try:
                result = await self._store.add_batches(batches, now=now)
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
        except StoreError:
            # Not the input: each request tries alone and hears its own outcome.
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
