"""Random intkey workloads in random delivery orders equal serial execution in fingerprint order.

Transactions declare their inputs and outputs as single addresses or as
namespace prefixes of every length (the empty one included), mixed, and
sometimes as a prefix that does not cover the name they touch (the batch is
then INVALID, as the serial execution says).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.codec import ParsedBatch, Signer, make_batch, make_transaction
from ledgerq.codec.intkey import NAMESPACE, encode_payload, make_address
from ledgerq.node.candidates import batch_candidate
from ledgerq.node.families import default_registry
from ledgerq.node.ordering.machine import OrderingMachine
from ledgerq.node.ordering.messages import ProgramResult
from tests.unit.node.workload import Issuer, fingerprint_order, run_random

SIGNER = Signer.generate()
REGISTRY = default_registry()

#: How a transaction declares what it touches, for its inputs and its outputs.
DECLARATIONS = ["address", "address", "namespace", "all", "2", "10", "68", "both", "other"]

op = st.tuples(
    st.sampled_from(["set", "inc", "dec"]),
    st.integers(0, 9),  # name index, folded into the key space below
    st.sampled_from([0, 1, 2, 7, 2**32 - 1]),
    st.sampled_from(DECLARATIONS),
    st.sampled_from(DECLARATIONS),
)


def declared(how: str, name: str) -> tuple[str, ...]:
    address = make_address(name)
    if how == "address":
        return (address,)
    if how == "namespace":
        return (NAMESPACE,)
    if how == "all":
        return ("",)
    if how == "both":
        return (address, address[:8])
    if how == "other":  # a prefix of another name's address only
        return (make_address(name + "~")[:10],)
    return (address[: int(how)],)


def transaction(verb: str, name: str, value: int, inputs: str, outputs: str):  # type: ignore[no-untyped-def]
    return make_transaction(
        SIGNER,
        family_name="intkey",
        family_version="1.0",
        inputs=declared(inputs, name),
        outputs=declared(outputs, name),
        payload=encode_payload(verb, name, value),
    )


def serial(
    batches: list[ParsedBatch],
) -> tuple[dict[str, bytes], dict[str, tuple[bool, str]], dict[str, dict[str, bytes | None]]]:
    """Each batch's own code run alone, in order, against a plain dict."""
    state: dict[str, bytes] = {}
    outcome: dict[str, tuple[bool, str]] = {}
    reads: dict[str, dict[str, bytes | None]] = {}
    for batch in batches:
        program = batch_candidate(batch, REGISTRY).executable()
        seen = reads[batch.header_signature] = {}
        try:
            key = next(program)
            while True:
                seen[key] = state.get(key)
                key = program.send(state.get(key))
        except StopIteration as stop:
            result: ProgramResult = stop.value
        message = result.invalid[0].message if result.invalid else ""
        outcome[batch.header_signature] = (result.success, message)
        if result.success:
            state.update({k: v for k, v in result.writes.items() if v is not None})
    return state, outcome, reads


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.lists(op, min_size=1, max_size=3), min_size=1, max_size=25),
    keys=st.sampled_from([1, 2, 10]),
    shards=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_intkey_under_random_delivery_equals_serial(
    ops: list[list[tuple[str, int, int, str, str]]], keys: int, shards: int, seed: int
) -> None:
    batches = [
        make_batch(
            SIGNER,
            [transaction(verb, f"k{n % keys}", value, i, o) for verb, n, value, i, o in batch_ops],
        )
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
    state, outcome, reads = serial(order)
    assert machine.state() == state
    got = {
        s.tx_id: (s.success, s.invalid[0].message if s.invalid else "")
        for s in issuer.summaries.values()
    }
    assert got == outcome
    for summary in issuer.summaries.values():
        assert dict(summary.values_read) == reads[summary.tx_id]
    for shard in machine.shards:
        assert shard.pending_markers() == 0
