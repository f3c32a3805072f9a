"""JSON error bodies for the errors aiohttp itself raises.

The handlers answer every refusal as ``{"error": {"code", "title",
"message"}}`` (on Sawtooth's routes with Sawtooth's codes and titles:
:func:`sawtooth_error`); aiohttp's own answers (no route: 404, wrong method: 405, body
over the limit: 413, a handler that raised: 500) would be plain text. This
middleware, the outermost one, turns every such error into the same JSON
shape, keeping its status and headers (``Allow`` on a 405). A body aiohttp
cannot read (a gzip or deflate body that does not decode, a broken chunk)
is a 400 saying so. Any other exception of a handler is logged with its
traceback and answered as a 500 that says nothing about the internals.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HINTS = {
    404: "no such resource; see /openapi.json for the routes",
    405: "this route does not take {method}; the Allow header lists what it takes",
    413: "the request body is too large; split it into several requests",
}


#: Set on every answer: by the gateway app as it sends one
#: (``ledgerq.operator.security``), and by the connection guard on the
#: answers it makes before any app runs (``ledgerq.ingest.guard``).
SECURITY_HEADERS = {
    # aiohttp would name itself and Python, with their versions.
    "Server": "ledgerq",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The dashboard loads its own script and stylesheet only, and talks to
    # its own origin; nothing inline, nothing framed.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
}


#: The errors of Sawtooth's REST API the gateway itself gives on Sawtooth's
#: routes (sawtooth-core ``rest_api/sawtooth_rest_api/exceptions.py``): code →
#: HTTP status and title. The read routes' errors (50, 53, 54, 57, 62, 70-72,
#: 75, 80-83) are the ledger's own (:mod:`ledgerq.ingest.chain`).
SAWTOOTH_ERRORS: dict[int, tuple[int, str]] = {
    30: (400, "Submitted Batches Invalid"),
    34: (400, "No Batches Submitted"),
    35: (400, "Protobuf Not Decodable"),
    42: (400, "Wrong Content Type"),
    43: (400, "Wrong Content Type"),
    46: (400, "Bad Status Request"),
    60: (400, "Invalid Resource Id"),
    66: (400, "Id Query Invalid or Missing"),
}


def sawtooth_error(code: int, message: str, rule: str | None = None) -> web.Response:
    """Sawtooth's error ``code`` (:data:`SAWTOOTH_ERRORS`), its status and
    title, with ledgerq's message and the ``rule`` that was broken."""
    status, title = SAWTOOTH_ERRORS[code]
    return web.json_response(error_body(status, title, message, rule, code=code), status=status)


def error_body(
    status: int, title: str, message: str, rule: str | None = None, *, code: int | None = None
) -> dict[str, Any]:
    """``{"error": {"code", "title", "message", "rule"?}}``: ``code`` is
    Sawtooth's numeric code on Sawtooth's routes, else the HTTP status."""
    body: dict[str, Any] = {"code": status if code is None else code, "title": title}
    body["message"] = message
    if rule is not None:
        body["rule"] = rule
    return {"error": body}


def _json_from(exc: web.HTTPException, request: web.Request) -> web.Response:
    status = exc.status
    hint = _HINTS.get(status, exc.text or exc.reason or "")
    message = hint.format(method=request.method)
    headers = {
        k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")
    }
    return web.json_response(
        error_body(status, exc.reason, message), status=status, headers=headers
    )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        return _json_from(exc, request)
    except web.RequestPayloadError as exc:
        # The client's mistake, not the gateway's: no traceback, no 500.
        why = getattr(exc.__cause__, "message", None) or "it is malformed or ended early"
        response = web.json_response(
            error_body(400, "Bad Request", f"the request body cannot be read: {why}"), status=400
        )
        response.force_close()  # the rest of the body is not worth reading
        return response
    except Exception:
        if request.transport is None or request.transport.is_closing():
            raise  # the connection is gone (cut off, or the client left): nobody to answer
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response(
            error_body(
                500, "Internal Server Error", "the gateway failed on this request; see its log"
            ),
            status=500,
        )
