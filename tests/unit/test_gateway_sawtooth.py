"""The gateway as a Sawtooth REST API: every read route answered from its ledger.

Over real HTTP on loopback, against a gateway whose ledger is the in-process
node, and against one in front of ``ledgerq node`` (its REST API on a real
socket, reached by the Sawtooth client): every read route of Sawtooth's REST
API (sawtooth-core ``rest_api.py``) answers through the gateway what the
node answers itself — status, body, error codes — with the links moved
onto the gateway, at its root and under a service's prefix. A Sawtooth
client's flow (submit under ``/services/svc1``, wait, read state, blocks
and transactions back) runs through the prefix alone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema_rs
import pytest
from aiohttp import web

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_address, make_intkey_batch
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError
from ledgerq.gateway.bus import MetricsSockets, WorkerChainReads
from ledgerq.gateway.run import IngestOnlyLedger
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers.base import LedgerClient
from ledgerq.ledgers.chain import SAWTOOTH_READS
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.ledgers.splinter import SplinterClient
from ledgerq.node import Node
from ledgerq.node.rest import make_app
from ledgerq.operator.openapi import load_spec
from ledgerq.store import open_store

OCTET = {"Content-Type": "application/octet-stream"}
SIGNER = Signer.generate()


class Setup:
    def __init__(self, gateway: str, node: str, http: aiohttp.ClientSession) -> None:
        self.gateway, self.node, self.http = gateway, node, http

    async def get(self, url: str, status: int = 200, **kwargs: Any) -> Any:
        async with self.http.get(url, **kwargs) as r:
            assert r.status == status, await r.text()
            return await r.json()


@contextlib.asynccontextmanager
async def gateway_on(
    ledger: LedgerClient, flags: Mapping[str, Any] | None = None
) -> AsyncIterator[tuple[str, Gateway]]:
    with tempfile.TemporaryDirectory(prefix="ledgerq-test-") as folder:
        db = f"sqlite:///{folder}/gateway.sqlite3"
        settings = load_settings(
            {"db": db, "bind": "127.0.0.1:0", **(flags or {})},
            environ={},
            config_file=None,
            cwd=Path(folder),
        )
        store = await open_store(db)
        gateway = Gateway(settings, store, ledger)
        task = asyncio.create_task(gateway.run())
        try:
            await asyncio.wait_for(gateway.started.wait(), 10)
            yield f"http://127.0.0.1:{gateway.port}", gateway
        finally:
            gateway.stop()
            await asyncio.wait_for(task, 10)
            await store.close()


@contextlib.asynccontextmanager
async def served_node(node: Node) -> AsyncIterator[str]:
    runner = web.AppRunner(make_app(node), shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture(params=["in-process", "sawtooth+http"])
async def setup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Setup]:
    node = await Node.open(tmp_path / "node")
    try:
        async with served_node(node) as node_url:
            in_process = request.param == "in-process"
            ledger: LedgerClient = NodeClient(node) if in_process else SawtoothClient(node_url)
            async with (
                gateway_on(ledger) as (gateway_url, _),
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
            ):
                yield Setup(gateway_url, node_url, http)
            await ledger.close()
    finally:
        await node.close()


async def submit(setup: Setup, prefix: str, *ops: tuple[str, str, int]) -> list[str]:
    """Post one batch per op through the gateway under ``prefix`` and wait for them."""
    batches = [make_intkey_batch(SIGNER, [op]) for op in ops]
    async with setup.http.post(
        f"{setup.gateway}{prefix}/batches", data=encode_batch_list(batches), headers=OCTET
    ) as r:
        assert r.status == 202, await r.text()
        link = (await r.json())["link"]
    assert link.startswith(f"{setup.gateway}{prefix}/batch_statuses?id=")
    doc = await setup.get(link + "&wait=10")
    assert {d["status"] for d in doc["data"]} == {"COMMITTED"}, doc
    return [b.header_signature for b in batches]


def documented(route: str, method: str, status: int, doc: Any) -> None:
    """``doc`` is what the gateway's spec says ``method route`` answers with ``status``."""
    spec = load_spec("gateway.openapi.json")
    responses = spec["paths"][route][method.lower()]["responses"]
    assert str(status) in responses, (method, route, status)
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    jsonschema_rs.validator_for({**schema, "components": spec["components"]}).validate(doc)


def without_links(doc: Any) -> Any:
    """A Sawtooth answer without the links, which differ by where it was asked."""
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k != "link"}
        if isinstance(doc.get("paging"), dict):
            doc["paging"] = {k: v for k, v in doc["paging"].items() if k != "next"}
    return doc


