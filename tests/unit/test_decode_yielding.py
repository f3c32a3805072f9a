"""Large posts yield to the pipeline (``ledgerq.ingest.decoding``): verified
in chunks that pause while the pipeline is busy, never past a bound,
stored in full once verified."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bench._hostile import broken_list
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError, InvalidBatchError
from ledgerq.ingest.api import GatewayApi
from ledgerq.ingest.decoding import CHUNK, BatchListDecoder, Pacer, Yielding
from ledgerq.store import open_store

OCTET = {"Content-Type": "application/octet-stream"}


class FakeTime:
    """CPU and wall clocks moved by hand; ``sleep`` moves the wall clock."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.sleeps: list[float] = []

    def cpu(self) -> float:
        return self.cpu_s

    def clock(self) -> float:
        return self.wall_s

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.wall_s += s


def _pacer(t: FakeTime, share: Callable[[], float], max_wait_s: float = 30.0) -> Pacer:
    return Pacer(share, max_wait_s, sleep=t.sleep, cpu=t.cpu, clock=t.clock)


def _verify_chunk(pacer: Pacer, t: FakeTime, cpu_s: float) -> None:
    """One chunk of batches, each looked at by the pacer, costing ``cpu_s``."""
    for _ in range(CHUNK):
        pacer()
        t.cpu_s += cpu_s / CHUNK


def test_a_free_pipeline_never_pauses_a_post() -> None:
    t = FakeTime()
    pacer = _pacer(t, lambda: 1.0)
    for _ in range(10):
        _verify_chunk(pacer, t, 0.002)
    assert t.sleeps == []
    assert pacer.paused_s == 0 and not pacer.overdue


def test_a_busy_pipeline_caps_the_post_at_its_share_of_a_core() -> None:
    t = FakeTime()
    pacer = _pacer(t, lambda: 0.25)
    for _ in range(4):
        _verify_chunk(pacer, t, 0.002)
    # Before the first chunk nothing was used; after each, three times its CPU.
    assert t.sleeps == pytest.approx([0.0, 0.006, 0.006, 0.006])
    assert pacer.paused_s == pytest.approx(0.018)
    assert not pacer.overdue


def test_at_share_zero_the_post_waits_until_the_pipeline_is_idle() -> None:
    t = FakeTime()
    shares = iter([0.0, 0.0, 0.0, 1.0])  # busy three looks, then idle
    events: list[str] = []
    pacer = _pacer(t, lambda: next(shares))
    pacer.on_pause = lambda: _recording(events)
    pacer()  # before the first batch
    assert events == ["paused", "released"]
    assert len(t.sleeps) == 3  # looked again until the share rose
    for _ in range(CHUNK - 1):
        pacer()  # the rest of the chunk: no look
    assert len(t.sleeps) == 3 and not pacer.overdue


def test_a_post_paused_to_the_bound_runs_unthrottled() -> None:
    t = FakeTime()
    looks = 0

    def busy() -> float:
        nonlocal looks
        looks += 1
        return 0.0

    pacer = _pacer(t, busy, max_wait_s=0.1)
    pacer()
    assert pacer.overdue
    assert pacer.paused_s == pytest.approx(0.1)
    seen = looks
    for _ in range(5):
        _verify_chunk(pacer, t, 0.002)
    assert looks == seen  # no more looks, no more sleeps
    assert sum(t.sleeps) == pytest.approx(0.1)


class _recording:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def __enter__(self) -> None:
        self.events.append("paused")

    def __exit__(self, *_exc: object) -> None:
        self.events.append("released")


def _good_list(n: int) -> bytes:
    signer = Signer.generate()
    return encode_batch_list(
        [make_intkey_batch(signer, [("set", f"k{i}", i)]).serialized for i in range(n)]
    )


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def test_a_large_post_waits_while_the_pipeline_is_busy_then_is_stored(
    http: aiohttp.ClientSession,
) -> None:
    store = await open_store("memory://")
    busy = True
    body = _good_list(400)
    api = GatewayApi(
        store,
        decode_slots=1,
        decode_yielding=Yielding(bytes=len(body), share=0.0, max_wait_s=600),
        pipeline_busy=lambda: busy,
    )
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    events: list[str] = []
    try:

        async def post() -> int:
            async with http.post(f"{url}/batches?service_id=s", data=body, headers=OCTET) as r:
                events.append("answered")
                return r.status

        answer = asyncio.create_task(post())
        await until(lambda: api.decoder.pausing == 1)  # its worker pauses it
        events.append("paused")
        # A smaller post is pipeline work: taken in at once meanwhile.
        async with http.post(f"{url}/batches?service_id=t", data=_good_list(3), headers=OCTET) as r:
            assert r.status == 202
        assert not answer.done() and api.decoder.pausing == 1
        assert not (await store.list_batches(service_id="s", limit=1000)).batches
        events.append("pipeline idle")
        busy = False
        assert await answer == 202
        assert events == ["paused", "pipeline idle", "answered"]
        assert api.decoder.paused_posts == 1 and api.decoder.overdue_posts == 0
        stored = (await store.list_batches(service_id="s", limit=1000)).batches
        assert len(stored) == 400  # all of it, verified
    finally:
        await runner.cleanup()
        await store.close()


