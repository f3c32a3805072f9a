"""Random intkey workloads in random delivery orders equal serial execution in fingerprint order."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.codec import ParsedBatch, Signer
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.node.candidates import apply_batch, batch_candidate
from ledgerq.node.families import default_registry
from ledgerq.node.ordering.machine import OrderingMachine
from tests.unit.node.workload import Issuer, fingerprint_order, run_random

SIGNER = Signer.generate()
REGISTRY = default_registry()

op = st.tuples(
    st.sampled_from(["set", "inc", "dec"]),
    st.integers(0, 9),  # name index, folded into the key space below
    st.sampled_from([0, 1, 2, 7, 2**32 - 1]),
)


def serial(batches: list[ParsedBatch]) -> tuple[dict[str, bytes], dict[str, tuple[bool, str]]]:
    state: dict[str, bytes] = {}
    outcome: dict[str, tuple[bool, str]] = {}
    for batch in batches:
        reads = {a for tx in batch.transactions for a in tx.header.inputs}
        result = apply_batch(batch, REGISTRY, {a: state.get(a) for a in reads})
        message = result.invalid[0].message if result.invalid else ""
        outcome[batch.header_signature] = (result.success, message)
        if result.success:
            state.update({k: v for k, v in result.writes.items() if v is not None})
    return state, outcome


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.lists(op, min_size=1, max_size=3), min_size=1, max_size=25),
    keys=st.sampled_from([1, 2, 10]),
    shards=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_intkey_under_random_delivery_equals_serial(
    ops: list[list[tuple[str, int, int]]], keys: int, shards: int, seed: int
) -> None:
    batches = [
        make_intkey_batch(SIGNER, [(verb, f"k{n % keys}", value) for verb, n, value in batch_ops])
        for batch_ops in ops
    ]
    by_id = {b.header_signature: b for b in batches}
    issuer = Issuer()
    machine = OrderingMachine(issuer, shards=shards, batch_size=4, clock=lambda: 0)
    for batch in batches:
        machine.submit(batch_candidate(batch, REGISTRY))
    run_random(machine, random.Random(seed))
    order = [by_id[tx] for _, tx in fingerprint_order(issuer)]
    assert len(order) == len(by_id)
    state, outcome = serial(order)
    assert machine.state() == state
    got = {
        s.tx_id: (s.success, s.invalid[0].message if s.invalid else "")
        for s in issuer.summaries.values()
    }
    assert got == outcome
