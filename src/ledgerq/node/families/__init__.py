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

Handlers must be deterministic functions of the transaction and the state
they read: a transaction that reads under a namespace prefix may be run
again from its start once the value it asked for has been fetched
(:class:`Unfetched`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from ledgerq.node.ordering.messages import KVSDatum, KVSKey

_ADDRESS = re.compile(r"[0-9a-f]{70}")


class InvalidTransaction(Exception):
    """The transaction is invalid; ``str(exc)`` is the message clients see."""

    def __init__(self, message: str, extended_data: bytes = b"") -> None:
        super().__init__(message)
        self.extended_data = extended_data


class Unfetched(BaseException):
    """A read under an input prefix of an address whose value is not fetched yet.

    :meth:`Context.get_state` raises it so that whoever runs the transaction
    fetches ``address`` and runs the transaction again from its start,
    discarding what it wrote. A ``BaseException``, as ``GeneratorExit`` is:
    it is control flow, and a handler's ``except Exception`` must let it
    through.
    """

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


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

    As Sawtooth's context: an address may be read when it is one of the
    transaction's inputs or lies under one of its input prefixes (namespace
    prefixes: an address under a prefix begins with it), and written when
    it is one of its outputs or lies under an output prefix; any other is
    refused (``Tried to get unauthorized address ...``), and so is anything
    but a 70-hex-character address under a prefix.

    Reads see the transaction's own writes, then ``overlay`` (the writes of
    earlier transactions of the same batch), then ``base`` (the values
    read from the shards). An address under an input prefix that ``base``
    does not hold raises :class:`Unfetched`. Writes go to ``writes``
    (``overlay`` itself unless given).
    """

    __slots__ = (
        "_base",
        "_input_prefixes",
        "_inputs",
        "_output_prefixes",
        "_outputs",
        "_overlay",
        "_writes",
    )

    def __init__(
        self,
        inputs: Collection[str],
        outputs: Collection[str],
        base: Mapping[KVSKey, KVSDatum | None],
        overlay: dict[KVSKey, KVSDatum],
        *,
        writes: dict[KVSKey, KVSDatum] | None = None,
        input_prefixes: tuple[str, ...] = (),
        output_prefixes: tuple[str, ...] = (),
    ) -> None:
        self._inputs = inputs
        self._outputs = outputs
        self._base = base
        self._overlay = overlay
        self._writes = overlay if writes is None else writes
        self._input_prefixes = input_prefixes
        self._output_prefixes = output_prefixes

    def get_state(self, addresses: Iterable[str]) -> dict[str, bytes]:
        """Values at ``addresses``; absent addresses are left out."""
        found: dict[str, bytes] = {}
        writes, overlay, base = self._writes, self._overlay, self._base
        for address in addresses:
            exact = address in self._inputs
            if not exact and not _under(address, self._input_prefixes):
                raise InvalidTransaction(f"Tried to get unauthorized address {address}")
            value = writes.get(address)
            if value is None and writes is not overlay:
                value = overlay.get(address)
            if value is None:
                value = base.get(address)
                if value is None and not exact and address not in base:
                    raise Unfetched(address)
            if value is not None:
                found[address] = value
        return found

    def set_state(self, entries: Mapping[str, bytes]) -> None:
        for address in entries:
            if address not in self._outputs and not _under(address, self._output_prefixes):
                raise InvalidTransaction(f"Tried to set unauthorized address {address}")
        self._writes.update(entries)


def _under(address: str, prefixes: tuple[str, ...]) -> bool:
    return (
        bool(prefixes) and address.startswith(prefixes) and _ADDRESS.fullmatch(address) is not None
    )


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
