"""Decoding and verifying posted BatchLists off the node's event loop.

Checking a batch's secp256k1 signatures costs far more than ordering and
executing it, and the node's engines run on one thread. So a body of at
least ``pool_bytes`` is decoded and verified in a pool of worker
**processes** (``workers``, by default one per core but one: the event loop
keeps its own), which answers the decoded batches; the event loop only
unpickles them. Smaller bodies are decoded inline, where a round trip to
another process would cost more than it saves. The pool
(:class:`ledgerq.procpool.WorkerPool`) starts on first use (``spawn``: no
state of the node is copied into it) and stops with
:meth:`BatchDecoder.close`; on Linux its workers die with the node's process
(``PR_SET_PDEATHSIG``), so a node killed with SIGKILL leaves none behind.

Refusals are the same either way: the codec's
:class:`~ledgerq.errors.InvalidBatchError`, raised in the caller.

The decoded batches cross back pickled. The codec's frozen slotted
dataclasses pickle through ``dataclasses``' generic ``__getstate__`` and
``__setstate__``, which look up the fields of every object (about 20 µs
per transaction each way, measured); this module registers reducers that
pickle them as their constructor's arguments instead (about half of it),
in the node's process and in the workers, which import it to run
:func:`_decode`.
"""

from __future__ import annotations

import copyreg
import dataclasses
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

from ledgerq.codec import DEFAULT_MAX_BYTES, ParsedBatch, decode_batch_list
from ledgerq.codec.parsed import ParsedTransaction, TransactionHeader
from ledgerq.procpool import WorkerPool

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
        self.pool = WorkerPool(self.workers) if self.workers > 0 else None

    async def decode(self, body: bytes) -> Sequence[ParsedBatch]:
        """The verified batches of a BatchList (raises ``InvalidBatchError``)."""
        if len(body) < self.pool_bytes or self.pool is None:
            return decode_batch_list(body, max_bytes=self.max_bytes)
        return await self.pool.run(_decode, body, self.max_bytes)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _decode(body: bytes, max_bytes: int) -> Sequence[ParsedBatch]:
    return decode_batch_list(body, max_bytes=max_bytes)


def _reducer(cls: type) -> Callable[[Any], tuple[type, tuple[Any, ...]]]:
    values = operator.attrgetter(*(f.name for f in dataclasses.fields(cls)))

    def reduce(obj: Any) -> tuple[type, tuple[Any, ...]]:
        return cls, values(obj)

    return reduce


for _cls in (ParsedBatch, ParsedTransaction, TransactionHeader):
    copyreg.pickle(_cls, _reducer(_cls))
