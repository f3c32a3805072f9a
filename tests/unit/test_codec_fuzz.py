"""Mutated encodings: the decoder either accepts or raises InvalidBatchError, nothing else."""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protowire import batch_list, hand_batch, hand_tx, private_key, public_key

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


_SIGNATURE_RULES = {"bad_batch_signature", "bad_transaction_signature"}


def _only_invalid_batch_error(data: bytes) -> None:
    try:
        unverified = decode_batch_list(data, verify=False)
    except InvalidBatchError:
        unverified = None
    try:
        batches = decode_batch_list(data)
    except InvalidBatchError as exc:
        rule = exc.rule
    else:
        rule = None
    # verify=False differs only by skipping signature checks.
    if rule is not None:
        assert unverified is None or rule in _SIGNATURE_RULES, rule
        return
    assert unverified == batches
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


_KEYS = [private_key(n) for n in (21, 22, 23)]
_text = st.text(max_size=30)


@st.composite
def hand_encoded_batch(draw: st.DrawFn) -> tuple[bytes, dict[str, object]]:
    """A valid batch of random content, hand-encoded, with the values it holds."""
    batcher = draw(st.sampled_from(_KEYS))
    txs = []
    for n in range(draw(st.integers(1, 4))):
        fields = {
            "family_name": draw(_text),
            "family_version": draw(_text),
            "inputs": draw(st.lists(_text, max_size=3)),
            "outputs": draw(st.lists(_text, max_size=3)),
            "dependencies": draw(st.lists(st.sampled_from(["ab" * 64, "cd" * 64]), max_size=2)),
        }
        txs.append(
            hand_tx(
                draw(st.sampled_from(_KEYS)),
                draw(st.binary(max_size=64)),
                batcher=public_key(batcher),
                nonce=f"{n}-{draw(_text)}",
                **fields,
            )
        )
    trace = draw(st.booleans())
    batch_id, encoded = hand_batch(batcher, txs, trace=trace)
    return encoded, {"id": batch_id, "txs": txs, "trace": trace, "signer": public_key(batcher)}


@settings(max_examples=100, deadline=None)
@given(st.lists(hand_encoded_batch(), min_size=1, max_size=3))
def test_random_valid_batches_decode_to_what_was_encoded(
    items: list[tuple[bytes, dict[str, object]]],
) -> None:
    # Distinct nonces per position do not make ids distinct across batches.
    ids = [meta["id"] for _, meta in items]
    if len(set(ids)) != len(ids):
        return
    parsed = decode_batch_list(batch_list(encoded for encoded, _ in items))
    for batch, (encoded, meta) in zip(parsed, items, strict=True):
        assert batch.header_signature == meta["id"]
        assert batch.signer_public_key == meta["signer"]
        assert batch.trace == meta["trace"]
        assert batch.serialized == encoded
        txs = meta["txs"]
        assert isinstance(txs, list)
        assert [t.header_signature for t in batch.transactions] == [t.id for t in txs]
        assert [t.header_bytes for t in batch.transactions] == [t.header for t in txs]
        assert [t.payload for t in batch.transactions] == [t.payload for t in txs]


@_FUZZ
@given(st.binary(max_size=200), st.booleans())
def test_signed_garbage_headers_raise_only_invalid_batch_error(
    header: bytes, in_transaction: bool
) -> None:
    # Correctly signed, so decoding gets past the signature to the header itself.
    key = _KEYS[0]
    if in_transaction:
        tx = hand_tx(key, b"p", header=header)
        _, encoded = hand_batch(key, [tx])
    else:
        _, encoded = hand_batch(key, [hand_tx(key, b"p")], header=header)
    _only_invalid_batch_error(batch_list([encoded]))
