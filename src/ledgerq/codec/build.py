"""Build and sign transactions, batches and BatchLists as the Sawtooth SDK does.

The builders do not check the rules :mod:`ledgerq.codec.decode` enforces (a
transaction may name another batcher, a batch may be empty), so tests can
build invalid input on purpose; decode what you build to check it.
Headers are serialized once and signed as serialized; ``ParsedBatch.serialized``
is the deterministic encoding of the ``Batch`` message.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence

from ledgerq.codec import batch_pb2, transaction_pb2
from ledgerq.codec.parsed import ParsedBatch, ParsedTransaction, TransactionHeader
from ledgerq.codec.signing import Signer
from ledgerq.codec.wire import BATCH_LIST_BATCHES_FIELD, join_repeated_field


def make_transaction(
    signer: Signer,
    *,
    family_name: str,
    family_version: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    payload: bytes,
    batcher_public_key: str | None = None,
    dependencies: Sequence[str] = (),
    nonce: str | None = None,
) -> ParsedTransaction:
    """A transaction signed by ``signer``; its batcher defaults to the same key."""
    header = TransactionHeader(
        batcher_public_key=signer.public_key if batcher_public_key is None else batcher_public_key,
        dependencies=tuple(dependencies),
        family_name=family_name,
        family_version=family_version,
        inputs=tuple(inputs),
        nonce=secrets.token_hex(16) if nonce is None else nonce,
        outputs=tuple(outputs),
        payload_sha512=hashlib.sha512(payload).hexdigest(),
        signer_public_key=signer.public_key,
    )
    header_bytes = transaction_pb2.TransactionHeader(
        batcher_public_key=header.batcher_public_key,
        dependencies=header.dependencies,
        family_name=header.family_name,
        family_version=header.family_version,
        inputs=header.inputs,
        nonce=header.nonce,
        outputs=header.outputs,
        payload_sha512=header.payload_sha512,
        signer_public_key=header.signer_public_key,
    ).SerializeToString(deterministic=True)
    return ParsedTransaction(
        header_signature=signer.sign(header_bytes),
        header=header,
        header_bytes=header_bytes,
        payload=bytes(payload),
    )


def transaction_message(tx: ParsedTransaction) -> transaction_pb2.Transaction:
    """The protobuf ``Transaction`` carrying ``tx``'s header bytes as signed."""
    return transaction_pb2.Transaction(
        header=tx.header_bytes, header_signature=tx.header_signature, payload=tx.payload
    )


def make_batch(
    signer: Signer, transactions: Sequence[ParsedTransaction], trace: bool = False
) -> ParsedBatch:
    """A batch of ``transactions`` in the given order, signed by ``signer``."""
    transaction_ids = tuple(tx.header_signature for tx in transactions)
    header_bytes = batch_pb2.BatchHeader(
        signer_public_key=signer.public_key, transaction_ids=transaction_ids
    ).SerializeToString(deterministic=True)
    header_signature = signer.sign(header_bytes)
    serialized = batch_pb2.Batch(
        header=header_bytes,
        header_signature=header_signature,
        transactions=[transaction_message(tx) for tx in transactions],
        trace=trace,
    ).SerializeToString(deterministic=True)
    return ParsedBatch(
        header_signature=header_signature,
        signer_public_key=signer.public_key,
        transaction_ids=transaction_ids,
        transactions=tuple(transactions),
        trace=trace,
        header_bytes=header_bytes,
        serialized=serialized,
    )


def encode_batch_list(batches: Iterable[ParsedBatch | bytes]) -> bytes:
    """A serialized ``BatchList`` of the batches (or serialized ``Batch`` messages).

    Each batch's bytes are copied unchanged, so a decoded batch re-encodes to
    exactly what its client sent.
    """
    return join_repeated_field(
        (b if isinstance(b, bytes) else b.serialized for b in batches),
        BATCH_LIST_BATCHES_FIELD,
    )
