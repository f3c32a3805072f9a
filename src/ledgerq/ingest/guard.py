"""Connection limits aiohttp does not have: header and body-read deadlines,
connection caps in all and per client address.

aiohttp bounds an idle keep-alive connection (``keepalive_timeout``) but not
a request in progress: a client may dribble its headers one byte at a time,
or its body, and hold a connection (and a file descriptor) for ever. A
:class:`GuardedSite` listens like :class:`aiohttp.web.TCPSite` but puts a
:class:`_Guard` in front of each connection's protocol. The gateway and
``ledgerq node`` both listen through one:

* **connection caps** — at most ``max_connections`` open connections, and
  at most ``max_connections_per_address`` from one client address (0: no
  such cap). A connection that would pass a cap first makes room by closing
  an **idle** one (no request in progress: never used, or between two
  requests), the longest idle of its own address at the address cap, of
  the address holding the most connections at the overall cap; HTTP lets a
  server close an idle keep-alive connection at any time. Only when none is
  idle is the new one answered ``503`` (JSON, ``Retry-After``) and closed
  at once. So silent sockets, however many, never keep a client out, and
  connections busy with requests from one address never take more than
  that address's share;
* **header deadline** — from the first byte of a request, its headers must
  be complete within ``header_timeout_s``, else ``408`` and the connection
  is closed;
* **body deadline** — from the end of the headers, the body must be
  complete within ``body_timeout_s``, else ``408`` and close;
* **JSON errors** — what aiohttp refuses before any handler runs (a
  malformed request, a request line or header over its limits) is answered
  in ledgerq's JSON error shape, not aiohttp's plain text;
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
connections are closed by aiohttp after ``keepalive_s`` (its
``keepalive_timeout``, which also bounds a connection that never sends a
request). An app may carry its own limits (:data:`LIMITS`, set from its
settings); the site then applies those.
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


@dataclass(frozen=True)
class HttpLimits:
    """What one connection may hold (module notes); configured as ``http.*``."""

    keepalive_s: float = 15.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 2048
    #: Open connections from one client address at most (0: no such cap).
    max_connections_per_address: int = 512


#: The limits an app asks of the site that serves it (over the site's own).
LIMITS: web.AppKey[HttpLimits] = web.AppKey("ledgerq_http_limits", HttpLimits)


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
    """Open connections of one site: how many, from which address, which are
    idle (each address's in the order they became idle)."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.open = 0
        self.refused = 0
        #: Idle connections closed to make room for new ones.
        self.evicted = 0
        #: Address → its open connections (an ordered set).
        self.by_address: dict[str, dict[_Guard, None]] = {}
        #: Address → its idle connections, longest idle first.
        self.idle: dict[str, dict[_Guard, None]] = {}

    def room_for(self, address: str) -> str | None:
        """Make room for a connection from ``address`` (closing an idle one if
        a cap is reached); why there is none, or None."""
        per_address = self.limits.max_connections_per_address
        mine = len(self.by_address.get(address, ()))
        if per_address and mine >= per_address and not self._evict(address):
            return f"{mine} connections from your address are open, its limit"
        if self.open >= self.limits.max_connections:
            busiest = sorted(self.idle, key=lambda a: len(self.by_address[a]), reverse=True)
            if not any(self._evict(a) for a in busiest[:1]):
                return f"{self.open} connections are open, the limit"
        return None

    def _evict(self, address: str) -> bool:
        idle = self.idle.get(address)
        if not idle:
            return False
        guard = next(iter(idle))
        guard.close_idle()
        self.evicted += 1
        return True

    def add(self, guard: _Guard) -> None:
        self.open += 1
        self.by_address.setdefault(guard.address, {})[guard] = None
        self.mark_idle(guard)

    def remove(self, guard: _Guard) -> None:
        self.open -= 1
        self.mark_busy(guard)
        mine = self.by_address.get(guard.address)
        if mine is not None:
            mine.pop(guard, None)
            if not mine:
                del self.by_address[guard.address]

    def mark_idle(self, guard: _Guard) -> None:
        self.idle.setdefault(guard.address, {})[guard] = None

    def mark_busy(self, guard: _Guard) -> None:
        idle = self.idle.get(guard.address)
        if idle is not None:
            idle.pop(guard, None)
            if not idle:
                del self.idle[guard.address]


_GUARDS: dict[int, _Guard] = {}


class _Guard(asyncio.Protocol):
    """Sits between the transport and aiohttp's protocol of one connection."""

    def __init__(self, inner: Any, counter: _Counter) -> None:
        self.inner = inner
        self.counter = counter
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.refused = False
        self.idle = True
        self.timer: asyncio.TimerHandle | None = None
        self.on_lost: set[Callable[[], None]] = set()

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not subclasses of asyncio.Transport.
        transport = self.transport = cast(asyncio.Transport, base)
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refusal = self.counter.room_for(self.address)
        if refusal is not None:
            self.refused = True
            self.counter.refused += 1
            transport.write(
                _raw_error(503, "Service Unavailable", f"{refusal}; retry later", Retry_After="1")
            )
            transport.close()
            return
        self.counter.add(self)
        _GUARDS[id(transport)] = self
        self.inner.connection_made(transport)

    def close_idle(self) -> None:
        """Close this idle connection (to make room for another): no answer is owed."""
        self.counter.mark_busy(self)  # never chosen twice
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.idle:
            self.idle = False
            self.counter.mark_busy(self)
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
        self.counter.remove(self)
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
        if self.transport is not None and not self.transport.is_closing():
            self.counter.mark_idle(self)

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
    and that it is done: its answer written, so that closing the connection
    as idle never cuts an answer off."""
    guard = _GUARDS.get(id(request.transport)) if request.transport is not None else None
    if guard is None:
        return await handler(request)
    guard.headers_in(request)
    try:
        response = await handler(request)
        if not response.prepared:
            await response.prepare(request)
        await response.write_eof()
        return response
    finally:
        guard.request_done()


class _JsonErrorHandler(RequestHandler):
    """aiohttp's protocol, answering the errors it finds before any handler
    runs (a malformed request, a request line or header over the limits) in
    ledgerq's JSON error shape instead of plain text, and logging each such
    request in one line (a failure of the server's own, a 5xx, with its
    traceback)."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:
            # A client's malformed request: one line, not a traceback a client
            # could repeat to flood the log.
            why = " ".join((message or str(exc) or type(exc).__name__).split())[:200]
            log.info("refused a malformed request from %s (%s): %s", request.remote, status, why)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was sent already; no error answer can follow it")
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        if status >= 500 or not message:
            text = "the server failed on this request; see its log"
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
        app = getattr(runner, "app", None)
        if isinstance(app, web.Application) and LIMITS in app:
            limits = app[LIMITS]  # the app's own, from its settings
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
