"""A Sawtooth batch as a transaction candidate.

* The candidate's id is the batch id; its label is the union of the
  transactions' ``inputs`` (eager reads: every input is fetched before the
  code runs, as Sawtooth's context would) and ``outputs`` (may-writes).
* Its code runs the transactions in order through their family handler, each
  confined to its own inputs and outputs, seeing the writes of the earlier
  ones. The batch is atomic: the first invalid transaction makes the batch
  INVALID with that transaction's id and message, and nothing is written.
* Addresses shorter than 70 hex characters are namespace prefixes. The node
  locks single keys only, so such a batch is INVALID with a message saying to
  list full addresses (it is still ordered and reported like any other).
* A batch the node refused before ordering it (``refusal``: a transaction
  already in the chain, say) is a candidate with an empty label whose code
  fails at once with that transaction's id and message: it is ordered,
  journaled and reported like any other, and touches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from ledgerq.codec import ParsedBatch
from ledgerq.node.families import Context, FamilyRegistry, InvalidTransaction
from ledgerq.node.ordering.messages import (
    InvalidTx,
    KVSDatum,
    KVSKey,
    Program,
    ProgramResult,
    TransactionCandidate,
    TransactionLabel,
)

_ADDRESS = re.compile(r"[0-9a-f]{70}")
#: Inputs and outputs a Context looks up as the header's tuples, not as sets.
_SMALL = 8


def batch_candidate(
    batch: ParsedBatch, registry: FamilyRegistry, refusal: InvalidTx | None = None
) -> TransactionCandidate:
    reads: set[str] = set()
    writes: set[str] = set()
    problem: InvalidTx | None = refusal
    for tx in () if refusal is not None else batch.transactions:
        for kind, addresses, into in (
            ("inputs", tx.header.inputs, reads),
            ("outputs", tx.header.outputs, writes),
        ):
            for address in addresses:
                if _ADDRESS.fullmatch(address):
                    into.add(address)
                elif problem is None:
                    problem = InvalidTx(tx.header_signature, _prefix_message(kind, address))
    if problem is not None:
        failed = problem

        def refuse() -> Program:
            return ProgramResult(success=False, invalid=(failed,), log=(failed.message,))
            yield  # pragma: no cover - makes this a generator

        return TransactionCandidate(batch.header_signature, TransactionLabel(), refuse)
    label = TransactionLabel(eager_read=frozenset(reads), may_write=frozenset(writes))

    def run() -> Program:
        values: dict[KVSKey, KVSDatum | None] = {}
        for address in sorted(reads):
            values[address] = yield address
        return apply_batch(batch, registry, values)

    return TransactionCandidate(batch.header_signature, label, run)


def apply_batch(
    batch: ParsedBatch, registry: FamilyRegistry, values: Mapping[KVSKey, KVSDatum | None]
) -> ProgramResult:
    """Run a batch's transactions in order over ``values``; atomic."""
    overlay: dict[KVSKey, KVSDatum] = {}
    log: list[str] = []
    for tx in batch.transactions:
        header = tx.header
        handler = registry.get(header.family_name, header.family_version)
        try:
            if handler is None:
                raise InvalidTransaction(
                    f"no transaction processor for family {header.family_name!r} "
                    f"version {header.family_version!r} on this node"
                )
            inputs: Collection[str] = header.inputs
            outputs: Collection[str] = header.outputs
            if len(inputs) > _SMALL or len(outputs) > _SMALL:
                inputs, outputs = frozenset(inputs), frozenset(outputs)
            context = Context(inputs, outputs, values, overlay)
            prepared = tx.prepared  # see FamilyRegistry.preparers
            if prepared is None:
                handler.apply(tx, context)
            else:
                handler.apply_prepared(tx, prepared, context)  # type: ignore[attr-defined]
        except InvalidTransaction as exc:
            message = str(exc)
            log.append(f"{tx.header_signature}: invalid: {message}")
            invalid = InvalidTx(tx.header_signature, message, exc.extended_data)
            return ProgramResult(success=False, invalid=(invalid,), log=tuple(log))
        log.append(f"{tx.header_signature}: ok")
    return ProgramResult(writes=overlay, log=tuple(log))


def _prefix_message(kind: str, address: str) -> str:
    if re.fullmatch(r"[0-9a-f]*", address) and len(address) < 70:
        return (
            f"{kind} address {address!r} is a namespace prefix; this node locks single "
            "addresses only: list the full 70-character address of every entry touched"
        )
    return f"{kind} address {address!r} is not a 70-character lowercase hex state address"
