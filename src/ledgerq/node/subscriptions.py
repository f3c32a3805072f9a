"""``GET /subscriptions``: Sawtooth's state-delta websocket, served by the node.

The protocol is Sawtooth's (``state_delta_websockets``); a "block" is one
batch commit (see :mod:`ledgerq.node.blocks`). Client messages are JSON
objects with an ``action``:

* ``{"action": "subscribe", "address_prefixes": [...]}`` starts the
  subscription as of the current point (or replaces the previous one, prefixes
  included): from then on each block the node commits is sent as one message,
  its ``state_changes`` limited to addresses starting with one of the
  prefixes. No prefixes (or an empty list) means every change, as in
  Sawtooth's REST API; a prefix that no address has (any non-hex string)
  gives block messages with no changes.
* ``{"action": "unsubscribe"}`` stops the messages; the socket stays open.
* ``{"action": "get_block_deltas", "block_id": ..., "address_prefixes": [...]}``
  answers with that block's message (recent ones from memory, older ones
  from the store), or ``{"error": ...}`` for a block the node does not have.
* Anything else gets ``{"error": "Unknown action \\"...\\""}``; text that is not
  a JSON object gets ``{"error": "Invalid input: ..."}``.

Messages are sent in block order; a subscriber that falls behind the
in-memory blocks catches up from the store. When the node's
server stops, open sockets are closed with code 1001 (going away).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from ledgerq import jsontext
from ledgerq.node.node import Node

log = logging.getLogger(__name__)

_HEARTBEAT_S = 20.0
_SEND_TIMEOUT_S = 30.0
_PREFIX_RULE = f"address_prefixes must be a list of at most {100} strings of at most 70 characters"
_SOCKETS: web.AppKey[weakref.WeakSet[web.WebSocketResponse]] = web.AppKey(
    "subscription_sockets", weakref.WeakSet
)


def add_subscriptions(app: web.Application, node: Node) -> None:
    """Serve ``GET /subscriptions`` for ``node`` and close its sockets on shutdown."""
    sockets: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
    app[_SOCKETS] = sockets

    async def subscriptions(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=_HEARTBEAT_S, max_msg_size=_MAX_MESSAGE)
        await ws.prepare(request)
        sockets.add(ws)
        session = _Session(node, ws)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await session.handle(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await session.send({"error": "Invalid input: send JSON text messages"})
        finally:
            await session.unsubscribe()
            sockets.discard(ws)
        return ws

    async def close_sockets(_app: web.Application) -> None:
        for ws in list(sockets):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    ws.close(code=WSCloseCode.GOING_AWAY, message=b"node stopping"), 5
                )

    app.router.add_get("/subscriptions", subscriptions)
    app.on_shutdown.append(close_sockets)


#: Most address prefixes one subscription may name, and the longest message taken.
MAX_PREFIXES = 100
_MAX_MESSAGE = 64 * 1024


def _prefixes(message: dict[str, Any]) -> list[str] | None:
    prefixes = message.get("address_prefixes", [])
    if (
        not isinstance(prefixes, list)
        or len(prefixes) > MAX_PREFIXES
        or not all(isinstance(p, str) and len(p) <= 70 for p in prefixes)
    ):
        return None
    return prefixes


class _Session:
    """One socket: its subscription (a task sending blocks) and its requests."""

    def __init__(self, node: Node, ws: web.WebSocketResponse) -> None:
        self._node = node
        self._ws = ws
        self._sender: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()

    async def send(self, doc: dict[str, Any]) -> None:
        async with self._send_lock:  # one frame at a time: sender task and replies
            await asyncio.wait_for(self._ws.send_str(json.dumps(doc)), _SEND_TIMEOUT_S)

    async def handle(self, text: str) -> None:
        try:
            message = jsontext.loads(text)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            await self.send({"error": f"Invalid input: {text[:200]!r}"})
            return
        action = message.get("action", "")
        if action == "subscribe":
            prefixes = _prefixes(message)
            if prefixes is None:
                await self.send({"error": _PREFIX_RULE})
                return
            await self.unsubscribe()
            after = self._node.height  # as of now, before any await
            self._sender = asyncio.create_task(self._send_blocks(after, prefixes))
        elif action == "unsubscribe":
            await self.unsubscribe()
        elif action == "get_block_deltas":
            await self._block_deltas(message)
        else:
            await self.send({"error": f'Unknown action "{action}"'})

    async def _block_deltas(self, message: dict[str, Any]) -> None:
        wanted = message.get("block_id")
        if not isinstance(wanted, str) or not wanted:
            await self.send({"error": "Must specify a block id"})
            return
        prefixes = _prefixes(message)
        if prefixes is None:
            await self.send({"error": _PREFIX_RULE})
            return
        block = self._node.find_block(wanted)
        if block is None:
            await self.send(
                {"error": f"Block {wanted[:32]!r} is unknown: the node keeps only recent blocks"}
            )
            return
        await self.send(block.to_json(prefixes))

    async def _send_blocks(self, after: int, prefixes: Sequence[str]) -> None:
        try:
            async with contextlib.aclosing(self._node.follow_blocks(after)) as blocks:
                async for block in blocks:
                    await self.send(block.to_json(prefixes))
        except (ConnectionResetError, TimeoutError) as exc:
            log.debug("subscription socket stopped taking messages: %r", exc)
            await self._ws.close()

    async def unsubscribe(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
