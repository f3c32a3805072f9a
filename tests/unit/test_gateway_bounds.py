"""Bounded work per request: status ids capped, de-duplicated, checked and read
in one query; long-polls refreshed together and capped; large bodies decoded
in worker processes, a few at a time; header and body deadlines, idle
connections closed, a connection cap."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bench._hostile import broken_list
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.ingest.api import Changes, GatewayApi, TooManyWaitersError
from ledgerq.ingest.decoding import POOL_BYTES
from ledgerq.ingest.guard import GuardedSite, HttpLimits
from ledgerq.model import Committed, Pending, TrackingBatch
from ledgerq.store import open_store

OCTET = {"Content-Type": "application/octet-stream"}


class CountingStore:
    """The memory store, counting the reads the API makes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.by_id_calls: list[int] = []
        #: Reads of the final batches only (in ``by_id_calls`` too).
        self.final_calls = 0
        self.single_gets = 0

    async def get_batch_statuses_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        self.by_id_calls.append(len(batch_ids))
        result: list[TrackingBatch] = await self.inner.get_batch_statuses_by_id(batch_ids)
        return result

    async def get_final_batch_statuses_by_id(
        self, batch_ids: Collection[str]
    ) -> list[TrackingBatch]:
        # The parked requests' refresher reads through this one.
        self.by_id_calls.append(len(batch_ids))
        self.final_calls += 1
        result: list[TrackingBatch] = await self.inner.get_final_batch_statuses_by_id(batch_ids)
        return result

    async def get_batch(self, id: str, service_id: str) -> TrackingBatch | None:
        self.single_gets += 1
        result: TrackingBatch | None = await self.inner.get_batch(id, service_id)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


Served = tuple[str, GatewayApi, CountingStore, list[TrackingBatch]]


