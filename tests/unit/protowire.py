"""Protobuf wire encoding by hand, from the field numbers in the .proto files.

Independent of the generated classes and of ledgerq's builder, so the codec
is tested against the published format rather than against itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import coincurve

LEN = 2
VARINT = 0


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def ld(field: int, value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return key(field, LEN) + varint(len(raw)) + raw


def vint(field: int, n: int) -> bytes:
    return key(field, VARINT) + varint(n)


def sign(private_key: coincurve.PrivateKey, message: bytes) -> str:
    digest = hashlib.sha256(message).digest()
    return private_key.sign_recoverable(digest, hasher=None)[:64].hex()


def public_key(private_key: coincurve.PrivateKey) -> str:
    return private_key.public_key.format(compressed=True).hex()


def private_key(n: int) -> coincurve.PrivateKey:
    return coincurve.PrivateKey(n.to_bytes(32, "big"))


def transaction_header(
    *,
    batcher: str,
    signer: str,
    payload_sha512: str,
    family_name: str = "intkey",
    family_version: str = "1.0",
    inputs: Sequence[str] = (),
    outputs: Sequence[str] = (),
    dependencies: Sequence[str] = (),
    nonce: str = "",
    extra: bytes = b"",
) -> bytes:
    """A TransactionHeader: fields 1..7, 9, 10; empty proto3 fields omitted."""
    parts = [ld(1, batcher)]
    parts += [ld(2, d) for d in dependencies]
    parts += [ld(3, family_name), ld(4, family_version)]
    parts += [ld(5, a) for a in inputs]
    if nonce:
        parts.append(ld(6, nonce))
    parts += [ld(7, a) for a in outputs]
    parts += [ld(9, payload_sha512), ld(10, signer)]
    return b"".join(parts) + extra


def transaction(header: bytes, signature: str, payload: bytes) -> bytes:
    return ld(1, header) + ld(2, signature) + ld(3, payload)


def batch_header(signer: str, transaction_ids: Iterable[str], extra: bytes = b"") -> bytes:
    return ld(1, signer) + b"".join(ld(2, t) for t in transaction_ids) + extra


def batch(
    header: bytes, signature: str, transactions: Iterable[bytes], trace: bool = False
) -> bytes:
    out = ld(1, header) + ld(2, signature) + b"".join(ld(3, t) for t in transactions)
    return out + (vint(4, 1) if trace else b"")


def batch_list(batches: Iterable[bytes]) -> bytes:
    return b"".join(ld(1, b) for b in batches)


@dataclass
class HandTx:
    """A hand-encoded signed transaction and the values that went into it."""

    id: str
    header: bytes
    payload: bytes
    encoded: bytes


def hand_tx(
    key: coincurve.PrivateKey,
    payload: bytes,
    *,
    batcher: str | None = None,
    payload_sha512: str | None = None,
    nonce: str = "n0",
    signature: str | None = None,
    header: bytes | None = None,
    **fields: object,
) -> HandTx:
    if header is None:
        header = transaction_header(
            batcher=public_key(key) if batcher is None else batcher,
            signer=public_key(key),
            payload_sha512=(
                hashlib.sha512(payload).hexdigest() if payload_sha512 is None else payload_sha512
            ),
            nonce=nonce,
            **fields,  # type: ignore[arg-type]
        )
    tx_id = sign(key, header) if signature is None else signature
    return HandTx(tx_id, header, payload, transaction(header, tx_id, payload))


def hand_batch(
    key: coincurve.PrivateKey,
    txs: Sequence[HandTx],
    *,
    declared_ids: Sequence[str] | None = None,
    signature: str | None = None,
    header: bytes | None = None,
    signer: str | None = None,
    trace: bool = False,
) -> tuple[str, bytes]:
    """(batch id, encoded Batch)."""
    if header is None:
        header = batch_header(
            public_key(key) if signer is None else signer,
            [t.id for t in txs] if declared_ids is None else declared_ids,
        )
    batch_id = sign(key, header) if signature is None else signature
    return batch_id, batch(header, batch_id, [t.encoded for t in txs], trace)
