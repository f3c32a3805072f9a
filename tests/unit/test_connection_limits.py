"""Connection caps on the gateway and the node, over real sockets on loopback:
one client address (127.0.0.2 here) cannot take every connection, silent
sockets never keep another client out (an idle one is closed to make room),
and the node has the gateway's header deadline, idle timeout and caps, and a
cap on its event streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ledgerq.commands.node import start_listening
from ledgerq.config import load_settings
from ledgerq.node import Node
from ledgerq.node.rest import RestLimits, make_app
from ledgerq.operator import extend_node_app
from tests.operator_fakes import running_gateway

ATTACKER = "127.0.0.2"
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def connect(port: int, source: str = "127.0.0.1") -> tuple[Any, Any]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return int(head.split()[1]), await reader.readexactly(length)


async def ask(port: int, request: bytes = HEALTH, source: str = "127.0.0.1") -> tuple[int, bytes]:
    reader, writer = await connect(port, source)
    try:
        writer.write(request)
        return await answer(reader)
    finally:
        writer.close()


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (it sent nothing before)."""
    return await asyncio.wait_for(reader.read(), 10) == b""


async def silent(port: int, n: int, source: str = ATTACKER) -> list[tuple[Any, Any]]:
    """``n`` connections that never send a byte, each accepted before the next."""
    held = []
    for _ in range(n):
        held.append(await connect(port, source))
        await ask(port, source="127.0.0.3")  # the server has taken it in by then
    return held


@contextlib.asynccontextmanager
async def gateway(flags: Mapping[str, Any]) -> AsyncIterator[int]:
    async with running_gateway(flags) as (url, _gw):
        yield int(url.rsplit(":", 1)[1])


async def test_one_address_holds_at_most_its_share_of_the_gateways_connections() -> None:
    flags = {"http.max_connections": 10, "http.max_connections_per_address": 4}
    async with gateway(flags) as port:
        # Silent sockets from one address: beyond its 4, each new one closes
        # that address's longest idle one; nobody else is kept out.
        held = await silent(port, 12)
        gone = [await closed(r) for r, _w in held[:8]]
        assert all(gone)
        for _ in range(5):
            assert (await ask(port))[0] == 200
        # Busy connections (a request begun) are not closed: a fifth from
        # that address is refused, another address is served.
        for _r, w in held[8:]:
            w.write(b"GET /health HTTP/1.1\r\n")
        await ask(port, source="127.0.0.3")  # the server has read those bytes by then
        status, body = await ask(port, source=ATTACKER)
        assert status == 503 and b"from your address" in body
        assert (await ask(port))[0] == 200
        for _r, w in held:
            w.close()


async def test_silent_sockets_never_keep_a_client_out_at_the_overall_cap() -> None:
    flags = {"http.max_connections": 6, "http.max_connections_per_address": 0}
    async with gateway(flags) as port:
        held = await silent(port, 5)
        held.append(await connect(port, ATTACKER))  # the sixth: every connection taken
        # At the cap, a request closes the longest idle connection instead of a 503.
        for _ in range(3):
            status, _body = await ask(port)
            assert status == 200
        assert await closed(held[0][0])
        for _r, w in held:
            w.close()


@contextlib.asynccontextmanager
async def node(flags: Mapping[str, Any], streams: int = 64) -> AsyncIterator[int]:
    ledger = await Node.open(None, shards=2)
    settings = load_settings(flags, environ={}, config_file=None)
    app = extend_node_app(make_app(ledger, limits=RestLimits(max_event_streams=streams)), ledger)
    runner = await start_listening(app, settings, "127.0.0.1", 0)
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
        await ledger.close()


STATE = b"GET /state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def test_the_node_has_the_gateways_deadlines_and_caps() -> None:
    flags = {
        "http.keepalive_s": 1.0,
        "http.header_timeout_s": 0.2,
        "node.max_connections": 10,
        "node.max_connections_per_address": 3,
    }
    async with node(flags) as port:
        # A silent connection is closed once idle for keepalive_s.
        reader, writer = await connect(port)
        assert await closed(reader)
        writer.close()
        # Headers dribbled and never finished: a JSON 408, then closed.
        reader, writer = await connect(port)
        writer.write(b"GET /state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
        status, body = await answer(reader)
        assert status == 408 and json.loads(body)["error"]["code"] == 408
        writer.close()
        # One address: 3 busy connections at most; others are served.
        held = []
        for _ in range(3):
            r, w = await connect(port, ATTACKER)
            w.write(b"GET /state HTTP/1.1\r\n")
            held.append((r, w))
            await ask(port, STATE, source="127.0.0.3")
        status, body = await ask(port, STATE, source=ATTACKER)
        assert status == 503 and b"from your address" in body
        assert (await ask(port, STATE))[0] == 200
        for _r, w in held:
            w.close()


async def test_the_nodes_event_streams_are_capped_per_address() -> None:
    events = b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with node({}, streams=8) as port:
        # A quarter of 8 per address: two streams open, the third refused.
        held = []
        for _ in range(2):
            reader, writer = await connect(port, ATTACKER)
            writer.write(events)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            held.append(writer)
        status, body = await ask(port, events, source=ATTACKER)
        assert status == 429 and b"your address" in body
        reader, writer = await connect(port)
        writer.write(events)
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(
            b"HTTP/1.1 200"
        )
        for w in [*held, writer]:
            w.close()
