"""HTTP hardening of the gateway and node apps: bearer token, CORS, service id rule.

* **Tokens** (``auth.token``, ``auth.tokens``): when any is set, every
  request needs ``Authorization: Bearer <token>``, reads included, except
  ``/health``, ``/ready``, ``/openapi.json`` and the dashboard's static page
  and assets (they hold no data; the page asks for the token and sends it
  with its own reads). A missing or wrong token is a 401 JSON error; a token
  used beyond its access (``read``/``write``; ``POST /batch_statuses`` is a
  read; an operator action, ``POST /services/{id}/pause`` and the like, needs
  ``operate``) a 403. The request carries the
  token's :class:`~ledgerq.scopes.Scope`; the API refuses (403) or hides
  what lies outside its services. Tokens are compared in constant time and
  never logged.
* **Host** (``allowed_hosts``): the ``Host`` header must be loopback, the
  bind address or a listed name, else 421 — no DNS rebinding onto a
  loopback gateway (``/health`` and ``/ready`` answer any Host: load
  balancers probe instances by address). Links are built from
  ``public_url``, or trusted ``X-Forwarded-*`` headers
  (``trust_forwarded``), or the checked Host.
* **Headers**: every answer carries ``X-Content-Type-Options: nosniff``,
  ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer`` and a strict
  ``Content-Security-Policy`` (own script and style only, no framing).
* **CORS** (``cors.origins``): no CORS header at all unless origins are
  configured; then only a listed origin (or ``*``) gets
  ``Access-Control-Allow-Origin`` and preflight answers.
* **Service ids** given as ``?service_id=`` or in a service's prefix
  (``/services/{service_id}/...``) must match :data:`SERVICE_ID_RE`
  (letters, digits and ``. _ - : ~ @ +``, at most
  :data:`~ledgerq.model.MAX_SERVICE_ID_LENGTH` characters, starting with a
  letter or digit), which admits Grid's ``circuit::service`` form; anything
  else is a 400 before any handler runs.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Collection, Sequence

from aiohttp import web

from ledgerq.ingest.api import BASE_URL, SCOPE
from ledgerq.ingest.chain import unprefixed_path
from ledgerq.ingest.control import is_action_path, is_control_path
from ledgerq.ingest.errors import SECURITY_HEADERS
from ledgerq.model import NO_SERVICE, service_id_problem
from ledgerq.model import SERVICE_ID_RE as SERVICE_ID_RE
from ledgerq.node.access import host_name, is_loopback
from ledgerq.scopes import Scope

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: POST routes that only read (long id lists in the body): they need read
#: access, at the root and under a service's prefix.
READ_POSTS = frozenset({"/batch_statuses", "/receipts"})
#: Paths that never need the token: they hold no tracked data.
PUBLIC_PATHS = frozenset({"/health", "/ready", "/", "/openapi.json"})
PUBLIC_PREFIXES = ("/static/",)
#: Probes answered whatever the Host: they say "up" or "ready", nothing else.
PROBE_PATHS = frozenset({"/health", "/ready"})
#: Paths about every service at once: only a token that sees everything reads them.
EVERYTHING_PATHS = frozenset({"/metrics"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def _json_error(status: int, title: str, message: str, **headers: str) -> web.Response:
    return web.json_response(
        {"error": {"code": status, "title": title, "message": message}},
        status=status,
        headers=headers,
    )


def token_middleware(
    tokens: Sequence[tuple[str, Scope]],
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Every route but :data:`PUBLIC_PATHS` needs one of ``tokens``; the request
    then carries the token's scope (``request[SCOPE]``), which the handlers
    use to refuse or filter what lies outside it."""
    known = [(t.encode(), scope) for t, scope in tokens]

    def scope_of(given: bytes) -> Scope | None:
        found = None
        for expected, scope in known:
            # Compare against every token, whatever matched: no timing hint
            # about which token (or how many) exist.
            if hmac.compare_digest(given, expected):
                found = scope
        return found

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if request.method == "OPTIONS" or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        scope = scope_of(given.strip().encode()) if scheme.lower() == "bearer" else None
        if scope is None:
            return _json_error(
                401,
                "Unauthorized",
                "send a gateway token as 'Authorization: Bearer <token>' "
                "(ledgerq commands: --token or LEDGERQ_TOKEN)",
                **{"WWW-Authenticate": 'Bearer realm="ledgerq"'},
            )
        # POST /batch_statuses is a read with its ids in the body (as Sawtooth's).
        write = request.method in WRITE_METHODS and unprefixed_path(request) not in READ_POSTS
        if write and is_action_path(path):
            if not scope.operate:
                return _json_error(
                    403,
                    "Forbidden",
                    f"the token {scope.name!r} may not pause, resume, skip or cancel; use a "
                    "token with access operate (or auth.token)",
                )
        elif (write and not scope.write) or (not write and not scope.read):
            return _json_error(
                403,
                "Forbidden",
                f"the token {scope.name!r} may not {'write' if write else 'read'}; "
                "use a token with that access",
            )
        if path in EVERYTHING_PATHS and not scope.sees_everything:
            return _json_error(
                403,
                "Forbidden",
                f"{path} covers every service; the token {scope.name!r} is limited to "
                f"{', '.join(scope.services)}",
            )
        request[SCOPE] = scope
        return await handler(request)

    return check


