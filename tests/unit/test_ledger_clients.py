"""Sawtooth and scabbard clients against real aiohttp servers on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlencode

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from ledgerq.errors import ConfigError, LedgerError
from ledgerq.ledgers import (
    Accepted,
    Ambiguous,
    Busy,
    HttpTimeouts,
    Rejected,
    SawtoothClient,
    SplinterClient,
    Unjudged,
    Unreachable,
    batch_list_bytes,
    http_ledger_client,
)
from ledgerq.ledgers.status import sawtooth_status, scabbard_status
from ledgerq.model import Committed, Invalid, Pending, Unknown
from ledgerq.testing.fault_ledger import MALFORMED_KINDS, FaultLedger, FaultPlan

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def app_with(routes: dict[tuple[str, str], Handler]) -> web.Application:
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    return app


def test_batch_list_bytes_is_protobuf_repeated_field() -> None:
    small = b"x" * 3
    big = b"y" * 300
    assert batch_list_bytes([small]) == b"\x0a\x03xxx"
    # 300 = 0b10_0101100 → varint ac 02
    assert batch_list_bytes([big])[:3] == b"\x0a\xac\x02"
    assert batch_list_bytes([small, small]) == b"\x0a\x03xxx\x0a\x03xxx"


async def test_submit_classifies_responses(serve: Callable[..., Awaitable[str]]) -> None:
    seen: list[bytes] = []
    answers = iter(
        [
            web.json_response({"link": "x"}, status=202),
            web.Response(status=503, headers={"Retry-After": "2"}),
            web.json_response({"error": {"code": 42, "title": "Busy"}}, status=429),
            web.json_response(
                {
                    "error": {
                        "code": 35,
                        "title": "Submitted Batches Invalid",
                        "message": "bad signature",
                    }
                },
                status=400,
            ),
            web.Response(status=500, text="boom"),
        ]
    )

    async def batches(request: web.Request) -> web.StreamResponse:
        assert request.content_type == "application/octet-stream"
        seen.append(await request.read())
        return next(answers)

    url = await serve(app_with({("POST", "/batches"): batches}))
    client = SawtoothClient(url)
    try:
        assert await client.submit("s", "b", b"abc") == Accepted(202)
        assert seen[0] == b"\x0a\x03abc"
        assert await client.submit("s", "b", b"abc") == Busy(503, "HTTP 503", 2000)
        busy = await client.submit("s", "b", b"abc")
        assert isinstance(busy, Busy) and busy.status == 429 and busy.retry_after_ms is None
        rejected = await client.submit("s", "b", b"abc")
        assert rejected == Rejected(400, "Submitted Batches Invalid: bad signature")
        ambiguous = await client.submit("s", "b", b"abc")
        assert isinstance(ambiguous, Ambiguous) and ambiguous.status == 500
    finally:
        await client.close()


async def test_submit_timeout_is_ambiguous(serve: Callable[..., Awaitable[str]]) -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await request.read()
        await release.wait()
        return web.Response(status=202)

    url = await serve(app_with({("POST", "/batches"): slow}))
    client = SawtoothClient(url, HttpTimeouts(submit=0.2))
    try:
        result = await client.submit("s", "b", b"abc")
        assert isinstance(result, Ambiguous)
        assert "no answer" in result.message
    finally:
        release.set()
        await client.close()


async def test_connection_dropped_after_sending_is_ambiguous(
    serve: Callable[..., Awaitable[str]],
) -> None:
    async def drop(request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        request.transport.close()
        return web.Response(status=202)

    url = await serve(app_with({("POST", "/batches"): drop}))
    client = SawtoothClient(url)
    try:
        assert isinstance(await client.submit("s", "b", b"abc"), Ambiguous)
    finally:
        await client.close()


async def test_nothing_listening_is_unreachable() -> None:
    # Bind a port, close it: nothing listens there afterwards.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    client = SawtoothClient(f"http://127.0.0.1:{port}")
    try:
        assert isinstance(await client.submit("s", "b", b"abc"), Unreachable)
    finally:
        await client.close()


async def test_statuses_get_and_post_check_ids(serve: Callable[..., Awaitable[str]]) -> None:
    queries: list[tuple[str, str | None, list[str]]] = []

    def answer(ids: list[str]) -> web.Response:
        data = [{"id": i, "status": "PENDING"} for i in ids]
        data[0] = {
            "id": ids[0],
            "status": "INVALID",
            "invalid_transactions": [{"id": "t1", "message": "no such key", "extended_data": ""}],
        }
        data.append({"id": "stranger", "status": "COMMITTED"})
        return web.json_response({"data": data})

    async def get(request: web.Request) -> web.StreamResponse:
        ids = request.query["id"].split(",")
        queries.append(("GET", request.query.get("wait"), ids))
        return answer(ids)

    async def post(request: web.Request) -> web.StreamResponse:
        ids = json.loads(await request.read())
        queries.append(("POST", request.query.get("wait"), ids))
        return answer(ids)

    url = await serve(
        app_with({("GET", "/batch_statuses"): get, ("POST", "/batch_statuses"): post})
    )
    client = SawtoothClient(url)
    try:
        got = await client.batch_statuses("s", ["a", "b"], wait_s=0.5)
        assert [s.batch_id for s in got] == ["a", "b"]
        assert got[0].status == Invalid(
            (got[0].status.transactions[0],)  # type: ignore[union-attr]
        )
        assert got[0].status.transactions[0].error_message == "no such key"  # type: ignore[union-attr]
        assert got[1].status == Pending()
        many = [f"id{i}" for i in range(20)]
        got = await client.batch_statuses("s", many)
        assert [s.batch_id for s in got] == many
        assert queries == [("GET", "1", ["a", "b"]), ("POST", None, many)]
    finally:
        await client.close()


async def test_status_error_raises_ledger_error(serve: Callable[..., Awaitable[str]]) -> None:
    async def fail(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503)

    url = await serve(app_with({("GET", "/batch_statuses"): fail}))
    client = SawtoothClient(url)
    try:
        with pytest.raises(LedgerError, match="503"):
            await client.batch_statuses("s", ["a"])
    finally:
        await client.close()


async def test_sse_events_resume_with_last_event_id(serve: Callable[..., Awaitable[str]]) -> None:
    resumes: list[str | None] = []

    async def events(request: web.Request) -> web.StreamResponse:
        resumes.append(request.headers.get("Last-Event-ID"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        start = int(request.headers.get("Last-Event-ID", "0"))
        for n in (start + 1, start + 2):
            doc = {"id": f"b{n}", "status": "COMMITTED", "invalid_transactions": []}
            await resp.write(f": keepalive\nid: {n}\ndata: {json.dumps(doc)}\n\n".encode())
        return resp  # closing the stream makes the client reconnect

    url = await serve(app_with({("GET", "/events"): events}))
    client = SawtoothClient(url)
    try:
        stream = client.events()
        assert stream is not None
        got = []
        async for event in stream:
            got.append(event)
            if len(got) == 4:
                break
        assert [e.batch_id for e in got] == ["b1", "b2", "b3", "b4"]
        assert all(e.status == Committed() for e in got)
        assert resumes == [None, "2"]
    finally:
        await client.close()


async def test_sse_absent_ends_stream(serve: Callable[..., Awaitable[str]]) -> None:
    url = await serve(web.Application())
    client = SawtoothClient(url)
    try:
        stream = client.events()
        assert stream is not None
        assert [e async for e in stream] == []
    finally:
        await client.close()


async def test_scabbard_routes_and_shapes(serve: Callable[..., Awaitable[str]]) -> None:
    async def post(request: web.Request) -> web.StreamResponse:
        assert request.match_info["circuit"] == "abcde-12345"
        return web.json_response({"link": "..."}, status=202)

    async def statuses(request: web.Request) -> web.StreamResponse:
        assert request.query["ids"] == "a,b,c"
        return web.json_response(
            [
                {
                    "id": "a",
                    "status": {"statusType": "Committed", "message": [{"transaction_id": "t"}]},
                },
                {
                    "id": "b",
                    "status": {
                        "statusType": "Invalid",
                        "message": [
                            {"transaction_id": "t2", "error_message": "bad", "error_data": [1, 2]}
                        ],
                    },
                },
                {"id": "c", "status": {"statusType": "Unknown", "message": []}},
            ]
        )

    url = await serve(
        app_with(
            {
                ("POST", "/scabbard/{circuit}/{service}/batches"): post,
                ("GET", "/scabbard/{circuit}/{service}/batch_statuses"): statuses,
            }
        )
    )
    client = SplinterClient(url)
    try:
        assert await client.submit("abcde-12345::gsAA", "b", b"x") == Accepted(202)
        bad = await client.submit("no-separator", "b", b"x")
        assert isinstance(bad, Rejected) and "circuit::service" in bad.message
        got = await client.batch_statuses("abcde-12345::gsAA", ["a", "b", "c"])
        assert isinstance(got[0].status, Committed)
        assert isinstance(got[1].status, Invalid)
        assert got[1].status.transactions[0].error_data == b"\x01\x02"
        assert got[2].status == Unknown()
        assert client.events() is None
    finally:
        await client.close()


def test_ledger_spec_parsing() -> None:
    assert isinstance(http_ledger_client("sawtooth+http://127.0.0.1:8008"), SawtoothClient)
    assert isinstance(http_ledger_client("splinter+http://127.0.0.1:8085"), SplinterClient)
    with pytest.raises(ConfigError, match="not understood"):
        http_ledger_client("http://x")
    with pytest.raises(ConfigError, match="unknown"):
        http_ledger_client("fabric+http://x")


# -- classifying every answer ---------------------------------------------------


def _sawtooth_error(code: int, status: int = 400) -> web.Response:
    return web.json_response({"error": {"code": code, "title": "t", "message": "m"}}, status=status)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda: _sawtooth_error(30), Rejected),  # Submitted Batches Invalid: judged
        (lambda: _sawtooth_error(34), Rejected),  # No Batches Submitted
        (lambda: _sawtooth_error(35), Rejected),  # Protobuf Not Decodable
        (lambda: _sawtooth_error(42), Unjudged),  # wrong content type: not the batch's fault
        (lambda: web.Response(status=400, text="<html>Bad Request</html>"), Unjudged),
        (lambda: web.Response(status=404, text="404: Not Found"), Unjudged),  # a wrong URL
        (lambda: web.Response(status=405), Unjudged),
        (lambda: web.Response(status=401), Unjudged),
        (lambda: web.Response(status=403), Unjudged),
        (lambda: web.Response(status=408), Unjudged),  # a proxy's timeout
        (lambda: web.Response(status=413, text="<html>too large</html>"), Unjudged),
        (lambda: web.Response(status=502, text="bad gateway"), Ambiguous),
        (lambda: web.Response(status=504), Ambiguous),
    ],
)
async def test_only_a_judgement_of_the_batch_is_a_rejection(
    serve: Callable[..., Awaitable[str]], answer: Callable[[], web.Response], expected: type
) -> None:
    async def batches(request: web.Request) -> web.StreamResponse:
        await request.read()
        return answer()

    url = await serve(app_with({("POST", "/batches"): batches}))
    client = SawtoothClient(url)
    try:
        assert isinstance(await client.submit("s", "b", b"x"), expected)
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda: web.json_response({"message": "invalid batch list"}, status=400), Rejected),
        (lambda: _sawtooth_error(30), Rejected),  # the ledgerq node's scabbard routes
        (lambda: web.Response(status=400, text="<html>proxy</html>"), Unjudged),
        (lambda: web.Response(status=404, text="not found"), Unjudged),
        (lambda: web.json_response({"message": "no such circuit"}, status=404), Unjudged),
        (lambda: web.Response(status=401), Unjudged),
    ],
)
async def test_splinter_batch_level_rejection_only(
    serve: Callable[..., Awaitable[str]], answer: Callable[[], web.Response], expected: type
) -> None:
    async def batches(request: web.Request) -> web.StreamResponse:
        await request.read()
        return answer()

    url = await serve(app_with({("POST", "/scabbard/{circuit}/{service}/batches"): batches}))
    client = SplinterClient(url)
    try:
        assert isinstance(await client.submit("abcde-12345::gsAA", "b", b"x"), expected)
    finally:
        await client.close()


@pytest.mark.parametrize("many", [False, True], ids=["get", "post"])
async def test_every_malformed_status_body_is_a_ledger_error(many: bool) -> None:
    """Against the fault ledger's malformed bodies: never a status, never a crash."""
    ids = [f"{n:0128x}" for n in range(20 if many else 1)]
    async with FaultLedger(FaultPlan(malformed_statuses=True)) as ledger:
        client = SawtoothClient(ledger.url)
        try:
            for kind in MALFORMED_KINDS:
                with pytest.raises(LedgerError) as info:
                    await client.batch_statuses("s", ids)
                assert info.value.cause == "malformed status body", (kind, info.value)
        finally:
            await client.close()


