"""Transaction dependencies: a batch waits, PENDING and unordered, until they commit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import cbor2
import pytest

from ledgerq.codec import ParsedBatch, ParsedTransaction, Signer, make_batch, make_transaction
from ledgerq.codec.intkey import encode_payload, make_address
from ledgerq.node import Node

SIGNER = Signer.generate()


def tx(verb: str, name: str, value: int, deps: tuple[str, ...] = ()) -> ParsedTransaction:
    address = make_address(name)
    return make_transaction(
        SIGNER,
        family_name="intkey",
        family_version="1.0",
        inputs=(address,),
        outputs=(address,),
        payload=encode_payload(verb, name, value),
        dependencies=deps,
    )


async def status(node: Node, batch: ParsedBatch, wait: float | None = None) -> str:
    bid = batch.header_signature
    return (await node.batch_statuses([bid], wait=wait))[bid].status


async def value(node: Node, name: str) -> int | None:
    data = await node.get_state(make_address(name))
    return None if data is None else int(cbor2.loads(data)[name])


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    n = await Node.open(None)
    yield n
    await n.close()


async def test_a_dependent_batch_waits_for_its_dependency(node: Node) -> None:
    set_tx = tx("set", "d", 1)
    inc = make_batch(SIGNER, [tx("inc", "d", 2, deps=(set_tx.header_signature,))])
    await node.submit([inc])
    assert await status(node, inc, wait=0.2) == "PENDING"  # not ordered: not INVALID
    assert node.fingerprint_of(inc.header_signature) is None
    setter = make_batch(SIGNER, [set_tx])
    await node.submit([setter])
    assert await status(node, setter, wait=5) == "COMMITTED"
    assert await status(node, inc, wait=5) == "COMMITTED"
    assert await value(node, "d") == 3


async def test_dependencies_inside_the_batch_or_committed_are_satisfied(node: Node) -> None:
    first = tx("set", "e", 1)
    both = make_batch(SIGNER, [first, tx("inc", "e", 1, deps=(first.header_signature,))])
    await node.submit([both])
    assert await status(node, both, wait=5) == "COMMITTED"
    later = make_batch(SIGNER, [tx("inc", "e", 1, deps=(first.header_signature,))])
    await node.submit([later])
    assert await status(node, later, wait=5) == "COMMITTED"
    assert await value(node, "e") == 3


async def test_a_dependency_that_is_invalid_keeps_the_batch_pending(node: Node) -> None:
    bad = tx("inc", "nobody", 1)
    await node.submit([bad_batch := make_batch(SIGNER, [bad])])
    assert await status(node, bad_batch, wait=5) == "INVALID"
    waiting = make_batch(SIGNER, [tx("set", "f", 1, deps=(bad.header_signature,))])
    await node.submit([waiting])
    assert await status(node, waiting, wait=0.2) == "PENDING"
    assert await value(node, "f") is None


async def test_committed_dependencies_survive_a_restart(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    first = tx("set", "g", 1)
    batch = make_batch(SIGNER, [first])
    await node.submit([batch])
    assert await status(node, batch, wait=5) == "COMMITTED"
    await node.close()
    again = await Node.open(tmp_path)
    try:
        later = make_batch(SIGNER, [tx("inc", "g", 1, deps=(first.header_signature,))])
        await again.submit([later])
        assert await status(again, later, wait=5) == "COMMITTED"
    finally:
        await again.close()
