"""The ``intkey load`` workload: the shape sawtooth-sdk-python's ``intkey create_batch``
makes, posted out of dependency order, and the judge of a run."""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest

from ledgerq.codec import ParsedBatch
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan
from ledgerq.testing.intkey import IntkeyState, parse_op
from ledgerq.testing.intkey_load import IntkeyLoad


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def _apply(batches: list[ParsedBatch]) -> IntkeyState:
    state = IntkeyState()
    for b in batches:
        assert state.apply(b) is None
    return state


def test_the_star_shape_is_create_batchs() -> None:
    load = IntkeyLoad(2, 30, keys=3, max_batch_size=4, seed=7)
    for s, (service, batches) in enumerate(load.batches.items()):
        populate, rest = batches[0], batches[1:]
        sets = {parse_op(t.payload).name: t for t in populate.transactions}
        assert sorted(sets) == [load.name(s, k) for k in range(3)]
        assert all(9000 <= parse_op(t.payload).value <= 100_000 for t in sets.values())
        assert all(parse_op(t.payload).verb == "set" for t in sets.values())
        assert len(rest) == 29 and {len(b.transactions) for b in rest} <= {1, 2, 3, 4}
        for b in rest:
            assert load.depends_on[b.header_signature] == {populate.header_signature}
            for t in b.transactions:
                op = parse_op(t.payload)
                assert op.verb in ("inc", "dec") and 1 <= op.value <= 10
                assert t.header.dependencies == (sets[op.name].header_signature,)
        assert load.service_of[rest[0].header_signature] == service


def test_the_chain_shape_links_each_batch_to_the_one_before() -> None:
    load = IntkeyLoad(1, 5, shape="chain")
    batches = load.batches[load.service_id(0)]
    for before, after in itertools.pairwise(batches):
        assert after.transactions[0].header.dependencies == before.transaction_ids
        assert load.depends_on[after.header_signature] == {before.header_signature}
    assert _apply(batches).values == load.values == {load.name(0, 0): 4}


def test_every_order_that_respects_the_dependencies_ends_in_the_same_values() -> None:
    load = IntkeyLoad(3, 40, keys=2, seed=3)
    rng = random.Random(0)
    for _ in range(5):
        order = []
        for batches in load.batches.values():
            rest = batches[1:]
            rng.shuffle(rest)
            order += [batches[0], *rest]
        assert _apply(order).values == load.values


def test_the_posts_are_shuffled_out_of_dependency_order() -> None:
    load = IntkeyLoad(3, 25, seed=1)
    posts = load.posts(per_post=10)
    assert posts == load.posts(per_post=10)  # seeded
    sent = [b.header_signature for _, chunk in posts for b in chunk]
    assert sorted(sent) == sorted(load.all_ids())
    assert all(len(chunk) <= 10 for _, chunk in posts)
    assert all(load.service_of[b.header_signature] == s for s, chunk in posts for b in chunk)
    for service, batches in load.batches.items():
        first = next(chunk[0] for s, chunk in posts if s == service)
        assert first is not batches[0]  # the set batch never goes first
    assert [s for s, _ in posts[:3]] == list(load.batches)  # services interleaved


def test_the_judge_names_what_went_wrong() -> None:
    load = IntkeyLoad(1, 3, shape="chain")
    a, b, c = load.all_ids()
    committed = dict.fromkeys((a, b, c), "COMMITTED")
    assert load.judge(committed, {a: 0, b: 1, c: 2}) == []
    assert load.judge(committed, {a: 0, b: 2, c: 1}) == [
        "1 committed before a batch they depend on"
    ]
    assert load.judge({a: "COMMITTED", b: "INVALID"}, {a: 0}) == [
        "2 of 3 not COMMITTED (1 INVALID, 1 no status)"
    ]


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        IntkeyLoad(1, 5, shape="tree")
    with pytest.raises(ValueError, match="per_service"):
        IntkeyLoad(1, 1)


@pytest.mark.parametrize("shape", ["star", "chain"])
async def test_posted_straight_to_a_sawtooth_like_ledger_everything_commits_in_order(
    http: aiohttp.ClientSession, shape: str
) -> None:
    load = IntkeyLoad(3, 12, shape=shape, keys=2, max_batch_size=3)
    async with FaultLedger(FaultPlan(commit_delay_ms=0), verify=False) as ledger:
        accepted = await load.post(http, ledger.url, posters=3, per_post=4, gateway=False)
        assert sorted(accepted) == sorted(load.all_ids())
        # Arriving out of dependency order, some batches were held.
        assert ledger.counts["held"] > 0
        async with http.post(f"{ledger.url}/batch_statuses?wait=10", json=load.all_ids()) as r:
            statuses = {e["id"]: e["status"] for e in (await r.json())["data"]}
        order = {b: r.commit_seq for b, r in ledger.batches.items() if r.commit_seq is not None}
        assert load.judge(statuses, order) == []
        assert ledger.state.values == load.values
        assert ledger.counts["dropped_after_hold"] == 0 and ledger.violations == []


def test_a_chain_with_an_invalid_batch_dooms_the_batches_after_it() -> None:
    load = IntkeyLoad(2, 6, shape="chain", invalid_at=3)
    first, other = load.batches.values()
    ids = [b.header_signature for b in first]
    assert load.invalid == {ids[3]} and load.doomed == set(ids[4:])
    # INVALID whatever was committed before it (only its dependency keeps
    # the ones after it from committing: intkey alone would take them).
    state = IntkeyState()
    assert [state.apply(b) is None for b in first] == [True, True, True, False, True, True]
    expected = {load.name(0, 0): 2, load.name(1, 0): 5}
    assert load.values == _apply(first[:3] + other).values == expected
    assert load.expected()[ids[2]] == "COMMITTED"
    assert {load.expected()[b] for b in ids[3:]} == {"INVALID"}
    committed = {b: "COMMITTED" for b in load.all_ids()}
    judged = committed | {ids[3]: "INVALID"} | dict.fromkeys(ids[4:], "PENDING")
    order = {b: i for i, b in enumerate(load.all_ids()) if judged[b] == "COMMITTED"}
    assert load.judge(judged, order) == []
    assert load.judge(committed | {ids[3]: "INVALID"}, {b: i for i, b in enumerate(ids)}) == [
        "2 committed after the INVALID batch they depend on"
    ]
    assert load.judge(judged | {ids[3]: "COMMITTED"}, order) == [
        "the invalid batch not judged INVALID"
    ]
    with pytest.raises(ValueError, match="invalid_at"):
        IntkeyLoad(1, 5, invalid_at=2)  # star
    with pytest.raises(ValueError, match="invalid_at"):
        IntkeyLoad(1, 5, shape="chain", invalid_at=5)


def test_in_order_posts_keep_each_service_s_batches_as_made() -> None:
    load = IntkeyLoad(2, 7, shape="chain")
    posts = load.posts(per_post=3, in_order=True)
    for service, batches in load.batches.items():
        sent = [b for s, chunk in posts if s == service for b in chunk]
        assert sent == batches


async def test_posted_in_order_to_a_ledger_nothing_is_held(http: aiohttp.ClientSession) -> None:
    load = IntkeyLoad(3, 9, shape="chain")
    async with FaultLedger(FaultPlan(commit_delay_ms=0), verify=False) as ledger:
        accepted = await load.post(
            http, ledger.url, posters=2, per_post=4, gateway=False, in_order=True
        )
        assert sorted(accepted) == sorted(load.all_ids())
        assert ledger.counts["held"] == 0
