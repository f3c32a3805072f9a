"""Fair shares among tenants (tokens): one tenant cannot take another's
long-poll places, status-read places or decoding turns; a BatchList fails on
its first bad entry, whatever follows it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from ledgerq.codec import parse_batch_list
from ledgerq.codec.wire import encode_varint
from ledgerq.errors import InvalidBatchError
from ledgerq.ingest.fairness import FairTurns, Shares
from tests.operator_fakes import batch_list, running_gateway

A = "tenant-a-token-0123456789"
B = "tenant-b-token-0123456789"
TOKENS = [
    {"name": "a", "token": A, "services": ["a-*"]},
    {"name": "b", "token": B, "services": ["b-*"]},
]


def test_a_tenant_below_its_guarantee_always_finds_a_place() -> None:
    shares = Shares(10, tenants=3)  # 3 each guaranteed
    taken = 0
    while shares.take("a"):
        taken += 1
    assert taken == 4  # its 3, and one borrowed: 6 stay for the others' guarantees
    assert all(shares.take("b") for _ in range(3))
    assert all(shares.take("c") for _ in range(3))
    assert not shares.take("b") and not shares.take("c")
    shares.give_back("a")
    assert shares.take("b")  # a free place again, nobody's guarantee unused
    alone = Shares(10)
    assert all(alone.take("a") for _ in range(10)) and not alone.take("a")


async def test_turns_go_to_the_tenant_served_least_recently() -> None:
    turns = FairTurns(1)
    order: list[str] = []

    async def post(tenant: str, name: str) -> None:
        await turns.acquire(tenant)
        order.append(name)
        await asyncio.sleep(0)
        turns.release(tenant)

    await turns.acquire("a")  # a's first list is being decoded
    waiting = [asyncio.create_task(post("a", f"a{i}")) for i in (2, 3)]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(post("b", "b1")))
    await asyncio.sleep(0)
    turns.release("a")
    await asyncio.gather(*waiting)
    assert order == ["b1", "a2", "a3"]


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    turns = FairTurns(1)
    await turns.acquire("a")
    gone = asyncio.create_task(turns.acquire("a"))
    stays = asyncio.create_task(turns.acquire("b"))
    await asyncio.sleep(0)
    gone.cancel()
    turns.release("a")
    await asyncio.wait_for(stays, 5)
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    turns.release("b")
    assert turns.free == 1


async def _park(http: aiohttp.ClientSession, url: str, token: str, ids: list[str]) -> int:
    async with http.get(
        f"{url}/batch_statuses",
        params={"id": ",".join(ids), "wait": "5"},
        headers={"Authorization": f"Bearer {token}"},
    ) as r:
        return r.status


async def test_one_tenants_long_polls_leave_the_others_places() -> None:
    flags: dict[str, Any] = {"auth.tokens": TOKENS, "max_waiters": 6}
    async with running_gateway(flags, pipeline=False) as (url, gw):
        async with aiohttp.ClientSession() as http:
            ids = {}
            for token, service in ((A, "a-1"), (B, "b-1")):
                body, ids[token] = batch_list(1, service)
                async with http.post(
                    f"{url}/batches?service_id={service}",
                    data=body,
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/octet-stream",
                    },
                ) as r:
                    assert r.status == 202
            # A asks for every place: it gets its 3, the rest are refused.
            a_polls = [asyncio.create_task(_park(http, url, A, ids[A])) for _ in range(6)]
            await until(lambda: sum(t.done() for t in a_polls) == 3)
            assert [t.result() for t in a_polls if t.done()] == [429] * 3
            assert gw.api.changes.parked == 3
            # B still finds its 3.
            b_polls = [asyncio.create_task(_park(http, url, B, ids[B])) for _ in range(3)]
            await until(lambda: gw.api.changes.parked == 6 or any(t.done() for t in b_polls))
            assert not any(t.done() for t in b_polls), [t.result() for t in b_polls]
            for t in a_polls + b_polls:
                t.cancel()
            await asyncio.gather(*a_polls, *b_polls, return_exceptions=True)


async def until(condition: Callable[[], bool]) -> None:
    """Polls ``condition`` (bounded): the gateway runs in this loop."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def _entry(payload: bytes) -> bytes:
    return b"\x0a" + encode_varint(len(payload)) + payload


def test_a_batch_list_fails_on_its_first_bad_entry() -> None:
    # An empty batch first, a malformed tail after: the first entry's error,
    # nothing past it split.
    with pytest.raises(InvalidBatchError) as caught:
        parse_batch_list(_entry(b"") + b"\x0a\xff", "svc")
    assert "batch #0" in str(caught.value) and caught.value.rule != "malformed_protobuf"
    # Five million empty entries (10 MB): refused at the first.
    with pytest.raises(InvalidBatchError) as caught:
        parse_batch_list(_entry(b"") * 5_000_000, "svc", max_bytes=10_000_000)
    assert "batch #0" in str(caught.value)
