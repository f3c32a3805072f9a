"""Every rule the codec enforces: one failing input each, with the rule and the offender named."""

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
    vint,
)

from ledgerq.codec import decode_batch, decode_batch_list, parse_batch_list
from ledgerq.errors import InvalidBatchError
from ledgerq.model import MAX_SERVICE_ID_LENGTH

ALICE = private_key(11)
BOB = private_key(12)
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def rejects(data: bytes, rule: str, **kwargs: object) -> InvalidBatchError:
    with pytest.raises(InvalidBatchError) as info:
        decode_batch_list(data, **kwargs)  # type: ignore[arg-type]
    assert info.value.rule == rule, str(info.value)
    return info.value


def names_batch(exc: InvalidBatchError, batch_id: str) -> None:
    assert exc.batch_id == batch_id
    assert batch_id in str(exc)


def names_transaction(exc: InvalidBatchError, batch_id: str, tx_id: str) -> None:
    names_batch(exc, batch_id)
    assert exc.transaction_id == tx_id
    assert tx_id in str(exc)


def good_batch(key=ALICE, payload: bytes = b"p", nonce: str = "0") -> tuple[str, bytes]:  # type: ignore[no-untyped-def]
    return hand_batch(key, [hand_tx(key, payload, nonce=nonce)])


# --- the list ------------------------------------------------------------------------------


def test_a_valid_list_passes() -> None:
    batch_id, encoded = good_batch()
    assert decode_batch_list(batch_list([encoded]))[0].header_signature == batch_id


def test_empty_body_is_an_empty_list() -> None:
    rejects(b"", "empty_batch_list")


def test_list_with_only_unknown_fields_is_empty() -> None:
    rejects(vint(5, 1) + ld(6, b"x"), "empty_batch_list")


def test_over_size_body_is_refused_before_parsing() -> None:
    # Garbage: if it were parsed first the rule would be malformed_protobuf.
    exc = rejects(b"\xff" * 101, "too_large", max_bytes=100)
    assert "101 bytes" in str(exc)
    assert "100" in str(exc)


def test_default_limit_is_ten_mebibytes() -> None:
    rejects(b"\x00" * (10 * 1024 * 1024 + 1), "too_large")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x0a", id="tag-without-length"),
        pytest.param(b"\x0a\x05abc", id="length-past-end"),
        pytest.param(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", id="over-long-varint"),
        pytest.param(b"\x08\x01", id="batches-as-varint"),
        pytest.param(b"\x0b\x0c", id="group"),
        pytest.param(b"\x00\x00", id="field-zero"),
        pytest.param(b"\xde\xad\xbe\xef" * 8, id="garbage"),
    ],
)
def test_garbage_list_is_malformed(data: bytes) -> None:
    exc = rejects(data, "malformed_protobuf")
    assert "BatchList" in str(exc)


def test_truncated_list_is_malformed() -> None:
    _, encoded = good_batch()
    data = batch_list([encoded])
    for cut in range(1, len(data)):
        with pytest.raises(InvalidBatchError):
            decode_batch_list(data[:cut])
    rejects(data[:-1], "malformed_protobuf")


def test_batch_that_is_not_a_batch_message_is_malformed() -> None:
    _, good = good_batch()
    exc = rejects(batch_list([good, b"\x0a\x09abc"]), "malformed_protobuf")
    assert "batch #1" in str(exc)


def test_invalid_utf8_in_a_string_field_is_malformed() -> None:
    rejects(batch_list([ld(2, b"\xff\xfe" * 64)]), "malformed_protobuf")


def test_duplicate_batch_id_in_one_list() -> None:
    batch_id, encoded = good_batch()
    _, other = good_batch(nonce="1")
    exc = rejects(batch_list([encoded, other, encoded]), "duplicate_batch_id")
    names_batch(exc, batch_id)
    assert "#2" in str(exc)
    assert "#0" in str(exc)


# --- the batch -------------------------------------------------------------------------


def test_batch_without_transactions() -> None:
    batch_id, encoded = hand_batch(ALICE, [])
    names_batch(rejects(batch_list([encoded]), "empty_batch"), batch_id)


@pytest.mark.parametrize(
    "signature",
    [
        pytest.param("", id="missing"),
        pytest.param("ab" * 63, id="short"),
        pytest.param("ab" * 65, id="long"),
        pytest.param("AB" * 64, id="upper-case"),
        pytest.param("zz" * 64, id="not-hex"),
    ],
)
def test_malformed_batch_signature(signature: str) -> None:
    _, encoded = hand_batch(ALICE, [hand_tx(ALICE, b"p")], signature=signature)
    exc = rejects(batch_list([encoded]), "malformed_signature")
    assert exc.batch_id == (signature or None)
    assert "batch #0" in str(exc)
    assert exc.transaction_id is None


def test_batch_header_that_does_not_decode() -> None:
    header = b"\x0a\x40" + b"0" * 10  # signer_public_key claims 64 bytes, has 10
    batch_id, encoded = hand_batch(ALICE, [hand_tx(ALICE, b"p")], header=header)
    names_batch(rejects(batch_list([encoded]), "malformed_batch_header"), batch_id)


