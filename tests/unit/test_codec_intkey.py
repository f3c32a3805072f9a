from __future__ import annotations

import hashlib

import cbor2
import pytest

from ledgerq.codec import Signer, decode_batch_list, encode_batch_list, make_batch
from ledgerq.codec.intkey import (
    FAMILY_NAME,
    FAMILY_VERSION,
    NAMESPACE,
    encode_payload,
    make_address,
    make_intkey_batch,
    make_intkey_transaction,
)


def test_address_of_the_spec_example() -> None:
    # integerkey_transaction_family.rst, "Addressing".
    assert make_address("name") == (
        "1cf126cc488cca4cc3565a876f6040f8b73a7b92475be1d0b1bc453f6140fba7183b9a"
    )


@pytest.mark.parametrize("name", ["a", "k101-0", "ünïcödé", "x" * 20])
def test_address_shape(name: str) -> None:
    address = make_address(name)
    assert len(address) == 70
    assert address.startswith(NAMESPACE)
    assert NAMESPACE == "1cf126"
    assert address[6:] == hashlib.sha512(name.encode()).hexdigest()[-64:]


def test_payload_is_the_cbor_map_in_spec_order() -> None:
    payload = encode_payload("inc", "k", 5)
    # a3 = map(3); keys as text strings, in the order Verb, Name, Value.
    assert payload == bytes.fromhex("a3") + b"\x64Verb\x63inc\x64Name\x61k\x65Value\x05"
    assert cbor2.loads(payload) == {"Verb": "inc", "Name": "k", "Value": 5}
    assert cbor2.loads(encode_payload("set", "big", 2**32 - 1))["Value"] == 2**32 - 1


def test_intkey_transaction_header() -> None:
    signer = Signer.generate()
    tx = make_intkey_transaction(signer, "set", "k", 3, nonce="fixed")
    h = tx.header
    assert (h.family_name, h.family_version) == (FAMILY_NAME, FAMILY_VERSION) == ("intkey", "1.0")
    assert h.inputs == h.outputs == (make_address("k"),)
    assert h.nonce == "fixed"
    assert h.batcher_public_key == h.signer_public_key == signer.public_key
    assert h.payload_sha512 == hashlib.sha512(tx.payload).hexdigest()
    assert cbor2.loads(tx.payload) == {"Verb": "set", "Name": "k", "Value": 3}


def test_nonces_differ_by_default() -> None:
    signer = Signer.generate()
    a = make_intkey_transaction(signer, "set", "k", 3)
    b = make_intkey_transaction(signer, "set", "k", 3)
    assert a.header_signature != b.header_signature


def test_built_batches_decode_to_themselves() -> None:
    signer = Signer.generate()
    batches = [
        make_intkey_batch(signer, [("set", f"k{i}", i), ("inc", f"k{i}", 1)], trace=i % 2 == 0)
        for i in range(4)
    ]
    assert decode_batch_list(encode_batch_list(batches)) == tuple(batches)


def test_batcher_differs_from_transaction_signer() -> None:
    batcher, client = Signer.generate(), Signer.generate()
    tx = make_intkey_transaction(client, "set", "k", 1, batcher_public_key=batcher.public_key)
    (parsed,) = decode_batch_list(encode_batch_list([make_batch(batcher, [tx])]))
    assert parsed.signer_public_key == batcher.public_key
    assert parsed.transactions[0].header.signer_public_key == client.public_key
