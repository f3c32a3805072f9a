"""Group commit of the pipeline's writes.

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
from collections.abc import Sequence

from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    Fence,
    SubmissionError,
    TransactionReceipt,
)
from ledgerq.store import common
from ledgerq.store.base import BatchWrite, GroupWriter

#: Writes applied in one transaction at most.
DEFAULT_MAX_GROUP = 512


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
        self._running = 0
        self.groups = 0
        self.writes = 0

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
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Retrieved here so a caller that stopped waiting leaves no warning.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queue.append((write, future))
        if self._running < self._flushers:
            self._running += 1
            asyncio.get_running_loop().create_task(self._flush())
        await asyncio.shield(future)

    async def _flush(self) -> None:
        try:
            while self._queue:
                group = self._queue[: self._max_group]
                del self._queue[: self._max_group]
                await self._apply(group)
        finally:
            self._running -= 1

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
