"""Long-polling status requests (ledgerq.ingest.longpoll): woken only by a
change to one of their batches, Sawtooth's rule for ids unknown when they
arrived, final answers shared through the cache, fresh answers when a wait
runs out. Asserted by counting reads and wake-ups, never by the clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Collection
from dataclasses import replace

import aiohttp
import pytest

from ledgerq.codec import Signer
from ledgerq.codec.decode import to_tracking_batch
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.errors import StoreUnavailableError
from ledgerq.ingest.api import GatewayApi, _json_string, status_body, status_entry
from ledgerq.ingest.longpoll import DELIVER_SLICE, Changes, FinalCache, Waiter
from ledgerq.model import (
    Committed,
    Invalid,
    InvalidTransaction,
    Pending,
    TrackingBatch,
    Unknown,
    Valid,
)
from ledgerq.scopes import Scope
from ledgerq.store import open_store
from tests.unit.test_gateway_bounds import CountingStore, _post, _serve, until

SIGNER = Signer.generate()


def _batch(service: str, n: int) -> TrackingBatch:
    return to_tracking_batch(make_intkey_batch(SIGNER, [("set", f"{service}{n}", n)]), service)


class FakeStore:
    """Batches by id, as the store holds them now; counts reads."""

    def __init__(self) -> None:
        self.state: dict[str, TrackingBatch] = {}
        self.reads: list[list[str]] = []
        #: Reads asking for any of these fail.
        self.fail: set[str] = set()
        #: The reads of :meth:`read_final` (each also in ``reads``).
        self.final_reads: list[list[str]] = []

    def put(self, *batches: TrackingBatch) -> None:
        for b in batches:
            self.state[b.batch_id] = b

    async def read(self, ids: Collection[str]) -> list[TrackingBatch]:
        self.reads.append(sorted(ids))
        if self.fail & set(ids):
            raise StoreUnavailableError("down")
        return [self.state[i] for i in ids if i in self.state]

    async def read_final(self, ids: Collection[str]) -> list[TrackingBatch]:
        """The final batches only, as the stores' final reads answer."""
        self.final_reads.append(sorted(ids))
        return [b for b in await self.read(ids) if b.is_final]


@pytest.fixture
async def changes() -> AsyncIterator[tuple[Changes, FakeStore]]:
    store = FakeStore()
    c = Changes(max_waiters=10)
    c.reader = store.read
    yield c, store
    await c.aclose()


async def test_a_waiter_is_woken_by_its_own_batch_and_not_by_unrelated_changes(
    changes: tuple[Changes, FakeStore],
) -> None:
    c, store = changes
    mine, neighbour, elsewhere = _batch("a", 0), _batch("a", 1), _batch("b", 0)
    store.put(mine, neighbour, elsewhere)
    other_waiter_batch = _batch("c", 0)
    store.put(other_waiter_batch)
    with c.park() as waiter, c.park() as other:
        c.watch(waiter, {mine.batch_id: mine}, [mine.batch_id])
        c.watch(
            other, {other_waiter_batch.batch_id: other_waiter_batch}, [other_waiter_batch.batch_id]
        )
        await until(lambda: len(store.reads) == 1)  # the watch reads both services once

        c.notify("b")  # nobody waits there: no read, no wake-up
        store.put(replace(neighbour, batch_status=Committed()))
        c.notify("a")  # a batch of its service, not its own: read, not woken
        await until(lambda: len(store.reads) == 2)
        assert store.reads[-1] == [mine.batch_id]  # only the batch waited for
        assert not waiter.event.is_set() and c.woken == 0

        store.put(replace(mine, batch_status=Committed()))
        c.notify("a")
        await until(lambda: waiter.event.is_set())
        assert len(store.reads) == 3 and c.woken == 1
        assert not other.event.is_set()  # its batch did not change
        assert waiter.found[mine.batch_id].is_final
    assert c.parked == 0 and c._by_service == {}


