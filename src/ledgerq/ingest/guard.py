"""Connection limits aiohttp does not have: header and body-read deadlines and
a connection cap.

aiohttp bounds an idle keep-alive connection (``keepalive_timeout``) but not
a request in progress: a client may dribble its headers one byte at a time,
or its body, and hold a connection (and a file descriptor) for ever. A
:class:`GuardedSite` listens like :class:`aiohttp.web.TCPSite` but puts a
:class:`_Guard` in front of each connection's protocol:

* **connection cap** — beyond ``max_connections`` open connections a new one
  is answered ``503`` (JSON, ``Retry-After``) and closed at once;
* **header deadline** — from the first byte of a request, its headers must
  be complete within ``header_timeout_s``, else ``408`` and the connection
  is closed;
* **body deadline** — from the end of the headers, the body must be
  complete within ``body_timeout_s``, else ``408`` and close;
* **JSON errors** — what aiohttp refuses before any handler runs (a
  malformed request, a request line or header over its limits) is answered
  in the gateway's JSON error shape, not aiohttp's plain text;
* **no inflating** — aiohttp runs with ``auto_decompress=False``: a gzip or
  deflate body is inflated only by a handler that reads it, off the event
  loop and bounded (:func:`ledgerq.httpbody.read_body`); a body no handler
  reads is discarded as sent. Any other ``Content-Encoding`` is the
  handlers' ``415`` naming :data:`ACCEPTED_ENCODINGS`
  (:func:`refuse_encoding`);
* **disconnects** — a handler may ask to hear when its client goes away
  (:func:`on_disconnect`): a parked long-poll then stops waiting at once,
  instead of holding its slot until its ``wait`` ends.

The guard learns where a request stands from :func:`guard_middleware`
(outermost middleware of the app): the handler starting means the headers
are in, the handler returning means the connection is idle again. Idle
connections are aiohttp's (``keepalive_timeout``, set from ``keepalive_s``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from ledgerq.ingest.errors import SECURITY_HEADERS, error_body

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one connection may hold (module notes); configured as ``http.*``."""

    keepalive_s: float = 15.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 2048


def request_line_limit(max_ids: int) -> int:
    """Longest request line that holds ``max_ids`` batch ids in a query
    (``%2C``-separated, the way a status link writes them) and a service id."""
    return max(8190, max_ids * (128 + 3) + 1024)


#: The ``Content-Encoding`` of a request body the gateway takes (gzip and
#: deflate inflated by :func:`ledgerq.httpbody.read_body`).
ACCEPTED_ENCODINGS = ("identity", "gzip", "deflate")


def encoding_refusal(encoding: str) -> web.Response:
    """The ``415`` for a body in a ``Content-Encoding`` the gateway does not take."""
    given = f"Content-Encoding {encoding!r}"
    return web.json_response(
        error_body(
            415,
            "Unsupported Media Type",
            f"{given} is not supported; send the body in one of {', '.join(ACCEPTED_ENCODINGS)}",
            "unsupported_encoding",
        ),
        status=415,
        headers={"Accept-Encoding": ", ".join(ACCEPTED_ENCODINGS)},
    )


def refuse_encoding(request: web.BaseRequest) -> web.Response | None:
    """The ``415`` for a request whose body is in an encoding the gateway does
    not take; None when it takes it (none given, identity, gzip, deflate)."""
    encoding = request.headers.get("Content-Encoding")
    if encoding and encoding.lower() not in ACCEPTED_ENCODINGS:
        return encoding_refusal(encoding)
    return None


