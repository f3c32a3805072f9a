"""Decoding and verifying posted BatchLists off the node's event loop.

Checking a batch's secp256k1 signatures costs far more than ordering and
executing it, and the node's engines run on one thread. So a body of at
least ``pool_bytes`` is decoded and verified in a pool of worker
**processes** (``workers``, by default one per core but one: the event loop
keeps its own), which answers the decoded batches; the event loop only
unpickles them. Smaller bodies are decoded inline, where a round trip to
another process would cost more than it saves, one per pass of the event
loop (:class:`ledgerq.turns.OnePerPass`). The pool
(:class:`ledgerq.procpool.WorkerPool`) starts on first use (``spawn``: no
state of the node is copied into it) and stops with
:meth:`BatchDecoder.close`; on Linux its workers die with the node's process
(``PR_SET_PDEATHSIG``), so a node killed with SIGKILL leaves none behind.

Refusals are the same either way: the codec's
:class:`~ledgerq.errors.InvalidBatchError`, raised in the caller.

The decoded batches cross back as plain tuples of strings and bytes
(:func:`_flatten`), which pickle in C, and are built into the codec's
frozen dataclasses again in the node's process (:func:`_rebuild`). With
them, each transaction's ``prepared``: what its family's ``prepare`` (the
node's registry's :meth:`~ledgerq.node.families.FamilyRegistry.preparers`)
computed from its payload in the worker — for intkey the CBOR decoding and
checks, the SHA-512 address and the value a ``set`` stores — so the event
loop does only the part that needs state. Tuples, not
the dataclasses themselves (through reducers passing their constructors'
arguments): the worker pickles tuples in about half the time, flattening
included, and the node's process unpickles and builds either at the same
cost.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ledgerq.codec import DEFAULT_MAX_BYTES, ParsedBatch, decode_batch_list
from ledgerq.codec.parsed import ParsedTransaction, TransactionHeader
from ledgerq.codec.wire import BATCH_LIST_BATCHES_FIELD, repeated_field_spans
from ledgerq.procpool import WorkerPool
from ledgerq.turns import OnePerPass

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
        preparers: Mapping[tuple[str, str], Callable[[bytes], object]] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.preparers = dict(preparers or {})
        self.pool_bytes = pool_bytes
        self.workers = default_workers() if workers is None else workers
        self.pool = WorkerPool(self.workers) if self.workers > 0 else None
        # Bodies decoded on the event loop take turns, one per pass: decoded
        # all in one pass, posts of one batch each arriving together would keep
        # every request that came meanwhile waiting for all of them — a
        # survivor's read of the statuses of the batches it took over among
        # them (a status read takes no turn).
        self._inline = OnePerPass()

    @property
    def inline_waits(self) -> int:
        """Bodies that waited for another's decoding on the loop (for tests)."""
        return self._inline.waits

    async def decode(self, body: bytes) -> Sequence[ParsedBatch]:
        """The verified batches of a BatchList (raises ``InvalidBatchError``)."""
        if len(body) < self.pool_bytes or self.pool is None:
            return await self._inline.run(decode_batch_list, body, max_bytes=self.max_bytes)
        return _rebuild(await self.pool.run(_decode, body, self.max_bytes, self.preparers), body)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


Preparers = Mapping[tuple[str, str], Callable[[bytes], object]]


def _decode(body: bytes, max_bytes: int, preparers: Preparers | None = None) -> tuple[Any, ...]:
    batches = decode_batch_list(body, max_bytes=max_bytes)
    return _flatten(batches, preparers or {}, repeated_field_spans(body, BATCH_LIST_BATCHES_FIELD))


def _prepare(preparers: Preparers, header: TransactionHeader, payload: bytes) -> object:
    prepare = preparers.get((header.family_name, header.family_version))
    if prepare is None:
        return None
    try:
        return prepare(payload)
    except Exception:  # left to the handler's apply(), where it raises as it would
        return None


def _flatten(
    batches: Sequence[ParsedBatch],
    preparers: Preparers | None = None,
    spans: Sequence[tuple[int, int]] | None = None,
) -> tuple[Any, ...]:
    """The batches as tuples of their fields (in the dataclasses' order), each
    transaction with what its family prepared from its payload.

    ``spans``: where each batch lies in the body it was decoded from
    (:func:`~ledgerq.codec.wire.repeated_field_spans`); given, a batch's
    ``serialized`` crosses as its ``(start, end)`` there, and
    :func:`_rebuild` slices it from its own copy of the body. That is a third
    of a result's bytes, which keeps the result of a large POST within what
    the pool's pipe holds, so the worker writes it at once instead of
    waiting for the node's process to read it a piece at a time
    (:func:`ledgerq.procpool.widen_pipes`)."""
    preparers = preparers or {}
    if spans is not None and len(spans) != len(batches):
        raise ValueError(f"{len(spans)} spans for {len(batches)} batches")
    return tuple(
        (
            b.header_signature,
            b.signer_public_key,
            b.transaction_ids,
            tuple(
                (
                    t.header_signature,
                    h.batcher_public_key,
                    h.dependencies,
                    h.family_name,
                    h.family_version,
                    h.inputs,
                    h.nonce,
                    h.outputs,
                    h.payload_sha512,
                    h.signer_public_key,
                    t.header_bytes,
                    t.payload,
                    _prepare(preparers, h, t.payload) if preparers else None,
                )
                for t in b.transactions
                for h in (t.header,)
            ),
            b.trace,
            b.header_bytes,
            b.serialized if spans is None else spans[i],
        )
        for i, b in enumerate(batches)
    )


def _rebuild(flat: tuple[Any, ...], body: bytes | None = None) -> tuple[ParsedBatch, ...]:
    """The batches :func:`_flatten` took apart (``body``: the one decoded, where
    it sent spans)."""
    header, transaction, batch = TransactionHeader, ParsedTransaction, ParsedBatch
    return tuple(
        batch(
            bid,
            signer,
            ids,
            tuple(
                transaction(
                    tid, header(bk, dep, fam, ver, ins, nonce, outs, sha, key), hb, pl, prep
                )
                for tid, bk, dep, fam, ver, ins, nonce, outs, sha, key, hb, pl, prep in txs
            ),
            trace,
            batch_header,
            serialized if body is None else body[serialized[0] : serialized[1]],
        )
        for bid, signer, ids, txs, trace, batch_header, serialized in flat
    )
