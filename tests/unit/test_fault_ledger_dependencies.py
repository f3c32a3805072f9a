"""The fault ledger treats ``dependencies`` as a Sawtooth validator does, over real HTTP:
a batch whose dependencies it has not seen is held (read UNKNOWN, or PENDING on
request), accepted once they arrive and committed after them, dropped after its
hold; a dependency judged INVALID leaves its dependent PENDING for ever; resends
of what it has are judged; committed transactions are read at /transactions/{id}."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
import pytest

from ledgerq.codec import ParsedBatch, Signer, encode_batch_list, make_batch
from ledgerq.codec.intkey import make_intkey_transaction
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan

OCTET = {"Content-Type": "application/octet-stream"}
SIGNER = Signer.generate()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


def batch(verb: str, name: str, value: int, *deps: ParsedBatch) -> ParsedBatch:
    """One intkey transaction depending on every transaction of ``deps``."""
    on = [t for d in deps for t in d.transaction_ids]
    return make_batch(SIGNER, [make_intkey_transaction(SIGNER, verb, name, value, dependencies=on)])


async def post(http: aiohttp.ClientSession, url: str, *batches: ParsedBatch) -> None:
    async with http.post(f"{url}/batches", data=encode_batch_list(batches), headers=OCTET) as r:
        assert r.status == 202, await r.text()


async def status(http: aiohttp.ClientSession, url: str, b: ParsedBatch, wait: str = "") -> str:
    params = {"id": b.header_signature, **({"wait": wait} if wait else {})}
    async with http.get(f"{url}/batch_statuses", params=params) as r:
        assert r.status == 200
        return str((await r.json())["data"][0]["status"])


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Polls ``condition`` until true (bounded): the ledger runs in this loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def seqs(ledger: FaultLedger, batches: Sequence[ParsedBatch]) -> list[int | None]:
    return [ledger.batches[b.header_signature].commit_seq for b in batches]


async def test_a_batch_is_held_until_its_dependency_arrives_then_committed_after_it(
    http: aiohttp.ClientSession,
) -> None:
    first = batch("set", "k", 0)
    second = batch("inc", "k", 1, first)
    async with FaultLedger(FaultPlan(commit_delay_ms=0)) as ledger:
        await post(http, ledger.url, second)
        # Held, not accepted: Sawtooth's REST API answers UNKNOWN (its batch
        # tracker has not seen it), and nothing is pending.
        assert await status(http, ledger.url, second) == "UNKNOWN"
        assert ledger.batches[second.header_signature].status == "HELD"
        assert ledger.progress()["held"] == 1 and ledger.peak_pending == 0
        await post(http, ledger.url, first)
        assert await status(http, ledger.url, second, wait="5") == "COMMITTED"
        assert await status(http, ledger.url, first) == "COMMITTED"
        assert seqs(ledger, [first, second]) == [0, 1]
        assert ledger.state.values == {"k": 1}
        assert ledger.counts["held"] == ledger.counts["released_from_hold"] == 1
        assert ledger.violations == []
        report = ledger.report()["batches"][second.header_signature]
        assert report["held_ms"] is not None and report["commit_seq"] == 1


async def test_a_chain_posted_backwards_is_released_link_by_link(
    http: aiohttp.ClientSession,
) -> None:
    a = batch("set", "k", 0)
    b = batch("inc", "k", 1, a)
    c = batch("inc", "k", 2, b)
    other = batch("set", "j", 5)
    both = batch("inc", "j", 1, other, c)  # two dependencies, one of them late
    async with FaultLedger(FaultPlan(commit_delay_ms=0)) as ledger:
        await post(http, ledger.url, both, c, b, other)
        assert await status(http, ledger.url, other, wait="5") == "COMMITTED"
        assert ledger.progress()["held"] == 3
        await post(http, ledger.url, a)
        assert await status(http, ledger.url, both, wait="5") == "COMMITTED"
        assert seqs(ledger, [other, a, b, c, both]) == [0, 1, 2, 3, 4]
        assert ledger.state.values == {"k": 3, "j": 6}


async def test_an_accepted_batch_waits_for_its_dependency_to_commit(
    http: aiohttp.ClientSession,
) -> None:
    first = batch("set", "k", 0)
    second = batch("inc", "k", 1, first)
    async with FaultLedger(FaultPlan(commit_delay_ms=1000)) as ledger:
        await post(http, ledger.url, first)
        # Seen (pending): the dependent is accepted, and due at once...
        ledger.plan = ledger.plan.updated({"commit_delay_ms": 0})
        await post(http, ledger.url, second)
        assert ledger.batches[second.header_signature].status == "PENDING"
        # ...but committed only after its dependency, a second later.
        assert await status(http, ledger.url, second, wait="5") == "COMMITTED"
        assert seqs(ledger, [first, second]) == [0, 1]
        assert ledger.state.values == {"k": 1}


async def test_held_batches_read_pending_on_request_and_are_dropped_after_the_hold(
    http: aiohttp.ClientSession,
) -> None:
    first = batch("set", "k", 0)
    second = batch("inc", "k", 1, first)
    plan = FaultPlan(commit_delay_ms=0, held_status="PENDING", dependency_hold_s=0.3)
    async with FaultLedger(plan) as ledger:
        await post(http, ledger.url, second)
        assert ledger.batches[second.header_signature].status == "HELD"
        # A long poll waits for the held batch until it is dropped, silently.
        assert await status(http, ledger.url, second, wait="10") == "UNKNOWN"
        assert ledger.counts["dropped_after_hold"] == 1 and ledger.progress()["held"] == 0
        # Dropped means forgotten: its dependency arriving does not bring it back.
        await post(http, ledger.url, first)
        assert await status(http, ledger.url, first, wait="5") == "COMMITTED"
        assert ledger.status_of(second.header_signature) == "UNKNOWN"
        # Sent again after the drop: a new start, held again, then accepted.
        await post(http, ledger.url, second)
        assert await status(http, ledger.url, second, wait="5") == "COMMITTED"
        assert ledger.violations == []


async def test_a_post_of_a_held_batch_restarts_its_hold(http: aiohttp.ClientSession) -> None:
    first = batch("set", "k", 0)
    second = batch("inc", "k", 1, first)
    async with FaultLedger(FaultPlan(held_status="PENDING", dependency_hold_s=60)) as ledger:
        await post(http, ledger.url, second)
        ledger.plan = ledger.plan.updated({"dependency_hold_s": 0})
        assert ledger.batches[second.header_signature].status == "HELD"  # due in a minute
        await post(http, ledger.url, second)  # restarts the hold, now of 0 s
        await until(lambda: ledger.status_of(second.header_signature) == "UNKNOWN")
        assert ledger.counts["dropped_after_hold"] == 1


async def test_a_post_of_a_held_batch_is_a_violation_unless_the_ledger_said_unknown(
    http: aiohttp.ClientSession,
) -> None:
    first = batch("set", "k", 0)
    second = batch("inc", "k", 1, first)
    async with FaultLedger(FaultPlan(commit_delay_ms=0)) as ledger:
        await post(http, ledger.url, second)
        await post(http, ledger.url, second)  # resent without asking
        assert [(v.batch_id, v.known_as) for v in ledger.violations] == [
            (second.header_signature, "HELD")
        ]
        assert await status(http, ledger.url, second) == "UNKNOWN"
        await post(http, ledger.url, second)  # what the ledger said allows it
        assert len(ledger.violations) == 1
        await post(http, ledger.url, second)  # but only once per answer
        assert len(ledger.violations) == 2
    async with FaultLedger(FaultPlan(held_status="PENDING")) as ledger:
        await post(http, ledger.url, second)
        assert await status(http, ledger.url, second) == "PENDING"
        await post(http, ledger.url, second)
        assert [v.known_as for v in ledger.violations] == ["HELD"]
        # A restart forgets held batches too.
        assert ledger.forget_pending() == 1
        assert await status(http, ledger.url, second) == "UNKNOWN"
        await post(http, ledger.url, second)
        assert len(ledger.violations) == 1


async def test_a_resend_after_unknown_is_excused_when_the_hold_ended_meanwhile(
    http: aiohttp.ClientSession,
) -> None:
    # Told UNKNOWN about a held batch, a client resends it once its dependency
    # is back; the ledger may have released it by then without saying so.
    first = batch("set", "k", 0)
    second = batch("inc", "k", 1, first)
    async with FaultLedger(FaultPlan(commit_delay_ms=0)) as ledger:
        await post(http, ledger.url, second)
        assert await status(http, ledger.url, second) == "UNKNOWN"
        await post(http, ledger.url, first)  # releases the held batch
        await until(lambda: ledger.status_of(second.header_signature) == "COMMITTED")
        await post(http, ledger.url, second)  # acting on what it was told
        assert ledger.violations == []
        await post(http, ledger.url, second)  # one POST per answer
        assert [v.known_as for v in ledger.violations] == ["COMMITTED"]
    async with FaultLedger(FaultPlan(commit_delay_ms=0)) as ledger:
        await post(http, ledger.url, second)
        assert await status(http, ledger.url, second) == "UNKNOWN"
        await post(http, ledger.url, first)
        # A read answering otherwise withdraws the leave.
        assert await status(http, ledger.url, second, wait="5") == "COMMITTED"
        await post(http, ledger.url, second)
        assert [v.known_as for v in ledger.violations] == ["COMMITTED"]


async def test_a_dependency_judged_invalid_leaves_its_dependent_pending_for_ever(
    http: aiohttp.ClientSession,
) -> None:
    bad = batch("inc", "nowhere", 1)  # INVALID: the name was never set
    after = batch("set", "k", 0, bad)
    late = batch("set", "j", 0, bad)
    async with FaultLedger(FaultPlan(commit_delay_ms=200)) as ledger:
        await post(http, ledger.url, bad, after)  # the dependent seen while bad is pending
        assert await status(http, ledger.url, bad, wait="5") == "INVALID"
        await until(lambda: ledger.batches[after.header_signature].status == "STUCK")
        await post(http, ledger.url, late)  # and one posted after the verdict
        await until(lambda: ledger.batches[late.header_signature].status == "STUCK")
        # Never committed, never judged: a validator's scheduler fails it
        # without a transaction processor, so its batch tracker keeps it PENDING.
        assert await status(http, ledger.url, after, wait="0.2") == "PENDING"
        assert await status(http, ledger.url, late) == "PENDING"
        assert ledger.state.values == {}
        assert ledger.counts["stuck_on_invalid_dependency"] == 2
        assert ledger.progress()["stuck"] == 2 and ledger.progress()["pending"] == 0
        assert ledger.batches[after.header_signature].stuck_on == bad.transaction_ids[0]
        await post(http, ledger.url, after)  # read PENDING: a resend is a violation
        assert [v.known_as for v in ledger.violations] == ["STUCK"]
        assert ledger.forget_pending() == 2  # a restart forgets them
        assert await status(http, ledger.url, after) == "UNKNOWN"


async def test_a_dependency_inside_its_own_batch_is_never_seen_first(
    http: aiohttp.ClientSession,
) -> None:
    # The validator checks a batch's dependencies before it counts the batch's
    # own transactions as seen: such a batch is held until it is dropped.
    setter = make_intkey_transaction(SIGNER, "set", "k", 0)
    inc = make_intkey_transaction(SIGNER, "inc", "k", 1, dependencies=[setter.header_signature])
    both = make_batch(SIGNER, [setter, inc])
    plan = FaultPlan(commit_delay_ms=0, held_status="PENDING", dependency_hold_s=0.2)
    async with FaultLedger(plan) as ledger:
        await post(http, ledger.url, both)
        assert await status(http, ledger.url, both, wait="10") == "UNKNOWN"
        assert ledger.counts["dropped_after_hold"] == 1 and ledger.state.values == {}


async def test_the_hold_settings_are_checked_and_steerable(http: aiohttp.ClientSession) -> None:
    with pytest.raises(ValueError, match="held_status"):
        FaultPlan(held_status="MAYBE")
    with pytest.raises(ValueError, match="dependency_hold_s"):
        FaultPlan(dependency_hold_s=-1)
    assert FaultPlan().dependency_hold_s == 1200.0  # Sawtooth's completer
    async with FaultLedger() as ledger:
        async with http.put(f"{ledger.url}/_fault/plan", json={"held_status": "MAYBE"}) as r:
            assert r.status == 400
        async with http.put(
            f"{ledger.url}/_fault/plan", json={"held_status": "PENDING", "dependency_hold_s": 5}
        ) as r:
            assert r.status == 200
        assert ledger.plan.held_status == "PENDING" and ledger.plan.dependency_hold_s == 5


async def test_committed_transactions_are_read_as_sawtooths_rest_api_answers(
    http: aiohttp.ClientSession,
) -> None:
    first = batch("set", "k", 0)
    second = batch("inc", "k", 1, first)
    txn = first.transaction_ids[0]
    async with FaultLedger(FaultPlan(commit_delay_ms=60_000)) as ledger:
        client = SawtoothClient(ledger.url)
        try:
            await post(http, ledger.url, first, second)
            async with http.get(f"{ledger.url}/transactions/{txn}") as r:
                assert r.status == 404  # pending: Sawtooth's REST API knows committed ones only
                assert (await r.json())["error"]["code"] == 72
            assert await client.transaction_committed(txn) is False
            ledger.plan = ledger.plan.updated({"commit_delay_ms": 0})
            ledger.forget_pending()
            await post(http, ledger.url, first)
            assert await status(http, ledger.url, first, wait="5") == "COMMITTED"
            async with http.get(f"{ledger.url}/transactions/{txn}") as r:
                assert r.status == 200
                data = (await r.json())["data"]
            assert data["header_signature"] == txn
            assert data["header"]["family_name"] == "intkey"
            assert base64.b64decode(data["payload"]) == first.transactions[0].payload
            assert await client.transaction_committed(txn) is True
            assert await client.transaction_committed(second.transaction_ids[0]) is False
            async with http.get(f"{ledger.url}/transactions/{txn.upper()}") as r:
                assert r.status == 400 and (await r.json())["error"]["code"] == 60
        finally:
            await client.close()
