"""The node's ``/subscriptions`` websocket over real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import cbor2
import pytest
from aiohttp import WSCloseCode, WSMsgType, web

from ledgerq.codec import ParsedBatch, Signer, encode_batch_list
from ledgerq.codec.intkey import NAMESPACE, make_address, make_intkey_batch
from ledgerq.node import Node
from ledgerq.node.rest import make_app

SIGNER = Signer.generate()
OCTET = {"Content-Type": "application/octet-stream"}


class Server:
    def __init__(self, node: Node, runner: web.AppRunner, url: str) -> None:
        self.node, self.runner, self.url = node, runner, url
        self.session = aiohttp.ClientSession()

    async def commit(self, *batches: ParsedBatch) -> None:
        """POST the batches and wait until they are final."""
        async with self.session.post(
            f"{self.url}/batches", data=encode_batch_list(list(batches)), headers=OCTET
        ) as r:
            assert r.status == 202
        ids = [b.header_signature for b in batches]
        infos = await self.node.batch_statuses(ids, wait=10)
        assert all(i.status in ("COMMITTED", "INVALID") for i in infos.values())

    def block_id(self, num: int) -> str:
        block = self.node.get_block(num)
        assert block is not None
        return block.id

    async def socket(self) -> aiohttp.ClientWebSocketResponse:
        return await self.session.ws_connect(f"{self.url}/subscriptions")


async def serve(node: Node) -> Server:
    runner = web.AppRunner(make_app(node), shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return Server(node, runner, f"http://{host}:{port}")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    node = await Node.open(None, shards=2, block_buffer=3)
    srv = await serve(node)
    yield srv
    await srv.session.close()
    await srv.runner.cleanup()
    await node.close()


async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), 10)
    assert msg.type == WSMsgType.TEXT, msg
    doc: dict[str, Any] = json.loads(msg.data)
    return doc


async def subscribe(ws: aiohttp.ClientWebSocketResponse, prefixes: list[str] | None) -> None:
    message: dict[str, Any] = {"action": "subscribe"}
    if prefixes is not None:
        message["address_prefixes"] = prefixes
    await ws.send_json(message)
    # The subscription starts when the node has read the message: a request
    # answered after it shows that it has.
    await ws.send_json({"action": "ping"})
    assert await receive(ws) == {"error": 'Unknown action "ping"'}


def value(change: dict[str, Any]) -> Any:
    return cbor2.loads(base64.b64decode(change["value"]))


async def test_subscribe_filters_state_changes_by_prefix(server: Server) -> None:
    before = make_intkey_batch(SIGNER, [("set", "before", 1)])
    await server.commit(before)  # block 1, committed before anyone subscribed
    only_x = await server.socket()
    everything = await server.socket()
    await subscribe(only_x, [make_address("x")[:20]])
    await subscribe(everything, None)

    both = make_intkey_batch(SIGNER, [("set", "x", 5), ("set", "y", 6)])
    invalid = make_intkey_batch(SIGNER, [("inc", "missing", 1)])
    after = make_intkey_batch(SIGNER, [("set", "x2", 7)])
    await server.commit(both)
    await server.commit(invalid)
    await server.commit(after)

    first = await receive(only_x)  # as of the subscription: block 1 is not sent
    assert first["block_num"] == 2
    assert first["block_id"] == server.block_id(2)
    assert first["previous_block_id"] == server.block_id(1)
    assert first["state_changes"] == [
        {"type": "SET", "value": first["state_changes"][0]["value"], "address": make_address("x")}
    ]
    assert value(first["state_changes"][0]) == {"x": 5}
    second = await receive(only_x)
    assert second == {
        "block_num": 3,  # the INVALID batch is in no block: the next one is `after`'s
        "block_id": server.block_id(3),
        "previous_block_id": first["block_id"],
        "state_changes": [],  # nothing under the prefix
    }

    all_first = await receive(everything)
    assert all_first["block_id"] == first["block_id"]
    changes = {c["address"]: value(c) for c in all_first["state_changes"]}
    assert changes == {make_address("x"): {"x": 5}, make_address("y"): {"y": 6}}
    assert all(
        c["type"] == "SET" and c["address"].startswith(NAMESPACE)
        for c in all_first["state_changes"]
    )
    assert (await receive(everything))["block_num"] == 3
    await only_x.close()
    await everything.close()


async def test_first_block_follows_the_genesis_block(server: Server) -> None:
    ws = await server.socket()
    await subscribe(ws, [NAMESPACE])
    batch = make_intkey_batch(SIGNER, [("set", "one", 1)])
    await server.commit(batch)
    doc = await receive(ws)
    assert (doc["block_num"], doc["previous_block_id"]) == (1, server.block_id(0))
    assert len(doc["block_id"]) == 128
    await ws.close()


async def test_resubscribe_replaces_prefixes_and_unsubscribe_stops(server: Server) -> None:
    ws = await server.socket()
    await subscribe(ws, [make_address("a")])
    a = make_intkey_batch(SIGNER, [("set", "a", 1), ("set", "b", 1)])
    await server.commit(a)
    assert [c["address"] for c in (await receive(ws))["state_changes"]] == [make_address("a")]

    await subscribe(ws, [make_address("d")])
    b = make_intkey_batch(SIGNER, [("set", "c", 2), ("set", "d", 2)])
    await server.commit(b)
    assert [c["address"] for c in (await receive(ws))["state_changes"]] == [make_address("d")]

    await ws.send_json({"action": "unsubscribe"})
    c = make_intkey_batch(SIGNER, [("set", "e", 3)])
    await server.commit(c)
    # The next message is the answer to this request, not block 3.
    await ws.send_json({"action": "get_block_deltas", "block_id": server.block_id(3)})
    answer = await receive(ws)
    assert answer["block_num"] == 3 and answer["block_id"] == server.block_id(3)
    await ws.close()


async def test_get_block_deltas(server: Server) -> None:
    batches = [make_intkey_batch(SIGNER, [("set", f"k{i}", i)]) for i in range(5)]
    for batch in batches:
        await server.commit(batch)
    ws = await server.socket()
    known = server.block_id(4)
    await ws.send_json(
        {"action": "get_block_deltas", "block_id": known, "address_prefixes": [NAMESPACE]}
    )
    doc = await receive(ws)
    assert doc["block_num"] == 4
    assert doc["previous_block_id"] == server.block_id(3)
    assert [value(c) for c in doc["state_changes"]] == [{"k3": 3}]
    await ws.send_json(
        {"action": "get_block_deltas", "block_id": known, "address_prefixes": ["00"]}
    )
    assert (await receive(ws))["state_changes"] == []

    # The node keeps the last 3 blocks in memory (block_buffer=3); older ones are read
    # from the store.
    older = server.block_id(1)
    await ws.send_json({"action": "get_block_deltas", "block_id": older})
    doc = await receive(ws)
    assert doc["block_num"] == 1 and doc["previous_block_id"] == server.block_id(0)
    for unknown in ("f" * 128, server.block_id(4)[::-1], "nothex"):
        await ws.send_json({"action": "get_block_deltas", "block_id": unknown})
        assert set(await receive(ws)) == {"error"}
    await ws.send_json({"action": "get_block_deltas"})
    assert await receive(ws) == {"error": "Must specify a block id"}
    await ws.close()


async def test_unknown_action_and_invalid_input(server: Server) -> None:
    ws = await server.socket()
    await ws.send_json({"action": "bad_action"})
    assert await receive(ws) == {"error": 'Unknown action "bad_action"'}
    await ws.send_json({})
    assert await receive(ws) == {"error": 'Unknown action ""'}
    await ws.send_str("not json")
    assert (await receive(ws))["error"].startswith("Invalid input")
    await ws.send_json({"action": "subscribe", "address_prefixes": "1cf126"})
    assert "error" in await receive(ws)
    # The socket still works after errors.
    await subscribe(ws, [])
    await server.commit(make_intkey_batch(SIGNER, [("set", "after", 1)]))
    assert (await receive(ws))["block_num"] == 1
    await ws.close()


async def test_stopping_the_server_closes_open_sockets() -> None:
    node = await Node.open(None, shards=2)
    srv = await serve(node)
    try:
        ws = await srv.socket()
        await subscribe(ws, [])
        await srv.runner.cleanup()
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert (msg.type, msg.data) == (WSMsgType.CLOSE, WSCloseCode.GOING_AWAY)
        await ws.close()
    finally:
        await srv.session.close()
        await node.close()


async def test_block_ids_survive_a_restart(tmp_path: Path) -> None:
    node = await Node.open(tmp_path, shards=2)
    first = make_intkey_batch(SIGNER, [("set", "r1", 1)])
    await node.submit([first])
    await node.batch_statuses([first.header_signature], wait=10)
    before = [b.id for b in map(node.get_block, (0, 1)) if b is not None]
    await node.close()

    node = await Node.open(tmp_path, shards=2)
    try:
        follow = node.follow_blocks()
        second = make_intkey_batch(SIGNER, [("set", "r2", 2)])
        await node.submit([second])
        block = await asyncio.wait_for(follow.__anext__(), 10)
        await follow.aclose()
        assert block.num == 2
        assert [b.id for b in map(node.get_block, (0, 1)) if b is not None] == before
        assert block.previous_id == before[1]
        again = node.get_block(2)
        assert again is not None and block.id == again.id
    finally:
        await node.close()