def _raw_error(status: int, reason: str, message: str, **headers: str) -> bytes:
    body = json.dumps({"error": {"code": status, "title": reason, "message": message}}).encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
        *(f"{k}: {v}" for k, v in SECURITY_HEADERS.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Counter:
    """Open connections of one site, and the guard of each transport."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.open = 0
        self.refused = 0
        self.timed_out = 0


_GUARDS: dict[int, _Guard] = {}


class _Guard(asyncio.Protocol):
    """Sits between the transport and aiohttp's protocol of one connection."""

    def __init__(self, inner: Any, counter: _Counter) -> None:
        self.inner = inner
        self.counter = counter
        self.transport: asyncio.Transport | None = None
        self.refused = False
        self.idle = True
        self.timer: asyncio.TimerHandle | None = None
        self.on_lost: set[Callable[[], None]] = set()

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not subclasses of asyncio.Transport.
        transport = self.transport = cast(asyncio.Transport, base)
        if self.counter.open >= self.counter.limits.max_connections:
            self.refused = True
            self.counter.refused += 1
            transport.write(
                _raw_error(
                    503,
                    "Service Unavailable",
                    f"the gateway holds {self.counter.open} connections, its limit; retry later",
                    Retry_After="1",
                )
            )
            transport.close()
            return
        self.counter.open += 1
        _GUARDS[id(transport)] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.idle:
            self.idle = False
            self._arm(self.counter.limits.header_timeout_s, "headers")
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.refused:
            return None
        result: bool | None = self.inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.refused:
            return
        self.counter.open -= 1
        if self.transport is not None:
            _GUARDS.pop(id(self.transport), None)
        self.inner.connection_lost(exc)
        for callback in list(self.on_lost):
            callback()

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    # -- where the request stands (from guard_middleware) ---------------------

    def headers_in(self, request: web.Request) -> None:
        self._disarm()
        if request.body_exists and not request.content.is_eof():
            self._arm(self.counter.limits.body_timeout_s, "body", request)

    def request_done(self) -> None:
        self._disarm()
        self.idle = True

    # -- deadlines -------------------------------------------------------------

    def _arm(self, delay_s: float, what: str, request: web.Request | None = None) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(delay_s, self._expired, delay_s, what, request)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self, delay_s: float, what: str, request: web.Request | None) -> None:
        self.timer = None
        if request is not None and request.content.is_eof():
            return  # the body is in; the handler is working on it
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.counter.timed_out += 1
        log.info("closing a connection whose request %s took over %g s", what, delay_s)
        transport.write(
            _raw_error(
                408,
                "Request Timeout",
                f"the request's {what} did not arrive within {delay_s:g} s",
            )
        )
        transport.close()


def on_disconnect(request: web.Request, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` when the client of ``request`` goes away (on a guarded
    site; elsewhere never); returns what stops that."""
    guard = _GUARDS.get(id(request.transport)) if request.transport is not None else None
    if guard is None:
        return lambda: None
    guard.on_lost.add(callback)
    return lambda: guard.on_lost.discard(callback)


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tells the connection's guard (if any) that a request's headers are in,
    and that it is done."""
    guard = _GUARDS.get(id(request.transport)) if request.transport is not None else None
    if guard is None:
        return await handler(request)
    guard.headers_in(request)
    try:
        return await handler(request)
    finally:
        guard.request_done()


class _JsonErrorHandler(RequestHandler):
    """aiohttp's protocol, answering the errors it finds before any handler
    runs (a malformed request, a request line or header over the limits) in
    the gateway's JSON error shape instead of plain text."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs, checks nothing was sent
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        if status >= 500 or not message:
            text = "the gateway failed on this request; see its log"
        else:
            text = f"{message}; send a well-formed HTTP/1.1 request within the limits"
        response = web.json_response(
            error_body(status, reason, text), status=status, headers=SECURITY_HEADERS
        )
        response.force_close()
        return response


def _protocol_factory(server: Any) -> Callable[[], Any]:
    """What makes each connection's aiohttp protocol: :class:`_JsonErrorHandler`
    built as aiohttp's ``Server`` builds its own, or aiohttp's own if that
    ever changes shape."""

    def make() -> Any:
        try:
            # Bodies as sent: inflated only by a handler that reads one (module notes).
            kwargs = {**server._kwargs, "auto_decompress": False}
            return _JsonErrorHandler(server, loop=server._loop, **kwargs)
        except (AttributeError, TypeError):
            return server()

    return make


class GuardedSite(web.BaseSite):
    """A :class:`aiohttp.web.TCPSite` (``host``/``port``) or ``SockSite``
    (``sock``) whose connections are guarded by ``limits``."""

    __slots__ = ("_host", "_port", "_sock", "counter")

    def __init__(
        self,
        runner: web.BaseRunner,
        limits: HttpLimits,
        host: str | None = None,
        port: int = 0,
        *,
        sock: socket.socket | None = None,
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._sock = sock
        self.counter = _Counter(limits)

    @property
    def name(self) -> str:
        if self._sock is not None:
            return f"sock:{self._sock.getsockname()}"
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        factory = _protocol_factory(server)
        counter = self.counter

        def protocol() -> _Guard:
            return _Guard(factory(), counter)

        if self._sock is not None:
            self._server = await loop.create_server(protocol, sock=self._sock)
        else:
            self._server = await loop.create_server(
                protocol, self._host, self._port, reuse_address=True
            )
