"""The node locked down: token, Host and Origin on every route; caps and expiries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from ledgerq.codec import Signer, encode_batch_list, make_batch, make_transaction
from ledgerq.codec.intkey import encode_payload, make_address, make_intkey_batch
from ledgerq.errors import NodeBusyError
from ledgerq.ledgers import Accepted, Unjudged, http_ledger_client
from ledgerq.model import BatchStatusName
from ledgerq.node import Node
from ledgerq.node.access import AccessPolicy, is_loopback
from ledgerq.node.rest import RestLimits, make_app
from ledgerq.node.scabbard import ScabbardServices
from ledgerq.operator import extend_node_app

SIGNER = Signer.generate()
TOKEN = "s3cret-token-0123456789"
OCTET = {"Content-Type": "application/octet-stream"}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Served:
    def __init__(self, runner: web.AppRunner, url: str, session: aiohttp.ClientSession) -> None:
        self.runner, self.url, self.session = runner, url, session


async def serve(app: web.Application) -> Served:
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    return Served(runner, f"http://127.0.0.1:{port}", aiohttp.ClientSession())


@pytest.fixture
async def locked(tmp_path: Path) -> AsyncIterator[tuple[Served, Node]]:
    node = await Node.open(None, shards=2)
    scabbard = ScabbardServices(tmp_path)
    policy = AccessPolicy(
        token=TOKEN, allowed_hosts=("node.example",), allowed_origins=("https://ok.example",)
    )
    app = extend_node_app(
        make_app(node, scabbard=scabbard, access=policy, limits=RestLimits(max_status_ids=5)),
        node,
    )
    served = await serve(app)
    yield served, node
    await served.session.close()
    await served.runner.cleanup()
    await scabbard.close()
    await node.close()


ROUTES = [
    ("POST", "/batches"),
    ("GET", "/batch_statuses?id=" + "a" * 128),
    ("POST", "/batch_statuses"),
    ("GET", "/state"),
    ("GET", "/state/" + "0" * 70),
    ("GET", "/logs/0.0"),
    ("GET", "/fingerprints/" + "a" * 128),
    ("GET", "/events"),
    ("GET", "/subscriptions"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("POST", "/scabbard/c/s/batches"),
    ("GET", "/scabbard/c/s/batch_statuses?ids=" + "a" * 128),
    ("GET", "/no/such/route"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_needs_the_token(
    locked: tuple[Served, Node], method: str, path: str
) -> None:
    served, _ = locked
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    for headers in ({}, wrong, {"Authorization": TOKEN}):
        async with served.session.request(method, served.url + path, headers=headers) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await r.json())["error"]["title"] == "Unauthorized"


async def test_the_token_lets_requests_in_websocket_and_sse_included(
    locked: tuple[Served, Node],
) -> None:
    served, _ = locked
    batch = make_intkey_batch(SIGNER, [("set", "a", 1)])
    async with served.session.post(
        served.url + "/batches", data=encode_batch_list([batch]), headers={**OCTET, **AUTH}
    ) as r:
        assert r.status == 202
    async with served.session.get(served.url + "/events", headers=AUTH) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    async with served.session.ws_connect(served.url + "/subscriptions", headers=AUTH) as ws:
        await ws.send_json({"action": "unsubscribe"})
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with served.session.ws_connect(served.url + "/subscriptions"):
            pass
    assert refused.value.status == 401


async def test_host_and_origin_are_checked(locked: tuple[Served, Node]) -> None:
    served, _ = locked
    cases = [
        ({"Host": "evil.example"}, 403),  # DNS rebinding: a foreign name for 127.0.0.1
        ({"Host": "node.example:8008"}, 200),  # listed
        ({"Host": "localhost:1"}, 200),
        ({"Origin": "https://evil.example"}, 403),  # a web page driving a browser
        ({"Origin": "https://ok.example"}, 200),
    ]
    for headers, status in cases:
        async with served.session.get(served.url + "/state", headers={**AUTH, **headers}) as r:
            assert r.status == status, headers
            if status == 403:
                assert (await r.json())["error"]["title"].endswith("Not Allowed")
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with served.session.ws_connect(
            served.url + "/subscriptions", headers={**AUTH, "Origin": "https://evil.example"}
        ):
            pass
    assert refused.value.status == 403


def test_loopback_addresses() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        assert is_loopback(host)
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.com"):
        assert not is_loopback(host)


async def test_too_many_ids_in_one_status_request(locked: tuple[Served, Node]) -> None:
    served, _ = locked
    ids = [f"{i:0128x}" for i in range(6)]
    async with served.session.post(
        served.url + "/batch_statuses",
        data=json.dumps(ids),
        headers={**AUTH, "Content-Type": "application/json"},
    ) as r:
        assert r.status == 400
        body = await r.json()
        assert body["error"]["code"] == 46 and "at most 5" in body["error"]["message"]


async def test_unknown_routes_and_crashes_answer_json(locked: tuple[Served, Node]) -> None:
    served, _ = locked
    async with served.session.get(served.url + "/nope", headers=AUTH) as r:
        assert r.status == 404 and set((await r.json())["error"]) == {"code", "title", "message"}
    async with served.session.delete(served.url + "/batches", headers=AUTH) as r:
        assert r.status == 405 and "error" in await r.json()
        assert "POST" in r.headers["Allow"]


async def test_a_crash_in_a_handler_is_a_sawtooth_500(
    locked: tuple[Served, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, node = locked

    async def broken(address: str) -> bytes | None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(node, "get_state", broken)
    async with served.session.get(served.url + "/state/" + "1cf126" + "0" * 64, headers=AUTH) as r:
        assert r.status == 500
        body = await r.json()
    assert body["error"]["code"] == 10 and body["error"]["title"] == "Unknown Validator Error"
    assert "disk on fire" not in body["error"]["message"]  # the details go to the log only


async def test_scabbard_opens_only_on_post_and_is_capped(tmp_path: Path) -> None:
    now = [0.0]
    services = ScabbardServices(tmp_path, max_services=2, idle_s=10, clock=lambda: now[0])
    try:
        assert await services.get("c", "never", create=False) is None
        assert not (tmp_path / "scabbard" / "c" / "never").exists()  # a GET creates nothing
        one = await services.get("c", "one")
        assert one is not None
        await services.get("c", "two")
        busy = make_intkey_batch(SIGNER, [("set", "b", 1)])
        await Node.submit(one, [busy])  # "one" is idle again once this commits
        await one.batch_statuses([busy.header_signature], wait=5)
        three = await services.get("c", "three")  # room made by closing the idlest
        assert three is not None and services.open_count == 2
        # A closed service's ledger is on disk: a status read reopens it.
        again = await services.get("c", "one", create=False)
        assert again is not None
        assert (await again.batch_statuses([busy.header_signature]))[
            busy.header_signature
        ].status == "COMMITTED"
        now[0] += 11
        assert await services.close_idle() == 2
        assert services.open_count == 0
        assert not ScabbardServices.valid("c" * 65, "s")
    finally:
        await services.close()


async def test_scabbard_reads_over_rest_open_nothing(
    locked: tuple[Served, Node], tmp_path: Path
) -> None:
    served, _ = locked
    url = served.url + "/scabbard/circ/svc/batch_statuses?ids=" + "a" * 128
    for _ in range(3):
        async with served.session.get(url, headers=AUTH) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == 71
    assert not (tmp_path / "scabbard").exists()  # no directory, journal or driver task
    long = served.url + "/scabbard/" + "c" * 65 + "/svc/batches"
    async with served.session.post(long, data=b"", headers=AUTH) as r:
        assert r.status == 404 and "at most 64 characters" in (await r.json())["error"]["message"]


async def test_scabbard_cap_refuses_when_all_are_busy(tmp_path: Path) -> None:
    services = ScabbardServices(tmp_path, max_services=1, commit_delay_ms=60_000)
    try:
        one = await services.get("c", "one")
        assert one is not None
        await one.submit([make_intkey_batch(SIGNER, [("set", "p", 1)])])  # stays PENDING
        with pytest.raises(NodeBusyError, match="scabbard services are open and busy"):
            await services.get("c", "two")
    finally:
        await services.close()


def _dependent(dep: str) -> object:
    address = make_address("h")
    return make_batch(
        SIGNER,
        [
            make_transaction(
                SIGNER,
                family_name="intkey",
                family_version="1.0",
                inputs=(address,),
                outputs=(address,),
                payload=encode_payload("set", "h", 1),
                dependencies=(dep,),
            )
        ],
    )


async def test_held_batches_expire_invalid_and_have_their_own_cap() -> None:
    now = [0]
    node = await Node.open(None, max_held=2, held_expiry_s=30, clock=lambda: now[0])
    try:
        missing = "f" * 128
        held = [_dependent(missing) for _ in range(2)]
        await node.submit(held)  # type: ignore[arg-type]
        ids = [b.header_signature for b in held]  # type: ignore[attr-defined]
        assert {i.status for i in (await node.batch_statuses(ids)).values()} == {"PENDING"}
        with pytest.raises(NodeBusyError, match="holds 2 batches"):
            await node.submit([_dependent(missing)])  # type: ignore[list-item]
        now[0] += 30_000
        node._wake.set()
        infos = await node.batch_statuses(ids, wait=5)
        for info in infos.values():
            assert info.status == "INVALID"
            [invalid] = info.invalid_transactions
            assert missing in invalid.message and "within 30 s" in invalid.message
        await node.submit([_dependent(missing)])  # type: ignore[list-item]  # room again
    finally:
        await node.close()


async def test_parked_waiters_are_capped() -> None:
    node = await Node.open(None, commit_delay_ms=60_000, max_waiters=3)
    try:
        batches = [make_intkey_batch(SIGNER, [("set", f"w{i}", i)]) for i in range(4)]
        await node.submit(batches)
        ids = [b.header_signature for b in batches]
        # Four PENDING ids would park four futures: over the cap, answered at once.
        answer = await asyncio.wait_for(node.batch_statuses(ids, wait=300), 1)
        assert {i.status for i in answer.values()} == {"PENDING"}
        parked = asyncio.create_task(node.batch_statuses(ids[:3], wait=300))
        await asyncio.sleep(0.01)
        assert not parked.done()
        assert node._parked == 3
        parked.cancel()
    finally:
        await node.close()


async def test_subscription_prefixes_are_capped(locked: tuple[Served, Node]) -> None:
    served, _ = locked
    async with served.session.ws_connect(served.url + "/subscriptions", headers=AUTH) as ws:
        await ws.send_json({"action": "subscribe", "address_prefixes": ["1cf126"] * 101})
        reply = await ws.receive_json(timeout=5)
        assert "at most 100" in reply["error"]


async def test_the_gateways_ledger_client_sends_the_token(
    locked: tuple[Served, Node],
) -> None:
    """`ledger_token`: the gateway's Sawtooth client gets into a locked node;
    without it, the node's 401 leaves the batch unjudged (never final)."""
    served, _node = locked
    batch = make_intkey_batch(Signer.generate(), [("set", "gw", 1)])
    without = http_ledger_client(f"sawtooth+{served.url}")
    with_token = http_ledger_client(f"sawtooth+{served.url}", token=TOKEN)
    try:
        refused = await without.submit("svc", batch.header_signature, batch.serialized)
        assert isinstance(refused, Unjudged) and refused.status == 401, refused
        accepted = await with_token.submit("svc", batch.header_signature, batch.serialized)
        assert isinstance(accepted, Accepted), accepted
        [status] = await with_token.batch_statuses("svc", [batch.header_signature], wait_s=5)
        assert status.status.name is BatchStatusName.COMMITTED
    finally:
        await without.close()
        await with_token.close()
