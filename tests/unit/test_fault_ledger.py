"""The fault ledger over real HTTP: Sawtooth's shapes, commits in order, judging, faults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.testing.fault_ledger import MALFORMED_KINDS, FaultLedger, FaultPlan

OCTET = {"Content-Type": "application/octet-stream"}
SIGNER = Signer.generate()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def _post(http: aiohttp.ClientSession, url: str, *batches: object) -> int:
    async with http.post(f"{url}/batches", data=encode_batch_list(batches), headers=OCTET) as r:  # type: ignore[arg-type]
        await r.read()
        return r.status


async def _status(http: aiohttp.ClientSession, url: str, bid: str, wait: str = "") -> str:
    params = {"id": bid, **({"wait": wait} if wait else {})}
    async with http.get(f"{url}/batch_statuses", params=params) as r:
        assert r.status == 200
        return str((await r.json())["data"][0]["status"])


async def test_commits_in_order_and_judges_reorders(http: aiohttp.ClientSession) -> None:
    set_, inc = (make_intkey_batch(SIGNER, [op]) for op in (("set", "k", 0), ("inc", "k", 1)))
    early = make_intkey_batch(SIGNER, [("inc", "other", 1)])  # before any set: a reorder
    # Commits a second after accepting: long enough that the read right after
    # the POST sees PENDING however busy the machine is.
    async with FaultLedger(FaultPlan(commit_delay_ms=1000)) as ledger:
        assert await _post(http, ledger.url, set_) == 202
        assert await _status(http, ledger.url, set_.header_signature) == "PENDING"
        assert await _status(http, ledger.url, set_.header_signature, "5") == "COMMITTED"
        assert await _post(http, ledger.url, inc, early) == 202
        assert await _status(http, ledger.url, inc.header_signature, "5") == "COMMITTED"
        async with http.post(
            f"{ledger.url}/batch_statuses?wait=5", json=[early.header_signature]
        ) as r:
            entry = (await r.json())["data"][0]
        assert entry["status"] == "INVALID"
        assert "not in state" in entry["invalid_transactions"][0]["message"]
        assert ledger.state.values == {"k": 1}
        assert ledger.state.order == {"k": [set_.header_signature, inc.header_signature]}
        assert await _status(http, ledger.url, "f" * 128) == "UNKNOWN"
        assert ledger.violations == []


async def test_a_post_of_a_held_batch_is_a_violation_but_not_after_a_forget(
    http: aiohttp.ClientSession,
) -> None:
    a, b = (make_intkey_batch(SIGNER, [("set", n, 1)]) for n in "ab")
    async with FaultLedger(FaultPlan(commit_delay_ms=60_000)) as ledger:
        await _post(http, ledger.url, a)
        assert await _post(http, ledger.url, a) == 202  # a validator tolerates it...
        assert [(v.batch_id, v.known_as) for v in ledger.violations] == [
            (a.header_signature, "PENDING")
        ]  # ...ledgerq's rule does not
        assert ledger.forget_pending() == 1
        assert await _status(http, ledger.url, a.header_signature) == "UNKNOWN"
        await _post(http, ledger.url, a)  # forgotten: sending again is right
        assert len(ledger.violations) == 1
        ledger.plan = ledger.plan.updated({"commit_delay_ms": 0})
        await _post(http, ledger.url, b)
        assert await _status(http, ledger.url, b.header_signature, "5") == "COMMITTED"
        assert ledger.status_of(a.header_signature) == "PENDING"  # still due in a minute
        await _post(http, ledger.url, b)
        assert ledger.violations[-1].known_as == "COMMITTED"
        assert ledger.report()["batches"][a.header_signature]["posts"] == 3


async def test_faults_before_and_after_accepting(http: aiohttp.ClientSession) -> None:
    a, b, c = (make_intkey_batch(SIGNER, [("set", n, 1)]) for n in "abc")
    async with FaultLedger(FaultPlan(commit_delay_ms=60_000, busy_503=1.0)) as ledger:
        assert await _post(http, ledger.url, a) == 503
        assert ledger.status_of(a.header_signature) == "UNKNOWN"
        ledger.plan = FaultPlan(commit_delay_ms=60_000, busy_429=1.0)
        assert await _post(http, ledger.url, a) == 429
        ledger.plan = FaultPlan(commit_delay_ms=60_000, drop_after_accept=1.0)
        with pytest.raises(aiohttp.ClientError):
            await _post(http, ledger.url, b)
        assert ledger.status_of(b.header_signature) == "PENDING"  # it has it; the client can't know
        ledger.plan = FaultPlan(commit_delay_ms=60_000, error_500_after_accept=1.0)
        assert await _post(http, ledger.url, c) == 500
        assert ledger.status_of(c.header_signature) == "PENDING"
        ledger.plan = FaultPlan(commit_delay_ms=60_000, max_pending=2)
        assert await _post(http, ledger.url, a) == 429  # b and c pending already
        assert ledger.violations == []


async def test_forgotten_batches_turn_unknown_and_waiters_return(
    http: aiohttp.ClientSession,
) -> None:
    a = make_intkey_batch(SIGNER, [("set", "a", 1)])
    async with FaultLedger(FaultPlan(commit_delay_ms=5, forget=1.0)) as ledger:
        await _post(http, ledger.url, a)
        assert await _status(http, ledger.url, a.header_signature, "5") == "UNKNOWN"
        assert ledger.counts["forgotten"] == 1


async def test_no_events_no_subscriptions_and_404_for_a_while(
    http: aiohttp.ClientSession,
) -> None:
    a = make_intkey_batch(SIGNER, [("set", "a", 1)])
    async with FaultLedger() as ledger:
        for path in ("/events", "/subscriptions"):
            async with http.get(ledger.url + path) as r:
                assert r.status == 404
        ledger.plan = FaultPlan(not_found=True)
        assert await _post(http, ledger.url, a) == 404
        async with http.get(f"{ledger.url}/batch_statuses?id=x") as r:
            assert r.status == 404
        async with http.get(f"{ledger.url}/_fault/report") as r:
            assert r.status == 200  # steering never fails
        async with http.put(f"{ledger.url}/_fault/plan", json={"not_found": False}) as r:
            assert r.status == 200
        assert await _post(http, ledger.url, a) == 202
        async with http.put(f"{ledger.url}/_fault/plan", json={"no_such": 1}) as r:
            assert r.status == 400


async def test_malformed_status_bodies_rotate(http: aiohttp.ClientSession) -> None:
    async with FaultLedger(FaultPlan(malformed_statuses=True)) as ledger:
        bodies = set()
        for _ in MALFORMED_KINDS:
            async with http.get(f"{ledger.url}/batch_statuses?id=abc") as r:
                assert r.status == 200
                bodies.add(await r.text())
        assert len(bodies) == len(MALFORMED_KINDS)


async def test_wait_returns_when_no_id_is_pending() -> None:
    a, b = (make_intkey_batch(SIGNER, [("set", n, 1)]) for n in "ab")
    async with (
        FaultLedger(FaultPlan(commit_delay_ms=60_000)) as ledger,
        aiohttp.ClientSession() as http,
    ):
        await _post(http, ledger.url, a, b)
        read = asyncio.create_task(
            _status(http, ledger.url, f"{a.header_signature},{b.header_signature}", "30")
        )
        await asyncio.sleep(0.05)
        assert not read.done()
        ledger.forget_pending()
        assert await asyncio.wait_for(read, 5) == "UNKNOWN"


def test_plan_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="probability"):
        FaultPlan(busy_503=2.0)
    with pytest.raises(ValueError, match="unknown plan fields"):
        FaultPlan().updated({"busy": 1})
