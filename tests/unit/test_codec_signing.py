from __future__ import annotations

import subprocess
import sys

import pytest
from protowire import private_key, public_key, sign

from ledgerq.codec import Signer, verify_signature
from ledgerq.codec.signing import load_public_key


def test_sign_verify_round_trip() -> None:
    signer = Signer.generate()
    signature = signer.sign(b"header bytes")
    assert len(signature) == 128
    assert signature == signature.lower()
    assert len(signer.public_key) == 66
    assert signer.public_key[:2] in {"02", "03"}
    assert verify_signature(signer.public_key, b"header bytes", signature)


def test_signature_by_another_key_fails() -> None:
    alice, bob = Signer.generate(), Signer.generate()
    assert not verify_signature(alice.public_key, b"m", bob.sign(b"m"))


def test_signature_of_another_message_fails() -> None:
    signer = Signer.generate()
    assert not verify_signature(signer.public_key, b"m2", signer.sign(b"m1"))


def test_from_hex_round_trip_and_deterministic_signatures() -> None:
    signer = Signer.generate()
    again = Signer.from_hex(signer.private_key_hex)
    assert again.public_key == signer.public_key
    # RFC 6979 nonces: same key, same message, same signature.
    assert again.sign(b"m") == signer.sign(b"m")


def test_signatures_match_an_independent_secp256k1_signer() -> None:
    key = private_key(7)
    signer = Signer.from_hex(key.to_hex())
    assert signer.public_key == public_key(key)
    assert signer.sign(b"abc") == sign(key, b"abc")


@pytest.mark.parametrize("bad", ["", "00" * 32, "ff" * 32, "12" * 31, "xyz", "12" * 33])
def test_from_hex_refuses_non_keys(bad: str) -> None:
    with pytest.raises(ValueError, match="private key"):
        Signer.from_hex(bad)


@pytest.mark.parametrize(
    "signature",
    ["", "00" * 64, "ff" * 64, "ab" * 63, "ab" * 65, "zz" * 64],
)
def test_malformed_signatures_verify_false(signature: str) -> None:
    signer = Signer.generate()
    assert not verify_signature(signer.public_key, b"m", signature)


def test_upper_case_or_uncompressed_keys_are_refused() -> None:
    signer = Signer.generate()
    signature = signer.sign(b"m")
    assert not verify_signature(signer.public_key.upper(), b"m", signature)
    assert not verify_signature(signer.public_key + "00", b"m", signature)
    assert load_public_key("04" + "11" * 64) is None


def test_repr_does_not_leak_the_private_key() -> None:
    signer = Signer.generate()
    assert signer.private_key_hex not in repr(signer)
    assert signer.public_key in repr(signer)


def test_generated_protobuf_modules_import_without_warnings() -> None:
    # A fresh interpreter: pytest may already have imported them.
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import ledgerq.codec.batch_pb2, ledgerq.codec.transaction_pb2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
