"""Decoding and verifying large posted BatchLists in worker processes.

A 10 MiB BatchList costs seconds of CPU to decode and verify (tens of
thousands of secp256k1 signatures). On the event loop that stalls every
request and claim renewal; on threads it still competes with the loop for
the GIL (protobuf parsing holds it), and a few hostile posts at once slow
the whole gateway. So bodies of at least ``pool_bytes`` go to ``slots``
worker **processes**, started on first use (``spawn``: nothing of the
gateway is copied) at a lower scheduling priority (``nice``): under load the
pipeline's own processes get the CPU first, the decoding waits. More posts
than slots wait their turn (an ``asyncio.Semaphore``), without blocking
anything else. Refusals are the codec's :class:`~ledgerq.errors.InvalidBatchError`
either way, raised in the caller.

Measured (docs/BENCHMARKS.md, "Hostile clients"): one 10 MiB list decoded
inline blocked the loop for its whole decode; on a thread the loop's worst
stall was tens of milliseconds, on a process less.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from ledgerq.codec import parse_batch_list
from ledgerq.errors import InvalidBatchError
from ledgerq.model import TrackingBatch

#: Bodies at least this large are decoded in a worker process (about 100
#: single-transaction batches; below, the round trip costs more than it saves).
POOL_BYTES = 64 * 1024
#: How much lower the workers' scheduling priority is.
WORKER_NICENESS = 10


@dataclass(frozen=True, slots=True)
class _Refusal:
    """An ``InvalidBatchError`` as it crosses back from a worker."""

    message: str
    rule: str
    batch_id: str | None
    transaction_id: str | None


def _lower_priority() -> None:
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICENESS)


def _parse(
    body: bytes, service_id: str | None, max_bytes: int
) -> Sequence[TrackingBatch] | _Refusal:
    try:
        return parse_batch_list(body, service_id, max_bytes=max_bytes)
    except InvalidBatchError as exc:
        return _Refusal(str(exc), exc.rule, exc.batch_id, exc.transaction_id)


class BatchListDecoder:
    def __init__(self, *, max_bytes: int, slots: int = 2, pool_bytes: int = POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self.slots = slots
        self.pool_bytes = pool_bytes
        self._turns = asyncio.Semaphore(slots)
        self._pool: ProcessPoolExecutor | None = None
        #: Bodies decoded in the pool (for tests and metrics).
        self.pooled = 0

    async def decode(self, body: bytes, service_id: str | None) -> Sequence[TrackingBatch]:
        """The list's verified batches for ``service_id`` (raises ``InvalidBatchError``)."""
        if len(body) < self.pool_bytes:
            return parse_batch_list(body, service_id, max_bytes=self.max_bytes)
        async with self._turns:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.slots,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_lower_priority,
                )
            self.pooled += 1
            result = await asyncio.get_running_loop().run_in_executor(
                self._pool, _parse, body, service_id, self.max_bytes
            )
        if isinstance(result, _Refusal):
            raise InvalidBatchError(
                result.message,
                rule=result.rule,
                batch_id=result.batch_id,
                transaction_id=result.transaction_id,
            )
        return result

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