async def test_every_read_route_answers_what_the_ledger_answers(setup: Setup) -> None:
    ids = await submit(setup, "", ("set", "a", 1), ("set", "b", 2), ("inc", "a", 5))
    blocks = (await setup.get(f"{setup.node}/blocks"))["data"]
    tx = (await setup.get(f"{setup.node}/transactions"))["data"][0]["header_signature"]
    address = make_address("a")
    asked = {
        "/state": [f"/state?address={address[:6]}", "/state?limit=1", "/state?limit=0"],
        "/state/{address}": [f"/state/{address}", f"/state/{'0' * 70}", "/state/xyz"],
        "/blocks": ["/blocks", "/blocks?limit=1", "/blocks?limit=x", f"/blocks?head={'a' * 128}"],
        "/blocks/{block_id}": [
            f"/blocks/{blocks[0]['header_signature']}",
            f"/blocks/{'a' * 128}",
            "/blocks/nothex",
        ],
        "/batches": ["/batches", "/batches?limit=2", f"/batches?start={ids[1]}"],
        "/batches/{batch_id}": [f"/batches/{ids[0]}", f"/batches/{'b' * 128}", "/batches/x"],
        "/transactions": ["/transactions", "/transactions?limit=1&reverse"],
        "/transactions/{transaction_id}": [f"/transactions/{tx}", f"/transactions/{'c' * 128}"],
        "/receipts": [f"/receipts?id={tx}", "/receipts", f"/receipts?id={'d' * 128}"],
        "/peers": ["/peers"],
        "/status": ["/status"],
    }
    assert set(asked) == {route for _, route in SAWTOOTH_READS}
    for route, paths in asked.items():
        for path in paths:
            for prefix in ("", "/services/svc1"):
                async with setup.http.get(setup.node + path) as r:
                    expected_status, expected = r.status, await r.json()
                async with setup.http.get(setup.gateway + prefix + path) as r:
                    assert r.status == expected_status, (route, path, await r.text())
                    assert r.content_type == "application/json"
                    got = await r.json()
                assert without_links(got) == without_links(expected), (route, path)
                documented(prefix.replace("svc1", "{service_id}") + route, "GET", r.status, got)
                if "link" in expected:
                    # The same link, on the gateway and under the prefix it was asked by.
                    assert got["link"] == setup.gateway + prefix + expected["link"].removeprefix(
                        setup.node
                    )
    for body, content_type in (([tx], "application/json"), ([tx], "text/plain"), ([], None)):
        kwargs: dict[str, Any] = {"json": body} if content_type is None else {}
        if content_type is not None:
            kwargs = {"data": str(body), "headers": {"Content-Type": content_type}}
        async with setup.http.post(f"{setup.node}/receipts", **kwargs) as r:
            expected_status, expected = r.status, await r.json()
        async with setup.http.post(f"{setup.gateway}/services/s/receipts", **kwargs) as r:
            got = await r.json()
            assert (r.status, without_links(got)) == (expected_status, without_links(expected))
            documented("/services/{service_id}/receipts", "POST", r.status, got)


async def test_paging_links_stay_on_the_gateway(setup: Setup) -> None:
    ids = await submit(setup, "/services/svc1", *(("set", f"k{i}", i) for i in range(3)))
    seen: list[str] = []
    url: str | None = f"{setup.gateway}/services/svc1/batches?limit=1"
    while url is not None:
        assert url.startswith(f"{setup.gateway}/services/svc1/batches?")
        doc = await setup.get(url)
        seen += [b["header_signature"] for b in doc["data"]]
        url = doc["paging"].get("next")
    assert seen == ids[::-1]


async def test_a_sawtooth_client_flow_under_a_service_prefix(setup: Setup) -> None:
    """Submit, wait, then read state, blocks and transactions back, all
    under ``/services/svc1`` as a Sawtooth client with that ``--url`` would."""
    base = f"{setup.gateway}/services/svc1"
    ids = await submit(setup, "/services/svc1", ("set", "flow", 7), ("inc", "flow", 3))
    # The batches are the service's, in the gateway's tracking.
    tracked = await setup.get(f"{setup.gateway}/tracking/batches?service_id=svc1")
    assert [b["id"] for b in tracked["data"]] == ids
    state = await setup.get(f"{base}/state/{make_address('flow')}")
    assert base64.b64decode(state["data"]) == bytes.fromhex("a164666c6f770a")  # {"flow": 10}
    listed = await setup.get(f"{base}/state?address={make_address('flow')[:6]}")
    assert [e["address"] for e in listed["data"]] == [make_address("flow")]
    blocks = await setup.get(f"{base}/blocks")
    in_blocks = [b["header_signature"] for block in blocks["data"] for b in block["batches"]]
    assert in_blocks[:2] == ids[::-1]
    batch = await setup.get(f"{base}/batches/{ids[0]}")
    tx_id = batch["data"]["transactions"][0]["header_signature"]
    tx = await setup.get(f"{base}/transactions/{tx_id}")
    assert tx["data"]["header"]["family_name"] == "intkey"
    assert tx["link"] == f"{base}/transactions/{tx_id}"