async def test_a_large_post_paused_past_the_bound_gets_its_precise_answer() -> None:
    decoder = BatchListDecoder(
        max_bytes=10 * 2**20,
        slots=1,
        pool_bytes=1,
        yielding=Yielding(bytes=1, share=0.0, max_wait_s=0.2),
        busy=lambda: True,  # never idle
    )
    try:
        with pytest.raises(InvalidBatchError) as refused:
            await decoder.decode(broken_list(100_000), "s")
        assert refused.value.rule == "bad_batch_signature"
        assert decoder.paused_posts == 1 and decoder.overdue_posts == 1
        # Below the yielding size: never paused, busy or not.
        decoder.yielding = Yielding(bytes=10**9, share=0.0, max_wait_s=600)
        assert len(await decoder.decode(_good_list(50), "s")) == 50
        assert decoder.paused_posts == 1
    finally:
        decoder.close()


async def test_a_paused_large_post_never_keeps_a_smaller_pooled_post_waiting() -> None:
    busy = True
    large = _good_list(300)
    decoder = BatchListDecoder(
        max_bytes=10 * 2**20,
        slots=2,
        pool_bytes=1,  # every post in the pool
        yielding=Yielding(bytes=len(large), share=0.0, max_wait_s=600),
        busy=lambda: busy,
    )
    try:
        first = asyncio.create_task(decoder.decode(large, "s"))
        await until(lambda: decoder.pausing == 1)
        # A second large post waits for the large posts' one slot ...
        second = asyncio.create_task(decoder.decode(large, "t"))
        await until(lambda: decoder.waiting == 1)
        # ... while a smaller one takes the other slot at once, busy or not.
        assert len(await decoder.decode(_good_list(20), "u")) == 20
        assert not first.done() and not second.done()
        assert decoder.pausing == 1 and decoder.waiting == 1
        busy = False
        assert len(await first) == 300 and len(await second) == 300
        assert decoder.waiting == 0
    finally:
        decoder.close()


async def test_the_large_posts_share_is_split_among_those_verified_at_once() -> None:
    busy = True
    decoder = BatchListDecoder(
        max_bytes=10 * 2**20, slots=2, yielding=Yielding(share=0.5), busy=lambda: busy
    )
    try:
        decoder.large = 2
        decoder.sample()
        assert decoder._share.value == pytest.approx(0.25)
        decoder.large = 1
        decoder.sample()
        assert decoder._share.value == pytest.approx(0.5)
        busy = False
        decoder._busy_at = -1e9  # long idle
        decoder.sample()
        assert decoder._share.value == 1.0
    finally:
        decoder.close()


def test_yield_settings(tmp_path: Path) -> None:
    settings = load_settings(environ={}, cwd=tmp_path)
    assert settings.decode_yield_bytes == 1024 * 1024
    assert settings.decode_yield_share == 0.1
    assert settings.decode_yield_max_wait_s == 30.0
    env = {"LEDGERQ_DECODE_YIELD_SHARE": "0", "LEDGERQ_DECODE_YIELD_MAX_WAIT_S": "5"}
    settings = load_settings(environ=env, cwd=tmp_path)
    assert settings.decode_yield_share == 0.0
    assert settings.decode_yield_max_wait_s == 5.0
    with pytest.raises(ConfigError, match="decode_yield_share"):
        load_settings(environ={"LEDGERQ_DECODE_YIELD_SHARE": "1.5"}, cwd=tmp_path)


async def test_in_a_gateway_a_large_post_waits_for_the_submission_in_flight(
    http: aiohttp.ClientSession,
) -> None:
    from tests.operator_fakes import CommittingLedger, batch_list, running_gateway

    ledger = CommittingLedger()
    ledger.gate = asyncio.Event()  # the ledger answers no POST until set
    big = _good_list(600)
    flags = {"decode_yield_bytes": len(big), "decode_yield_share": 0.0}
    async with running_gateway(flags, ledger) as (url, gateway):
        events: list[str] = []
        small, _ids = batch_list(2, "a")
        async with http.post(f"{url}/batches?service_id=a", data=small, headers=OCTET) as r:
            assert r.status == 202
        await asyncio.wait_for(ledger.posted.wait(), 10)  # a submission in flight
        assert gateway.producer.submitting == 1

        async def post() -> int:
            async with http.post(f"{url}/batches?service_id=b", data=big, headers=OCTET) as r:
                events.append("answered")
                return r.status

        answer = asyncio.create_task(post())
        await until(lambda: gateway.api.decoder.pausing == 1)
        events.append("paused")
        assert not answer.done()
        events.append("ledger answers")
        ledger.gate.set()
        assert await answer == 202
        assert events == ["paused", "ledger answers", "answered"]
        listed = await gateway.store.list_batches(service_id="b", limit=1000)
        assert len(listed.batches) == 600


async def test_small_posts_decoded_on_the_loop_one_per_pass_io_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Small posts arriving together are decoded one per pass of the event
    loop, in arrival order: what the first decode made ready (an answer on a
    socket: here a callback it scheduled) runs before the second decode, not
    after all of them."""
    import ledgerq.ingest.decoding as decoding

    order: list[str] = []
    real = decoding.parse_batch_list

    def parse(body: bytes, service_id: str | None, **kwargs: object) -> object:
        order.append(f"decode {service_id}")
        asyncio.get_running_loop().call_soon(order.append, f"ready after {service_id}")
        return real(body, service_id, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(decoding, "parse_batch_list", parse)
    decoder = BatchListDecoder(max_bytes=10 * 2**20)  # every post below pool_bytes
    try:
        body = _good_list(5)
        lists = await asyncio.gather(*(decoder.decode(body, s) for s in ("a", "b", "c")))
        assert [len(b) for b in lists] == [5, 5, 5]
        assert [b[0].service_id for b in lists] == ["a", "b", "c"]
        assert order == [
            "decode a",
            "ready after a",
            "decode b",
            "ready after b",
            "decode c",
            "ready after c",
        ]
        assert decoder.inline_waits == 2 and decoder.pooled == 0
    finally:
        decoder.close()
