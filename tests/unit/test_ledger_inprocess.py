"""The in-process node as a ledger client."""

from __future__ import annotations

import asyncio

from ledgerq.codec import Signer
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.ledgers.base import Accepted, Busy, Rejected
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.model import Committed, Invalid
from ledgerq.node import Node


async def test_submit_statuses_and_events() -> None:
    node = await Node.open(None, shards=2)
    client = NodeClient(node)
    try:
        signer = Signer.generate()
        ok = make_intkey_batch(signer, [("set", "a", 1)])
        bad = make_intkey_batch(signer, [("inc", "nope", 1)])
        stream = client.events()
        assert stream is not None
        events = aiter(stream)
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0)
        assert await client.submit("s", ok.header_signature, ok.serialized) == Accepted(202)
        assert await client.submit("s", bad.header_signature, bad.serialized) == Accepted(202)
        statuses = await client.batch_statuses(
            "s", [ok.header_signature, bad.header_signature], wait_s=10
        )
        assert isinstance(statuses[0].status, Committed)
        assert isinstance(statuses[1].status, Invalid)
        event = await asyncio.wait_for(first, 10)
        assert event.batch_id == ok.header_signature
        assert isinstance(event.status, Committed)
        rejected = await client.submit("s", "x", b"\x0a\x02no")
        assert isinstance(rejected, Rejected)
    finally:
        await node.close()


async def test_full_node_is_busy() -> None:
    node = await Node.open(None, shards=1, max_pending=1, commit_delay_ms=60_000)
    client = NodeClient(node)
    try:
        signer = Signer.generate()
        a, b = (make_intkey_batch(signer, [("set", n, 1)]) for n in "ab")
        assert await client.submit("s", a.header_signature, a.serialized) == Accepted(202)
        busy = await client.submit("s", b.header_signature, b.serialized)
        assert isinstance(busy, Busy) and busy.status == 429
    finally:
        await node.close()
