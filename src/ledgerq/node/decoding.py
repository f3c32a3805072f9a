"""Decoding and verifying posted BatchLists off the node's event loop.

Checking a batch's secp256k1 signatures costs far more than ordering and
executing it, and the node's engines run on one thread. So a body of at
least ``pool_bytes`` is decoded and verified in a pool of worker
**processes** (``workers``, by default one per core but one: the event loop
keeps its own), which answers the decoded batches; the event loop only
unpickles them. Smaller bodies are decoded inline, where a round trip to
another process would cost more than it saves. The pool starts on first use
(``spawn``: no state of the node is copied into it) and stops with
:meth:`BatchDecoder.close`; on Linux its workers die with the node's process
(``PR_SET_PDEATHSIG``), so a node killed with SIGKILL leaves none behind.

Refusals are the same either way: the codec's
:class:`~ledgerq.errors.InvalidBatchError`, raised in the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from ledgerq.codec import DEFAULT_MAX_BYTES, ParsedBatch, decode_batch_list
from ledgerq.errors import InvalidBatchError

#: Bodies at least this large go to the pool (about 40 single-transaction batches).
DEFAULT_POOL_BYTES = 16 * 1024


def default_workers() -> int:
    return max(1, (os.cpu_count() or 1) - 1)


class BatchDecoder:
    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        pool_bytes: int = DEFAULT_POOL_BYTES,
        workers: int | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.pool_bytes = pool_bytes
        self.workers = default_workers() if workers is None else workers
        self._pool: ProcessPoolExecutor | None = None

    async def decode(self, body: bytes) -> Sequence[ParsedBatch]:
        """The verified batches of a BatchList (raises ``InvalidBatchError``)."""
        if len(body) < self.pool_bytes or self.workers == 0:
            return decode_batch_list(body, max_bytes=self.max_bytes)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_die_with,
                initargs=(os.getpid(),),
            )
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._pool, _decode, body, self.max_bytes)
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


_PR_SET_PDEATHSIG = 1


def _die_with(node_pid: int) -> None:
    """In a worker: SIGKILL it when the node's process dies (Linux), starting now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != node_pid:
        os._exit(1)  # the node died before we could watch it


@dataclass(frozen=True, slots=True)
class _Refusal:
    """An ``InvalidBatchError`` as it crosses back from a worker process."""

    message: str
    rule: str
    batch_id: str | None
    transaction_id: str | None


def _decode(body: bytes, max_bytes: int) -> Sequence[ParsedBatch] | _Refusal:
    try:
        return decode_batch_list(body, max_bytes=max_bytes)
    except InvalidBatchError as exc:
        return _Refusal(str(exc), exc.rule, exc.batch_id, exc.transaction_id)