#: Sawtooth's REST API errors (sawtooth-core ``exceptions.py``): code → status, title.
SAWTOOTH = {
    30: (400, "Submitted Batches Invalid"),
    34: (400, "No Batches Submitted"),
    35: (400, "Protobuf Not Decodable"),
    42: (400, "Wrong Content Type"),
    43: (400, "Wrong Content Type"),
    46: (400, "Bad Status Request"),
    60: (400, "Invalid Resource Id"),
    66: (400, "Id Query Invalid or Missing"),
}


def _bad_signature() -> bytes:
    batch = make_intkey_batch(SIGNER, [("set", "sig", 1)])
    raw = bytearray(batch.serialized)
    at = raw.index(batch.header_signature.encode()) + 100
    raw[at] = ord("0") if raw[at] != ord("0") else ord("1")  # the signature no longer verifies
    return encode_batch_list([bytes(raw)])


@pytest.mark.parametrize("prefix", ["", "/services/svc1"])
async def test_sawtooth_routes_answer_sawtooth_errors_with_the_rule_kept(prefix: str) -> None:
    # A bad signature was {"code": 400, "title": "Invalid BatchList"}: a
    # Sawtooth client (or a gateway in front) did not recognise a rejection.
    ok = encode_batch_list([make_intkey_batch(SIGNER, [("set", "e", 1)])])
    cases: list[tuple[str, str, Any, dict[str, str], int, str | None]] = [
        ("POST", "/batches", _bad_signature(), OCTET, 30, "bad_batch_signature"),
        ("POST", "/batches", b"", OCTET, 34, "empty_batch_list"),
        ("POST", "/batches", b"\x0a\x05junk!", OCTET, 35, "malformed_protobuf"),
        ("POST", "/batches", ok, {"Content-Type": "text/plain"}, 42, "wrong_content_type"),
        ("POST", "/batch_statuses", b"[]", {"Content-Type": "text/plain"}, 43, None),
        ("POST", "/batch_statuses", b'{"id": 1}', {"Content-Type": "application/json"}, 46, None),
        ("POST", "/batch_statuses", b"[]", {"Content-Type": "application/json"}, 46, "missing_id"),
        ("GET", "/batch_statuses?id=nothex", None, {}, 60, "malformed_id"),
        ("GET", "/batch_statuses", None, {}, 66, "missing_id"),
    ]
    node = await Node.open(None)
    async with gateway_on(NodeClient(node)) as (url, _), aiohttp.ClientSession() as http:
        for method, path, body, headers, code, rule in cases:
            async with http.request(method, url + prefix + path, data=body, headers=headers) as r:
                error = (await r.json())["error"]
                status, title = SAWTOOTH[code]
                assert (r.status, error["code"], error["title"]) == (status, code, title), error
            if rule is not None:
                assert error["rule"] == rule, (path, error)
            assert error["message"]
    await node.close()


async def test_an_invalid_batch_is_answered_without_empty_properties(tmp_path: Path) -> None:
    # Sawtooth's REST API drops empty strings (route_handlers._drop_empty_props):
    # "extended_data": "" was in every INVALID entry.
    node = await Node.open(tmp_path)
    async with gateway_on(NodeClient(node)) as (url, _), aiohttp.ClientSession() as http:
        batch = make_intkey_batch(SIGNER, [("inc", "missing", 1)])
        async with http.post(
            f"{url}/services/s/batches", data=encode_batch_list([batch]), headers=OCTET
        ) as r:
            link = (await r.json())["link"]
        async with http.get(link + "&wait=10") as r:
            (entry,) = (await r.json())["data"]
    assert entry["status"] == "INVALID"
    (invalid,) = entry["invalid_transactions"]
    assert invalid == {
        "id": batch.transactions[0].header_signature,
        "message": 'Verb is "inc" but name "missing" not in state',
    }
    await node.close()


async def test_an_unreachable_ledger_is_sawtooths_validator_disconnected() -> None:
    ledger = SawtoothClient("http://127.0.0.1:9")  # the discard port: nothing listens
    async with gateway_on(ledger) as (url, _), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/services/s/blocks") as r:
            assert r.status == 503
            error = (await r.json())["error"]
    assert (error["code"], error["title"]) == (18, "Validator Disconnected")
    assert "127.0.0.1:9" in error["message"]
    await ledger.close()


