"""Mutated encodings: the decoder either accepts or raises InvalidBatchError, nothing else."""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protowire import batch_list, hand_batch, hand_tx, private_key

from ledgerq.codec import Signer, decode_batch, decode_batch_list, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.errors import InvalidBatchError

_SIGNER = Signer.from_hex("11" * 32)
_KEY = private_key(5)
_BASES: list[bytes] = [
    encode_batch_list([make_intkey_batch(_SIGNER, [("set", "a", 1)])]),
    encode_batch_list(
        [
            make_intkey_batch(_SIGNER, [("set", "a", 1), ("inc", "a", 2)], trace=True),
            make_intkey_batch(_SIGNER, [("dec", "b", 3)]),
        ]
    ),
    batch_list([hand_batch(_KEY, [hand_tx(_KEY, b"x" * 40, nonce="n")])[1]]),
]

_FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(_BASES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        else:
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[pos : pos + len(chunk)] = chunk
    return bytes(data)


def _only_invalid_batch_error(data: bytes) -> None:
    try:
        batches = decode_batch_list(data)
    except InvalidBatchError:
        return
    # Whatever was accepted is valid and stable under re-encoding.
    assert decode_batch_list(encode_batch_list(batches)) == batches
    for b in batches:
        assert decode_batch(b.serialized) == b


@_FUZZ
@given(mutated())
def test_mutated_lists_raise_only_invalid_batch_error(data: bytes) -> None:
    _only_invalid_batch_error(data)


@_FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_invalid_batch_error(data: bytes) -> None:
    _only_invalid_batch_error(data)


@_FUZZ
@given(mutated())
def test_mutated_single_batches_raise_only_invalid_batch_error(data: bytes) -> None:
    # Feed the mutation as one Batch message rather than a BatchList.
    with contextlib.suppress(InvalidBatchError):
        decode_batch(data[2:])


def test_most_single_bit_flips_are_caught() -> None:
    # Exhaustive over one small list: every flipped bit is either rejected or
    # lands somewhere that does not change what was signed (e.g. the trace flag).
    base = _BASES[0]
    (original,) = decode_batch_list(base)
    accepted = 0
    for i in range(len(base) * 8):
        data = bytearray(base)
        data[i // 8] ^= 1 << (i % 8)
        try:
            (batch,) = decode_batch_list(bytes(data))
        except InvalidBatchError:
            continue
        accepted += 1
        assert batch.header_signature == original.header_signature
        assert batch.header_bytes == original.header_bytes
        assert [t.header_bytes for t in batch.transactions] == [
            t.header_bytes for t in original.transactions
        ]
        assert [t.payload for t in batch.transactions] == [t.payload for t in original.transactions]
    assert accepted < len(base)
