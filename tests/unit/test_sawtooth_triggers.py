"""The Sawtooth client follows ``/subscriptions``: real node, real sockets on 127.0.0.1.

The node serves ``/events`` too; these clients are built with
``use_events=False`` to stand for a Sawtooth validator's REST API, which has
only the websocket.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from ledgerq.codec import Signer
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.follow.follower import Follower, FollowSettings
from ledgerq.ledgers import SawtoothClient
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import BatchStatusName, TrackingBatch
from ledgerq.node import Node
from ledgerq.node.rest import make_app

SIGNER = Signer.generate()


class NodeServer:
    """A node behind its REST API; ``restart`` serves a fresh one on the same port."""

    def __init__(self) -> None:
        self.node: Node | None = None
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.node = await Node.open(None, shards=2)
        self.runner = web.AppRunner(make_app(self.node), shutdown_timeout=0.5)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self.node is not None:
            await self.node.close()
            self.node = None

    async def commit(self, name: str) -> str:
        assert self.node is not None
        b = make_intkey_batch(SIGNER, [("set", name, 1)])
        await self.node.submit([b])
        await self.node.batch_statuses([b.header_signature], wait=10)
        return b.header_signature


@pytest.fixture
async def server() -> AsyncIterator[NodeServer]:
    srv = NodeServer()
    await srv.start()
    yield srv
    await srv.stop()


async def next_trigger(triggers: AsyncIterator[None]) -> None:
    await asyncio.wait_for(anext(triggers), 15)


def until(condition: Callable[[], bool]) -> Awaitable[None]:
    """Poll ``condition`` (cheap, in-process) until it holds; fail after 15 s."""

    async def wait() -> None:
        for _ in range(1500):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the condition did not hold within 15 s")

    return wait()


async def test_each_block_is_a_trigger(server: NodeServer) -> None:
    client = SawtoothClient(server.url, use_events=False)
    assert client.events() is None
    triggers = client.triggers()
    assert triggers is not None
    try:
        await next_trigger(triggers)  # connected and subscribed
        await server.commit("t1")
        await next_trigger(triggers)
        await server.commit("t2")
        await server.commit("t3")
        await next_trigger(triggers)
        await next_trigger(triggers)
    finally:
        await triggers.aclose()  # type: ignore[attr-defined]
        await client.close()


async def test_block_announcements_reach_the_follower(server: NodeServer) -> None:
    """Every block the websocket announces is a trigger of the follower (which then
    asks about the batches not parked right now; see ``test_follower``)."""
    client = SawtoothClient(server.url, use_events=False)
    heard: dict[str, BatchStatusName] = {}

    class Sink:
        async def ledger_status(self, _service_id: str, status: LedgerBatchStatus) -> None:
            heard[status.batch_id] = status.status.name

    class Nothing:
        async def monitored_batches(self, *, limit: int) -> list[TrackingBatch]:
            return []

    settings = FollowSettings(poll_interval_s=3600, min_poll_interval_s=0.01)
    follower = Follower(Nothing(), client, Sink(), settings)
    task = asyncio.create_task(follower.run())
    try:
        await until(lambda: follower.triggers_received >= 1)  # connected
        real = make_intkey_batch(SIGNER, [("set", "watched", 1)])
        await client.submit("svc", real.header_signature, real.serialized)
        follower.accepted(real.header_signature, "svc")
        await until(lambda: heard.get(real.header_signature) is BatchStatusName.COMMITTED)
        await until(lambda: follower.triggers_received >= 2)  # the block that committed it
    finally:
        follower.stop()
        await asyncio.wait_for(task, 15)
        await client.close()


async def test_reconnects_after_the_node_restarts(server: NodeServer) -> None:
    client = SawtoothClient(server.url, use_events=False)
    triggers = client.triggers()
    assert triggers is not None
    try:
        await next_trigger(triggers)
        await server.stop()
        waiting = asyncio.ensure_future(next_trigger(triggers))
        await server.start()  # same port
        await waiting  # reconnected: a trigger, since blocks may have been missed
        await server.commit("after-restart")
        await next_trigger(triggers)
    finally:
        await triggers.aclose()  # type: ignore[attr-defined]
        await client.close()


async def test_falls_back_to_polling_without_the_endpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def statuses(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/batch_statuses", statuses)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    client = SawtoothClient(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        events, triggers = client.events(), client.triggers()
        assert events is not None and triggers is not None
        with caplog.at_level(logging.INFO, logger="ledgerq.ledgers.sawtooth"):
            # No /events (404), then no /subscriptions (404): both streams end.
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(events), 15)
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(triggers), 15)
        notes = [
            r.getMessage() for r in caplog.records if "subscription websocket" in r.getMessage()
        ]
        assert len(notes) == 1 and "parked reads only" in notes[0]
    finally:
        await client.close()
        await runner.cleanup()


async def test_no_triggers_where_events_exist(server: NodeServer) -> None:
    """The ledgerq node has /events, which carries statuses: the websocket is not used."""
    client = SawtoothClient(server.url)
    events, triggers = client.events(), client.triggers()
    assert events is not None and triggers is not None
    try:
        pending = asyncio.ensure_future(anext(events))
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(triggers), 15)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        await client.close()
