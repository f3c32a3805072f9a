"""The Sawtooth batch codec: decode, verify, build and sign ``BatchList`` messages.

Wire format: ``proto/batch.proto`` and ``proto/transaction.proto`` (Hyperledger
Sawtooth 1.x). Signatures are secp256k1 ECDSA over SHA-256 of the serialized
header, 64-byte compact, low ``s``, in lowercase hex; keys are 33-byte
compressed points in lowercase hex.

Decoding verifies every rule listed in :mod:`ledgerq.codec.decode` and raises
:class:`~ledgerq.errors.InvalidBatchError` (with ``rule``, ``batch_id`` and
``transaction_id``) on the first one broken; any other exception is a bug.
Decoded batches keep their bytes exactly as sent. See ``docs/codec.md``.

May import: ``model`` and ``errors`` only.
"""

from ledgerq.codec.build import encode_batch_list, make_batch, make_transaction
from ledgerq.codec.decode import (
    DEFAULT_MAX_BYTES,
    decode_batch,
    decode_batch_list,
    parse_batch_list,
    to_tracking_batch,
)
from ledgerq.codec.parsed import ParsedBatch, ParsedTransaction, TransactionHeader
from ledgerq.codec.signing import Signer, verify_signature

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ParsedBatch",
    "ParsedTransaction",
    "Signer",
    "TransactionHeader",
    "decode_batch",
    "decode_batch_list",
    "encode_batch_list",
    "make_batch",
    "make_transaction",
    "parse_batch_list",
    "to_tracking_batch",
    "verify_signature",
]
