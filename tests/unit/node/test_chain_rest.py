"""Sawtooth's read endpoints: blocks, batches, transactions, receipts, paging, head.

Also the node's OpenAPI held against Sawtooth's own (a copy of the REST API's
``openapi.yaml`` in ``tests/data``): every Sawtooth operation is served and
documented, with Sawtooth's response shapes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from ledgerq.codec import ParsedBatch, Signer, encode_batch_list, make_batch
from ledgerq.codec.intkey import make_address, make_intkey_batch
from ledgerq.node import Node
from ledgerq.node.blocks import block_id
from ledgerq.node.rest import make_app
from ledgerq.operator import extend_node_app
from ledgerq.operator.openapi import load_spec

SIGNER = Signer.generate()
SAWTOOTH_SPEC = Path(__file__).parents[2] / "data" / "sawtooth-openapi.yaml"
SAWTOOTH = yaml.safe_load(SAWTOOTH_SPEC.read_text())


class Chain:
    def __init__(self, url: str, session: aiohttp.ClientSession, batches: list[ParsedBatch]):
        self.url, self.session, self.batches = url, session, batches

    async def get(self, path: str, status: int = 200) -> Any:
        async with self.session.get(self.url + path) as r:
            assert r.status == status, await r.text()
            return await r.json()


@pytest.fixture
async def chain(tmp_path: Path) -> AsyncIterator[Chain]:
    node = await Node.open(tmp_path, block_buffer=2)
    runner = web.AppRunner(extend_node_app(make_app(node), node), shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    session = aiohttp.ClientSession()
    two = make_batch(
        SIGNER,
        [make_intkey_batch(SIGNER, [("set", n, 1)]).transactions[0] for n in ("b", "c")],
    )
    batches = [
        make_intkey_batch(SIGNER, [("set", "a", 1)]),  # block 1
        two,  # block 2: two transactions
        make_intkey_batch(SIGNER, [("inc", "nope", 1)]),  # block 3: INVALID, no batch
        make_intkey_batch(SIGNER, [("inc", "a", 5)]),  # block 4
    ]
    for batch in batches:
        await node.submit([batch])
        await node.batch_statuses([batch.header_signature], wait=5)
    await node.snapshot()  # half of it from the store, half from memory: both read alike
    yield Chain(url, session, batches)
    await session.close()
    await runner.cleanup()
    await node.close()


def ids(doc: dict[str, Any]) -> list[str]:
    return [d["header_signature"] for d in doc["data"]]


async def test_blocks_newest_first_with_paging_and_head(chain: Chain) -> None:
    b = chain.batches
    expected = [block_id(n, x.header_signature) for n, x in zip((4, 3, 2, 1), b[::-1], strict=True)]
    doc = await chain.get("/blocks")
    assert ids(doc) == expected and doc["head"] == expected[0]
    assert doc["data"][0]["header"]["previous_block_id"] == expected[1]
    assert doc["data"][1]["batches"] == [] and doc["data"][1]["header"]["batch_ids"] == []
    assert doc["data"][3]["header"]["previous_block_id"] == "0" * 16
    page = await chain.get("/blocks?limit=2")
    assert ids(page) == expected[:2] and page["paging"]["next_position"] == expected[2]
    rest = await chain.get(page["paging"]["next"].removeprefix(chain.url))
    assert ids(rest) == expected[2:] and "next_position" not in rest["paging"]
    assert ids(await chain.get("/blocks?reverse")) == expected[::-1]
    older = await chain.get(f"/blocks?head={expected[1]}")
    assert ids(older) == expected[1:] and older["head"] == expected[1]
    assert ids(await chain.get("/blocks?head=2")) == expected[2:]
    one = await chain.get(f"/blocks/{expected[2]}")
    assert one["data"]["batches"][0]["header_signature"] == b[1].header_signature
    assert (await chain.get(f"/blocks/{'a' * 128}", 404))["error"]["code"] == 70
    assert (await chain.get("/blocks/xyz", 400))["error"]["code"] == 60
    assert (await chain.get(f"/blocks?head={'a' * 128}", 404))["error"]["code"] == 50
    assert (await chain.get("/blocks?limit=0", 400))["error"]["code"] == 53


async def test_batches_and_transactions(chain: Chain) -> None:
    b = chain.batches
    committed = [b[3], b[1], b[0]]  # newest first; the INVALID one is in no block
    doc = await chain.get("/batches")
    assert ids(doc) == [x.header_signature for x in committed]
    assert doc["data"][1]["header"]["transaction_ids"] == list(b[1].transaction_ids)
    page = await chain.get("/batches?limit=1&start=" + b[1].header_signature)
    assert ids(page) == [b[1].header_signature]
    assert page["paging"]["next_position"] == b[0].header_signature
    one = await chain.get(f"/batches/{b[0].header_signature}")
    assert one["data"]["transactions"][0]["header"]["family_name"] == "intkey"
    assert (await chain.get(f"/batches/{b[2].header_signature}", 404))["error"]["code"] == 71
    txs = [t.header_signature for x in committed for t in reversed(x.transactions)]
    assert ids(await chain.get("/transactions")) == txs
    assert ids(await chain.get("/transactions?reverse=true")) == txs[::-1]
    second = b[1].transactions[1].header_signature
    assert ids(await chain.get(f"/transactions?start={second}&limit=2")) == txs[1:3]
    tx = await chain.get(f"/transactions/{second}")
    assert tx["data"]["header"]["outputs"] == list(b[1].transactions[1].header.outputs)
    missing = b[2].transactions[0].header_signature
    assert (await chain.get(f"/transactions/{missing}", 404))["error"]["code"] == 72


async def test_receipts_status_and_peers(chain: Chain) -> None:
    b = chain.batches
    tid = b[1].transactions[0].header_signature
    doc = await chain.get(f"/receipts?id={tid}")
    [receipt] = doc["data"]
    assert receipt["transaction_id"] == tid and receipt["events"] == []
    assert [c["address"] for c in receipt["state_changes"]] == [make_address("b")]
    async with chain.session.post(
        chain.url + "/receipts",
        data=json.dumps([tid, b[3].transactions[0].header_signature]),
        headers={"Content-Type": "application/json"},
    ) as r:
        assert r.status == 200 and len((await r.json())["data"]) == 2
    missing = b[2].transactions[0].header_signature
    assert (await chain.get(f"/receipts?id={missing}", 404))["error"]["code"] == 80
    assert (await chain.get("/receipts", 400))["error"]["code"] == 83
    assert (await chain.get("/status"))["data"] == {"endpoint": "", "peers": []}
    assert (await chain.get("/peers"))["data"] == []


async def test_state_head_and_paging(chain: Chain) -> None:
    latest = (await chain.get("/blocks?limit=1"))["head"]
    entry = await chain.get(f"/state/{make_address('a')}?head={latest}")
    assert entry["head"] == latest
    older = block_id(1, chain.batches[0].header_signature)
    refused = await chain.get(f"/state/{make_address('a')}?head={older}", 404)
    assert refused["error"]["code"] == 50
    page = await chain.get("/state?limit=2")
    assert len(page["data"]) == 2 and page["paging"]["next_position"]
    rest = await chain.get(page["paging"]["next"].removeprefix(chain.url))
    assert len(rest["data"]) == 1 and "next" not in rest["paging"]


@pytest.mark.parametrize("head", ["\u00b2", "9" * 5000, "0", "-1", "5"])
@pytest.mark.parametrize("path", ["/blocks", "/state", f"/state/{make_address('a')}"])
async def test_a_head_that_is_no_block_number_is_head_not_found(
    chain: Chain, path: str, head: str
) -> None:
    refused = await chain.get(f"{path}?head={head}", 404)
    assert refused["error"]["code"] == 50


@pytest.mark.parametrize("path", ["/blocks", "/batches", "/transactions", "/state"])
async def test_a_limit_above_the_largest_page_gets_the_largest_page(
    chain: Chain, path: str
) -> None:
    # Sawtooth's validator pages a limit above 1000 by 1000; it is no error.
    page = await chain.get(f"{path}?limit=5000")
    assert page["data"] and page["paging"]["limit"] == 1000
    for bad in ("0", "-1", "many"):
        assert (await chain.get(f"{path}?limit={bad}", 400))["error"]["code"] == 53


@pytest.mark.parametrize("start", ["zz", "1cfz", "1CF126", "g" * 70, "1" * 71])
async def test_state_start_that_is_no_address_is_a_paging_error(chain: Chain, start: str) -> None:
    # Not a 500 from the store's seek: a start that is no position is Sawtooth's
    # "Invalid Paging Query".
    refused = await chain.get(f"/state?start={start}", 400)
    assert refused["error"]["code"] == 54


async def test_submitting_through_rest_then_reading_the_chain(chain: Chain) -> None:
    batch = make_intkey_batch(SIGNER, [("set", "z", 9)])
    async with chain.session.post(
        chain.url + "/batches",
        data=encode_batch_list([batch]),
        headers={"Content-Type": "application/octet-stream"},
    ) as r:
        assert r.status == 202
    await chain.get(f"/batch_statuses?id={batch.header_signature}&wait=5")
    assert ids(await chain.get("/batches?limit=1")) == [batch.header_signature]


# --- the node's OpenAPI against Sawtooth's --------------------------------------------


def _sawtooth_operations() -> set[tuple[str, str]]:
    return {(m, p) for p, ops in SAWTOOTH["paths"].items() for m in ops if m in ("get", "post")}


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = spec["components"]["schemas"][name]
    return schema


def test_every_sawtooth_operation_is_in_the_node_spec_with_its_codes() -> None:
    node = load_spec("node.openapi.json")
    for method, path in sorted(_sawtooth_operations()):
        assert path in node["paths"] and method in node["paths"][path], (method, path)
        ours = node["paths"][path][method]["responses"]
        theirs = SAWTOOTH["paths"][path][method]["responses"]
        # Every success and client-error status Sawtooth documents, the node documents.
        wanted = {str(c) for c in theirs if 200 <= int(c) < 500 and int(c) != 429}
        assert wanted <= set(ours), (method, path, wanted - set(ours))


def test_sawtooth_response_envelopes_and_shapes_are_the_node_s() -> None:
    node = load_spec("node.openapi.json")
    for method, path in sorted(_sawtooth_operations()):
        theirs = SAWTOOTH["paths"][path][method]["responses"].get(200)
        if not theirs or "schema" not in theirs:
            continue
        envelope = set(theirs["schema"].get("properties", {}))
        ours = node["paths"][path][method]["responses"]["200"]["content"]["application/json"]
        assert envelope <= set(_resolve(node, ours["schema"]).get("properties", {})), path
    for name in ("Block", "Batch", "Transaction", "TransactionReceipt", "Paging"):
        theirs = set(SAWTOOTH["definitions"][name]["properties"])
        ours = set(node["components"]["schemas"][name]["properties"])
        assert theirs <= ours, (name, theirs - ours)
    for name, header in (("Block", "BlockHeader"), ("Transaction", "TransactionHeader")):
        theirs = set(SAWTOOTH["definitions"][header]["properties"])
        schema = _resolve(node, node["components"]["schemas"][name]["properties"]["header"])
        assert theirs <= set(schema["properties"]), (header, theirs - set(schema["properties"]))