@pytest.mark.parametrize(
    "signer",
    [
        pytest.param("", id="missing"),
        pytest.param("02" + "ab" * 31, id="short"),
        pytest.param(private_key(11).public_key.format(compressed=False).hex(), id="uncompressed"),
        pytest.param("05" + "11" * 32, id="bad-prefix"),
        pytest.param(public_key(ALICE).upper(), id="upper-case"),
        pytest.param("xy" * 33, id="not-hex"),
    ],
)
def test_malformed_batch_signer_key(signer: str) -> None:
    batch_id, encoded = hand_batch(ALICE, [hand_tx(ALICE, b"p")], signer=signer)
    exc = rejects(batch_list([encoded]), "malformed_public_key")
    names_batch(exc, batch_id)


def test_batch_signed_by_another_key() -> None:
    tx = hand_tx(ALICE, b"p")
    header = batch_header(public_key(ALICE), [tx.id])
    forged = sign(BOB, header)
    _, encoded = hand_batch(ALICE, [tx], header=header, signature=forged)
    names_batch(rejects(batch_list([encoded]), "bad_batch_signature"), forged)


def test_batch_header_altered_after_signing() -> None:
    tx = hand_tx(ALICE, b"p")
    header = batch_header(public_key(ALICE), [tx.id])
    signature = sign(ALICE, header)
    altered = header + vint(9, 1)
    _, encoded = hand_batch(ALICE, [tx], header=altered, signature=signature)
    names_batch(rejects(batch_list([encoded]), "bad_batch_signature"), signature)


def test_high_s_batch_signature_is_refused() -> None:
    tx = hand_tx(ALICE, b"p")
    header = batch_header(public_key(ALICE), [tx.id])
    low = sign(ALICE, header)
    r, s = low[:64], int(low[64:], 16)
    high = r + format(SECP256K1_N - s, "064x")
    assert high != low
    _, encoded = hand_batch(ALICE, [tx], header=header, signature=high)
    names_batch(rejects(batch_list([encoded]), "bad_batch_signature"), high)


def test_transaction_ids_in_the_wrong_order() -> None:
    txs = [hand_tx(ALICE, b"a", nonce="1"), hand_tx(ALICE, b"b", nonce="2")]
    batch_id, encoded = hand_batch(ALICE, txs, declared_ids=[txs[1].id, txs[0].id])
    exc = rejects(batch_list([encoded]), "transaction_ids_mismatch")
    names_batch(exc, batch_id)
    assert "position 0" in str(exc)


@pytest.mark.parametrize("declared", ["missing", "extra", "other"])
def test_transaction_ids_that_do_not_match(declared: str) -> None:
    txs = [hand_tx(ALICE, b"a", nonce="1"), hand_tx(ALICE, b"b", nonce="2")]
    ids = {
        "missing": [txs[0].id],
        "extra": [txs[0].id, txs[1].id, "cd" * 64],
        "other": [txs[0].id, "cd" * 64],
    }[declared]
    batch_id, encoded = hand_batch(ALICE, txs, declared_ids=ids)
    names_batch(rejects(batch_list([encoded]), "transaction_ids_mismatch"), batch_id)


def test_the_same_transaction_twice_in_a_batch() -> None:
    tx = hand_tx(ALICE, b"a")
    batch_id, encoded = hand_batch(ALICE, [tx, tx])
    exc = rejects(batch_list([encoded]), "duplicate_transaction_id")
    names_transaction(exc, batch_id, tx.id)


def test_decode_batch_applies_the_same_rules() -> None:
    tx = hand_tx(ALICE, b"a")
    batch_id, encoded = hand_batch(ALICE, [tx], declared_ids=[])
    with pytest.raises(InvalidBatchError) as info:
        decode_batch(encoded)
    assert info.value.rule == "transaction_ids_mismatch"
    names_batch(info.value, batch_id)


# --- the transactions --------------------------------------------------------------------


@pytest.mark.parametrize("signature", ["", "ab" * 10, "AB" * 64, "g" * 128])
def test_malformed_transaction_signature(signature: str) -> None:
    tx = hand_tx(ALICE, b"p", signature=signature)
    batch_id, encoded = hand_batch(ALICE, [tx])
    exc = rejects(batch_list([encoded]), "malformed_signature")
    names_batch(exc, batch_id)
    assert exc.transaction_id == (signature or None)
    assert "transaction #0" in str(exc)


def test_transaction_header_that_does_not_decode() -> None:
    tx = hand_tx(ALICE, b"p", header=b"\x52\x7f")  # field 10 claims 127 bytes, has none
    batch_id, encoded = hand_batch(ALICE, [tx])
    names_transaction(
        rejects(batch_list([encoded]), "malformed_transaction_header"), batch_id, tx.id
    )


