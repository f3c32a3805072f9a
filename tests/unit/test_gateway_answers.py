"""Right answers: a permanent input problem is a 400 naming the field, 503
only for a store that is unavailable, and aiohttp's own errors in the same
JSON shape as every other answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ledgerq.codec import Signer, encode_batch_list, make_batch, make_transaction
from ledgerq.errors import StoreError, StoreInputError, StoreUnavailableError
from ledgerq.ingest.api import GatewayApi
from ledgerq.model import TrackingBatch
from ledgerq.store import open_store

OCTET = {"Content-Type": "application/octet-stream"}
TX_ID = "ab" * 64


class _RefusingAcceptor:
    """An acceptor whose store refuses with a chosen error."""

    def __init__(self) -> None:
        self.error: StoreError | None = None

    async def add_batches(self, batches: list[TrackingBatch], *, now: int | None = None) -> Any:
        assert self.error is not None
        raise self.error


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, _RefusingAcceptor, GatewayApi]]:
    store = await open_store("memory://")
    acceptor = _RefusingAcceptor()
    api = GatewayApi(store, max_body_bytes=64 * 1024)
    app = api.app()

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("secret internals")

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app.router.add_get("/boom", boom)
    # Reads its body without a check of its own: aiohttp raises the 413.
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", acceptor, api
    await runner.cleanup()
    await store.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


def _list(**fields: Any) -> bytes:
    signer = Signer.generate()
    tx_fields: dict[str, Any] = {
        "family_name": "intkey",
        "family_version": "1.0",
        "inputs": ["1cf126"],
        "outputs": ["1cf126"],
        "payload": b"p",
    }
    tx_fields.update(fields)
    return encode_batch_list([make_batch(signer, [make_transaction(signer, **tx_fields)])])


@pytest.mark.parametrize(
    ("fields", "rule", "named"),
    [
        ({"family_name": ""}, "invalid_family_name", "family_name"),
        ({"family_name": "f" * 129}, "invalid_family_name", "family_name"),
        ({"family_version": ""}, "invalid_family_version", "family_version"),
        ({"family_version": "1" * 17}, "invalid_family_version", "family_version"),
        ({"family_name": "int\x00key"}, "invalid_header_text", "family_name"),
        ({"outputs": ["1cf1\x00"]}, "invalid_header_text", "outputs"),
        ({"dependencies": ["not-a-transaction-id"]}, "malformed_dependency", "dependencies"),
    ],
)
async def test_a_signed_batch_the_store_cannot_hold_is_a_400_naming_the_field(
    served: tuple[str, _RefusingAcceptor, GatewayApi],
    http: aiohttp.ClientSession,
    fields: dict[str, Any],
    rule: str,
    named: str,
) -> None:
    url, _, _ = served
    async with http.post(f"{url}/batches?service_id=s1", data=_list(**fields), headers=OCTET) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["rule"] == rule
    assert named in error["message"]


async def test_the_limits_themselves_are_accepted(
    served: tuple[str, _RefusingAcceptor, GatewayApi], http: aiohttp.ClientSession
) -> None:
    url, _, _ = served
    body = _list(family_name="f" * 128, family_version="1" * 16, dependencies=[TX_ID])
    async with http.post(f"{url}/batches?service_id=s1", data=body, headers=OCTET) as r:
        assert r.status == 202


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (StoreInputError("family_version is 17 characters long"), 400),
        (StoreUnavailableError("PostgreSQL is down"), 503),
        (StoreError("PostgreSQL failed: something odd"), 500),
    ],
)
async def test_only_an_unavailable_store_is_a_503(
    served: tuple[str, _RefusingAcceptor, GatewayApi],
    http: aiohttp.ClientSession,
    error: StoreError,
    status: int,
) -> None:
    url, acceptor, api = served
    api.acceptor = acceptor
    acceptor.error = error
    async with http.post(f"{url}/batches?service_id=s1", data=_list(), headers=OCTET) as r:
        assert r.status == status
        body = await r.json()
    # The field a store refused is named; a failure's cause (which may name
    # the database) goes to the log, not to the client.
    assert (str(error) in body["error"]["message"]) is (status == 400)
    assert ("retry" in body["error"]["message"]) is (status == 503)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/no/such/route", 404),
        ("DELETE", "/batches", 405),
        ("PUT", "/health", 405),
        ("GET", "/boom", 500),
    ],
)
async def test_aiohttp_errors_come_back_as_json(
    served: tuple[str, _RefusingAcceptor, GatewayApi],
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    status: int,
) -> None:
    url, _, _ = served
    async with http.request(method, f"{url}{path}") as r:
        assert r.status == status
        assert r.content_type == "application/json"
        body = await r.json()
        if status == 405:
            assert "GET" in r.headers["Allow"] or "POST" in r.headers["Allow"]
    assert body["error"]["code"] == status
    assert body["error"]["message"]
    assert "secret internals" not in body["error"]["message"]


async def test_a_body_over_the_limit_is_a_json_413_on_any_route(
    served: tuple[str, _RefusingAcceptor, GatewayApi], http: aiohttp.ClientSession
) -> None:
    url, _, api = served
    big = b"x" * (api.max_body_bytes + 10)
    for path in ("/batches", "/echo"):
        async with http.post(f"{url}{path}", data=big, headers=OCTET) as r:
            assert r.status == 413
            assert r.content_type == "application/json"
            assert (await r.json())["error"]["code"] == 413


@pytest.mark.parametrize(
    "path",
    [
        "/tracking/batches",
        f"/tracking/batches/{TX_ID}",
        "/services",
        f"/batch_statuses?id={TX_ID}",
    ],
)
@pytest.mark.parametrize(
    ("error", "status"),
    [
        (StoreUnavailableError("PostgreSQL is down"), 503),
        (StoreError("PostgreSQL failed: something odd"), 500),
    ],
)
async def test_a_read_the_store_cannot_answer_says_so(
    served: tuple[str, _RefusingAcceptor, GatewayApi],
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    error: StoreError,
    status: int,
) -> None:
    url, _, api = served

    async def failing(*_args: Any, **_kwargs: Any) -> Any:
        raise error

    for read in ("list_batches", "get_batches_by_id", "list_services", "get_batch_statuses_by_id"):
        monkeypatch.setattr(api.store, read, failing)
    async with http.get(f"{url}{path}") as r:
        assert r.status == status
        body = await r.json()
    assert str(error) not in body["error"]["message"]  # the cause is the log's
    assert ("retry" in body["error"]["message"]) is (status == 503)
    assert "stored" not in body["error"]["message"]  # a read stores nothing
