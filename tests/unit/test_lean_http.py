"""The lean HTTP/1.1 client of the ledger requests (ledgerq.ledgers.lean):
framing, keep-alive, and the failures the submitter's classification rests on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from ledgerq.ledgers.base import Accepted, Ambiguous, Busy, Unreachable
from ledgerq.ledgers.http import HttpTimeouts, post_batch_lean, read_statuses_lean
from ledgerq.ledgers.lean import ConnectFailed, LeanOrigin, RequestFailed
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.model import Committed

#: Answers a raw server gives, one per request, as bytes.
Script = Callable[[bytes], bytes | None]


class RawServer:
    """A TCP server that reads one request head (and its Content-Length body)
    at a time and writes what ``script`` returns (None: close the connection)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + (await reader.readexactly(length) if length else b"")
                self.requests.append(request)
                answer = self.script(request)
                if answer is None:
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
                if b"\r\nConnection: close\r\n" in answer.split(b"\r\n\r\n", 1)[0] + b"\r\n":
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Script], RawServer]]:
    servers: list[RawServer] = []

    async def start(script: Script) -> RawServer:
        s = RawServer(script)
        s.server = await asyncio.start_server(s.handle, "127.0.0.1", 0)
        servers.append(s)
        return s

    yield start  # type: ignore[misc]
    for s in servers:
        assert s.server is not None
        s.server.close()


def _ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_keep_alive_reuses_one_connection(raw) -> None:  # type: ignore[no-untyped-def]
    server = await raw(lambda _req: _ok(b"{}"))
    origin = LeanOrigin(server.url, connect_timeout_s=1)
    for _ in range(3):
        answer = await origin.request("GET", "/x", total_s=2)
        assert (answer.status, answer.body) == (200, b"{}")
    assert server.connections == 1
    await origin.close()


async def test_connection_close_and_http10_are_not_reused(raw) -> None:  # type: ignore[no-untyped-def]
    answers = iter(
        [
            _ok(b"a", "Connection: close"),
            b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb",
            _ok(b"c"),
        ]
    )
    server = await raw(lambda _req: next(answers))
    origin = LeanOrigin(server.url, connect_timeout_s=1)
    bodies = [(await origin.request("GET", "/x", total_s=2)).body for _ in range(3)]
    assert bodies == [b"a", b"b", b"c"]
    assert server.connections == 3
    await origin.close()


