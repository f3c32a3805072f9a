"""A Sawtooth batch as a transaction candidate.

* The candidate's id is the batch id; its label is the union of the
  transactions' ``inputs`` (eager reads: every input address is fetched
  before the code runs, as Sawtooth's context would) and ``outputs``
  (may-writes).
* An entry of ``inputs`` or ``outputs`` is a state address (70 lowercase hex
  characters) or a namespace prefix: an even number of lowercase hex
  characters, fewer than 70, the empty prefix included (what Sawtooth's
  context manager accepts, ``([0-9a-f]{2}){0,35}``). A prefix covers every
  address that begins with it: it goes to the label's read or write
  prefixes, and an address under an input prefix is fetched when a
  transaction first reads it. Any other entry makes the batch INVALID,
  naming the entry (it is still ordered and reported like any other).
* Its code runs the transactions in order through their family handler, each
  confined to its own inputs and outputs (addresses and the addresses under
  its prefixes), seeing the writes of the earlier ones. A transaction that
  reads under a prefix an address not fetched yet is run again from its
  start once the value is there (:class:`~ledgerq.node.families.Unfetched`).
  The batch is atomic: the first invalid transaction makes the batch
  INVALID with that transaction's id and message, and nothing is written.
* A batch the node refused before ordering it (``refusal``: a transaction
  already in the chain, say) is a candidate with an empty label whose code
  fails at once with that transaction's id and message: it is ordered,
  journaled and reported like any other, and touches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from ledgerq.codec import ParsedBatch, ParsedTransaction
from ledgerq.node.families import Context, FamilyRegistry, InvalidTransaction, Unfetched
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
#: A namespace prefix as Sawtooth's context manager takes it: whole bytes, fewer than 35.
_PREFIX = re.compile(r"(?:[0-9a-f]{2}){0,34}")
#: Inputs and outputs a Context looks up as the header's tuples, not as sets.
_SMALL = 8


def batch_candidate(
    batch: ParsedBatch, registry: FamilyRegistry, refusal: InvalidTx | None = None
) -> TransactionCandidate:
    reads: set[str] = set()
    writes: set[str] = set()
    read_prefixes: set[str] = set()
    write_prefixes: set[str] = set()
    problem: InvalidTx | None = refusal
    for tx in () if refusal is not None else batch.transactions:
        for kind, addresses, into, prefixes in (
            ("inputs", tx.header.inputs, reads, read_prefixes),
            ("outputs", tx.header.outputs, writes, write_prefixes),
        ):
            for address in addresses:
                if _ADDRESS.fullmatch(address):
                    into.add(address)
                elif _PREFIX.fullmatch(address):
                    prefixes.add(address)
                elif problem is None:
                    problem = InvalidTx(tx.header_signature, _entry_message(kind, address))
    if problem is not None:
        failed = problem

        def refuse() -> Program:
            return ProgramResult(success=False, invalid=(failed,), log=(failed.message,))
            yield  # pragma: no cover - makes this a generator

        return TransactionCandidate(batch.header_signature, TransactionLabel(), refuse)
    prefixed = bool(read_prefixes or write_prefixes)
    if prefixed:
        label = TransactionLabel(
            eager_read=frozenset(reads),
            may_write=frozenset(writes),
            read_prefixes=frozenset(read_prefixes),
            write_prefixes=frozenset(write_prefixes),
        )
    else:
        label = TransactionLabel(eager_read=frozenset(reads), may_write=frozenset(writes))

    def run() -> Program:
        values: dict[KVSKey, KVSDatum | None] = {}
        for address in sorted(reads):
            values[address] = yield address
        if read_prefixes:
            return (yield from run_batch(batch, registry, values))
        # Every read is in ``values``; entries are all addresses unless prefixed.
        return apply_batch(batch, registry, values, prefixed=prefixed)

    return TransactionCandidate(batch.header_signature, label, run)


def apply_batch(
    batch: ParsedBatch,
    registry: FamilyRegistry,
    values: Mapping[KVSKey, KVSDatum | None],
    *,
    prefixed: bool = True,
) -> ProgramResult:
    """Run a batch's transactions in order over ``values``, which holds every
    address they read (one it lacks has no value); atomic. ``prefixed=False``
    says that no entry of the batch is a namespace prefix."""
    known = values
    overlay: dict[KVSKey, KVSDatum] = {}
    log: list[str] = []
    for tx in batch.transactions:
        while True:
            try:
                failure = _apply_transaction(tx, registry, known, overlay, log, prefixed)
            except Unfetched as unfetched:
                known = {**known, unfetched.address: None}
                continue
            break
        if failure is not None:
            return failure
    return ProgramResult(writes=overlay, log=tuple(log))


def run_batch(
    batch: ParsedBatch, registry: FamilyRegistry, values: dict[KVSKey, KVSDatum | None]
) -> Program:
    """Run a batch's transactions in order over ``values``; atomic.

    Yields each address under an input prefix that a transaction reads and
    ``values`` lacks, and is sent its value (added to ``values``); the
    transaction then runs again from its start.
    """
    overlay: dict[KVSKey, KVSDatum] = {}
    log: list[str] = []
    for tx in batch.transactions:
        while True:
            try:
                failure = _apply_transaction(tx, registry, values, overlay, log, True)
            except Unfetched as unfetched:
                values[unfetched.address] = yield unfetched.address
                continue
            break
        if failure is not None:
            return failure
    return ProgramResult(writes=overlay, log=tuple(log))


def _apply_transaction(
    tx: ParsedTransaction,
    registry: FamilyRegistry,
    values: Mapping[KVSKey, KVSDatum | None],
    overlay: dict[KVSKey, KVSDatum],
    log: list[str],
    prefixed: bool,
) -> ProgramResult | None:
    """Apply one transaction (entries as :func:`batch_candidate` admits them)
    over ``overlay`` and ``values``: ``None`` when it succeeded (its writes
    are in ``overlay``), else the failed batch's result. Raises
    :class:`Unfetched` before any write reaches ``overlay``."""
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
        input_prefixes = _prefixes(inputs) if prefixed else ()
        output_prefixes = _prefixes(outputs) if prefixed else ()
        if input_prefixes or output_prefixes:
            # A transaction that may be run again writes apart until it succeeds.
            writes: dict[KVSKey, KVSDatum] = {} if input_prefixes else overlay
            context = Context(
                frozenset(inputs).difference(input_prefixes),
                frozenset(outputs).difference(output_prefixes),
                values,
                overlay,
                writes=writes,
                input_prefixes=input_prefixes,
                output_prefixes=output_prefixes,
            )
        else:
            if len(inputs) > _SMALL or len(outputs) > _SMALL:
                inputs, outputs = frozenset(inputs), frozenset(outputs)
            writes = overlay
            context = Context(inputs, outputs, values, overlay)
        prepared = tx.prepared  # see FamilyRegistry.preparers
        if prepared is None:
            handler.apply(tx, context)
        else:
            handler.apply_prepared(tx, prepared, context)  # type: ignore[attr-defined]
        if writes is not overlay:
            overlay.update(writes)
    except InvalidTransaction as exc:
        message = str(exc)
        log.append(f"{tx.header_signature}: invalid: {message}")
        invalid = InvalidTx(tx.header_signature, message, exc.extended_data)
        return ProgramResult(success=False, invalid=(invalid,), log=tuple(log))
    log.append(f"{tx.header_signature}: ok")
    return None


def _prefixes(entries: Collection[str]) -> tuple[str, ...]:
    """The namespace prefixes among a transaction's checked ``entries``."""
    for entry in entries:
        if len(entry) != 70:
            return tuple(e for e in entries if len(e) != 70)
    return ()


def _entry_message(kind: str, entry: str) -> str:
    shown = entry if len(entry) <= 80 else entry[:77] + "..."
    return (
        f"{kind} entry {shown!r} is neither a state address (70 lowercase hex characters) "
        "nor a namespace prefix (an even number of lowercase hex characters, fewer than 70)"
    )