async def test_an_unknown_id_accepted_meanwhile_keeps_the_request_waiting(
    changes: tuple[Changes, FakeStore],
) -> None:
    """Sawtooth's rule: the wait ends when no id is PENDING, also an id the
    gateway did not know when the request arrived."""
    c, store = changes
    known, late = _batch("a", 0), _batch("b", 0)
    store.put(known)
    found = {known.batch_id: known}
    with c.park() as waiter:
        c.watch(waiter, found, [known.batch_id], [late.batch_id])
        await until(lambda: len(store.reads) == 1)
        store.put(late)  # accepted (by another instance) while it waits
        store.put(replace(known, batch_status=Committed()))
        c.notify("a")
        # Its known batch is final: the unknown id is read again (one read),
        # found PENDING, and waited for.
        await until(lambda: [late.batch_id] in store.reads)
        await until(lambda: "b" in c._by_service)
        assert not waiter.event.is_set() and c.woken == 0
        assert found[late.batch_id] == late

        store.put(replace(late, batch_status=Committed()))
        c.notify("b")
        await until(lambda: waiter.event.is_set())
        assert found[late.batch_id].is_final and c.woken == 1


async def test_an_id_still_unknown_after_the_others_are_final_ends_the_wait(
    changes: tuple[Changes, FakeStore],
) -> None:
    c, store = changes
    known, never = _batch("a", 0), _batch("z", 9)
    store.put(known)
    with c.park() as waiter, c.park() as second:
        c.watch(waiter, {known.batch_id: known}, [known.batch_id], [never.batch_id])
        c.watch(second, {known.batch_id: known}, [known.batch_id], [never.batch_id])
        await until(lambda: len(store.reads) == 1)
        store.put(replace(known, batch_status=Committed()))
        c.notify("a")
        await until(lambda: waiter.event.is_set() and second.event.is_set())
        # One read for the change, one re-check for both requests together.
        assert store.reads[1:] == [[known.batch_id], [never.batch_id]]
        assert never.batch_id not in waiter.found and c.woken == 2


async def test_a_request_learns_nothing_of_batches_it_may_not_see(
    changes: tuple[Changes, FakeStore],
) -> None:
    c, store = changes
    known, foreign = _batch("a", 0), _batch("secret", 0)
    store.put(known, foreign)
    scope = Scope(name="t", services=("a",), read=True, write=False)
    with c.park(scope=scope) as waiter:
        c.watch(waiter, {known.batch_id: known}, [known.batch_id], [foreign.batch_id])
        store.put(replace(known, batch_status=Committed()))
        c.notify("a")
        await until(lambda: waiter.event.is_set())
    assert foreign.batch_id not in waiter.found  # still unknown to it, not waited for


async def test_a_failed_recheck_wakes_the_requests_with_what_they_have(
    changes: tuple[Changes, FakeStore],
) -> None:
    c, store = changes
    known, unknown = _batch("a", 0), _batch("b", 0)
    store.put(known)
    with c.park() as waiter:
        c.watch(waiter, {known.batch_id: known}, [known.batch_id], [unknown.batch_id])
        await until(lambda: len(store.reads) == 1)
        store.fail = {unknown.batch_id}  # the re-check fails
        store.put(replace(known, batch_status=Committed()))
        c.notify("a")
        await until(lambda: waiter.event.is_set())
        assert store.reads[1:] == [[known.batch_id], [unknown.batch_id]]
        assert unknown.batch_id not in waiter.found


async def test_a_batch_read_while_pending_is_not_handed_out_and_a_final_one_only_once(
    changes: tuple[Changes, FakeStore],
) -> None:
    c, store = changes
    mine = _batch("a", 0)
    store.put(mine)
    with c.park() as waiter:
        found = {mine.batch_id: mine}
        c.watch(waiter, found, [mine.batch_id])
        await until(lambda: len(store.reads) == 1)
        submitted = replace(mine, submitted=True)
        store.put(submitted)
        c.notify("a")
        await until(lambda: len(store.reads) == 2)
        # Still pending: not handed out (the request needs final states only).
        assert found[mine.batch_id] is mine and waiter.pending and c.woken == 0
        store.put(replace(mine, batch_status=Committed()))
        c.notify("a")
        await until(lambda: waiter.event.is_set())
        assert found[mine.batch_id].is_final and not waiter.pending
        assert c._by_service == {}  # final: watched by no one any more


async def test_a_long_pass_yields_to_the_event_loop(
    changes: tuple[Changes, FakeStore],
) -> None:
    """A pass over many final batches lets other tasks run between slices
    (counted: what another task saw delivered when it ran)."""
    c, store = changes
    n = 3 * DELIVER_SLICE
    batches = [_batch("a", i) for i in range(n)]
    store.put(*batches)
    with c.park() as waiter:
        c.watch(waiter, {b.batch_id: b for b in batches}, [b.batch_id for b in batches])
        await until(lambda: len(store.reads) == 1)
        store.put(*(replace(b, batch_status=Committed()) for b in batches))
        c.notify("a")
        seen: list[int] = []
        while not waiter.event.is_set():
            seen.append(n - len(waiter.pending))
            await asyncio.sleep(0)
    # Some turns of this task came while the pass was under way.
    assert any(0 < k < n for k in seen), seen