async def test_chunked_and_until_close_bodies(raw) -> None:  # type: ignore[no-untyped-def]
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\nTrailer: x\r\n\r\n"
    )
    answers = iter([chunked, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end"])
    server = await raw(lambda _req: next(answers))
    origin = LeanOrigin(server.url, connect_timeout_s=1)
    assert (await origin.request("GET", "/x", total_s=2)).body == b"Wikipedia"
    # No length, no chunks: the body is what comes until the server closes.
    assert (await origin.request("GET", "/y", total_s=2)).body == b"to the end"
    assert server.connections == 1
    await origin.close()


async def test_request_line_prefix_and_headers(raw) -> None:  # type: ignore[no-untyped-def]
    server = await raw(lambda _req: _ok(b"{}"))
    origin = LeanOrigin(
        server.url + "/api/", connect_timeout_s=1, headers={"Authorization": "Bearer t"}
    )
    await origin.request(
        "POST", "/batches?x=1", body=b"\x01\x02", content_type="application/octet-stream",
        total_s=2,
    )  # fmt: skip
    request = server.requests[0]
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /api/batches?x=1 HTTP/1.1"
    assert b"Authorization: Bearer t" in lines
    assert b"Content-Type: application/octet-stream" in lines
    assert b"Content-Length: 2" in lines
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in lines)
    assert body == b"\x01\x02"
    await origin.close()


async def test_failures_keep_their_kind(raw) -> None:  # type: ignore[no-untyped-def]
    timeouts = HttpTimeouts(connect=1, submit=0.3)
    # Nothing listening: never sent.
    closed = await raw(lambda _req: _ok(b""))
    assert closed.server is not None
    url = closed.url
    closed.server.close()
    await closed.server.wait_closed()
    origin = LeanOrigin(url, connect_timeout_s=1)
    with pytest.raises(ConnectFailed):
        await origin.request("GET", "/", total_s=1)
    assert isinstance(await post_batch_lean(origin, "/batches", b"x", timeouts), Unreachable)
    # Dropped after the request was read: ambiguous.
    dropping = await raw(lambda _req: None)
    origin = LeanOrigin(dropping.url, connect_timeout_s=1)
    with pytest.raises(RequestFailed):
        await origin.request("GET", "/", total_s=1)
    result = await post_batch_lean(origin, "/batches", b"x", timeouts)
    assert isinstance(result, Ambiguous) and result.status is None
    # No answer in time: ambiguous; the connection is not reused.
    silent = await raw(lambda _req: b"")
    origin = LeanOrigin(silent.url, connect_timeout_s=1)
    assert isinstance(await post_batch_lean(origin, "/batches", b"x", timeouts), Ambiguous)
    assert isinstance(await post_batch_lean(origin, "/batches", b"x", timeouts), Ambiguous)
    assert silent.connections == 2
    # Garbage instead of HTTP: ambiguous for a POST, a LedgerError for a read.
    garbage = await raw(lambda _req: b"SSH-2.0-OpenSSH\r\n\r\n")
    origin = LeanOrigin(garbage.url, connect_timeout_s=1)
    assert isinstance(await post_batch_lean(origin, "/batches", b"x", timeouts), Ambiguous)
    from ledgerq.errors import LedgerError

    with pytest.raises(LedgerError) as info:
        await read_statuses_lean(origin, "GET", "/batch_statuses?id=a", 0, timeouts)
    assert info.value.cause == "connection failed"


async def test_busy_answer_keeps_retry_after(raw) -> None:  # type: ignore[no-untyped-def]
    body = b'{"error": {"code": 31, "title": "busy", "message": "queue full"}}'
    server = await raw(
        lambda _req: (
            (
                f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
    )
    origin = LeanOrigin(server.url, connect_timeout_s=1)
    result = await post_batch_lean(origin, "/batches", b"x", HttpTimeouts())
    assert isinstance(result, Busy)
    assert result.retry_after_ms == 2000 and "queue full" in result.message
    ok = await raw(lambda _req: b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
    origin = LeanOrigin(ok.url, connect_timeout_s=1)
    assert isinstance(await post_batch_lean(origin, "/batches", b"x", HttpTimeouts()), Accepted)


@pytest.mark.parametrize("lean", [True, False])
async def test_sawtooth_client_on_either_http_client(raw, lean: bool) -> None:  # type: ignore[no-untyped-def]
    ids = [f"{i:0128x}" for i in range(20)]

    def script(request: bytes) -> bytes:
        if request.startswith(b"POST /batches "):
            return b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\n{}"
        entries = ",".join(f'{{"id": "{i}", "status": "COMMITTED"}}' for i in ids)
        return _ok(f'{{"data": [{entries}]}}'.encode())

    server = await raw(script)
    client = SawtoothClient(server.url, HttpTimeouts(lean=lean))
    try:
        assert isinstance(await client.submit("s", ids[0], b""), Accepted)
        few = await client.batch_statuses("s", ids[:2], wait_s=2)
        many = await client.batch_statuses("s", ids, wait_s=0)
    finally:
        await client.close()
    assert [s.batch_id for s in few] == ids[:2]
    assert [s.batch_id for s in many] == ids
    assert all(isinstance(s.status, Committed) for s in many)
    get = server.requests[1].split(b"\r\n", 1)[0].decode()
    assert get.startswith("GET /batch_statuses?") and "wait=2" in get
    assert f"{ids[0]},{ids[1]}" in get or f"{ids[0]}%2C{ids[1]}" in get
    post = server.requests[2]
    assert post.startswith(b"POST /batch_statuses") and b"application/json" in post


async def test_interim_answers_are_skipped(raw) -> None:  # type: ignore[no-untyped-def]
    server = await raw(lambda _req: b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"done"))
    origin = LeanOrigin(server.url, connect_timeout_s=1)
    answer = await origin.request("POST", "/batches", total_s=2, body=b"x")
    assert (answer.status, answer.body) == (200, b"done")
    await origin.close()


async def test_bytes_after_the_answer_keep_it_but_not_the_connection(raw) -> None:  # type: ignore[no-untyped-def]
    server = await raw(lambda _req: _ok(b"one") + _ok(b"two"))
    origin = LeanOrigin(server.url, connect_timeout_s=1)
    assert (await origin.request("GET", "/x", total_s=2)).body == b"one"
    assert (await origin.request("GET", "/x", total_s=2)).body == b"one"
    assert server.connections == 2  # the first connection was not reused
    await origin.close()


async def test_oversized_and_malformed_answers_fail_as_request_failed(
    raw, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from ledgerq.ledgers import lean

    monkeypatch.setattr(lean, "MAX_HEAD", 1024)
    monkeypatch.setattr(lean, "MAX_BODY", 100)
    answers = iter(
        [
            b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 4096 + b"\r\n\r\n",
            _ok(b"z" * 101),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n"
            + b"z" * 101
            + b"\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n",
            b"HTTP/1.1 2x0 OK\r\n\r\n",
        ]
    )
    server = await raw(lambda _req: next(answers))
    origin = LeanOrigin(server.url, connect_timeout_s=1)
    for expected in (
        "headers are too long",
        "out of bounds",
        "too long",
        "well-formed",
        "well-formed",
    ):
        with pytest.raises(RequestFailed, match=expected):
            await origin.request("GET", "/x", total_s=2)
    await origin.close()
