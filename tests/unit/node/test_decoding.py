"""BatchLists decoded and verified in worker processes: same batches, same refusals."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from ledgerq.codec import Signer, decode_batch_list, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.codec.wire import (
    BATCH_LIST_BATCHES_FIELD,
    repeated_field_spans,
    split_repeated_field,
)
from ledgerq.errors import InvalidBatchError
from ledgerq.node import Node
from ledgerq.node.decoding import BatchDecoder, _decode, _flatten, _rebuild
from ledgerq.node.families import default_registry
from ledgerq.node.families.intkey import IntkeyHandler

SIGNER = Signer.generate()


async def test_large_bodies_are_verified_in_the_pool_with_the_same_outcome() -> None:
    batches = [make_intkey_batch(SIGNER, [("set", f"d{i}", i)]) for i in range(50)]
    body = encode_batch_list(batches)
    decoder = BatchDecoder(pool_bytes=1_000, workers=1, preparers=default_registry().preparers())
    try:
        pooled = list(await decoder.decode(body))
        assert pooled == list(decode_batch_list(body))
        assert decoder.pool is not None and decoder.pool.started  # it went to the pool
        # The worker ran intkey's prepare() beside the checks (see node.families).
        assert [t.prepared for b in pooled for t in b.transactions] == [
            IntkeyHandler.prepare(t.payload) for b in batches for t in b.transactions
        ]
        tampered = bytearray(body)
        tampered[-3] ^= 0x01  # inside the last transaction's payload: its hash no longer matches
        with pytest.raises(InvalidBatchError) as refused:
            await decoder.decode(bytes(tampered))
        with pytest.raises(InvalidBatchError) as inline:
            decode_batch_list(bytes(tampered))
        assert refused.value.rule == inline.value.rule
        small = encode_batch_list(batches[:1])
        assert list(await BatchDecoder(pool_bytes=10**6).decode(small)) == batches[:1]
    finally:
        decoder.close()


def test_decoded_batches_pickle_back_equal() -> None:
    signer = Signer.generate()
    batches = [
        make_intkey_batch(signer, [("set", f"p{i}", i), ("inc", f"p{i}", 1)]) for i in range(3)
    ]
    parsed = decode_batch_list(encode_batch_list(batches))
    assert pickle.loads(pickle.dumps(parsed)) == parsed


def test_a_pooled_result_sends_each_batch_as_its_span_of_the_body() -> None:
    """The worker sends a batch's ``serialized`` as where it lies in the body,
    and the node slices it from its own copy: the same batches, byte for
    byte, also where the body holds other fields before and between them."""
    batches = [
        make_intkey_batch(SIGNER, [("set", f"s{i}-{j}", i) for j in range(3)]) for i in range(4)
    ]
    plain = encode_batch_list(batches)
    # An unknown varint field (number 7) first and an unknown bytes field (number 9)
    # between the first batch and the rest: skipped by the decoder, kept out of the spans.
    first = repeated_field_spans(plain, BATCH_LIST_BATCHES_FIELD)[0]
    body = b"\x38\x05" + plain[: first[1]] + b"\x4a\x03abc" + plain[first[1] :]
    spans = repeated_field_spans(body, BATCH_LIST_BATCHES_FIELD)
    assert [body[s:e] for s, e in spans] == split_repeated_field(body, BATCH_LIST_BATCHES_FIELD)
    flat = _decode(body, 10**6, default_registry().preparers())
    assert [b[-1] for b in flat] == spans  # spans cross, not the batches' bytes
    rebuilt = _rebuild(pickle.loads(pickle.dumps(flat)), body)
    inline = decode_batch_list(body)
    assert rebuilt == inline
    assert [b.serialized for b in rebuilt] == [b.serialized for b in inline]
    as_bytes = _flatten(decode_batch_list(body), default_registry().preparers())
    assert len(pickle.dumps(flat)) < len(pickle.dumps(as_bytes))


async def test_a_status_read_is_answered_between_small_posts_decoded_on_the_loop() -> None:
    """Small bodies are decoded on the event loop one per pass, in order of
    arrival: a status read that comes while twenty wait is answered after at
    most one of them, not after all (by order, not by time)."""
    node = await Node.open(None, shards=1)
    decoder = BatchDecoder(workers=0)
    bodies = [
        encode_batch_list([make_intkey_batch(SIGNER, [("set", f"q{i}", i)])]) for i in range(20)
    ]
    order: list[str] = []

    async def post(i: int) -> None:
        await decoder.decode(bodies[i])
        order.append(f"post {i}")

    async def read() -> None:
        await node.batch_statuses(["ab" * 64])
        order.append("status")

    try:
        posts = [asyncio.create_task(post(i)) for i in range(20)]
        status = asyncio.create_task(read())
        await asyncio.gather(*posts, status)
    finally:
        await node.close()
    assert order.index("status") <= 1
    assert [o for o in order if o != "status"] == [f"post {i}" for i in range(20)]
    assert decoder.inline_waits == 19
