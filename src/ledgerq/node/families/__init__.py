"""Transaction families: the code a Sawtooth transaction runs on the node.

A family handler is registered under ``(family_name, family_version)`` and
applies one transaction to a :class:`Context`, raising
:class:`InvalidTransaction` to reject it (Sawtooth's processor contract).
A transaction of an unregistered family is INVALID (a Sawtooth network
without the processor would leave it pending forever; we say so at once).

A handler may split its work in two: ``prepare(payload)``, a pure function
of the payload alone (decoding it, checking it, computing addresses), and
``apply_prepared(transaction, prepared, context)``, the rest, which needs
state; its ``apply`` is then ``apply_prepared`` of ``prepare``. The node's
decoding worker runs ``prepare`` beside the signature checks (in another
process: :meth:`FamilyRegistry.preparers`) and the event loop only
``apply_prepared``; a transaction decoded anywhere else (a small body, a
journal replay) runs ``apply``. Either way the outcome is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from ledgerq.node.ordering.messages import KVSDatum, KVSKey


class InvalidTransaction(Exception):
    """The transaction is invalid; ``str(exc)`` is the message clients see."""

    def __init__(self, message: str, extended_data: bytes = b"") -> None:
        super().__init__(message)
        self.extended_data = extended_data


class HeaderLike(Protocol):
    @property
    def signer_public_key(self) -> str: ...


class TransactionLike(Protocol):
    @property
    def header_signature(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def header(self) -> HeaderLike: ...


class Context:
    """State as one transaction sees it, confined to its inputs and outputs.

    Reads see the candidate's values read from the shards overlaid with the
    writes of earlier transactions of the same batch.
    """

    __slots__ = ("_base", "_inputs", "_outputs", "_overlay")

    def __init__(
        self,
        inputs: Collection[str],
        outputs: Collection[str],
        base: Mapping[KVSKey, KVSDatum | None],
        overlay: dict[KVSKey, KVSDatum],
    ) -> None:
        self._inputs = inputs
        self._outputs = outputs
        self._base = base
        self._overlay = overlay

    def get_state(self, addresses: Iterable[str]) -> dict[str, bytes]:
        """Values at ``addresses``; absent addresses are left out."""
        found: dict[str, bytes] = {}
        for address in addresses:
            if address not in self._inputs:
                raise InvalidTransaction(f"Tried to get unauthorized address {address}")
            value = self._overlay.get(address)
            if value is None:
                value = self._base.get(address)
            if value is not None:
                found[address] = value
        return found

    def set_state(self, entries: Mapping[str, bytes]) -> None:
        for address in entries:
            if address not in self._outputs:
                raise InvalidTransaction(f"Tried to set unauthorized address {address}")
        self._overlay.update(entries)


class TransactionHandler(Protocol):
    family_name: str
    family_versions: tuple[str, ...]

    def apply(self, transaction: TransactionLike, context: Context) -> None: ...


class FamilyRegistry:
    def __init__(self, handlers: Iterable[TransactionHandler] = ()) -> None:
        self._handlers: dict[tuple[str, str], TransactionHandler] = {}
        for handler in handlers:
            self.register(handler)

    def register(self, handler: TransactionHandler) -> None:
        for version in handler.family_versions:
            self._handlers[(handler.family_name, version)] = handler

    def get(self, family_name: str, family_version: str) -> TransactionHandler | None:
        return self._handlers.get((family_name, family_version))

    def preparers(self) -> dict[tuple[str, str], Callable[[bytes], object]]:
        """``prepare`` of every handler that has one, by (family, version).

        Each must pickle (a module-level function or a static method): the
        node's decoding worker runs them in another process.
        """
        return {
            key: prepare
            for key, handler in self._handlers.items()
            if (prepare := getattr(handler, "prepare", None)) is not None
        }


def default_registry() -> FamilyRegistry:
    from ledgerq.node.families.intkey import IntkeyHandler
    from ledgerq.node.families.settings import SettingsHandler

    return FamilyRegistry([IntkeyHandler(), SettingsHandler()])
