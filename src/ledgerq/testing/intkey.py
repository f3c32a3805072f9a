"""IntegerKey (``intkey`` 1.0) executed as the spec says, and the order it saw per key.

:class:`IntkeyState` applies a batch atomically: every transaction valid, or
none applied and the first failure reported. Because a workload of ``set
name 0`` followed by ``inc name 1``s is valid only in its order, executing
it here turns any reorder into an ``INVALID`` batch and any double execution
into a wrong final value. :attr:`IntkeyState.order` lists, per name, the
batches committed that touched it, in commit order — what a per-key
ordering rule is judged on.

Transactions of other families are committed without effect (the fault
ledger is not their judge).
"""

from __future__ import annotations

from dataclasses import dataclass

import cbor2

from ledgerq.codec import ParsedBatch
from ledgerq.codec.intkey import FAMILY_NAME, MAX_NAME_LENGTH, MAX_VALUE, VERBS


@dataclass(frozen=True, slots=True)
class TxFailure:
    transaction_id: str
    message: str


@dataclass(frozen=True, slots=True)
class Op:
    verb: str
    name: str
    value: int


def parse_op(payload: bytes) -> Op:
    """The payload's ``{"Verb", "Name", "Value"}``; ``ValueError`` naming what is wrong."""
    if not payload:
        raise ValueError("the payload is empty")
    try:
        doc = cbor2.loads(payload)
    except Exception as exc:  # cbor2 raises several types for bad input
        raise ValueError(f"the payload is not CBOR: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("the payload is not a CBOR map")
    verb, name, value = doc.get("Verb"), doc.get("Name"), doc.get("Value")
    if verb not in VERBS:
        raise ValueError(f"Verb {verb!r} is not one of {', '.join(VERBS)}")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"Name {name!r} must be 1 to {MAX_NAME_LENGTH} characters")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_VALUE:
        raise ValueError(f"Value {value!r} is not a 32-bit unsigned integer")
    return Op(verb, name, value)


def names_of(batch: ParsedBatch) -> tuple[str, ...]:
    """The intkey names a batch touches (those whose payload parses), in order."""
    out: list[str] = []
    for tx in batch.transactions:
        if tx.header.family_name != FAMILY_NAME:
            continue
        try:
            name = parse_op(tx.payload).name
        except ValueError:
            continue
        if name not in out:
            out.append(name)
    return tuple(out)


class IntkeyState:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        #: name -> ids of the committed batches that touched it, in commit order.
        self.order: dict[str, list[str]] = {}

    def apply(self, batch: ParsedBatch) -> TxFailure | None:
        """Commit ``batch`` (all or nothing); the first failure if it is invalid."""
        staged: dict[str, int] = {}
        touched: list[str] = []
        for tx in batch.transactions:
            if tx.header.family_name != FAMILY_NAME:
                continue
            failure = self._stage(tx.header_signature, tx.payload, staged)
            if isinstance(failure, TxFailure):
                return failure
            if failure not in touched:
                touched.append(failure)
        self.values.update(staged)
        for name in touched:
            self.order.setdefault(name, []).append(batch.header_signature)
        return None

    def _stage(self, tx_id: str, payload: bytes, staged: dict[str, int]) -> TxFailure | str:
        try:
            op = parse_op(payload)
        except ValueError as exc:
            return TxFailure(tx_id, str(exc))
        current = staged.get(op.name, self.values.get(op.name))
        if op.verb == "set":
            if current is not None:
                return TxFailure(tx_id, f"Verb is 'set' but Name {op.name!r} already in state")
            staged[op.name] = op.value
            return op.name
        if current is None:
            return TxFailure(tx_id, f"Verb is {op.verb!r} but Name {op.name!r} not in state")
        result = current + op.value if op.verb == "inc" else current - op.value
        if not 0 <= result <= MAX_VALUE:
            return TxFailure(tx_id, f"{op.verb} of {op.name!r} would leave {result}, out of range")
        staged[op.name] = result
        return op.name
