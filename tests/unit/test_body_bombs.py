"""Compressed request bodies on the gateway and the node, over real HTTP on
127.0.0.1: a gzip bomb is never inflated by aiohttp (not before a handler
reads it, not while a connection drains an unread body after the answer);
a handler that reads one inflates it off the event loop and stops past the
body limit (413); a valid gzip body is still taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import re
import threading
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.compression_utils import ZLibDecompressor

from ledgerq import httpbody
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.commands.node import start_listening
from ledgerq.config import load_settings
from ledgerq.ingest.api import ids_body_limit
from ledgerq.node import Node
from ledgerq.node.rest import make_app
from ledgerq.operator import extend_node_app
from tests.operator_fakes import running_gateway

LIMIT = 1 << 20
#: 32 MiB of zeros in about 32 KB.
BOMB = gzip.compress(bytes(32 << 20))


class Inflation:
    """What was inflated in this process: by aiohttp, and by ledgerq's reader
    (bytes out, and the threads it ran on)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_aiohttp = 0
        self.by_reader: list[int] = []
        self.threads: set[int] = set()
        original = ZLibDecompressor.decompress_sync
        inflate = httpbody.inflate

        def counted(decompressor: Any, data: bytes, max_length: int = 0) -> bytes:
            out: bytes = original(decompressor, data, max_length)
            self.by_aiohttp += len(out)
            return out

        def reader(raw: bytes, encoding: str, max_bytes: int) -> bytes:
            self.threads.add(threading.get_ident())
            try:
                out = inflate(raw, encoding, max_bytes)
            except httpbody.BodyTooLarge as exc:
                self.by_reader.append(exc.size)  # what it inflated before it stopped
                raise
            self.by_reader.append(len(out))
            return out

        monkeypatch.setattr(ZLibDecompressor, "decompress_sync", counted)
        monkeypatch.setattr(httpbody, "inflate", reader)


async def exchange(port: int, *requests: bytes) -> list[int]:
    """Send ``requests`` on one connection; the status of each answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(requests))
        await writer.drain()
        statuses = []
        for _ in requests:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
            statuses.append(int(head.split()[1]))
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            assert length is not None, head
            await reader.readexactly(int(length.group(1)))
        return statuses
    finally:
        writer.close()


def post(path: str, body: bytes, kind: str = "application/octet-stream") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def valid_list(n: int = 2) -> bytes:
    signer = Signer.generate()
    return encode_batch_list(
        [make_intkey_batch(signer, [("set", f"gz{i}", i)]).serialized for i in range(n)]
    )


@contextlib.asynccontextmanager
async def node_port() -> AsyncIterator[int]:
    node = await Node.open(None, shards=2)
    settings = load_settings({}, environ={}, config_file=None)
    app = extend_node_app(make_app(node, max_bytes=LIMIT), node)
    runner = await start_listening(app, settings, "127.0.0.1", 0)
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
        await node.close()


async def test_the_gateway_never_inflates_a_body_its_route_does_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = Inflation(monkeypatch)
    async with running_gateway({"max_body_bytes": LIMIT}) as (url, _gw):
        port = int(url.rsplit(":", 1)[1])
        # Answered at once (405), the unread bomb drained as sent; the next
        # request on the connection is answered after the drain.
        assert await exchange(port, post("/health", BOMB), get("/health")) == [405, 200]
        assert await exchange(port, post("/batches", BOMB), get("/health")) == [413, 200]
        statuses = post("/batch_statuses", BOMB, "application/json")
        assert await exchange(port, statuses, get("/health")) == [413, 200]
        assert await exchange(port, post("/batches", gzip.compress(valid_list()))) == [202]
    assert seen.by_aiohttp == 0
    # The reader stopped past each route's limit (the status route's is its
    # longest id list), on a thread that is not the loop's.
    limit = max(LIMIT, ids_body_limit(1000))
    assert seen.by_reader and max(seen.by_reader) <= limit + httpbody.STEP_BYTES
    assert threading.get_ident() not in seen.threads


async def test_the_node_never_inflates_a_body_its_route_does_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = Inflation(monkeypatch)
    async with node_port() as port:
        assert await exchange(port, post("/state", BOMB), get("/state")) == [405, 200]
        assert await exchange(port, post("/batches", BOMB), get("/state")) == [413, 200]
        statuses = post("/batch_statuses", BOMB, "application/json")
        assert await exchange(port, statuses, get("/state")) == [413, 200]
        assert await exchange(port, post("/batches", gzip.compress(valid_list()))) == [202]
    assert seen.by_aiohttp == 0
    assert seen.by_reader and max(seen.by_reader) <= LIMIT + 1024 + httpbody.STEP_BYTES
    assert threading.get_ident() not in seen.threads


@pytest.mark.parametrize(
    ("encoding", "raw", "expected"),
    [
        ("gzip", gzip.compress(b"abc") + gzip.compress(b"def"), b"abcdef"),
        ("gzip", gzip.compress(b"abc") + bytes(8), b"abc"),
        ("deflate", zlib.compress(b"abc"), b"abc"),
        ("deflate", zlib.compress(b"abc")[2:-4], b"abc"),  # raw deflate, as aiohttp takes it
    ],
)
def test_inflate_reads_what_gzip_and_deflate_write(
    encoding: str, raw: bytes, expected: bytes
) -> None:
    assert httpbody.inflate(raw, encoding, 100) == expected


@pytest.mark.parametrize(
    ("raw", "why"),
    [(b"not gzip at all", "not valid gzip"), (gzip.compress(b"abc" * 1000)[:20], "ends before")],
)
def test_inflate_refuses_what_does_not_inflate(raw: bytes, why: str) -> None:
    with pytest.raises(web.HTTPBadRequest) as caught:
        httpbody.inflate(raw, "gzip", 1 << 20)
    assert caught.value.text is not None
    assert caught.value.text.startswith(httpbody.UNREADABLE) and why in caught.value.text


def test_inflate_stops_past_the_limit() -> None:
    with pytest.raises(web.HTTPRequestEntityTooLarge):
        httpbody.inflate(BOMB, "gzip", LIMIT)
