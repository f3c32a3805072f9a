"""BatchLists encoded by hand from the .proto field numbers must decode exactly."""

from __future__ import annotations

import hashlib

import pytest
from protowire import (
    batch,
    batch_header,
    batch_list,
    hand_batch,
    hand_tx,
    ld,
    private_key,
    public_key,
    sign,
    transaction,
    transaction_header,
    vint,
)

from ledgerq.codec import (
    decode_batch,
    decode_batch_list,
    encode_batch_list,
    parse_batch_list,
)
from ledgerq.codec.intkey import encode_payload, make_address
from ledgerq.errors import InvalidBatchError
from ledgerq.model import NO_SERVICE

ALICE = private_key(1)
BOB = private_key(2)


def test_hand_encoded_batch_list_decodes_to_its_fields() -> None:
    payload = encode_payload("set", "x", 7)
    address = make_address("x")
    dep = "ab" * 64
    tx_header = transaction_header(
        batcher=public_key(BOB),
        signer=public_key(ALICE),
        payload_sha512=hashlib.sha512(payload).hexdigest(),
        family_name="intkey",
        family_version="1.0",
        inputs=[address, "1cf126"],
        outputs=[address],
        dependencies=[dep],
        nonce="nonce-1",
    )
    tx_id = sign(ALICE, tx_header)
    b_header = batch_header(public_key(BOB), [tx_id])
    batch_id = sign(BOB, b_header)
    encoded_batch = batch(b_header, batch_id, [transaction(tx_header, tx_id, payload)], trace=True)
    data = batch_list([encoded_batch])

    (parsed,) = decode_batch_list(data)

    assert parsed.header_signature == batch_id
    assert parsed.signer_public_key == public_key(BOB)
    assert parsed.transaction_ids == (tx_id,)
    assert parsed.trace is True
    assert parsed.header_bytes == b_header
    assert parsed.serialized == encoded_batch
    (tx,) = parsed.transactions
    assert tx.header_signature == tx_id
    assert tx.header_bytes == tx_header
    assert tx.payload == payload
    h = tx.header
    assert h.batcher_public_key == public_key(BOB)
    assert h.signer_public_key == public_key(ALICE)
    assert h.dependencies == (dep,)
    assert (h.family_name, h.family_version) == ("intkey", "1.0")
    assert h.inputs == (address, "1cf126")
    assert h.outputs == (address,)
    assert h.nonce == "nonce-1"
    assert h.payload_sha512 == hashlib.sha512(payload).hexdigest()


def test_several_batches_keep_their_order_and_bytes() -> None:
    batches = [hand_batch(ALICE, [hand_tx(ALICE, b"p%d" % i, nonce=str(i))]) for i in range(5)]
    data = batch_list(encoded for _, encoded in batches)

    parsed = decode_batch_list(data)

    assert [p.header_signature for p in parsed] == [batch_id for batch_id, _ in batches]
    assert [p.serialized for p in parsed] == [encoded for _, encoded in batches]
    assert encode_batch_list(parsed) == data
    assert encode_batch_list(p.serialized for p in parsed) == data


def test_fields_in_any_order_and_unknown_fields_are_accepted_and_kept() -> None:
    payload = b"opaque"
    # Unknown fields inside the signed headers: the signature covers them.
    tx_header = transaction_header(
        batcher=public_key(ALICE),
        signer=public_key(ALICE),
        payload_sha512=hashlib.sha512(payload).hexdigest(),
        extra=vint(15, 3) + ld(16, b"future"),
    )
    tx_id = sign(ALICE, tx_header)
    b_header = batch_header(public_key(ALICE), [tx_id], extra=ld(9, "x"))
    batch_id = sign(ALICE, b_header)
    # Batch fields out of numeric order, plus an unknown varint and fixed32 field.
    encoded_batch = (
        vint(4, 0)
        + ld(3, transaction(tx_header, tx_id, payload))
        + vint(20, 99)
        + bytes([8 << 3 | 5])
        + b"\x01\x02\x03\x04"
        + ld(2, batch_id)
        + ld(1, b_header)
    )
    # An unknown field at the BatchList level too.
    data = vint(7, 1) + batch_list([encoded_batch])

    (parsed,) = decode_batch_list(data)

    assert parsed.header_signature == batch_id
    assert parsed.serialized == encoded_batch
    assert parsed.transactions[0].header_bytes == tx_header
    assert decode_batch(parsed.serialized) == parsed


def test_without_a_service_id_batches_get_the_no_service_sentinel() -> None:
    _, encoded = hand_batch(ALICE, [hand_tx(ALICE, b"x")])

    (tracked,) = parse_batch_list(batch_list([encoded]))

    assert tracked.service_id == NO_SERVICE
    assert tracked.transactions[0].service_id == NO_SERVICE


def test_parse_batch_list_builds_tracking_batches() -> None:
    txs = [hand_tx(ALICE, b"a", nonce="1"), hand_tx(ALICE, b"b", nonce="2")]
    batch_id, encoded = hand_batch(ALICE, txs, trace=True)

    (tracked,) = parse_batch_list(batch_list([encoded]), "circuit-abc::svc0", created_at=1234)

    assert tracked.batch_header == batch_id
    assert tracked.service_id == "circuit-abc::svc0"
    assert tracked.signer_public_key == public_key(ALICE)
    assert tracked.trace is True
    assert tracked.serialized_batch == encoded
    assert tracked.created_at == 1234
    assert tracked.submitted is False
    assert tracked.batch_status is None
    assert tracked.data_change_id is None
    assert [t.transaction_header for t in tracked.transactions] == [t.id for t in txs]
    assert [t.payload for t in tracked.transactions] == [b"a", b"b"]
    assert {t.service_id for t in tracked.transactions} == {"circuit-abc::svc0"}
    assert {(t.family_name, t.family_version) for t in tracked.transactions} == {("intkey", "1.0")}
    assert {t.signer_public_key for t in tracked.transactions} == {public_key(ALICE)}


@pytest.mark.parametrize("max_bytes", [1, 100])
def test_limit_counts_the_whole_body(max_bytes: int) -> None:
    _, encoded = hand_batch(ALICE, [hand_tx(ALICE, b"x" * 200)])
    data = batch_list([encoded])
    assert decode_batch_list(data, max_bytes=len(data))
    with pytest.raises(InvalidBatchError, match="over the limit"):
        decode_batch_list(data, max_bytes=max_bytes)


def test_non_minimal_varints_are_accepted_and_bytes_kept() -> None:
    # Protobuf parsers accept over-long (but at most 10-byte) varints; so must we.
    _, encoded = hand_batch(ALICE, [hand_tx(ALICE, b"x")])
    length = len(encoded)
    padded_length = bytes([(length & 0x7F) | 0x80, (length >> 7) | 0x80, 0x80, 0x00])
    data = b"\x0a" + padded_length + encoded

    (parsed,) = decode_batch_list(data)

    assert parsed.serialized == encoded
