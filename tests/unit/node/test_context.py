"""The context a transaction runs in: its inputs and outputs, addresses and prefixes."""

from __future__ import annotations

import pytest

from ledgerq.codec.intkey import NAMESPACE, make_address
from ledgerq.node.families import Context, InvalidTransaction, Unfetched

A = make_address("a")
B = make_address("b")
OTHER = "ab" + A[2:]  # an address of another namespace


def context(
    base: dict[str, bytes | None],
    *,
    inputs: tuple[str, ...] = (),
    outputs: tuple[str, ...] = (),
    input_prefixes: tuple[str, ...] = (),
    output_prefixes: tuple[str, ...] = (),
) -> tuple[Context, dict[str, bytes], dict[str, bytes]]:
    overlay: dict[str, bytes] = {}
    writes: dict[str, bytes] = {}
    ctx = Context(
        inputs,
        outputs,
        base,
        overlay,
        writes=writes,
        input_prefixes=input_prefixes,
        output_prefixes=output_prefixes,
    )
    return ctx, overlay, writes


def test_addresses_under_an_input_prefix_may_be_read_and_others_not() -> None:
    ctx, _, _ = context({A: b"1", B: None}, input_prefixes=(NAMESPACE,))
    assert ctx.get_state([A, B]) == {A: b"1"}
    with pytest.raises(InvalidTransaction, match=f"Tried to get unauthorized address {OTHER}"):
        ctx.get_state([OTHER])
    # Only a 70-hex-character address lies under a prefix, as Sawtooth's context checks.
    for wrong in (NAMESPACE, A[:-2], A.upper(), A + "00"):
        with pytest.raises(InvalidTransaction, match="unauthorized address"):
            ctx.get_state([wrong])


def test_an_address_under_an_input_prefix_not_fetched_yet_asks_for_it() -> None:
    ctx, _, _ = context({}, inputs=(B,), input_prefixes=("",))  # the empty prefix: all state
    assert ctx.get_state([B]) == {}  # a listed input absent from the values: no value
    with pytest.raises(Unfetched) as raised:
        ctx.get_state([A])
    assert raised.value.address == A
    assert not isinstance(raised.value, Exception)  # a handler's `except Exception` lets it by


def test_addresses_under_an_output_prefix_may_be_written_and_others_not() -> None:
    ctx, overlay, writes = context({A: None}, inputs=(A,), output_prefixes=(A[:8], "1cf127"))
    ctx.set_state({A: b"2"})
    assert writes == {A: b"2"} and overlay == {}
    assert ctx.get_state([A]) == {A: b"2"}  # a transaction reads its own writes
    with pytest.raises(InvalidTransaction, match=f"Tried to set unauthorized address {B}"):
        ctx.set_state({B: b"3"})
    # An output prefix gives no right to read, as in Sawtooth.
    with pytest.raises(InvalidTransaction, match=f"Tried to get unauthorized address {B}"):
        ctx.get_state([B])


def test_reads_see_the_earlier_transactions_of_the_batch() -> None:
    overlay = {A: b"earlier"}
    ctx = Context((A,), (A,), {A: b"state"}, overlay)
    assert ctx.get_state([A]) == {A: b"earlier"}
    ctx.set_state({A: b"mine"})  # without ``writes``, writes go to the overlay
    assert overlay == {A: b"mine"}
