"""A posted list is stored while long-polls' first reads are pending, the
parked requests' refresher reads at a bounded rate, and status ids are
checked in one pass. Asserted by counting reads and inserts, never by the
clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from typing import Any

import aiohttp
import pytest

from ledgerq.ingest.api import GatewayApi, _all_batch_ids, _id_problem
from ledgerq.ingest.longpoll import (
    REFRESH_IDS_PER_S,
    REFRESH_INTERVAL_S,
    Changes,
    refresh_pause,
)
from ledgerq.model import TrackingBatch
from ledgerq.store import open_store
from tests.unit.test_gateway_bounds import _post, _serve, until
from tests.unit.test_longpoll import FakeStore, _batch


class HeldStore:
    """The memory store; status reads wait for ``reads_open``, inserts for
    ``inserts_open``; records how many status reads had started when each
    insert began and ended."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads_open = asyncio.Event()
        self.inserts_open = asyncio.Event()
        self.inserts_open.set()
        self.reads_started = 0
        self.inserts: list[tuple[int, int]] = []
        self.inserting = asyncio.Event()

    async def get_batch_statuses_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        self.reads_started += 1
        await self.reads_open.wait()
        result: list[TrackingBatch] = await self.inner.get_batch_statuses_by_id(batch_ids)
        return result

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        began = self.reads_started
        self.inserting.set()
        await self.inserts_open.wait()
        stored: list[TrackingBatch] = await self.inner.add_batches(batches, now=now)
        self.inserts.append((began, self.reads_started))
        return stored

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
async def held() -> AsyncIterator[tuple[str, GatewayApi, HeldStore]]:
    inner = await open_store("memory://")
    store = HeldStore(inner)
    api = GatewayApi(store, acceptor=store, changes=Changes(max_waiters=100))  # type: ignore[arg-type]
    url, runner = await _serve(api)
    yield url, api, store
    store.reads_open.set()
    store.inserts_open.set()
    await runner.cleanup()
    await inner.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def test_a_post_is_stored_while_long_polls_first_reads_are_pending(
    held: tuple[str, GatewayApi, HeldStore], http: aiohttp.ClientSession
) -> None:
    url, api, store = held
    polls = 30
    ids = [f"{k:02x}" * 64 for k in range(polls)]
    asked = [asyncio.create_task(http.get(f"{url}/batch_statuses?id={i}&wait=20")) for i in ids]
    # Two reads under way (the slots), every other request waiting its turn.
    await until(lambda: store.reads_started == 2 and api.status_reads.queued == polls - 2)
    posted = await _post(http, url, 3, "s1")
    # Stored and answered 202 while none of the long-polls has had its first answer.
    assert len(posted) == 3 and store.inserts == [(2, 2)]
    assert not any(t.done() for t in asked)
    store.reads_open.set()
    answers = await asyncio.gather(*asked)
    assert [r.status for r in answers] == [200] * polls
    for r in answers:
        assert (await r.json())["data"][0]["status"] == "UNKNOWN"
        r.release()


def test_the_refresher_reads_a_bounded_number_of_ids_per_second() -> None:
    # A small read is not slowed; a large one spaces the next out.
    assert refresh_pause(0) == refresh_pause(100) == REFRESH_INTERVAL_S
    assert refresh_pause(REFRESH_IDS_PER_S) == pytest.approx(1.0)
    assert refresh_pause(REFRESH_IDS_PER_S // 2) == pytest.approx(0.5)


async def test_a_large_refresh_spaces_out_the_next() -> None:
    store = FakeStore()
    changes = Changes(max_waiters=2_000)
    changes.reader = store.read
    batches = [_batch("s", n) for n in range(REFRESH_IDS_PER_S // 2)]
    store.put(*batches)
    loop = asyncio.get_running_loop()
    with changes.park() as waiter:
        began = loop.time()
        changes.watch(waiter, {b.batch_id: b for b in batches}, [b.batch_id for b in batches])
        await until(lambda: len(store.reads) == 1)
        # The next read may not start before half a second after this one.
        assert changes._next_read >= began + 0.5 - 1e-6
        assert changes.ids_read == len(batches)
    await changes.aclose()


@pytest.mark.parametrize(
    "bad",
    [
        "A" * 128,  # uppercase
        "g" * 128,
        "a" * 127,
        "a" * 129,
        "a" * 127 + " ",
        "a" * 126 + "é",
        "a" * 127 + "\u0660",  # a digit, not ASCII
    ],
)
def test_status_ids_are_checked_in_one_pass(bad: str) -> None:
    good = ["0123456789abcdef" * 8, "f" * 128]
    assert _all_batch_ids(good)
    assert not _all_batch_ids([*good, bad])
    # Two ids whose lengths only add up are refused too.
    assert not _all_batch_ids(["a" * 127, "b" * 129])
    if len(bad) != 128 or not bad.isascii() or bad != bad.lower():
        assert _id_problem(bad) is not None
