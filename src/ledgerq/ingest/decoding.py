"""Decoding and verifying large posted BatchLists in worker processes.

A 10 MiB BatchList costs seconds of CPU to decode and verify (tens of
thousands of secp256k1 signatures). On the event loop that stalls every
request and claim renewal; on threads it still competes with the loop for
the GIL (protobuf parsing holds it), and a few hostile posts at once slow
the whole gateway. So bodies of at least ``pool_bytes`` go to ``slots``
worker **processes** (:class:`ledgerq.procpool.WorkerPool`: started on first
use, dying with the gateway) at a lower scheduling priority
(``decode_priority``, by default ``idle``: ``SCHED_IDLE``): under load the pipeline's own
processes get the CPU first, the decoding waits. More posts than slots wait
their turn (an ``asyncio.Semaphore``), without blocking anything else; a
post whose client goes away while it waits is dropped when its turn comes
(nothing decoded, nothing stored: the client got no ``202``, so it posts
again if it still means to).
Refusals are the codec's :class:`~ledgerq.errors.InvalidBatchError` either
way, raised in the caller.

Measured (docs/BENCHMARKS.md, "Hostile clients"): one 10 MiB list decoded
inline blocked the loop for its whole decode; on a thread the loop's worst
stall was tens of milliseconds, on a process less.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from ledgerq.codec import parse_batch_list
from ledgerq.model import TrackingBatch
from ledgerq.procpool import Priority, WorkerPool

#: Bodies at least this large are decoded in a worker process (about 100
#: single-transaction batches; below, the round trip costs more than it saves).
POOL_BYTES = 64 * 1024
#: The workers' default scheduling priority (``decode_priority``).
DEFAULT_PRIORITY = Priority.parse("idle")


class ClientGone(Exception):
    """The client of a waiting post went away: nothing was decoded, nothing is stored."""


class BatchListDecoder:
    def __init__(
        self,
        *,
        max_bytes: int,
        slots: int = 2,
        pool_bytes: int = POOL_BYTES,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> None:
        self.max_bytes = max_bytes
        self.slots = slots
        self.pool_bytes = pool_bytes
        self._turns = asyncio.Semaphore(slots)
        self.pool = WorkerPool(slots, priority=priority)
        #: Bodies decoded in the pool (for tests and metrics).
        self.pooled = 0
        #: Bodies dropped because their client left while they waited their turn.
        self.abandoned = 0
        #: Bodies waiting for their turn now.
        self.waiting = 0

    async def decode(
        self, body: bytes, service_id: str | None, *, gone: Callable[[], bool] = lambda: False
    ) -> Sequence[TrackingBatch]:
        """The list's verified batches for ``service_id`` (raises ``InvalidBatchError``).

        ``gone``: whether the client has gone away; checked when the body's
        turn comes, so that a post abandoned while it waited costs no
        decoding (raises :class:`ClientGone`)."""
        if len(body) < self.pool_bytes:
            return parse_batch_list(body, service_id, max_bytes=self.max_bytes)
        self.waiting += 1
        try:
            await self._turns.acquire()
        finally:
            self.waiting -= 1
        try:
            if gone():
                self.abandoned += 1
                raise ClientGone("the client went away before its BatchList's turn to be verified")
            self.pooled += 1
            return await self.pool.run(parse_batch_list_in_worker, body, service_id, self.max_bytes)
        finally:
            self._turns.release()

    def close(self) -> None:
        self.pool.close()


def parse_batch_list_in_worker(
    body: bytes, service_id: str | None, max_bytes: int
) -> Sequence[TrackingBatch]:
    return parse_batch_list(body, service_id, max_bytes=max_bytes)