@pytest.mark.parametrize(
    "entry",
    [
        "not an object",
        {"id": "a"},
        {"id": "a", "status": 7},
        {"id": "a", "status": "INVALID", "invalid_transactions": ["not an object"]},
        {"id": "a", "status": "INVALID", "invalid_transactions": "nope"},
        {"id": 5, "status": "COMMITTED"},
    ],
)
def test_sawtooth_entries_are_checked(entry: object) -> None:
    with pytest.raises(LedgerError, match="malformed"):
        sawtooth_status(entry)


@pytest.mark.parametrize(
    "entry",
    [
        {"id": "a", "status": "Committed"},
        {"id": "a", "status": {"statusType": "Invalid", "message": ["x"]}},
        {"id": "a", "status": {"statusType": "Invalid", "message": [{"error_data": "zz"}]}},
        {"id": "a", "status": {"statusType": "Maybe", "message": []}},
    ],
)
def test_scabbard_entries_are_checked(entry: object) -> None:
    with pytest.raises(LedgerError, match="malformed"):
        scabbard_status(entry)


async def test_status_read_failures_name_their_cause(serve: Callable[..., Awaitable[str]]) -> None:
    async def not_found(request: web.Request) -> web.StreamResponse:
        return web.Response(status=404, text="no such route")

    url = await serve(app_with({("GET", "/batch_statuses"): not_found}))
    client = SawtoothClient(url)
    try:
        with pytest.raises(LedgerError) as info:
            await client.batch_statuses("s", ["a"])
        assert info.value.cause == "HTTP 404"
    finally:
        await client.close()
    gone = SawtoothClient("http://127.0.0.1:9")  # nothing listens on the discard port
    try:
        with pytest.raises(LedgerError) as info:
            await gone.batch_statuses("s", ["a"])
        assert info.value.cause == "connection failed"
    finally:
        await gone.close()