async def test_the_refresher_reads_only_final_batches_and_rechecks_read_every_state() -> None:
    """With a final reader, the refresher's reads of watched batches ask the
    store for final batches only (a pending one costs no row); the re-check
    of ids unknown when the request came reads every state (a pending one is
    then waited for)."""
    store = FakeStore()
    c = Changes(max_waiters=10)
    c.reader, c.final_reader = store.read, store.read_final
    try:
        mine, late = _batch("a", 0), _batch("b", 0)
        store.put(mine)
        with c.park() as waiter:
            found = {mine.batch_id: mine}
            c.watch(waiter, found, [mine.batch_id], [late.batch_id])
            await until(lambda: len(store.reads) == 1)
            assert store.final_reads == [[mine.batch_id]]  # watched: final only
            store.put(late)  # accepted while the request waits, pending
            store.put(replace(mine, batch_status=Committed()))
            c.notify("a")
            await until(lambda: [late.batch_id] in store.reads)
            # The re-check of the unknown id read every state: found pending.
            assert [late.batch_id] not in store.final_reads
            assert waiter.pending == {late.batch_id: late.batch_id} and not waiter.event.is_set()
            store.put(replace(late, batch_status=Committed()))
            c.notify("b")
            await until(lambda: waiter.event.is_set())
            assert store.final_reads[-1] == [late.batch_id]
            assert found[late.batch_id].is_final
    finally:
        await c.aclose()


async def test_without_a_final_reader_the_refresher_filters_the_reader_s_answer(
    changes: tuple[Changes, FakeStore],
) -> None:
    c, store = changes
    assert c.final_reader is None
    mine = _batch("a", 0)
    store.put(mine)
    with c.park() as waiter:
        found = {mine.batch_id: mine}
        c.watch(waiter, found, [mine.batch_id])
        await until(lambda: len(store.reads) == 1)
        assert found[mine.batch_id] is mine and not waiter.event.is_set()
        store.put(replace(mine, batch_status=Committed()))
        c.notify("a")
        await until(lambda: waiter.event.is_set())
        assert found[mine.batch_id].is_final


def test_a_waiter_without_service_or_scope_limits_sees_every_batch() -> None:
    assert Waiter().sees_all and Waiter().sees(_batch("x", 0))
    scoped = Waiter(scope=Scope(name="t", services=("a",), read=True, write=False))
    assert not scoped.sees_all
    assert scoped.sees(_batch("a", 0)) and not scoped.sees(_batch("b", 0))
    assert not Waiter(service_id="a").sees(_batch("b", 0))


def test_the_final_cache_keeps_only_states_that_never_change_bodies_left_out() -> None:
    cache = FinalCache(size=2)
    pending, valid = _batch("a", 0), replace(_batch("a", 1), batch_status=Valid())
    done = [replace(_batch("a", n), batch_status=Committed()) for n in range(2, 5)]
    cache.add_all([pending, valid, *done])
    assert cache.get(pending.batch_id) is None
    assert cache.get(valid.batch_id) is None  # Splinter's Valid becomes Committed
    assert cache.get(done[0].batch_id) is None  # the least recently used, dropped
    kept = cache.get(done[2].batch_id)
    assert kept is not None and kept.serialized_batch == b"" and kept.is_final
    assert len(cache) == 2 and cache.hits == 1


