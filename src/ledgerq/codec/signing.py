"""secp256k1 keys and signatures exactly as Sawtooth uses them.

A Sawtooth signature is ECDSA over secp256k1 of the SHA-256 of the message
(the serialized header bytes), encoded as the 64-byte "compact" ``r || s``
with ``s`` normalized low, written as 128 lowercase hex characters. Public keys
are 33-byte compressed points written as 66 lowercase hex characters.

:func:`verify_signature` accepts only that form: a DER or 65-byte recoverable
signature, a high-``s`` signature, an uncompressed key or upper-case hex all
verify as ``False`` (libsecp256k1 rejects high ``s``, as Sawtooth does).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from functools import lru_cache

import coincurve
from coincurve._libsecp256k1 import lib as _secp256k1
from coincurve.ecdsa import deserialize_compact

#: Hex length of a compact signature (64 bytes).
SIGNATURE_HEX_LENGTH = 128
#: Hex length of a compressed public key (33 bytes).
PUBLIC_KEY_HEX_LENGTH = 66

#: ``fullmatch`` of exactly ``length`` lowercase hex characters, by length: a
#: compiled pattern checks a signature's characters in C, in one call, where
#: ``frozenset.issuperset`` walks them one Python character at a time.
_LOWER_HEX: dict[int, Callable[[str], re.Match[str] | None]] = {}


def _sha256(message: bytes) -> bytes:
    return hashlib.sha256(message).digest()


def is_lower_hex(value: str, length: int) -> bool:
    """True when ``value`` is exactly ``length`` lowercase hex characters."""
    match = _LOWER_HEX.get(length)
    if match is None:
        match = _LOWER_HEX[length] = re.compile(f"[0-9a-f]{{{length}}}").fullmatch
    return match(value) is not None


class Signer:
    """A secp256k1 private key that signs as the Sawtooth SDK does."""

    __slots__ = ("_key", "private_key_hex", "public_key")

    def __init__(self, key: coincurve.PrivateKey) -> None:
        self._key = key
        self.private_key_hex: str = key.to_hex()
        self.public_key: str = key.public_key.format(compressed=True).hex()

    @classmethod
    def generate(cls) -> Signer:
        """A new random key (from the operating system's CSPRNG)."""
        return cls(coincurve.PrivateKey())

    @classmethod
    def from_hex(cls, private_key_hex: str) -> Signer:
        """Load a 32-byte private key written as 64 hex characters."""
        try:
            raw = bytes.fromhex(private_key_hex.strip())
            if len(raw) != 32:
                raise ValueError(f"{len(raw)} bytes instead of 32")
            return cls(coincurve.PrivateKey(raw))
        except ValueError as exc:
            raise ValueError(
                f"not a secp256k1 private key ({exc}); expected 64 hex characters"
            ) from exc

    def sign(self, message: bytes) -> str:
        """The compact, low-``s`` signature of ``message`` as 128 hex characters."""
        # The recoverable form is r || s || recovery id; Sawtooth wants r || s.
        return self._key.sign_recoverable(message, hasher=_sha256)[:64].hex()

    def __repr__(self) -> str:
        return f"Signer(public_key={self.public_key!r})"


@lru_cache(maxsize=4096)
def load_public_key(public_key_hex: str) -> coincurve.PublicKey | None:
    """The key as a curve point, or ``None`` when it is not a compressed key.

    Cached: a service's batches are usually signed by a handful of keys, and
    parsing a point costs about as much as half a verification.
    """
    if not is_lower_hex(public_key_hex, PUBLIC_KEY_HEX_LENGTH):
        return None
    try:
        return coincurve.PublicKey(bytes.fromhex(public_key_hex))
    except ValueError:
        return None


def verify_signature(public_key_hex: str, message: bytes, signature_hex: str) -> bool:
    """True when ``signature_hex`` is the key's Sawtooth signature of ``message``."""
    key = load_public_key(public_key_hex)
    if key is None or not is_lower_hex(signature_hex, SIGNATURE_HEX_LENGTH):
        return False
    return verify_checked(key, message, signature_hex)


#: A signature to verify: the signer's loaded key, the signed bytes, the
#: signature (already known to be :data:`SIGNATURE_HEX_LENGTH` lowercase hex).
SignatureCheck = tuple[coincurve.PublicKey, bytes, str]


def signatures_valid(checks: Sequence[SignatureCheck]) -> bool:
    """Whether every one of ``checks`` verifies (:func:`verify_checked`), in
    order, stopping at the first that does not. libsecp256k1 runs without
    the GIL: a thread calling this leaves the event loop free."""
    return all(verify_checked(key, message, signature) for key, message, signature in checks)


def verify_checked(key: coincurve.PublicKey, message: bytes, signature_hex: str) -> bool:
    """:func:`verify_signature` for a loaded key and a signature already known to
    be :data:`SIGNATURE_HEX_LENGTH` lowercase hex characters (the codec checks both
    before it verifies).

    The compact signature goes to libsecp256k1's ``secp256k1_ecdsa_verify``
    as parsed: ``PublicKey.verify`` takes DER only, and encoding the signature
    to DER only to have it parsed back is work on every verification that
    buys nothing.
    """
    try:
        signature = deserialize_compact(bytes.fromhex(signature_hex))
    except ValueError:
        # r or s out of range: not a signature at all.
        return False
    # libsecp256k1 rejects a high-s signature here, as Sawtooth does.
    digest = hashlib.sha256(message).digest()
    return bool(
        _secp256k1.secp256k1_ecdsa_verify(key.context.ctx, signature, digest, key.public_key)
    )
