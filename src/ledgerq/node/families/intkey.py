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

:meth:`IntkeyHandler.prepare` does what needs the payload alone (the rules
on the payload above, the address, and the value a ``set`` stores at an
address holding nothing else), where the node decodes the batch;
:meth:`IntkeyHandler.apply_prepared` the rest.
"""

from __future__ import annotations

import hashlib
from typing import Any, cast

import cbor2

from ledgerq.node.families import Context, InvalidTransaction, TransactionLike

FAMILY_NAME = "intkey"
NAMESPACE = hashlib.sha512(FAMILY_NAME.encode()).hexdigest()[:6]
MIN_VALUE = 0
MAX_VALUE = 2**32 - 1
MAX_NAME_LENGTH = 20


#: :meth:`IntkeyHandler.prepare`'s answer for a valid payload: verb, name, value,
#: address, and for ``set`` the canonical CBOR of ``{name: value}``.
Prepared = tuple[str, str, int, str, "bytes | None"]


def make_address(name: str) -> str:
    return NAMESPACE + hashlib.sha512(name.encode("utf-8")).hexdigest()[-64:]


class IntkeyHandler:
    family_name = FAMILY_NAME
    family_versions: tuple[str, ...] = ("1.0",)

    @staticmethod
    def prepare(payload: bytes) -> Prepared | str | None:
        """The payload's verb, name and value, the name's address and, for ``set``,
        the state a ``set`` writes where nothing else is stored; the message of the
        payload's refusal (a ``str``); ``None`` when it is left to :meth:`apply`."""
        try:
            verb, name, value = _unpack(payload)
        except InvalidTransaction as exc:
            return str(exc)
        try:
            address = make_address(name)
        except Exception:  # raised again where apply() runs, as it would be
            return None
        alone = cbor2.dumps({name: value}, canonical=True) if verb == "set" else None
        return verb, name, value, address, alone

    def apply(self, transaction: TransactionLike, context: Context) -> None:
        verb, name, value = _unpack(transaction.payload)
        self._apply(verb, name, value, make_address(name), None, context)

    def apply_prepared(
        self, transaction: TransactionLike, prepared: object, context: Context
    ) -> None:
        """:meth:`apply` with :meth:`prepare`'s answer for ``transaction.payload``."""
        if prepared is None:
            self.apply(transaction, context)
        elif type(prepared) is str:
            raise InvalidTransaction(prepared)
        else:
            verb, name, value, address, alone = cast(Prepared, prepared)
            self._apply(verb, name, value, address, alone, context)

    def _apply(
        self,
        verb: str,
        name: str,
        value: int,
        address: str,
        alone: bytes | None,
        context: Context,
    ) -> None:
        state = _load(context.get_state([address]).get(address))
        if verb == "set":
            if name in state:
                raise InvalidTransaction(
                    f'Verb is "set", but already exists: Name: {name}, Value {state[name]}'
                )
            if not state and alone is not None:  # {name: value}, encoded in prepare()
                context.set_state({address: alone})
                return
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
