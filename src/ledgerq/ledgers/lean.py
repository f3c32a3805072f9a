"""A lean HTTP/1.1 client for the two requests made per batch: ``POST /batches``
and the status read.

aiohttp's client does work on each request that these two never need (URL
handling, header multidicts, cookies, tracing hooks, its response
machinery); a submission and its status read are two requests per batch, the
largest share of the gateway's CPU per committed batch (figures in
``docs/gateway.md``, "CPU per batch"). This client does only what those requests need, on keep-alive
connections: it writes one request, has httptools (llhttp, the HTTP parser of
Node.js and uvicorn) parse the answer — status line, headers, a body framed by
``Content-Length`` or ``Transfer-Encoding: chunked``, or one that ends with
the connection — and hands the connection back to its pool when the answer
allows it (HTTP/1.1 without ``Connection: close``).

Failures keep the distinctions the submitter's classification rests on:

* :class:`ConnectFailed` — no connection could be made: the request was never
  sent (the submitter's ``Unreachable``);
* :class:`TimeoutError` — no complete answer within the total time (the
  connection is closed: its state is unknown);
* :class:`RequestFailed` — the connection broke or the answer could not be
  parsed once the request may have been written (``Ambiguous``).

Event streams and websockets stay on aiohttp (:mod:`ledgerq.ledgers.http`).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from collections import deque
from dataclasses import dataclass

import httptools

#: Largest answer read (a status list of ``max_ids`` ids is a few hundred KiB).
MAX_BODY = 64 << 20
#: Largest status line plus headers.
MAX_HEAD = 64 << 10


class ConnectFailed(OSError):
    """No connection: the request was not sent."""


class RequestFailed(OSError):
    """The connection broke, or the answer was not HTTP, after the request may have been sent."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    #: Header names in lower case (the last value of a repeated header).
    headers: dict[str, str]
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time.

    The answer is parsed by httptools (llhttp, the parser of Node.js and
    uvicorn): status line, headers, a body framed by ``Content-Length`` or
    ``Transfer-Encoding: chunked``, interim ``1xx`` answers skipped. Only a
    body that ends with the connection (neither header) is completed here, at
    end of file, which llhttp cannot see through httptools.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[Answer] | None = None
        self._reset()
        #: None until a request is sent: bytes before it are nobody's.
        self._parser: httptools.HttpResponseParser | None = None
        self.lost = False

    def _reset(self) -> None:
        """Before each request: a new parser, nothing of the last answer."""
        self._parser = httptools.HttpResponseParser(self)
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._head_seen = 0
        self._unparsed = 0
        self._headers_done = False
        self._done = False
        self.reusable = False

    # -- protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done() or self._parser is None:
            # Bytes nobody asked for: not a connection to reuse.
            self.lost = True
            self._close()
            return
        if not self._headers_done:
            self._unparsed += len(data)
        try:
            self._parser.feed_data(data)
        except Exception as exc:  # every parser failure is one outcome: see _failure
            if self._done:
                # Bytes after a complete answer: keep the answer, not the connection.
                answer.set_result(Answer(self._status, self._headers, b"".join(self._body)))
                self._close()
                return
            self._fail(_failure(exc))
            return
        if not self._headers_done and self._unparsed > MAX_HEAD:
            # No end of the headers in sight (a status line or a header that never ends).
            self._fail(RequestFailed("the answer's headers are too long"))
        elif self._done and not answer.done():
            answer.set_result(Answer(self._status, self._headers, b"".join(self._body)))

    def eof_received(self) -> bool | None:
        self.reusable = False
        answer = self._answer
        if answer is not None and not answer.done():
            if self._headers_done and not self._framed():
                # Neither Content-Length nor chunked: the body ends with the connection.
                answer.set_result(Answer(self._status, self._headers, b"".join(self._body)))
            else:
                self._fail(RequestFailed("the ledger closed the connection mid-answer"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if self._answer is not None and not self._answer.done():
            self._fail(RequestFailed(f"connection lost before the answer: {exc!r}"))

    # -- parser callbacks (httptools) ------------------------------------------------

    def on_message_begin(self) -> None:
        if self._done:
            raise RequestFailed("the ledger sent more than one answer")
        self._headers = {}
        self._body = []
        self._size = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_seen += len(name) + len(value) + 4
        if self._head_seen > MAX_HEAD:
            raise RequestFailed("the answer's headers are too long")
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._status = self._parser.get_status_code()
        if self._status >= 200:
            self._headers_done = True
            length = self._headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY:
                raise RequestFailed(f"Content-Length {length} out of bounds")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_BODY:
            raise RequestFailed("the answer is too long")
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._parser is not None
        if self._status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self._done = True
        self.reusable = self._parser.should_keep_alive()

    def _framed(self) -> bool:
        return (
            "content-length" in self._headers
            or "chunked" in self._headers.get("transfer-encoding", "").lower()
            or self._status in (204, 304)
        )

    # -- requests ------------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._reset()
        self._answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._answer

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
        self._close()

    def _close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def close(self) -> None:
        self._close()


def _failure(exc: Exception) -> Exception:
    """What a failure while parsing an answer is to the submitter: ``RequestFailed``."""
    if isinstance(exc, httptools.HttpParserCallbackError):
        cause = exc.__context__ or exc.__cause__
        if isinstance(cause, RequestFailed):
            return cause
    if isinstance(exc, RequestFailed):
        return exc
    if isinstance(exc, httptools.HttpParserUpgrade):
        return RequestFailed("the ledger switched protocols")
    if isinstance(exc, httptools.HttpParserError):
        return RequestFailed(f"not a well-formed HTTP/1.x answer: {exc}")
    return RequestFailed(f"the answer could not be read: {exc!r}")


def _expire(answer: asyncio.Future[Answer]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError("no complete answer in time"))


class LeanOrigin:
    """Keep-alive connections to one ``http://`` or ``https://`` origin.

    ``limit``: connections at once (0: no limit). ``headers``: sent with every
    request (an ``Authorization``, say).
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        limit: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        self.base_url = base_url.rstrip("/")
        default_port = self.port == (443 if url.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._fixed = f"Host: {self.host_header}\r\n{extra}"
        self._connect_timeout = connect_timeout_s
        self._idle: deque[_Connection] = deque()
        self._limit = asyncio.Semaphore(limit) if limit > 0 else None
        self._open: set[_Connection] = set()
        self.closed = False

    def url(self, target: str) -> str:
        """The full URL of ``target`` (for messages)."""
        return f"{self.base_url}{target}"

    def request_bytes(
        self, method: str, target: str, body: bytes | None, content_type: str | None
    ) -> bytes:
        head = f"{method} {self.prefix}{target} HTTP/1.1\r\n{self._fixed}"
        if content_type is not None:
            head += f"Content-Type: {content_type}\r\n"
        if body is not None or method in ("POST", "PUT"):
            head += f"Content-Length: {len(body or b'')}\r\n"
        return (head + "\r\n").encode("latin-1") + (body or b"")

    async def request(
        self,
        method: str,
        target: str,
        *,
        total_s: float,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> Answer:
        """One request; ``target`` is the path (after the base URL's) and query.

        Raises :class:`ConnectFailed`, :class:`TimeoutError` or
        :class:`RequestFailed` (module notes)."""
        if self.closed:
            raise ConnectFailed("the client is closed")
        request = self.request_bytes(method, target, body, content_type)
        if self._limit is not None:
            await self._limit.acquire()
        conn: _Connection | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total_s
        try:
            if self._idle:
                conn = self._reuse()
            if conn is None:
                # A new connection: the whole deadline bounds connecting too.
                async with asyncio.timeout_at(deadline):
                    conn = await self._connection()
            # Waiting for the answer: a timer that fails the answer's future
            # (cheaper than a timeout context per request; a cancellation
            # from outside still arrives as one).
            answer_future = conn.send(request)
            timer = loop.call_at(deadline, _expire, answer_future)
            try:
                answer = await answer_future
            finally:
                timer.cancel()
        except BaseException:
            if conn is not None:
                conn.close()  # its state is unknown
                self._open.discard(conn)
            raise
        finally:
            if self._limit is not None:
                self._limit.release()
        if conn.reusable and not self.closed:
            self._idle.append(conn)
        else:
            conn.close()
            self._open.discard(conn)
        return answer

    def _reuse(self) -> _Connection | None:
        """An idle connection still open, if any."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._open.discard(conn)
        return None

    async def _connection(self) -> _Connection:
        conn = self._reuse()
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    _Connection,
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except TimeoutError as exc:
            raise ConnectFailed(
                f"cannot connect to {self.host_header} within {self._connect_timeout:g} s"
            ) from exc
        except OSError as exc:  # refused, unreachable, DNS, TLS handshake
            raise ConnectFailed(f"cannot connect to {self.host_header}: {exc}") from exc
        self._open.add(conn)
        return conn

    async def close(self) -> None:
        self.closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
