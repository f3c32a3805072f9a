"""Gateway REST API against the in-memory store, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web

from ledgerq.codec import Signer, encode_batch_list, make_batch
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.ingest.api import GatewayApi
from ledgerq.model import Committed, Pending, TrackingBatch
from ledgerq.store import open_store

JSON = {"Content-Type": "application/json"}
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, GatewayApi, list[TrackingBatch]]]:
    store = await open_store("memory://")
    accepted: list[TrackingBatch] = []
    gateway_api = GatewayApi(store, on_accepted=accepted.extend, max_body_bytes=4096)
    runner = web.AppRunner(gateway_api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", gateway_api, accepted
    await runner.cleanup()
    await store.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


def batches(n: int, name: str = "k") -> list[bytes]:
    signer = Signer.generate()
    return [make_intkey_batch(signer, [("set", f"{name}{i}", i)]).serialized for i in range(n)]


async def test_post_stores_in_order_and_links_statuses(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    url, _, accepted = api
    body = encode_batch_list(batches(3))
    async with http.post(f"{url}/batches?service_id=c1::s1", data=body, headers=OCTET) as r:
        assert r.status == 202
        link = (await r.json())["link"]
    assert [b.seq for b in accepted] == sorted(b.seq for b in accepted)
    assert all(b.service_id == "c1::s1" for b in accepted)
    async with http.get(link) as r:
        status = await r.json()
    data = status["data"]
    assert [d["id"] for d in data] == [b.batch_id for b in accepted]
    # Absolute, as Sawtooth's, and the same request.
    assert status["link"].startswith(f"{url}/batch_statuses?")
    assert parse_qs(urlsplit(status["link"]).query) == parse_qs(urlsplit(link).query)
    ids = [b.batch_id for b in accepted]
    async with http.post(f"{url}/batch_statuses", json=ids) as r:
        assert (await r.json())["link"].startswith(f"{url}/batch_statuses?id=")
    # The link of a POST asks what it asked: its ids, in its service.
    async with http.post(f"{url}/batch_statuses?service_id=c1::s1", json=ids) as r:
        posted = await r.json()
    async with http.get(posted["link"]) as r:
        assert (await r.json())["data"] == posted["data"]
    async with http.post(f"{url}/batch_statuses?service_id=c2", json=ids) as r:
        posted = await r.json()
    assert {d["status"] for d in posted["data"]} == {"UNKNOWN"}
    async with http.get(posted["link"]) as r:
        assert (await r.json())["data"] == posted["data"]
    assert {d["status"] for d in data} == {"PENDING"}
    async with http.get(f"{url}/batch_statuses?id={'0' * 128}") as r:
        assert (await r.json())["data"][0]["status"] == "UNKNOWN"


async def test_post_errors_name_the_problem(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    url, _, _ = api
    body = encode_batch_list(batches(1))
    async with http.post(f"{url}/batches", data=body, headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 400  # Sawtooth's code 42
        assert "application/octet-stream" in (await r.json())["error"]["message"]
    async with http.post(f"{url}/batches", data=b"\x0a\x05junk!", headers=OCTET) as r:
        assert r.status == 400
        assert (await r.json())["error"]["rule"] == "malformed_protobuf"
    async with http.post(f"{url}/batches", data=b"x" * 5000, headers=OCTET) as r:
        assert r.status == 413
    async with http.post(f"{url}/batches?service_id={'x' * 65}", data=body, headers=OCTET) as r:
        assert r.status == 400
        assert (await r.json())["error"]["rule"] == "invalid_service_id"
    async with http.post(f"{url}/batches", data=body, headers=OCTET) as r:
        assert r.status == 202
    async with http.get(f"{url}/batch_statuses") as r:
        assert r.status == 400
    # Ids nested past the JSON parser's recursion limit: a malformed list too.
    deep = b"[" * 4_000
    async with http.post(f"{url}/batch_statuses", data=deep, headers=JSON) as r:
        assert r.status == 400
        assert "JSON array of batch ids" in (await r.json())["error"]["message"]


async def test_wait_returns_when_final(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    url, gateway_api, accepted = api
    async with http.post(f"{url}/batches", data=encode_batch_list(batches(1)), headers=OCTET):
        pass
    batch = accepted[0]
    store = gateway_api.store

    async def commit_later() -> None:
        # As the pipeline records it: taken, accepted, committed, then told.
        await asyncio.sleep(0)
        await store.change_batch_to_submitted(batch.batch_id, batch.service_id)
        await store.update_batch_status(batch.batch_id, batch.service_id, Pending())
        await store.update_batch_status(batch.batch_id, batch.service_id, Committed())
        gateway_api.changes.notify(batch.service_id)

    task = asyncio.create_task(commit_later())
    async with http.get(f"{url}/batch_statuses?id={batch.batch_id}&wait=30") as r:
        data = (await r.json())["data"]
    await task
    assert data[0]["status"] == "COMMITTED"
    assert data[0]["ledgerq_status"] == "Committed"


async def test_a_batch_is_found_by_id_alone_across_services(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    url, _, accepted = api
    for service, body in (
        ("a::1", encode_batch_list(batches(2, "a"))),
        ("b::2", encode_batch_list(batches(2, "b"))),
        (None, encode_batch_list(batches(1, "n"))),
    ):
        query = f"?service_id={service}" if service else ""
        async with http.post(f"{url}/batches{query}", data=body, headers=OCTET) as r:
            assert r.status == 202, await r.text()
    a1, b1, nobody = accepted[0], accepted[2], accepted[-1]
    ids = ",".join([a1.batch_id, b1.batch_id, nobody.batch_id, "ab" * 64])
    async with http.get(f"{url}/batch_statuses?id={ids}") as r:
        data = (await r.json())["data"]
    assert [(d["id"], d["status"], d.get("service_id")) for d in data] == [
        (a1.batch_id, "PENDING", "a::1"),
        (b1.batch_id, "PENDING", "b::2"),
        (nobody.batch_id, "PENDING", "#none"),
        ("ab" * 64, "UNKNOWN", None),
    ]
    async with http.get(f"{url}/tracking/batches/{b1.batch_id}") as r:
        assert (await r.json())["data"]["service_id"] == "b::2"
    # A service named explicitly is the only place looked in.
    async with http.get(f"{url}/batch_statuses?id={a1.batch_id}&service_id=b::2") as r:
        assert (await r.json())["data"][0]["status"] == "UNKNOWN"
    async with http.get(f"{url}/tracking/batches/{a1.batch_id}?service_id=b::2") as r:
        assert r.status == 404
        assert "in service b::2" in (await r.json())["error"]["message"]
    async with http.get(f"{url}/tracking/batches/{'cd' * 64}") as r:
        assert r.status == 404
        assert "in any service" in (await r.json())["error"]["message"]


@pytest.mark.parametrize("path_id", ["zz", "a%00b", "AB" * 64, "dc:", "dc:a%00b"])
async def test_a_malformed_batch_id_is_a_400_naming_it(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession, path_id: str
) -> None:
    # As for status requests: a NUL reached PostgreSQL and came back a 500.
    url, _, _ = api
    async with http.get(f"{url}/tracking/batches/{path_id}") as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["rule"] == "malformed_id"
    assert "128 lowercase hex" in error["message"] or "data change id" in error["message"]
    async with http.get(f"{url}/tracking/batches/dc:order-17") as r:
        assert r.status == 404


async def test_listing_pagination_services_health(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    url, _, accepted = api
    for service in ("a::1", "b::2"):
        body = encode_batch_list(batches(3, service[0]))
        async with http.post(f"{url}/batches?service_id={service}", data=body, headers=OCTET):
            pass
    seen = []
    next_url: str | None = f"{url}/tracking/batches?limit=4"
    while next_url:
        async with http.get(next_url) as r:
            page = await r.json()
        seen += [d["id"] for d in page["data"]]
        next_url = page["paging"]["next"]
    assert seen == [b.batch_id for b in accepted]
    async with http.get(f"{url}/tracking/batches?service_id=b::2&status=none") as r:
        assert len((await r.json())["data"]) == 3
    async with http.get(f"{url}/tracking/batches?status=bogus") as r:
        assert r.status == 400
    one = accepted[0]
    async with http.get(f"{url}/tracking/batches/{one.batch_id}?service_id=a::1") as r:
        assert (await r.json())["data"]["service_id"] == "a::1"
    async with http.get(f"{url}/tracking/batches/{one.batch_id}?service_id=b::2") as r:
        assert r.status == 404
    async with http.get(f"{url}/services") as r:
        services = {s["service_id"]: s for s in (await r.json())["data"]}
    assert services["a::1"]["queue_depth"] == 3
    assert services["a::1"]["head_batch_id"] == one.batch_id
    async with http.get(f"{url}/health") as r:
        assert r.status == 200
    async with http.get(f"{url}/ready") as r:
        assert r.status == 200


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("limit=x", "limit"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("after=x", "after"),
        ("after=1.5", "after"),
        ("after=9223372036854775808", "after"),
        ("after=-99999999999999999999", "after"),
    ],
)
async def test_a_bad_listing_query_is_a_400_naming_the_parameter(
    tmp_path: Path, http: aiohttp.ClientSession, query: str, named: str
) -> None:
    # On SQLite (and PostgreSQL) an after beyond 64 bits was a 500.
    async with await open_store(f"sqlite:///{tmp_path / 'store.sqlite3'}") as store:
        runner = web.AppRunner(GatewayApi(store).app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with http.get(f"{url}/tracking/batches?{query}") as r:
                assert r.status == 400
                message = (await r.json())["error"]["message"]
            assert message.startswith(f"{named} must be an integer from")
            assert repr(query.partition("=")[2]) in message
            async with http.get(
                f"{url}/tracking/batches?after=9223372036854775807&limit=1000"
            ) as r:
                assert r.status == 200
                assert (await r.json())["data"] == []
        finally:
            await runner.cleanup()


@pytest.mark.parametrize("limit", ["x", "0", "10001", "1.5"])
async def test_a_bad_services_limit_is_a_400_naming_it(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession, limit: str
) -> None:
    url, _, _ = api
    async with http.get(f"{url}/services", params={"limit": limit}) as r:
        assert r.status == 400
        message = (await r.json())["error"]["message"]
    assert message == f"limit must be an integer from 1 to 10000; got {limit!r}"


async def test_a_parameter_given_twice_with_different_values_is_a_400_naming_it(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    # The first value was taken and the others dropped without a word.
    url, _, accepted = api
    body = encode_batch_list(batches(1, "a"))
    async with http.post(f"{url}/batches?service_id=a", data=body, headers=OCTET) as r:
        assert r.status == 202
    one = accepted[0].batch_id
    for method, path, named in (
        ("POST", "/batches?service_id=a&service_id=b", "service_id"),
        ("GET", f"/batch_statuses?id={one}&service_id=a&service_id=b", "service_id"),
        ("GET", f"/batch_statuses?id={one}&wait=0&wait=false", "wait"),
        ("POST", "/batch_statuses?service_id=a&service_id=", "service_id"),
        ("GET", f"/tracking/batches/{one}?service_id=a&service_id=b", "service_id"),
        ("GET", "/tracking/batches?service_id=a&service_id=b", "service_id"),
        ("GET", "/tracking/batches?status=none&status=Pending", "status"),
        ("GET", "/tracking/batches?limit=1&limit=2", "limit"),
        ("GET", "/tracking/batches?after=1&after=2", "after"),
        ("GET", "/services?limit=1&limit=2", "limit"),
        ("GET", "/services?after=a&after=b", "after"),
    ):
        if method == "GET":
            request = http.get(f"{url}{path}")
        elif path.startswith("/batches"):
            request = http.post(f"{url}{path}", data=body, headers=OCTET)
        else:
            request = http.post(f"{url}{path}", json=[one])
        async with request as r:
            assert r.status == 400, (path, await r.text())
            error = (await r.json())["error"]
        assert error["rule"] == "repeated_parameter", path
        assert error["message"].startswith(f"{named} is given 2 times with different values")
    assert len(accepted) == 1
    # The same value twice is no question.
    async with http.get(f"{url}/tracking/batches?service_id=a&service_id=a&limit=5&limit=5") as r:
        assert [d["id"] for d in (await r.json())["data"]] == [one]
    async with http.get(f"{url}/services?limit=5&limit=5") as r:
        assert r.status == 200
    # Ids given twice are one list, as comma-separated ones.
    unknown = "f" * 128
    async with http.get(f"{url}/batch_statuses?id={one}&id={unknown},{one}&wait=0&wait=0") as r:
        assert r.status == 200
        data = (await r.json())["data"]
    assert [(d["id"], d["status"]) for d in data] == [(one, "PENDING"), (unknown, "UNKNOWN")]


async def test_services_pages_link_the_next_one(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    url, _, _ = api
    services = ["s1", "s2", "s3", "s4", "s5"]
    for service in services:
        body = encode_batch_list(batches(1, service))
        async with http.post(f"{url}/batches?service_id={service}", data=body, headers=OCTET):
            pass
    for limit, pages in ((2, 3), (5, 2), (6, 1)):
        seen: list[str] = []
        links = 0
        next_url: str | None = f"{url}/services?limit={limit}"
        while next_url:
            async with http.get(next_url) as r:
                page = await r.json()
            seen += [s["service_id"] for s in page["data"]]
            assert page["paging"]["limit"] == limit
            next_url = page["paging"]["next"]
            if next_url is not None:
                links += 1
                # Absolute, as every link the gateway gives, and the same question.
                assert next_url.startswith(f"{url}/services?")
                query = parse_qs(urlsplit(next_url).query)
                assert query == {"limit": [str(limit)], "after": [seen[-1]]}
        assert seen == services
        assert links + 1 == pages, limit


async def test_services_after_a_control_character_is_a_400(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    # PostgreSQL refuses a NUL in a query: the page was a 500 there.
    url, _, _ = api
    for after in ("a%00b", "%0a"):
        async with http.get(f"{url}/services?after={after}") as r:
            assert r.status == 400
            assert "after must be the last service id" in (await r.json())["error"]["message"]
    for after in ("", "%23none", "a::b"):
        async with http.get(f"{url}/services?after={after}") as r:
            assert r.status == 200


async def test_a_repost_of_held_batches_is_a_retry_a_changed_one_a_conflict(
    api: tuple[str, GatewayApi, list[TrackingBatch]], http: aiohttp.ClientSession
) -> None:
    url, gateway_api, accepted = api
    signer = Signer.generate()
    sent = [make_intkey_batch(signer, [("set", f"r{i}", i)]) for i in range(2)]
    body = encode_batch_list(sent)
    async with http.post(f"{url}/batches?service_id=a::b", data=body, headers=OCTET) as r:
        assert r.status == 202
        link = (await r.json())["link"]
    # The same bytes again (a client retrying after a lost answer): 202, same link.
    async with http.post(f"{url}/batches?service_id=a::b", data=body, headers=OCTET) as r:
        assert r.status == 202
        assert (await r.json())["link"] == link
    assert len(accepted) == 2  # nothing stored twice, nobody woken twice
    # The same batch id under another service.
    async with http.post(f"{url}/batches?service_id=c::d", data=body, headers=OCTET) as r:
        assert r.status == 409
        error = (await r.json())["error"]
        assert "'a::b'" in error["message"] and "'c::d'" in error["message"]
        assert error["rule"] == "duplicate_batch"
    # A held batch beside a new one: not a retry.
    mixed = encode_batch_list([*sent, make_intkey_batch(signer, [("set", "new", 1)])])
    async with http.post(f"{url}/batches?service_id=a::b", data=mixed, headers=OCTET) as r:
        assert r.status == 409
        assert sent[0].header_signature in (await r.json())["error"]["message"]
    # The same batch id with another body: the trace flag is not signed.
    changed = make_batch(signer, sent[0].transactions, trace=True)
    assert changed.header_signature == sent[0].header_signature
    assert changed.serialized != sent[0].serialized
    async with http.post(
        f"{url}/batches?service_id=a::b", data=encode_batch_list([changed]), headers=OCTET
    ) as r:
        assert r.status == 409
        assert "different body" in (await r.json())["error"]["message"]
    stored = await gateway_api.store.get_batches_by_id([sent[0].header_signature])
    assert [(b.service_id, b.serialized_batch) for b in stored] == [("a::b", sent[0].serialized)]
    assert len(accepted) == 2
