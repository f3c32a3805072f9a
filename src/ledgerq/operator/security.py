"""HTTP hardening of the gateway and node apps: bearer token, CORS, service id rule.

* **Bearer token** (``auth.token``): when set, every write (``POST``, ``PUT``,
  ``PATCH``, ``DELETE``) needs ``Authorization: Bearer <token>``; with
  ``auth.protect_reads`` every request does, except ``/health``, ``/ready``
  and the dashboard's static page and assets (they hold no data; the page
  asks for the token and sends it with its own reads). A missing or wrong
  token is a 401 JSON error; tokens are compared in constant time and never
  logged.
* **CORS** (``cors.origins``): no CORS header at all unless origins are
  configured; then only a listed origin (or ``*``) gets
  ``Access-Control-Allow-Origin`` and preflight answers.
* **Service ids** given as ``?service_id=`` must match :data:`SERVICE_ID_RE`
  (letters, digits and ``. _ - : ~ @ +``, at most
  :data:`~ledgerq.model.MAX_SERVICE_ID_LENGTH` characters, starting with a
  letter or digit), which admits Grid's ``circuit::service`` form; anything
  else is a 400 before any handler runs.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable, Collection

from aiohttp import web

from ledgerq.model import MAX_SERVICE_ID_LENGTH

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SERVICE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-:~@+]*")
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Paths that never need the token: they hold no tracked data.
PUBLIC_PATHS = frozenset({"/health", "/ready", "/", "/openapi.json"})
PUBLIC_PREFIXES = ("/static/",)


def _json_error(status: int, title: str, message: str, **headers: str) -> web.Response:
    return web.json_response(
        {"error": {"code": status, "title": title, "message": message}},
        status=status,
        headers=headers,
    )


def service_id_problem(service_id: str) -> str | None:
    """Why ``service_id`` is refused, or ``None`` if it is acceptable."""
    if len(service_id) > MAX_SERVICE_ID_LENGTH:
        return f"service_id is longer than {MAX_SERVICE_ID_LENGTH} characters"
    if not SERVICE_ID_RE.fullmatch(service_id):
        return (
            "service_id must start with a letter or digit and hold only letters, digits "
            "and . _ - : ~ @ +"
        )
    return None


def bearer_middleware(
    token: str, *, protect_reads: bool
) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = token.encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        needs = request.method in WRITE_METHODS or (
            protect_reads
            and request.method != "OPTIONS"
            and path not in PUBLIC_PATHS
            and not path.startswith(PUBLIC_PREFIXES)
        )
        if needs:
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), expected
            ):
                return _json_error(
                    401,
                    "Unauthorized",
                    "send the gateway's token as 'Authorization: Bearer <token>' "
                    "(ledgerq commands: --token or LEDGERQ_TOKEN)",
                    **{"WWW-Authenticate": 'Bearer realm="ledgerq"'},
                )
        return await handler(request)

    return check


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
    service_id = request.query.get("service_id")
    if service_id:
        problem = service_id_problem(service_id)
        if problem is not None:
            return _json_error(400, "Invalid Service Id", problem)
    return await handler(request)


def parse_origins(value: str) -> tuple[str, ...]:
    return tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
