"""The values the codec produces: a batch and its transactions, decoded.

They keep the exact bytes that were signed (``header_bytes``) and, for a
batch, the exact bytes of the ``Batch`` message (``serialized``), so a batch
can be stored and forwarded to a ledger byte for byte as the client sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TransactionHeader:
    """A decoded ``TransactionHeader`` (field numbers in ``proto/transaction.proto``)."""

    batcher_public_key: str
    dependencies: tuple[str, ...]
    family_name: str
    family_version: str
    inputs: tuple[str, ...]
    nonce: str
    outputs: tuple[str, ...]
    payload_sha512: str
    signer_public_key: str


@dataclass(frozen=True, slots=True)
class ParsedTransaction:
    #: The transaction id: the signature of ``header_bytes``.
    header_signature: str
    header: TransactionHeader
    #: The serialized header exactly as signed.
    header_bytes: bytes
    payload: bytes
    #: What the node's decoding worker computed from ``payload`` for the
    #: transaction's family (see :meth:`ledgerq.node.families.FamilyRegistry.preparers`),
    #: so the node's event loop need not; ``None`` when nothing was. Not compared.
    prepared: object = field(default=None, compare=False, repr=False)

    @property
    def transaction_id(self) -> str:
        return self.header_signature


@dataclass(frozen=True, slots=True)
class ParsedBatch:
    #: The batch id: the signature of ``header_bytes``.
    header_signature: str
    signer_public_key: str
    transaction_ids: tuple[str, ...]
    transactions: tuple[ParsedTransaction, ...]
    trace: bool
    #: The serialized ``BatchHeader`` exactly as signed.
    header_bytes: bytes
    #: This ``Batch`` message alone, protobuf-encoded, exactly as received.
    serialized: bytes

    @property
    def batch_id(self) -> str:
        return self.header_signature