async def test_an_event_line_of_any_size_never_ends_the_stream(
    serve: Callable[..., Awaitable[str]],
) -> None:
    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"id: 1\ndata: " + b"x" * (3 << 20) + b"\n\n")  # 3 MiB, one line
        await resp.write(b"id: 2\ndata: {not json}\n\n")
        ok = {"id": "b3", "status": "COMMITTED", "invalid_transactions": []}
        await resp.write(f"id: 3\ndata: {json.dumps(ok)}\n\n".encode())
        await asyncio.sleep(0.5)
        return resp

    url = await serve(app_with({("GET", "/events"): events}))
    client = SawtoothClient(url)
    try:
        stream = client.events()
        assert stream is not None
        first = await asyncio.wait_for(anext(stream), 10)
        assert first.batch_id == "b3" and first.event_id == "3"
    finally:
        await client.close()


@given(
    st.dictionaries(
        st.sampled_from(["wait", "id"]),
        st.text(min_size=0, max_size=60)
        | st.lists(st.text(alphabet="0123456789abcdef", min_size=1, max_size=128)).map(",".join),
    )
)
def test_the_status_query_is_urlencodes(params: dict[str, str]) -> None:
    """The status read's query skips urlencode's per-character quoting for
    plain values (hex ids) and gives the same string for any value."""
    from ledgerq.ledgers.sawtooth import _query

    assert _query(params) == urlencode(params, safe=",")
