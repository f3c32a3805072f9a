"""Build IntegerKey (``intkey`` 1.0) transactions, per the Sawtooth spec.

Addresses are the first 6 hex characters of SHA-512("intkey") followed by the
last 64 of SHA-512(name); payloads are the CBOR map ``{"Verb", "Name",
"Value"}`` in that order, as the Sawtooth SDK's intkey client writes it.

Only building lives here: the builders do not enforce the family's validity
rules (name length, value range, verbs), so tests can produce transactions the
node must find invalid. The rules are checked by the node's intkey family.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import cbor2

from ledgerq.codec.build import make_batch, make_transaction
from ledgerq.codec.parsed import ParsedBatch, ParsedTransaction
from ledgerq.codec.signing import Signer

FAMILY_NAME = "intkey"
FAMILY_VERSION = "1.0"
NAMESPACE = hashlib.sha512(FAMILY_NAME.encode()).hexdigest()[:6]
MAX_NAME_LENGTH = 20
MAX_VALUE = 2**32 - 1
VERBS = ("set", "inc", "dec")


def make_address(name: str) -> str:
    """The 70-hex-character state address of the entry ``name``."""
    return NAMESPACE + hashlib.sha512(name.encode("utf-8")).hexdigest()[-64:]


def encode_payload(verb: str, name: str, value: int) -> bytes:
    """The CBOR payload ``{"Verb": verb, "Name": name, "Value": value}``."""
    return bytes(cbor2.dumps({"Verb": verb, "Name": name, "Value": value}))


def make_intkey_transaction(
    signer: Signer,
    verb: str,
    name: str,
    value: int,
    *,
    batcher_public_key: str | None = None,
    dependencies: Sequence[str] = (),
    nonce: str | None = None,
) -> ParsedTransaction:
    """An intkey transaction reading and writing ``name``'s address only,
    valid only after the transactions ``dependencies`` name have committed."""
    address = make_address(name)
    return make_transaction(
        signer,
        family_name=FAMILY_NAME,
        family_version=FAMILY_VERSION,
        inputs=(address,),
        outputs=(address,),
        payload=encode_payload(verb, name, value),
        batcher_public_key=batcher_public_key,
        dependencies=dependencies,
        nonce=nonce,
    )


def make_intkey_batch(
    signer: Signer, ops: Sequence[tuple[str, str, int]], trace: bool = False
) -> ParsedBatch:
    """One batch, signed by ``signer``, of one transaction per ``(verb, name, value)``."""
    return make_batch(
        signer,
        [make_intkey_transaction(signer, verb, name, value) for verb, name, value in ops],
        trace,
    )
