"""Ledger clients behind one interface (:class:`LedgerClient`).

:func:`http_ledger_client` turns the ``--ledger`` setting into a client:
``sawtooth+http://H:P`` (a Sawtooth REST API or ``ledgerq node``,
:mod:`ledgerq.ledgers.sawtooth`), ``splinter+http://H:P`` (scabbard,
:mod:`ledgerq.ledgers.splinter`). ``node`` (the in-process node,
:mod:`ledgerq.ledgers.inprocess`) is built by the gateway, which owns the
node's lifetime.

May import: the foundation, ``codec`` and ``node`` (the in-process client).
Never the store, the pipeline stages or the gateway: a ledger client knows
nothing of services' queues.
"""

from __future__ import annotations

from ledgerq.errors import ConfigError
from ledgerq.ledgers.base import (
    Accepted,
    Ambiguous,
    Busy,
    CommitEvent,
    LedgerBatchStatus,
    LedgerClient,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
    batch_list_bytes,
)
from ledgerq.ledgers.http import HttpTimeouts
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.ledgers.splinter import SplinterClient

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
    "Unjudged",
    "Unreachable",
    "batch_list_bytes",
    "http_ledger_client",
]


def http_ledger_client(
    spec: str, timeouts: HttpTimeouts | None = None, *, token: str = ""
) -> LedgerClient:
    """A client for ``sawtooth+http(s)://host:port`` or ``splinter+http(s)://host:port``.

    ``token``: sent as ``Authorization: Bearer <token>`` on every request
    (a ``ledgerq node`` with ``node.token``; a Splinter node's
    ``Cylinder:<jwt>``, or a proxy's bearer token).
    """
    authorization = f"Bearer {token}" if token else None
    kind, sep, rest = spec.partition("+")
    if not sep or not rest.startswith(("http://", "https://")):
        raise ConfigError(
            f"ledger {spec!r} is not understood; use node, sawtooth+http://HOST:PORT "
            "or splinter+http://HOST:PORT"
        )
    if kind == "sawtooth":
        return SawtoothClient(rest, timeouts, authorization=authorization)
    if kind == "splinter":
        return SplinterClient(rest, timeouts, authorization=authorization)
    raise ConfigError(f"ledger kind {kind!r} in {spec!r} is unknown; use sawtooth or splinter")