async def _serve(api: GatewayApi, limits: HttpLimits | None = None) -> tuple[str, web.AppRunner]:
    limits = limits or HttpLimits()
    runner = web.AppRunner(api.app(), keepalive_timeout=limits.keepalive_s)
    await runner.setup()
    site = GuardedSite(runner, limits, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    inner = await open_store("memory://")
    store = CountingStore(inner)
    accepted: list[TrackingBatch] = []
    api = GatewayApi(
        store,  # type: ignore[arg-type]
        acceptor=inner,
        on_accepted=accepted.extend,
        max_status_ids=5,
        changes=Changes(max_waiters=2),
    )
    url, runner = await _serve(api)
    yield url, api, store, accepted
    await runner.cleanup()
    await inner.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Polls ``condition`` until true (bounded): the server runs in this loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _post(http: aiohttp.ClientSession, url: str, n: int, service: str) -> list[str]:
    signer = Signer.generate()
    body = encode_batch_list(
        [make_intkey_batch(signer, [("set", f"{service}{i}", i)]).serialized for i in range(n)]
    )
    async with http.post(f"{url}/batches?service_id={service}", data=body, headers=OCTET) as r:
        assert r.status == 202
        link: str = (await r.json())["link"]
    return link.split("id=")[1].split("&")[0].split("%2C")


async def test_status_ids_are_deduplicated_checked_capped_and_read_in_one_query(
    served: Served, http: aiohttp.ClientSession
) -> None:
    url, _, store, _ = served
    ids = await _post(http, url, 3, "s1")
    unknown = "f" * 128
    asked = ",".join([ids[0], ids[1], ids[0], unknown, ids[2], ids[1]])
    store.by_id_calls.clear()
    async with http.get(f"{url}/batch_statuses?id={asked}") as r:
        assert r.status == 200
        data = (await r.json())["data"]
    assert [d["id"] for d in data] == [ids[0], ids[1], unknown, ids[2]]
    assert [d["status"] for d in data] == ["PENDING", "PENDING", "UNKNOWN", "PENDING"]
    assert store.by_id_calls == [4] and store.single_gets == 0

    # The same as a POSTed JSON array.
    async with http.post(f"{url}/batch_statuses", json=[ids[2], ids[2], unknown]) as r:
        assert r.status == 200
        body = await r.json()
    assert [d["id"] for d in body["data"]] == [ids[2], unknown]

    six = ",".join(f"{i:0128x}" for i in range(6))
    async with http.get(f"{url}/batch_statuses?id={six}") as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["rule"] == "too_many_ids" and "at most 5" in error["message"]

    for bad in ("nosuchbatch", "A" * 128, "dc:", "dc:a\x01b"):
        async with http.get(f"{url}/batch_statuses", params={"id": bad}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["rule"] == "malformed_id"

    for wait in ("-1", "nan", "-inf"):
        async with http.get(f"{url}/batch_statuses", params={"id": ids[0], "wait": wait}) as r:
            assert r.status == 400
            error = (await r.json())["error"]
        assert error["rule"] == "bad_wait" and repr(wait) in error["message"]
    # More than 300 counts as 300, however large, and a word as the longest
    # wait (Sawtooth's reading): an unknown id is answered at once.
    for wait in ("301", "1e400", "inf", "Infinity", "soon", "yes", "TRUE", ""):
        async with http.get(f"{url}/batch_statuses", params={"id": unknown, "wait": wait}) as r:
            assert r.status == 200, await r.text()
            assert [d["status"] for d in (await r.json())["data"]] == ["UNKNOWN"]

    async with http.post(f"{url}/batch_statuses", json={"id": ids[0]}) as r:
        assert r.status == 400


async def test_a_long_poll_wakes_only_for_its_services_and_reads_only_its_pending_batches(
    served: Served, http: aiohttp.ClientSession
) -> None:
    url, api, store, accepted = served
    ids = await _post(http, url, 2, "s1")
    await _post(http, url, 1, "s2")
    first = next(b for b in accepted if b.batch_id == ids[0])
    store.by_id_calls.clear()

    poll = asyncio.create_task(
        http.get(f"{url}/batch_statuses?id={ids[0]},{ids[1]}&wait=30&service_id=s1")
    )
    await until(lambda: api.changes.parked == 1)
    reads = len(store.by_id_calls)
    for _ in range(5):
        api.changes.notify("s2")  # another service: nothing to read again
    await asyncio.sleep(0.05)
    assert len(store.by_id_calls) == reads

    # As the pipeline records it: taken, accepted, committed, then told.
    await store.change_batch_to_submitted(first.batch_id, "s1")
    await store.update_batch_status(first.batch_id, "s1", Pending())
    await store.update_batch_status(first.batch_id, "s1", Committed())
    api.changes.notify("s1")
    await until(lambda: len(store.by_id_calls) > reads)
    # Woken by its service; only the two pending batches are read again,
    # and only for a final state.
    assert store.by_id_calls[-1] == 2 and store.final_calls >= 1
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    await until(lambda: api.changes.parked == 0)  # the client left: the slot is free


async def test_parked_long_polls_are_capped_then_429_with_retry_after(
    served: Served, http: aiohttp.ClientSession
) -> None:
    url, api, store, _ = served
    ids = await _post(http, url, 1, "s1")
    polls = [
        asyncio.create_task(http.get(f"{url}/batch_statuses?id={ids[0]}&wait=30")) for _ in range(2)
    ]
    await until(lambda: api.changes.parked == 2)
    reads = len(store.by_id_calls)
    async with http.get(f"{url}/batch_statuses?id={ids[0]}&wait=30") as r:
        assert r.status == 429
        assert r.headers["Retry-After"] == "1"
        assert (await r.json())["error"]["rule"] == "too_many_waiters"
    assert len(store.by_id_calls) == reads  # refused before reading anything
    # Without wait, nothing is parked: answered at once.
    async with http.get(f"{url}/batch_statuses?id={ids[0]}") as r:
        assert r.status == 200
    api.changes.notify()  # nothing final: they park again
    for p in polls:
        p.cancel()
    await asyncio.gather(*polls, return_exceptions=True)


async def test_changes_reads_once_for_every_parked_request_and_wakes_only_finished_ones() -> None:
    from dataclasses import replace

    store = await open_store("memory://")
    signer = Signer.generate()
    batches = {
        (service, n): _tracking(make_intkey_batch(signer, [("set", f"{service}{n}", n)]), service)
        for service in ("a", "b")
        for n in range(2)
    }
    state = dict(batches)
    reads: list[list[str]] = []

    async def reader(ids: Collection[str]) -> list[TrackingBatch]:
        reads.append(sorted(ids))
        return [b for b in state.values() if b.batch_id in ids]

    changes = Changes(max_waiters=3)
    changes.reader = reader
    waiters = []
    with contextlib.ExitStack() as stack:
        for _ in range(3):  # three requests wait for the same two batches of a
            waiter = stack.enter_context(changes.park())
            found = {b.batch_id: b for b in (batches["a", 0], batches["a", 1])}
            changes.watch(waiter, found, list(found))
            waiters.append(waiter)
        with pytest.raises(TooManyWaitersError), changes.park():
            pass
        await until(lambda: len(reads) == 1)  # one read for all three
        changes.notify("b")  # nobody waits there: no read
        state["a", 0] = replace(batches["a", 0], batch_status=Committed())
        changes.notify("a")
        await until(lambda: len(reads) == 2)
        assert not any(w.event.is_set() for w in waiters)  # a1 is still pending
        state["a", 1] = replace(batches["a", 1], batch_status=Committed())
        changes.notify("a")
        await until(lambda: all(w.event.is_set() for w in waiters))
        assert len(reads) == 3
        assert all(b.is_final for w in waiters for b in w.found.values())
    assert changes.parked == 0
    assert changes._by_service == {}
    await changes.aclose()
    await store.close()


def _tracking(batch: Any, service: str) -> TrackingBatch:
    from ledgerq.codec.decode import to_tracking_batch

    return to_tracking_batch(batch, service)


async def test_large_bodies_are_decoded_in_worker_processes_refusals_intact(
    http: aiohttp.ClientSession,
) -> None:
    store = await open_store("memory://")
    api = GatewayApi(store, decode_slots=1)
    url, runner = await _serve(api)
    try:
        signer = Signer.generate()
        count = POOL_BYTES // 150
        good = encode_batch_list(
            [make_intkey_batch(signer, [("set", f"k{i}", i)]).serialized for i in range(count)]
        )
        broken = broken_list(POOL_BYTES + 1024)
        assert len(good) >= POOL_BYTES
        posts = [
            http.post(f"{url}/batches", data=good, headers=OCTET),
            http.post(f"{url}/batches", data=broken, headers=OCTET),
        ]
        first, second = await asyncio.gather(*posts)
        assert first.status == 202
        assert second.status == 400
        assert (await second.json())["error"]["rule"] == "bad_batch_signature"
        first.release()
        assert api.decoder.pooled == 2
        small = encode_batch_list([make_intkey_batch(signer, [("set", "small", 1)]).serialized])
        async with http.post(f"{url}/batches", data=small, headers=OCTET) as r:
            assert r.status == 202
        assert api.decoder.pooled == 2  # a small body: decoded inline
        assert len((await store.list_batches(limit=1000)).batches) == count + 1
    finally:
        await runner.cleanup()
        await store.close()


def _assert_secured(head: bytes) -> None:
    """The answer's head carries the security headers, as every answer does
    (here, from the bare API app: only the connection guard can have set them)."""
    lines = head.decode("latin-1").split("\r\n")
    assert "X-Content-Type-Options: nosniff" in lines, head
    assert "X-Frame-Options: DENY" in lines, head
    assert "Referrer-Policy: no-referrer" in lines, head
    assert any(
        line.startswith("Content-Security-Policy: ") and "frame-ancestors 'none'" in line
        for line in lines
    ), head


def _guards(runner: web.AppRunner) -> list[Any]:
    """The connection guards of the runner's guarded site."""
    (site,) = runner.sites
    assert isinstance(site, GuardedSite)
    return [g for guards in site.counter.by_address.values() for g in guards]


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 10)


async def test_slow_headers_and_bodies_are_cut_off_idle_connections_closed_and_capped() -> None:
    store = await open_store("memory://")
    limits = HttpLimits(keepalive_s=30, header_timeout_s=0.3, body_timeout_s=0.3, max_connections=3)
    url, runner = await _serve(GatewayApi(store), limits)
    port = int(url.rsplit(":", 1)[1])
    idle_url, idle_runner = await _serve(GatewayApi(store), HttpLimits(keepalive_s=0.3))
    idle_port = int(idle_url.rsplit(":", 1)[1])
    try:
        # Headers dribbled and never finished: 408, then closed.
        r1, w1 = await asyncio.open_connection("127.0.0.1", port)
        w1.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        answer = await _read_all(r1)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"headers" in answer
        _assert_secured(answer.partition(b"\r\n\r\n")[0])
        w1.close()

        # A body that stops short: 408, then closed.
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        w2.write(
            b"POST /batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: 1000\r\n\r\n" + b"\x0a" * 10
        )
        answer = await _read_all(r2)
        assert b"408 Request Timeout" in answer and b"body" in answer
        w2.close()

        # A finished request, then nothing: closed after keepalive_s.
        r3, w3 = await asyncio.open_connection("127.0.0.1", idle_port)
        w3.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await _read_all(r3)
        assert answer.startswith(b"HTTP/1.1 200 ")
        w3.close()

        # Three connections mid-request (headers begun); a fourth is refused
        # with a 503 (the caps and idle connections: test_connection_limits.py).
        busy_url, busy_runner = await _serve(GatewayApi(store), HttpLimits(max_connections=3))
        busy_port = int(busy_url.rsplit(":", 1)[1])
        held = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", busy_port)
            writer.write(b"GET /health HTTP/1.1\r\n")
            held.append((reader, writer))
        await until(lambda: sum(1 for g in _guards(busy_runner) if not g.idle) == 3)
        r4, w4 = await asyncio.open_connection("127.0.0.1", busy_port)
        answer = await _read_all(r4)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
        _assert_secured(answer.partition(b"\r\n\r\n")[0])
        w4.close()
        for _reader, writer in held:
            writer.close()
        await busy_runner.cleanup()
    finally:
        await idle_runner.cleanup()
        await runner.cleanup()
        await store.close()


async def test_what_aiohttp_refuses_before_any_handler_is_json_too() -> None:
    store = await open_store("memory://")
    url, runner = await _serve(GatewayApi(store))
    port = int(url.rsplit(":", 1)[1])
    try:
        for request in (
            b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
            b"NOT-HTTP\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            answer = await _read_all(reader)
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            status = int(head.split()[1])
            assert 400 <= status < 500, answer[:200]
            assert b"application/json" in head
            assert json.loads(body)["error"]["code"] == status
            _assert_secured(head)
    finally:
        await runner.cleanup()
        await store.close()


async def test_a_body_in_an_encoding_not_taken_is_a_415_naming_those_taken(
    served: Served, http: aiohttp.ClientSession
) -> None:
    url, _, _, accepted = served
    signer = Signer.generate()
    body = encode_batch_list([make_intkey_batch(signer, [("set", "enc", 1)]).serialized])
    # br and zstd: aiohttp knows them, but only the handlers look at a body's encoding.
    for encoding in ("br", "zstd", "compress", "x-gzip", "gzip, br"):
        for path, kind in (
            ("/batches", "application/octet-stream"),
            ("/batch_statuses", "application/json"),
        ):
            headers = {"Content-Type": kind, "Content-Encoding": encoding}
            async with http.post(f"{url}{path}", data=body, headers=headers) as r:
                assert r.status == 415, (encoding, path, await r.text())
                assert r.headers["Accept-Encoding"] == "identity, gzip, deflate"
                error = (await r.json())["error"]
            assert error["rule"] == "unsupported_encoding"
            assert error["message"].endswith("one of identity, gzip, deflate")
    assert accepted == []
    for encoding, data in (
        ("gzip", gzip.compress(body)),
        ("deflate", zlib.compress(body)),
        ("identity", body),
        ("GZIP", gzip.compress(body)),
    ):
        headers = {"Content-Type": "application/octet-stream", "Content-Encoding": encoding}
        async with http.post(f"{url}/batches", data=data, headers=headers) as r:
            assert r.status == 202, (encoding, await r.text())
    assert len(accepted) == 1
    # A body that does not decode as its encoding says: the client's mistake (it was a 500).
    for encoding, data in (("gzip", body), ("deflate", b"\x00" * 8)):
        headers = {"Content-Type": "application/octet-stream", "Content-Encoding": encoding}
        async with http.post(f"{url}/batches", data=data, headers=headers) as r:
            assert r.status == 400, (encoding, await r.text())
            message = (await r.json())["error"]["message"]
        assert message.startswith("the request body cannot be read: "), message


async def test_a_large_post_whose_client_leaves_while_it_waits_is_not_decoded() -> None:
    store = await open_store("memory://")
    api = GatewayApi(store, decode_slots=1)
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = GuardedSite(runner, HttpLimits(), "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    signer = Signer.generate()
    body = encode_batch_list(
        [make_intkey_batch(signer, [("set", f"k{i}", i)]).serialized for i in range(600)]
    )
    assert len(body) >= POOL_BYTES
    try:
        await api.decoder._turns.acquire()  # another post is being decoded
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /batches?service_id=s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        await writer.drain()
        await until(lambda: api.decoder.waiting == 1)  # in, waiting its turn
        writer.close()  # the client gives up
        await until(lambda: site.counter.open == 0)
        api.decoder._turns.release()
        await until(lambda: api.decoder.abandoned == 1)
        assert api.decoder.pooled == 0  # nothing decoded
        assert not api.decoder.pool.started
        assert not (await store.list_batches(limit=10)).batches  # nothing stored
        # A client that stays gets its answer as before.
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"http://127.0.0.1:{port}/batches?service_id=s", data=body, headers=OCTET
            ) as r:
                assert r.status == 202
        assert api.decoder.pooled == 1
    finally:
        await runner.cleanup()
        await store.close()
