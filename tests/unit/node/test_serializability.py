"""Whatever the delivery order, the machine equals a serial execution in fingerprint order."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.node.ordering.machine import OrderingMachine
from tests.unit.node.workload import (
    Issuer,
    candidate,
    fingerprint_order,
    random_specs,
    run_random,
    serial,
)


def check(
    seed: int,
    count: int,
    keys: int,
    shards: int,
    batch_size: int,
    fifo: bool,
    prefixes: bool = False,
) -> None:
    rnd = random.Random(seed)
    specs = random_specs(rnd, count, keys, prefixes)
    by_id = {s.id: s for s in specs}
    issuer = Issuer()
    machine = OrderingMachine(issuer, shards=shards, batch_size=batch_size, clock=lambda: 0)
    for spec in specs:
        machine.submit(candidate(spec))
    if fifo:
        assert machine.run()
    else:
        run_random(machine, rnd)
    order = fingerprint_order(issuer)
    assert len(order) == count  # every candidate ordered exactly once
    state, before, success = serial([by_id[tx] for _, tx in order])
    assert machine.state() == state
    assert len(issuer.summaries) == count  # executed exactly once each
    for summary in issuer.summaries.values():
        assert summary.success == success[summary.tx_id]
        for key, value in summary.values_read:
            assert before[summary.tx_id][key] == value, (summary.tx_id, key)
        if not summary.success:
            assert summary.values_written == ()
    for shard in machine.shards:
        assert shard.pending_markers() == 0  # every version folded, nothing left locked


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(1, 40),
    keys=st.sampled_from([1, 2, 3, 50]),
    shards=st.integers(1, 4),
    batch_size=st.sampled_from([1, 3, 1024]),
)
def test_random_delivery_order_is_serializable(
    seed: int, count: int, keys: int, shards: int, batch_size: int
) -> None:
    check(seed, count, keys, shards, batch_size, fifo=False)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(1, 200), keys=st.sampled_from([1, 5, 500]))
def test_fifo_router_is_serializable(seed: int, count: int, keys: int) -> None:
    check(seed, count, keys, 4, 16, fifo=True)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(1, 40),
    keys=st.sampled_from([1, 2, 3, 9, 50]),
    shards=st.integers(1, 4),
    batch_size=st.sampled_from([1, 3, 1024]),
)
def test_prefixes_mixed_with_keys_are_serializable(
    seed: int, count: int, keys: int, shards: int, batch_size: int
) -> None:
    check(seed, count, keys, shards, batch_size, fifo=False, prefixes=True)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(1, 200), keys=st.sampled_from([1, 9, 500]))
def test_fifo_router_with_prefixes_is_serializable(seed: int, count: int, keys: int) -> None:
    check(seed, count, keys, 4, 16, fifo=True, prefixes=True)
