"""The node read as Sawtooth's own clients read it (the ``sawtooth`` CLI and ``intkey``).

Each test follows one client's pattern, as running those clients against the
node showed it (``docs/api.md``, "Using an existing Grid or Sawtooth client"):

* the list commands (``sawtooth batch|transaction|block list``) follow
  ``paging.next`` until a page has none, sending their own query parameters
  again with every next link;
* ``sawtooth state list`` joins every page and prints the ``head`` of the
  last one, so all pages must be read at one head;
* ``sawtooth settings list`` lists the settings namespace, empty on this
  node, and needs ``head`` even then;
* ``intkey list`` reads one page of ``/state?address=1cf126`` and nothing
  more: 100 entries;
* ``sawtooth batch status`` and ``batch submit --wait`` POST the ids and
  read ``data``; ``intkey --wait`` reads ``data[0].status`` of a GET.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ledgerq.codec import ParsedBatch, Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.node import Node
from ledgerq.node.rest import make_app

SIGNER = Signer.generate()
INTKEY = "1cf126"
SETTINGS = "000000"


class Client:
    def __init__(self, node: Node, url: str, session: aiohttp.ClientSession) -> None:
        self.node, self.url, self.session = node, url, session

    async def get(self, url: str, params: dict[str, str] | None = None) -> Any:
        async with self.session.get(url, params=params) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def commit(self, batches: list[ParsedBatch]) -> None:
        await self.node.submit(batches)
        await self.node.batch_statuses([b.header_signature for b in batches], wait=5)

    async def follow(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        """Every page, as the CLI's list commands read them: its parameters go along
        with each next link (so a next link may carry ``limit`` twice)."""
        doc = await self.get(self.url + path, params)
        items = list(doc["data"])
        while "next" in doc["paging"]:
            doc = await self.get(doc["paging"]["next"], params)
            items += doc["data"]
        return items


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = await Node.open(None)
    runner = web.AppRunner(make_app(node), shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    session = aiohttp.ClientSession()
    yield Client(node, f"http://127.0.0.1:{runner.addresses[0][1]}", session)
    await session.close()
    await runner.cleanup()
    await node.close()


@pytest.mark.parametrize("path", ["/blocks", "/batches", "/transactions"])
async def test_list_commands_read_every_item_once_following_next(client: Client, path: str) -> None:
    await client.commit([make_intkey_batch(SIGNER, [("set", f"n{i}", i)]) for i in range(7)])
    whole = (await client.get(client.url + path))["data"]
    assert len(whole) == (8 if path == "/blocks" else 7)  # the blocks: and the genesis block
    assert await client.follow(path, {"limit": "2"}) == whole


@pytest.mark.parametrize("path", ["/blocks", "/batches", "/transactions"])
async def test_a_listing_read_while_the_chain_grows_is_the_list_at_its_first_head(
    client: Client, path: str
) -> None:
    await client.commit([make_intkey_batch(SIGNER, [("set", f"g{i}", i)]) for i in range(5)])
    before = (await client.get(client.url + path))["data"]
    first = await client.get(client.url + path, {"limit": "2"})
    await client.commit([make_intkey_batch(SIGNER, [("set", f"h{i}", i)]) for i in range(3)])
    items, doc = list(first["data"]), first
    while "next" in doc["paging"]:
        doc = await client.get(doc["paging"]["next"])
        assert doc["head"] == first["head"]
        items += doc["data"]
    assert items == before


async def test_state_list_joins_pages_read_at_one_head(client: Client) -> None:
    await client.commit([make_intkey_batch(SIGNER, [("set", f"s{i}", i) for i in range(230)])])
    doc = await client.get(client.url + "/state", {"address": INTKEY})
    heads, entries = {doc["head"]}, list(doc["data"])
    while "next" in doc["paging"]:
        doc = await client.get(doc["paging"]["next"])
        heads.add(doc["head"])
        entries += doc["data"]
    addresses = [e["address"] for e in entries]
    assert len(heads) == 1 and len(addresses) == 230 and addresses == sorted(set(addresses))


async def test_intkey_list_reads_one_page_of_100(client: Client) -> None:
    await client.commit([make_intkey_batch(SIGNER, [("set", f"p{i}", i) for i in range(130)])])
    page = await client.get(f"{client.url}/state?address={INTKEY}")
    assert len(page["data"]) == 100 and page["paging"]["next_position"]


async def test_settings_list_of_an_empty_namespace_still_names_the_head(client: Client) -> None:
    await client.commit([make_intkey_batch(SIGNER, [("set", "x", 1)])])
    latest = (await client.get(client.url + "/blocks?limit=1"))["head"]
    doc = await client.get(f"{client.url}/state?address={SETTINGS}")
    assert doc["data"] == [] and doc["head"] == latest and "next" not in doc["paging"]


async def test_status_commands_read_data(client: Client) -> None:
    good = make_intkey_batch(SIGNER, [("set", "ok", 1)])
    bad = make_intkey_batch(SIGNER, [("inc", "missing", 1)])
    async with client.session.post(
        client.url + "/batches",
        data=encode_batch_list([good, bad]),
        headers={"Content-Type": "application/octet-stream"},
    ) as r:
        assert r.status == 202
    ids = [good.header_signature, bad.header_signature]
    # sawtooth batch status / batch submit --wait: POST the ids, read "data".
    async with client.session.post(
        client.url + "/batch_statuses", params={"wait": "5"}, json=ids
    ) as r:
        statuses = (await r.json())["data"]
    assert [s["status"] for s in statuses] == ["COMMITTED", "INVALID"]
    assert statuses[0]["invalid_transactions"] == []
    [invalid] = statuses[1]["invalid_transactions"]
    assert invalid == {
        "id": bad.transactions[0].header_signature,
        "message": 'Verb is "inc" but name "missing" not in state',
    }
    # intkey --wait: GET with id and wait, read data[0].status.
    doc = await client.get(f"{client.url}/batch_statuses?id={ids[1]}&wait=5")
    assert doc["data"][0]["status"] == "INVALID"
