"""Who may talk to a node over HTTP: bearer token, Host and Origin checks.

:func:`access_middleware` runs before every route of the node's app — the
Sawtooth routes, scabbard, ``/events`` (SSE), ``/subscriptions``
(websocket, checked before the upgrade), ``/metrics`` and ``/openapi.json``:

* **Host.** The ``Host`` header must name the node: a loopback name
  (``localhost``, ``127.0.0.1``, ``::1``), the address it is bound to, or one
  of ``allowed_hosts``. Anything else is a 403 before any handler runs: a
  web page that rebinds its own DNS name to 127.0.0.1 cannot reach the node.
* **Origin.** A request carrying an ``Origin`` (a browser's, on any
  cross-site request and on every websocket) is refused with 403 unless that
  origin is in ``allowed_origins``: no page can drive the node from a
  visitor's browser.
* **Token.** With a ``token``, every request needs ``Authorization: Bearer
  <token>`` (compared in constant time); otherwise 401 with
  ``WWW-Authenticate``.

Errors are Sawtooth-shaped: ``{"error": {"code", "title", "message"}}``.
:func:`is_loopback` says whether a bind address stays on this machine (the
command refuses a wider bind without a token).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    token: str = ""
    allowed_hosts: Collection[str] = field(default_factory=tuple)
    allowed_origins: Collection[str] = field(default_factory=tuple)


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: A ``Host`` header (RFC 9110 ``uri-host [ ":" port ]``) as ledgerq takes it:
#: a bracketed IPv6 literal or a name of letters, digits, ``-``, ``.`` and
#: ``_`` (IPv4 addresses included), then an optional port of 1 to 5 digits.
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(:[0-9]{1,5})?")


def host_name(header: str) -> str:
    """The host named by a ``Host`` header, lower case and without its port
    or brackets; ``""`` for a header that is no host (``[::1]@evil.example``,
    a user part, a path, spaces, a bracketed literal that is no IPv6
    address), which no check lets in."""
    header = header.strip().lower()
    match = _HOST.fullmatch(header)
    if match is None:
        return ""
    name = match.group(1)
    if name.startswith("["):
        name = name[1:-1]
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return ""
    return name


def _error(status: int, code: int, title: str, message: str, **headers: str) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "title": title, "message": message}},
        status=status,
        headers=headers,
    )


def access_middleware(
    policy: AccessPolicy, *, bound_host: str = ""
) -> Callable[..., Awaitable[web.StreamResponse]]:
    hosts = {h.lower().strip("[]") for h in policy.allowed_hosts}
    if bound_host and bound_host not in ("0.0.0.0", "::", ""):
        hosts.add(bound_host.lower().strip("[]"))
    origins = {o.rstrip("/") for o in policy.allowed_origins}
    expected = policy.token.encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = host_name(request.headers.get("Host", ""))
        if not host or not (is_loopback(host) or host in hosts):
            host = host or request.headers.get("Host", "")[:100]
            return _error(
                403,
                403,
                "Host Not Allowed",
                f"this node does not answer for the host {host!r}; add it to the node's "
                "allowed hosts (--allowed-hosts) if it is really this node's name",
            )
        origin = request.headers.get("Origin")
        if origin is not None and origin.rstrip("/") not in origins:
            return _error(
                403,
                403,
                "Origin Not Allowed",
                f"requests from the web origin {origin!r} are refused; add it to the node's "
                "allowed origins (--allowed-origins) to let pages from it in",
            )
        if expected:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), expected
            ):
                return _error(
                    401,
                    401,
                    "Unauthorized",
                    "send the node's token as 'Authorization: Bearer <token>'",
                    **{"WWW-Authenticate": 'Bearer realm="ledgerq node"'},
                )
        return await handler(request)

    return check
