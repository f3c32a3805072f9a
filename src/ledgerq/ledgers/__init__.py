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
from ledgerq.ledgers.http import HttpTimeouts, url_credentials
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.ledgers.splinter import SplinterClient

#: Why a ledger URL with ``user:password@`` and ``ledger_token`` are refused together.
LEDGER_CREDENTIALS_TWICE = (
    "the ledger URL holds a user and password (user:password@) and ledger_token is set: "
    "each request to the ledger carries one Authorization header, HTTP Basic from the URL "
    "or Bearer from the token; keep one of them"
)

__all__ = [
    "LEDGER_CREDENTIALS_TWICE",
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
    ``Cylinder:<jwt>``, or a proxy's bearer token). A ``user:password@`` in
    the URL is sent as HTTP Basic instead, and kept out of the client's
    URL (:func:`~ledgerq.ledgers.http.url_credentials`); both at once are
    refused: a request carries one ``Authorization``.
    """
    kind, sep, rest = spec.partition("+")
    if not sep or not rest.startswith(("http://", "https://")):
        raise ConfigError(
            f"ledger {url_credentials(spec)[0]!r} is not understood; use node, "
            "sawtooth+http://HOST:PORT or splinter+http://HOST:PORT"
        )
    rest, basic = url_credentials(rest)
    if basic is not None and token:
        raise ConfigError(LEDGER_CREDENTIALS_TWICE)
    authorization = basic or (f"Bearer {token}" if token else None)
    if kind == "sawtooth":
        return SawtoothClient(rest, timeouts, authorization=authorization)
    if kind == "splinter":
        return SplinterClient(rest, timeouts, authorization=authorization)
    raise ConfigError(
        f"ledger kind {kind!r} in {kind}+{rest!r} is unknown; use sawtooth or splinter"
    )
