"""A lean HTTP/1.1 client for the two requests made per batch: ``POST /batches``
and the status read.

aiohttp's client spends about 0.2 ms of CPU on each request (URL handling,
header multidicts, cookies, tracing hooks, its response machinery); a
submission and its status read are two requests per batch, the largest share
of the gateway's CPU per committed batch (``docs/gateway.md``, "CPU per
batch"). This client does only what those requests need, on keep-alive
connections: it writes one request, parses the status line, the headers and a
body framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the end
of the connection, and hands the connection back to its pool when the answer
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
    """One keep-alive connection: one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._answer: asyncio.Future[Answer] | None = None
        self._head: tuple[int, dict[str, str]] | None = None
        self._body_at = 0
        self.reusable = False
        self.lost = False

    # -- protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            # Bytes nobody asked for: not a connection to reuse.
            self.lost = True
            self._close()
            return
        self._buf += data
        try:
            answer = self._parse(eof=False)
        except RequestFailed as exc:
            self._fail(exc)
            return
        if answer is not None:
            self._answer.set_result(answer)

    def eof_received(self) -> bool | None:
        self.reusable = False
        if self._answer is not None and not self._answer.done():
            try:
                answer = self._parse(eof=True)
            except RequestFailed as exc:
                self._fail(exc)
            else:
                if answer is not None:
                    self._answer.set_result(answer)
                else:
                    self._fail(RequestFailed("the ledger closed the connection mid-answer"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if self._answer is not None and not self._answer.done():
            self._fail(RequestFailed(f"connection lost before the answer: {exc!r}"))

    # -- requests ------------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._buf.clear()
        self._head = None
        self.reusable = False
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

    # -- parsing ---------------------------------------------------------------------

    def _parse(self, *, eof: bool) -> Answer | None:
        buf = self._buf
        while self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    raise RequestFailed("the answer's headers are too long")
                return None
            version, status, headers = _parse_head(bytes(buf[:end]))
            del buf[: end + 4]
            if 100 <= status < 200:
                continue  # an interim answer (100 Continue): the real one follows
            self._head = (status, headers)
            self._keep = _keep_alive(version, headers)
        status, headers = self._head
        body, done = self._body(status, headers, eof)
        if not done:
            return None
        self.reusable = self._keep and not eof and not buf
        return Answer(status, headers, body)

    _keep = False

    def _body(self, status: int, headers: dict[str, str], eof: bool) -> tuple[bytes, bool]:
        buf = self._buf
        if status in (204, 304):
            return b"", True
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return _chunked(buf)
        length = headers.get("content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                raise RequestFailed(f"bad Content-Length {length!r}") from None
            if n < 0 or n > MAX_BODY:
                raise RequestFailed(f"Content-Length {n} out of bounds")
            if len(buf) < n:
                return b"", False
            body = bytes(buf[:n])
            del buf[:n]
            return body, True
        # Neither: the body ends with the connection.
        self._keep = False
        if len(buf) > MAX_BODY:
            raise RequestFailed("the answer is too long")
        if not eof:
            return b"", False
        body = bytes(buf)
        buf.clear()
        return body, True


def _parse_head(head: bytes) -> tuple[bytes, int, dict[str, str]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise RequestFailed(f"not an HTTP/1.x answer: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise RequestFailed(f"malformed header line {line[:100]!r}")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return parts[0], int(parts[1]), headers


def _keep_alive(version: bytes, headers: dict[str, str]) -> bool:
    connection = headers.get("connection", "").lower()
    if version == b"HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


def _chunked(buf: bytearray) -> tuple[bytes, bool]:
    """A complete chunked body from the start of ``buf`` (consumed), or not yet."""
    out = bytearray()
    at = 0
    while True:
        end = buf.find(b"\r\n", at)
        if end < 0:
            return b"", False
        size_text = bytes(buf[at:end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise RequestFailed(f"bad chunk size {size_text[:20]!r}") from None
        if size < 0 or len(out) + size > MAX_BODY:
            raise RequestFailed("the answer is too long")
        at = end + 2
        if size == 0:
            # Trailers (usually none), then an empty line.
            while True:
                end = buf.find(b"\r\n", at)
                if end < 0:
                    return b"", False
                empty = end == at
                at = end + 2
                if empty:
                    del buf[:at]
                    return bytes(out), True
        if len(buf) < at + size + 2:
            return b"", False
        out += buf[at : at + size]
        at += size + 2


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