def test_malformed_transaction_signer_key() -> None:
    payload = b"p"
    header = (
        ld(1, public_key(ALICE))
        + ld(9, hashlib.sha512(payload).hexdigest())
        + ld(10, "03" + "zz" * 32)
    )
    tx = hand_tx(ALICE, payload, header=header)
    batch_id, encoded = hand_batch(ALICE, [tx])
    names_transaction(rejects(batch_list([encoded]), "malformed_public_key"), batch_id, tx.id)


def test_transaction_naming_another_batcher() -> None:
    tx = hand_tx(ALICE, b"p", batcher=public_key(BOB))
    batch_id, encoded = hand_batch(ALICE, [tx])
    exc = rejects(batch_list([encoded]), "batcher_public_key_mismatch")
    names_transaction(exc, batch_id, tx.id)


def test_transactions_by_other_signers_are_fine_when_they_name_the_batcher() -> None:
    tx = hand_tx(BOB, b"p", batcher=public_key(ALICE))
    _, encoded = hand_batch(ALICE, [tx])
    (parsed,) = decode_batch_list(batch_list([encoded]))
    assert parsed.transactions[0].header.signer_public_key == public_key(BOB)


def test_payload_that_does_not_match_its_hash() -> None:
    tx = hand_tx(ALICE, b"p", payload_sha512=hashlib.sha512(b"q").hexdigest())
    batch_id, encoded = hand_batch(ALICE, [tx])
    exc = rejects(batch_list([encoded]), "payload_sha512_mismatch")
    names_transaction(exc, batch_id, tx.id)


def test_payload_swapped_after_signing() -> None:
    tx = hand_tx(ALICE, b"p")
    swapped = transaction(tx.header, tx.id, b"other")
    batch_id = sign(ALICE, batch_header(public_key(ALICE), [tx.id]))
    encoded = batch(batch_header(public_key(ALICE), [tx.id]), batch_id, [swapped])
    names_transaction(rejects(batch_list([encoded]), "payload_sha512_mismatch"), batch_id, tx.id)


def test_transaction_signed_by_another_key() -> None:
    good = hand_tx(ALICE, b"p")
    forged = hand_tx(ALICE, b"p", header=good.header, signature=sign(BOB, good.header))
    batch_id, encoded = hand_batch(ALICE, [forged])
    exc = rejects(batch_list([encoded]), "bad_transaction_signature")
    names_transaction(exc, batch_id, forged.id)


def test_error_names_the_offending_transaction_among_several() -> None:
    txs = [
        hand_tx(ALICE, b"a", nonce="1"),
        hand_tx(ALICE, b"b", nonce="2", batcher=public_key(BOB)),
    ]
    batch_id, encoded = hand_batch(ALICE, txs)
    exc = rejects(batch_list([good_batch()[1], encoded]), "batcher_public_key_mismatch")
    names_transaction(exc, batch_id, txs[1].id)
    assert "transaction #1" in str(exc)
    assert "batch #1" in str(exc)


def test_verify_false_skips_only_the_signature_checks() -> None:
    good = hand_tx(ALICE, b"p")
    forged = hand_tx(ALICE, b"p", header=good.header, signature=sign(BOB, good.header))
    _, encoded = hand_batch(ALICE, [forged], signature=sign(BOB, b"whatever"))
    (parsed,) = decode_batch_list(batch_list([encoded]), verify=False)
    assert parsed.transactions[0].header_signature == forged.id
    assert decode_batch(encoded, verify=False) == parsed
    bad_hash = hand_tx(ALICE, b"p", payload_sha512="00")
    _, encoded = hand_batch(ALICE, [bad_hash])
    rejects(batch_list([encoded]), "payload_sha512_mismatch", verify=False)


# --- the service id ----------------------------------------------------------------------


@pytest.mark.parametrize("service_id", ["", "s" * (MAX_SERVICE_ID_LENGTH + 1)])
def test_service_id_the_store_cannot_hold(service_id: str) -> None:
    _, encoded = good_batch()
    with pytest.raises(InvalidBatchError) as info:
        parse_batch_list(batch_list([encoded]), service_id)
    assert info.value.rule == "invalid_service_id"
    assert str(MAX_SERVICE_ID_LENGTH) in str(info.value)


def test_longest_service_id_is_accepted() -> None:
    _, encoded = good_batch()
    service_id = "s" * MAX_SERVICE_ID_LENGTH
    assert parse_batch_list(batch_list([encoded]), service_id)[0].service_id == service_id


def test_id_checks_come_before_any_signature_check() -> None:
    # Cheap string checks first, so a malformed batch costs no curve arithmetic.
    tx = hand_tx(ALICE, b"p", signature="ef" * 64)  # also a bad transaction signature
    _, encoded = hand_batch(ALICE, [tx, tx], signature="ab" * 64)
    rejects(batch_list([encoded]), "duplicate_transaction_id")
    _, encoded = hand_batch(ALICE, [tx], declared_ids=["cd" * 64], signature="ab" * 64)
    rejects(batch_list([encoded]), "transaction_ids_mismatch")
