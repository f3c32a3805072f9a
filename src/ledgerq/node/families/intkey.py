"""IntegerKey (``intkey`` 1.0), exactly as the Sawtooth spec and its processor.

State at ``make_address(name)`` is a CBOR map ``{name: value}`` (several names
may share an address on a hash collision). Rules, in the order checked, with
the messages of the Sawtooth Python processor:

* payload empty or not a CBOR map → ``Invalid payload serialization``;
* ``Verb``/``Name``/``Value`` missing or empty → ``<Field> is required``;
* verb not ``set``/``inc``/``dec`` → ``Verb must be "set", "inc", or "dec"``;
* name not a string of at most 20 characters → ``Name must be a string of no
  more than 20 characters``;
* value not an integer in 0..2^32-1 → ``Value must be an integer no less than
  0 and no greater than 4294967295``;
* ``set`` of an existing name, ``inc``/``dec`` of a missing one, and results
  outside 0..2^32-1 are invalid.
"""

from __future__ import annotations

import hashlib
from typing import Any

import cbor2

from ledgerq.node.families import Context, InvalidTransaction, TransactionLike

FAMILY_NAME = "intkey"
NAMESPACE = hashlib.sha512(FAMILY_NAME.encode()).hexdigest()[:6]
MIN_VALUE = 0
MAX_VALUE = 2**32 - 1
MAX_NAME_LENGTH = 20


def make_address(name: str) -> str:
    return NAMESPACE + hashlib.sha512(name.encode("utf-8")).hexdigest()[-64:]


class IntkeyHandler:
    family_name = FAMILY_NAME
    family_versions: tuple[str, ...] = ("1.0",)

    def apply(self, transaction: TransactionLike, context: Context) -> None:
        verb, name, value = _unpack(transaction.payload)
        address = make_address(name)
        state = _load(context.get_state([address]).get(address))
        if verb == "set":
            if name in state:
                raise InvalidTransaction(
                    f'Verb is "set", but already exists: Name: {name}, Value {state[name]}'
                )
            result = value
        else:
            if name not in state:
                raise InvalidTransaction(f'Verb is "{verb}" but name "{name}" not in state')
            current = state[name]
            if verb == "inc":
                result = current + value
                if result > MAX_VALUE:
                    raise InvalidTransaction(
                        f'Verb is "inc", but result would be greater than {MAX_VALUE}'
                    )
            else:
                result = current - value
                if result < MIN_VALUE:
                    raise InvalidTransaction(
                        f'Verb is "dec", but result would be less than {MIN_VALUE}'
                    )
        updated = dict(state)
        updated[name] = result
        context.set_state({address: cbor2.dumps(updated, canonical=True)})


def _unpack(payload: bytes) -> tuple[str, str, int]:
    if not payload:
        raise InvalidTransaction("Invalid payload serialization")
    try:
        content = cbor2.loads(payload)
    except Exception as exc:  # cbor2 raises several unrelated types
        raise InvalidTransaction("Invalid payload serialization") from exc
    if not isinstance(content, dict):
        raise InvalidTransaction("Invalid payload serialization")
    for field in ("Verb", "Name", "Value"):
        if content.get(field) in (None, ""):
            raise InvalidTransaction(f"{field} is required")
    verb, name, value = content["Verb"], content["Name"], content["Value"]
    if verb not in ("set", "inc", "dec"):
        raise InvalidTransaction('Verb must be "set", "inc", or "dec"')
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH:
        raise InvalidTransaction(
            f"Name must be a string of no more than {MAX_NAME_LENGTH} characters"
        )
    if type(value) is not int or not MIN_VALUE <= value <= MAX_VALUE:
        raise InvalidTransaction(
            f"Value must be an integer no less than {MIN_VALUE} and no greater than {MAX_VALUE}"
        )
    return verb, name, value


def _load(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    try:
        state = cbor2.loads(data)
    except Exception as exc:
        raise InvalidTransaction("Failed to load state data") from exc
    if not isinstance(state, dict):
        raise InvalidTransaction("Failed to load state data")
    return state