@pytest.fixture
async def served_api() -> AsyncIterator[tuple[str, GatewayApi, CountingStore]]:
    inner = await open_store("memory://")
    store = CountingStore(inner)
    api = GatewayApi(store, acceptor=inner, max_status_ids=5)  # type: ignore[arg-type]
    url, runner = await _serve(api)
    yield url, api, store
    await runner.cleanup()
    await inner.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def test_final_batches_asked_again_cost_no_store_read(
    served_api: tuple[str, GatewayApi, CountingStore], http: aiohttp.ClientSession
) -> None:
    url, api, store = served_api
    ids = await _post(http, url, 2, "s1")
    for batch_id in ids:
        api.changes.final.add(replace(await _one(store, batch_id), batch_status=Committed()))
    unknown = "e" * 128
    store.by_id_calls.clear()
    for _ in range(3):
        async with http.get(f"{url}/batch_statuses?id={ids[0]},{ids[1]}&wait=30") as r:
            data = (await r.json())["data"]
        assert [d["status"] for d in data] == ["COMMITTED", "COMMITTED"]
    assert store.by_id_calls == []  # every answer from the cache, no wait
    async with http.get(f"{url}/batch_statuses?id={ids[0]},{unknown}") as r:
        data = (await r.json())["data"]
    assert [d["status"] for d in data] == ["COMMITTED", "UNKNOWN"]
    assert store.by_id_calls == [1]  # only the id not in the cache
    # Another service's request does not see them, cache or not.
    async with http.get(f"{url}/batch_statuses?id={ids[0]}&service_id=s2") as r:
        assert (await r.json())["data"][0]["status"] == "UNKNOWN"


async def test_a_wait_that_runs_out_answers_the_store_state_even_without_a_wake_up(
    served_api: tuple[str, GatewayApi, CountingStore], http: aiohttp.ClientSession
) -> None:
    url, api, store = served_api
    (batch_id,) = await _post(http, url, 1, "s1")
    unknown = "d" * 128
    poll = asyncio.create_task(http.get(f"{url}/batch_statuses?id={batch_id},{unknown}&wait=0.5"))
    await until(lambda: api.changes.parked == 1)
    calls = len(store.by_id_calls)
    # The batch is committed where no wake-up reaches this gateway.
    await store.change_batch_to_submitted(batch_id, "s1")
    await store.update_batch_status(batch_id, "s1", Pending())
    await store.update_batch_status(batch_id, "s1", Committed())
    assert api.changes.parked == 1 and len(store.by_id_calls) == calls
    r = await poll
    data = (await r.json())["data"]
    # Read again when the wait ran out: one read of the ids not final.
    assert store.by_id_calls[calls:] == [2]
    assert [d["status"] for d in data] == ["COMMITTED", "UNKNOWN"]


async def _one(store: CountingStore, batch_id: str) -> TrackingBatch:
    (batch,) = await store.inner.get_batch_statuses_by_id([batch_id])
    result: TrackingBatch = batch
    return result


def test_the_status_body_is_the_entries_as_json_final_ones_encoded_once() -> None:
    cache = FinalCache()
    done = replace(_batch("a", 0), batch_status=Committed())
    bad = replace(
        _batch("a", 1),
        batch_status=Invalid(
            transactions=(InvalidTransaction("t" * 128, 'say "no"\n', b"\x00\xff"),)
        ),
    )
    pending, by_dc = _batch("a", 2), replace(_batch("b", 0), data_change_id="x")
    valid = replace(_batch("c", 0), batch_status=Valid())
    lost = replace(_batch('quote"d', 0), batch_status=Unknown(), submitted=True)
    cache.add_all([done, bad, valid])
    found = {
        done.batch_id: done,
        bad.batch_id: bad,
        pending.batch_id: pending,
        "dc:x": by_dc,
        valid.batch_id: valid,
        lost.batch_id: lost,
    }
    ids = [
        done.batch_id,
        bad.batch_id,
        "f" * 128,
        pending.batch_id,
        "dc:x",
        'dc:"q',
        valid.batch_id,
        lost.batch_id,
    ]
    link = '/batch_statuses?id=a&x="y"'
    expected = {"data": [status_entry(i, found.get(i)) for i in ids], "link": link}
    for _ in range(2):  # encoded, then from the cache
        assert json.loads(status_body(ids, found, link, cache)) == expected
    assert cache.encoded(done.batch_id) is not None and cache.encoded(bad.batch_id) is not None
    assert cache.encoded(valid.batch_id) is None  # not settled, never cached


@pytest.mark.parametrize(
    "link",
    [
        "/batch_statuses?id=" + "ab" * 64 + "%2C" + "cd" * 64,
        'q"uote',
        "back\\slash",
        "é",
        "a\nb",
        "",
    ],
)
def test_the_status_link_is_quoted_as_json_would(link: str) -> None:
    body = json.loads(status_body([], {}, link, FinalCache()))
    assert body["link"] == link
    assert _json_string(link) == json.dumps(link)
