"""intkey split in two: what the decoding worker prepares from the payload, what the
node applies with state. Either way, the same writes and the same refusals."""

from __future__ import annotations

import pickle

import cbor2
import pytest

from ledgerq.codec import Signer, decode_batch_list, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.node.candidates import apply_batch
from ledgerq.node.decoding import _flatten, _rebuild
from ledgerq.node.families import Context, InvalidTransaction, default_registry
from ledgerq.node.families.intkey import IntkeyHandler, make_address

SIGNER = Signer.generate()

PAYLOADS = [
    b"",
    b"\xff\x00garbage",
    cbor2.dumps([1, 2]),
    cbor2.dumps({"Name": "x", "Value": 1}),
    cbor2.dumps({"Verb": "set", "Value": 1}),
    cbor2.dumps({"Verb": "set", "Name": "x"}),
    cbor2.dumps({"Verb": "set", "Name": "", "Value": 1}),
    cbor2.dumps({"Verb": "set", "Name": "x", "Value": True}),
    cbor2.dumps({"Verb": "set", "Name": "x", "Value": 2**32}),
    cbor2.dumps({"Verb": "set", "Name": 7, "Value": 1}),
    cbor2.dumps({"Verb": "set", "Name": "n" * 21, "Value": 1}),
    cbor2.dumps({"Verb": "bad", "Name": "x", "Value": 1}),
    *(
        cbor2.dumps({"Verb": verb, "Name": name, "Value": value})
        for verb in ("set", "inc", "dec")
        for name in ("x", "y")
        for value in (1, 7, 2**32 - 1)
    ),
]

#: State at x's address before the transaction: nothing, x alone, x beside a colliding name.
STATES = [None, cbor2.dumps({"x": 5}, canonical=True), cbor2.dumps({"x": 5, "w": 1})]


def outcome(run, payload: bytes, before: bytes | None):  # type: ignore[no-untyped-def]
    address = make_address("x")
    overlay: dict[str, bytes] = {}
    context = Context((address,), (address,), {address: before}, overlay)
    try:
        run(payload, context)
    except InvalidTransaction as exc:
        return ("invalid", str(exc), exc.extended_data)
    except Exception as exc:  # compared, not hidden
        return ("raised", type(exc), str(exc))
    return ("ok", overlay)


class _Tx:
    def __init__(self, payload: bytes) -> None:
        self.header_signature = "t" * 128
        self.payload = payload


@pytest.mark.parametrize("before", STATES)
@pytest.mark.parametrize("payload", PAYLOADS)
def test_prepared_and_plain_apply_agree(payload: bytes, before: bytes | None) -> None:
    handler = IntkeyHandler()
    prepared = pickle.loads(pickle.dumps(IntkeyHandler.prepare(payload)))  # as it crosses
    plain = outcome(lambda p, c: handler.apply(_Tx(p), c), payload, before)
    split = outcome(lambda p, c: handler.apply_prepared(_Tx(p), prepared, c), payload, before)
    assert split == plain


def test_the_worker_prepares_what_the_node_would_compute() -> None:
    batches = [
        make_intkey_batch(SIGNER, [("set", f"q{i}", i), ("inc", f"q{i}", 2)]) for i in range(4)
    ]
    parsed = decode_batch_list(encode_batch_list(batches))
    rebuilt = _rebuild(pickle.loads(pickle.dumps(_flatten(parsed, default_registry().preparers()))))
    assert list(rebuilt) == list(parsed)  # prepared is not compared
    for batch in rebuilt:
        for tx in batch.transactions:
            assert tx.prepared == IntkeyHandler.prepare(tx.payload)
            assert tx.prepared is not None
    # Applied either way, the batches write the same values.
    registry = default_registry()
    for plain, prepared in zip(parsed, rebuilt, strict=True):
        values = {a: None for t in plain.transactions for a in t.header.inputs}
        assert apply_batch(prepared, registry, values) == apply_batch(plain, registry, values)
    # Without preparers nothing is prepared (a small body, a journal replay: apply()).
    assert all(t.prepared is None for b in _rebuild(_flatten(parsed)) for t in b.transactions)
