"""Ledger clients behind one interface (:class:`LedgerClient`).

:func:`parse_ledger_url` turns the ``--ledger`` setting into a client:
``sawtooth+http://H:P`` (a Sawtooth REST API or ``ledgerq node``),
``splinter+http://H:P`` (scabbard). ``node`` (the in-process node) is built
by the gateway, which owns the node's lifetime.
"""

from __future__ import annotations

from ledgerq.dlt._http import HttpTimeouts
from ledgerq.dlt.base import (
    Accepted,
    Ambiguous,
    Busy,
    CommitEvent,
    LedgerBatchStatus,
    LedgerClient,
    Rejected,
    SubmitResult,
    Unreachable,
    batch_list_bytes,
)
from ledgerq.dlt.sawtooth import SawtoothClient
from ledgerq.dlt.splinter import SplinterClient
from ledgerq.errors import ConfigError

__all__ = [
    "Accepted",
    "Ambiguous",
    "Busy",
    "CommitEvent",
    "HttpTimeouts",
    "LedgerBatchStatus",
    "LedgerClient",
    "Rejected",
    "SawtoothClient",
    "SplinterClient",
    "SubmitResult",
    "Unreachable",
    "batch_list_bytes",
    "http_ledger_client",
]


def http_ledger_client(spec: str, timeouts: HttpTimeouts | None = None) -> LedgerClient:
    """A client for ``sawtooth+http(s)://host:port`` or ``splinter+http(s)://host:port``."""
    kind, sep, rest = spec.partition("+")
    if not sep or not rest.startswith(("http://", "https://")):
        raise ConfigError(
            f"ledger {spec!r} is not understood; use node, sawtooth+http://HOST:PORT "
            "or splinter+http://HOST:PORT"
        )
    if kind == "sawtooth":
        return SawtoothClient(rest, timeouts)
    if kind == "splinter":
        return SplinterClient(rest, timeouts)
    raise ConfigError(f"ledger kind {kind!r} in {spec!r} is unknown; use sawtooth or splinter")