async def test_a_ledger_without_reads_answers_501() -> None:
    ledger = SplinterClient("http://127.0.0.1:9")
    async with gateway_on(ledger) as (url, _), aiohttp.ClientSession() as http:
        for path in ("/blocks", "/services/c::s/state", "/status"):
            async with http.get(url + path) as r:
                assert r.status == 501, path
                assert "splinter" in (await r.json())["error"]["message"]
    await ledger.close()


ADMIN, ACME, AUDIT = (
    "admin-token-0123456789ab",
    "acme-token-0123456789ab",
    "audit-token-0123456789ab",
)
TOKENS = [
    {"name": "acme", "token": ACME, "services": ["acme-*"], "access": "read-write"},
    {"name": "audit", "token": AUDIT, "services": ["*"], "access": "read"},
]


async def test_chain_reads_need_a_token_that_reads_every_service(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with gateway_on(NodeClient(node), flags) as (url, _), aiohttp.ClientSession() as http:

        async def status(method: str, path: str, token: str | None, **kw: Any) -> int:
            headers = {**kw.pop("headers", {})}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            async with http.request(method, url + path, headers=headers, **kw) as r:
                return r.status

        body = encode_batch_list([make_intkey_batch(SIGNER, [("set", "t", 1)])])
        post = {"data": body, "headers": OCTET}
        tx = "ab" * 64
        # The chain is every service's: a token limited to some may not read it.
        for path in ("/blocks", "/services/acme-1/state", "/services/acme-1/status"):
            assert await status("GET", path, ACME) == 403, path
            assert await status("GET", path, AUDIT) == 200, path
            assert await status("GET", path, None) == 401, path
        # Posting under a prefix is a write into that service.
        async with http.post(
            f"{url}/services/acme-1/batches",
            data=body,
            headers={**OCTET, "Authorization": f"Bearer {ACME}"},
        ) as r:
            assert r.status == 202
        assert await status("POST", "/services/globex/batches", ACME, **post) == 403
        assert await status("POST", "/services/acme-1/batches", AUDIT, **post) == 403
        # POST /receipts and POST /batch_statuses are reads, under a prefix too.
        ids = {"json": [tx]}
        assert await status("POST", "/services/acme-1/receipts", AUDIT, **ids) == 404  # code 80
        assert await status("POST", "/services/acme-1/batch_statuses", AUDIT, **ids) == 200
        assert await status("POST", "/services/acme-1/batch_statuses", ACME, **ids) == 200
        assert await status("GET", "/services/bad%20id/blocks", ADMIN) == 400
    await node.close()


async def test_default_service_takes_batches_posted_without_one(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    flags = {"default_service": "main"}
    async with gateway_on(NodeClient(node), flags) as (url, _), aiohttp.ClientSession() as http:
        setup = Setup(url, "", http)
        ids = await submit(setup, "", ("set", "d", 1))
        ids += await submit(setup, "/services/other", ("set", "o", 1))
        listed = await setup.get(f"{url}/tracking/batches")
    assert [(b["id"], b["service_id"]) for b in listed["data"]] == [
        (ids[0], "main"),
        (ids[1], "other"),
    ]
    await node.close()


def test_default_service_is_checked_at_start() -> None:
    with pytest.raises(ConfigError, match="default_service"):
        load_settings({"default_service": "no spaces"}, environ={}, config_file=None)


async def test_a_worker_without_the_node_reads_it_through_worker_0(tmp_path: Path) -> None:
    """``serve --workers N`` on SQLite: the in-process node lives in worker 0;
    the others answer Sawtooth's reads through worker 0's socket."""
    node = await Node.open(tmp_path / "node")
    sockets = MetricsSockets(str(tmp_path), 0, 2)
    stop = await sockets.serve(lambda: b"", chain=NodeClient(node))
    reads = WorkerChainReads(sockets.path(0))
    try:
        async with (
            served_node(node) as node_url,
            gateway_on(IngestOnlyLedger(NodeClient.DESCRIPTION, reads)) as (url, _),
            aiohttp.ClientSession() as http,
        ):
            await node.submit([make_intkey_batch(SIGNER, [("set", "w", 1)])])
            setup = Setup(url, node_url, http)
            for path in ("/blocks", f"/state/{make_address('w')}", "/blocks/nothex"):
                async with http.get(node_url + path) as r:
                    expected_status, expected = r.status, await r.json()
                async with http.get(f"{url}/services/s{path}") as r:
                    assert r.status == expected_status, path
                    assert without_links(await r.json()) == without_links(expected)
            doc = await setup.get(f"{url}/services/s/blocks")
            assert doc["link"].startswith(f"{url}/services/s/blocks")
    finally:
        await reads.close()
        await stop()
        await node.close()
