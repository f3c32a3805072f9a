"""BatchLists decoded and verified in worker processes: same batches, same refusals."""

from __future__ import annotations

import pickle

import pytest

from ledgerq.codec import Signer, decode_batch_list, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.errors import InvalidBatchError
from ledgerq.node.decoding import BatchDecoder
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