def host_middleware(
    allowed: Collection[str], *, bound_host: str, public_url: str, trust_forwarded: bool
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuse a ``Host`` the gateway does not answer for (DNS rebinding: a page
    whose name now resolves to 127.0.0.1 would otherwise reach a loopback
    gateway), and set the base of the links the API builds (``request[BASE_URL]``):
    ``public_url`` if configured, else the trusted ``X-Forwarded-*`` headers if
    so configured, else the checked ``Host``."""
    any_host = "*" in allowed
    hosts = {h.lower().strip("[]") for h in allowed if h != "*"}
    if bound_host and bound_host not in WILDCARDS:
        hosts.add(bound_host.lower().strip("[]"))

    def refused(name: str, what: str) -> web.Response:
        return _json_error(
            421,
            "Misdirected Request",
            f"this gateway does not answer for the {what} {name!r}; if it is really this "
            "gateway's name, add it to allowed_hosts (--allowed-hosts)",
        )

    def ok(name: str) -> bool:
        # "" is a header that names no host (host_name): never let in, not even by "*".
        return bool(name) and (any_host or is_loopback(name) or name in hosts)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        if request.path in PROBE_PATHS:
            # A load balancer's probe often names the instance by address;
            # these answers hold nothing a rebinding page could use.
            return await handler(request)
        if not ok(host_name(host)):
            return refused(host_name(host) or host[:100], "host")
        base = public_url
        if not base and trust_forwarded and "X-Forwarded-Host" in request.headers:
            fwd_host = request.headers["X-Forwarded-Host"].split(",")[0].strip()
            if not ok(host_name(fwd_host)):
                return refused(host_name(fwd_host) or fwd_host[:100], "forwarded host")
            proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
            base = f"{proto if proto in ('http', 'https') else request.scheme}://{fwd_host}"
        if not base:
            base = "" if any_host else f"{request.scheme}://{host}"
        request[BASE_URL] = base
        return await handler(request)

    return check


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Set on every answer as it is sent (``on_response_prepare``), whatever
    made it: a handler, a middleware's refusal, or the JSON error the
    outermost middlewares make of a failure."""
    response.headers.update(SECURITY_HEADERS)


def cors_middleware(origins: Collection[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    allowed = frozenset(origins)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        ok = origin is not None and ("*" in allowed or origin in allowed)
        if (
            request.method == "OPTIONS"
            and origin is not None
            and "Access-Control-Request-Method" in request.headers
        ):
            if not ok:
                return _json_error(403, "Forbidden", f"origin {origin} is not in cors.origins")
            response: web.StreamResponse = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
            response.headers["Access-Control-Max-Age"] = "600"
        else:
            response = await handler(request)
        if ok and origin is not None:
            response.headers["Access-Control-Allow-Origin"] = "*" if "*" in allowed else origin
            response.headers["Vary"] = "Origin"
        return response

    return cors


@web.middleware
async def service_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    # In the query (?service_id=) and in the path (/services/{service_id}/...);
    # an operator reaches the batches posted without a service too (#none,
    # as /services/%23none/pause).
    in_path = request.match_info.get("service_id")
    if in_path == NO_SERVICE and is_control_path(request.path):
        in_path = None
    for service_id in (request.query.get("service_id"), in_path):
        if service_id:
            problem = service_id_problem(service_id)
            if problem is not None:
                return _json_error(400, "Invalid Service Id", problem)
    return await handler(request)


def parse_origins(value: str) -> tuple[str, ...]:
    return tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
