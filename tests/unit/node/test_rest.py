"""The node's REST API over real HTTP on 127.0.0.1: shapes and error cases."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import cbor2
import pytest
from aiohttp import web

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_address, make_intkey_batch
from ledgerq.node import Node
from ledgerq.node.rest import make_app

SIGNER = Signer.generate()
OCTET = {"Content-Type": "application/octet-stream"}
VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "sawtooth-sdk"


class Server:
    def __init__(self, node: Node, runner: web.AppRunner, url: str, session: aiohttp.ClientSession):
        self.node, self.runner, self.url, self.session = node, runner, url, session


async def start(node: Node) -> Server:
    runner = web.AppRunner(make_app(node), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return Server(node, runner, f"http://{host}:{port}", aiohttp.ClientSession())


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    node = await Node.open(None, shards=2, max_pending=50)
    srv = await start(node)
    yield srv
    await srv.session.close()
    await srv.runner.cleanup()
    await node.close()


async def post(srv: Server, body: bytes, headers: dict[str, str] = OCTET) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with srv.session.post(f"{srv.url}/batches", data=body, headers=headers) as r:
        return r.status, await r.json()


async def statuses(srv: Server, ids: list[str], wait: int = 5) -> dict[str, dict]:  # type: ignore[type-arg]
    url = f"{srv.url}/batch_statuses?id={','.join(ids)}&wait={wait}"
    async with srv.session.get(url) as r:
        assert r.status == 200
        doc = await r.json()
    return {d["id"]: d for d in doc["data"]}


async def test_submit_and_query(server: Server) -> None:
    b1 = make_intkey_batch(SIGNER, [("set", "a", 7)])
    b2 = make_intkey_batch(SIGNER, [("inc", "nope", 1)])
    status, doc = await post(server, encode_batch_list([b1, b2]))
    assert status == 202
    assert doc["link"].endswith(f"/batch_statuses?id={b1.header_signature},{b2.header_signature}")
    got = await statuses(server, [b1.header_signature, b2.header_signature])
    assert got[b1.header_signature] == {
        "id": b1.header_signature,
        "status": "COMMITTED",
        "invalid_transactions": [],
    }
    bad = got[b2.header_signature]
    assert bad["status"] == "INVALID"
    # No "extended_data": "": Sawtooth's REST API drops empty properties from statuses.
    assert bad["invalid_transactions"] == [
        {
            "id": b2.transactions[0].header_signature,
            "message": 'Verb is "inc" but name "nope" not in state',
        }
    ]
    async with server.session.post(
        f"{server.url}/batch_statuses", json=[b1.header_signature, "f" * 128, b1.header_signature]
    ) as r:
        doc = await r.json()
    # One status per id asked, a repeated one too; a POST's answer is "data" only (its
    # ids are in no URL, so Sawtooth gives no link).
    assert [d["status"] for d in doc["data"]] == ["COMMITTED", "UNKNOWN", "COMMITTED"]
    assert set(doc) == {"data"}
    addr = make_address("a")
    async with server.session.get(f"{server.url}/state/{addr}") as r:
        entry = await r.json()
    assert cbor2.loads(base64.b64decode(entry["data"])) == {"a": 7}
    async with server.session.get(f"{server.url}/state?address={addr[:6]}") as r:
        listing = await r.json()
    assert [e["address"] for e in listing["data"]] == [addr]
    async with server.session.get(f"{server.url}/fingerprints/{b1.header_signature}") as r:
        fp = (await r.json())["fingerprint"]
    async with server.session.get(f"{server.url}/logs/{fp}") as r:
        logs = await r.json()
    assert logs["id"] == b1.header_signature and logs["success"] is True


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"\x00\x01", {"Content-Type": "text/plain"}, 400, 42),
        (b"", OCTET, 400, 34),
        (b"\xff\xff\xff", OCTET, 400, 35),
    ],
)
async def test_post_batches_errors(
    server: Server, body: bytes, headers: dict[str, str], status: int, code: int
) -> None:
    got, doc = await post(server, body, headers)
    assert (got, doc["error"]["code"]) == (status, code)
    assert doc["error"]["title"] and doc["error"]["message"]


async def test_bad_signature_is_code_30(server: Server) -> None:
    batch = make_intkey_batch(SIGNER, [("set", "s", 1)])
    raw = bytearray(encode_batch_list([batch]))
    sig = batch.header_signature.encode()
    i = raw.find(sig)
    raw[i : i + 2] = b"00" if raw[i : i + 2] != b"00" else b"11"
    got, doc = await post(server, bytes(raw))
    assert (got, doc["error"]["code"]) == (400, 30)


async def test_full_queue_is_429() -> None:
    node = await Node.open(None, max_pending=1, commit_delay_ms=60_000)
    srv = await start(node)
    try:
        assert (await post(srv, encode_batch_list([make_intkey_batch(SIGNER, [("set", "q", 1)])])))[
            0
        ] == 202
        status, doc = await post(
            srv, encode_batch_list([make_intkey_batch(SIGNER, [("set", "r", 1)])])
        )
        assert (status, doc["error"]["code"]) == (429, 31)
        # As Sawtooth orders it: a body that does not parse is still a 400, but
        # busy comes before any signature is checked (a forged one gets the 429).
        status, doc = await post(srv, b"\xff not a batch list")
        assert (status, doc["error"]["code"]) == (400, 35)
        forged = make_intkey_batch(SIGNER, [("set", "f", 1)])
        raw = bytearray(encode_batch_list([forged]))
        i = raw.find(forged.header_signature.encode())
        raw[i : i + 2] = b"00" if raw[i : i + 2] != b"00" else b"11"
        status, doc = await post(srv, bytes(raw))
        assert (status, doc["error"]["code"]) == (429, 31)
        assert "pending (limit 1)" in doc["error"]["message"]
    finally:
        await srv.session.close()
        await srv.runner.cleanup()
        await node.close()


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("get", "/batch_statuses", {}, 400, 66),
        ("get", "/batch_statuses?id=xyz", {}, 400, 60),
        # An id parameter present but empty names one empty id: malformed, not missing.
        ("get", "/batch_statuses?id=", {}, 400, 60),
        ("get", f"/batch_statuses?id={'a' * 128},,{'b' * 128}", {}, 400, 60),
        ("post", "/batch_statuses", {"json": ["a" * 128, "xyz"]}, 400, 60),
        (
            "post",
            "/batch_statuses",
            {"data": b"[]", "headers": {"Content-Type": "text/plain"}},
            400,
            43,
        ),
        ("post", "/batch_statuses", {"json": []}, 400, 46),
        ("post", "/batch_statuses", {"json": {"id": 1}}, 400, 46),
        # Nested past the parser's recursion limit: still a malformed body.
        (
            "post",
            "/batch_statuses",
            {"data": b"[" * 100_000, "headers": {"Content-Type": "application/json"}},
            400,
            46,
        ),
        ("get", "/state/1cf126", {}, 400, 62),
        ("get", "/state/" + "a" * 70, {}, 404, 75),
        ("get", "/state?address=XYZ", {}, 400, 62),
        # A prefix is whole bytes, as Sawtooth's validator checks a namespace.
        ("get", "/state?address=1cf12", {}, 400, 62),
        ("get", "/state?reverse", {}, 400, 57),
        ("get", "/state?reverse=true", {}, 400, 57),
        ("get", "/state?limit=0", {}, 400, 53),
        ("get", "/logs/nonsense", {}, 400, 60),
        ("get", "/logs/99.0", {}, 404, 80),
    ],
)
async def test_query_errors(
    server: Server, method: str, path: str, kwargs, status: int, code: int
) -> None:  # type: ignore[no-untyped-def]
    async with server.session.request(method, server.url + path, **kwargs) as r:
        assert r.status == status
        assert (await r.json())["error"]["code"] == code


async def test_event_stream_and_resume(server: Server) -> None:
    batches = [make_intkey_batch(SIGNER, [("set", f"ev{i}", i)]) for i in range(3)]
    await post(server, encode_batch_list(batches))
    await statuses(server, [b.header_signature for b in batches])

    async def read(headers: dict[str, str], n: int) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
        out: list[tuple[str, dict]] = []  # type: ignore[type-arg]
        async with server.session.get(f"{server.url}/events", headers=headers) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            event_id = None
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:"):
                    out.append((event_id or "", json.loads(line[5:])))
                    if len(out) == n:
                        return out
        return out

    got = await asyncio.wait_for(read({"Last-Event-ID": "0"}, 3), 10)
    assert [i for i, _ in got] == ["1", "2", "3"]
    assert [d["id"] for _, d in got] == [b.header_signature for b in batches]
    assert got[0][1] == {
        "id": batches[0].header_signature,
        "status": "COMMITTED",
        "invalid_transactions": [],
    }
    resumed = await asyncio.wait_for(read({"Last-Event-ID": "2"}, 1), 10)
    assert resumed[0][0] == "3"
    live = asyncio.create_task(read({}, 1))
    await asyncio.sleep(0.1)
    late = make_intkey_batch(SIGNER, [("set", "late", 1)])
    await post(server, encode_batch_list([late]))
    ((seq, data),) = await asyncio.wait_for(live, 10)
    assert (seq, data["id"]) == ("4", late.header_signature)


async def test_a_subscriber_going_away_ends_its_stream_quietly(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /events HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b": ledgerq node events"), 10)
    assert b"text/event-stream" in head
    writer.close()  # gone, as a killed gateway
    await writer.wait_closed()
    # Events for the stream to write to the closed connection.
    for i in range(3):
        batch = make_intkey_batch(SIGNER, [("set", f"gone{i}", i)])
        await post(server, encode_batch_list([batch]))
        await statuses(server, [batch.header_signature])
    await asyncio.sleep(0.2)
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors]


def _manifest(name: str) -> dict:  # type: ignore[type-arg]
    path = VECTORS / name / "manifest.json"
    assert path.exists(), f"Sawtooth SDK vectors missing at {path}"
    return json.loads(path.read_text())


async def test_sdk_vectors_in_order_commit(server: Server) -> None:
    manifest = _manifest("ordered")
    for svc in manifest["services"].values():
        for f in svc["files"]:
            status, _ = await post(server, (VECTORS / "ordered" / f).read_bytes())
            assert status == 202
    for svc in manifest["services"].values():
        got = await statuses(server, svc["batch_ids"], wait=10)
        assert {d["status"] for d in got.values()} == {"COMMITTED"}
        async with server.session.get(f"{server.url}/state/{svc['address']}") as r:
            data = base64.b64decode((await r.json())["data"])
        assert cbor2.loads(data) == {svc["name"]: svc["expected"]}


async def test_sdk_vectors_out_of_order_inc_is_invalid(server: Server) -> None:
    manifest = _manifest("ordered")
    svc = next(iter(manifest["services"].values()))
    first, second = svc["files"]
    # The second file holds the last two incs: posted before the set, they meet no name.
    await post(server, (VECTORS / "ordered" / second).read_bytes())
    await post(server, (VECTORS / "ordered" / first).read_bytes())
    got = await statuses(server, svc["batch_ids"], wait=10)
    statuses_in_order = [got[b]["status"] for b in svc["batch_ids"]]
    assert statuses_in_order == ["COMMITTED", "COMMITTED", "INVALID", "INVALID"]


async def test_sdk_vector_inc_without_set_is_invalid(server: Server) -> None:
    manifest = _manifest("inc-without-set")
    (svc,) = manifest["services"].values()
    await post(server, (VECTORS / "inc-without-set" / svc["files"][0]).read_bytes())
    got = await statuses(server, svc["batch_ids"], wait=10)
    (only,) = got.values()
    assert only["status"] == "INVALID"
    assert "not in state" in only["invalid_transactions"][0]["message"]


async def test_scabbard_routes_keep_services_apart() -> None:
    from ledgerq.ledgers.base import Accepted
    from ledgerq.ledgers.splinter import SplinterClient
    from ledgerq.model import Committed, Invalid, Unknown
    from ledgerq.node.scabbard import ScabbardServices

    node = await Node.open(None)
    scabbard = ScabbardServices(None, shards=2)
    runner = web.AppRunner(make_app(node, scabbard=scabbard), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    client = SplinterClient(f"http://{host}:{port}")
    try:
        one, two = "abcde-01234::a000", "abcde-01234::b000"
        set_x = make_intkey_batch(SIGNER, [("set", "x", 1)])
        inc_x = make_intkey_batch(SIGNER, [("inc", "x", 1)])
        assert isinstance(
            await client.submit(one, set_x.header_signature, set_x.serialized), Accepted
        )
        assert isinstance(
            await client.submit(two, inc_x.header_signature, inc_x.serialized), Accepted
        )
        (a,) = await client.batch_statuses(one, [set_x.header_signature], wait_s=5)
        (b,) = await client.batch_statuses(two, [inc_x.header_signature], wait_s=5)
        assert isinstance(a.status, Committed)
        assert isinstance(b.status, Invalid)  # service two has no x: separate state
        assert "not in state" in (b.status.transactions[0].error_message or "")
        (c,) = await client.batch_statuses(two, [set_x.header_signature])
        assert isinstance(c.status, Unknown)
        assert await node.get_state(make_address("x")) is None  # nor the main ledger's
    finally:
        await client.close()
        await runner.cleanup()
        await scabbard.close()
        await node.close()


async def test_hundreds_of_http_long_polls_wake_on_commit() -> None:
    now = [0]
    node = await Node.open(None, commit_delay_ms=1_000, clock=lambda: now[0])
    srv = await start(node)
    connector = aiohttp.TCPConnector(limit=0)
    session = aiohttp.ClientSession(connector=connector)
    polls: list[asyncio.Task[str]] = []
    try:
        batch = make_intkey_batch(SIGNER, [("set", "lp", 1)])
        bid = batch.header_signature
        assert (await post(srv, encode_batch_list([batch])))[0] == 202

        async def poll() -> str:
            async with session.get(f"{srv.url}/batch_statuses?id={bid}&wait=60") as r:
                return str((await r.json())["data"][0]["status"])

        polls += [asyncio.create_task(poll()) for _ in range(200)]
        for _ in range(1000):  # until every request is parked; none can finish yet
            if len(node._waiters.get(bid, ())) == 200:
                break
            await asyncio.sleep(0.01)
        assert len(node._waiters[bid]) == 200  # parked on futures, not polling
        assert not any(p.done() for p in polls)  # the clock is stopped: nothing commits
        now[0] += 1_000  # the commit delay passes; the driver commits on its next round
        node._wake.set()
        assert set(await asyncio.wait_for(asyncio.gather(*polls), 10)) == {"COMMITTED"}
    finally:
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        await session.close()
        await srv.session.close()
        await srv.runner.cleanup()
        await node.close()


@pytest.mark.parametrize(
    ("wait", "waits"),
    [("yes", True), ("", True), ("TRUE", True), ("5", True), ("false", False), ("FALSE", False)],
)
async def test_wait_is_read_as_sawtooth_reads_it(wait: str, waits: bool) -> None:
    # Sawtooth's REST API: absent or "false" (any case) is no wait, an integer
    # is seconds, any other value the longest wait.
    now = [0]
    node = await Node.open(None, commit_delay_ms=1_000, clock=lambda: now[0])
    srv = await start(node)
    try:
        batch = make_intkey_batch(SIGNER, [("set", "wt", 1)])
        bid = batch.header_signature
        assert (await post(srv, encode_batch_list([batch])))[0] == 202

        async def poll() -> str:
            async with srv.session.get(f"{srv.url}/batch_statuses?id={bid}&wait={wait}") as r:
                return str((await r.json())["data"][0]["status"])

        task = asyncio.create_task(poll())
        for _ in range(500):
            if task.done() or node._waiters.get(bid):
                break
            await asyncio.sleep(0.01)
        if not waits:
            assert await asyncio.wait_for(task, 10) == "PENDING"
            return
        assert not task.done() and node._waiters.get(bid)  # parked: the clock is stopped
        now[0] += 1_000
        node._wake.set()
        assert await asyncio.wait_for(task, 10) == "COMMITTED"
    finally:
        await srv.session.close()
        await srv.runner.cleanup()
        await node.close()
