"""The node's chain: which batches are blocks, how blocks are numbered, and a data
directory written by an earlier store format."""

from __future__ import annotations

from pathlib import Path

import cbor2
import lmdb
import pytest

from ledgerq.codec import Signer
from ledgerq.codec.intkey import NAMESPACE, make_address, make_intkey_batch
from ledgerq.codec.signing import verify_signature
from ledgerq.node import Node
from ledgerq.node.chain import header_fields
from ledgerq.node.disk import _U64, CommitRecord, LmdbStore, encode_block
from ledgerq.node.merkle import EMPTY_ROOT
from ledgerq.node.ordering.messages import InvalidTx

SIGNER = Signer.generate()


async def test_an_invalid_batch_is_in_no_block(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    try:
        good = make_intkey_batch(SIGNER, [("set", "a", 1)])
        bad = make_intkey_batch(SIGNER, [("inc", "missing", 1)])
        later = make_intkey_batch(SIGNER, [("inc", "a", 1)])
        for batch in (good, bad, later):
            await node.submit([batch])
            await node.batch_statuses([batch.header_signature], wait=10)
        assert node.status(bad.header_signature).status == "INVALID"
        # Three final statuses (the event stream numbers them all), two blocks.
        assert node.ledger.event_seq == 3 and node.height == 2
        blocks = [node.get_block(n) for n in (1, 2)]
        assert [b.batch_id for b in blocks if b is not None] == [
            good.header_signature,
            later.header_signature,
        ]
        assert node.get_block(3) is None
        await node.snapshot()  # and so they read from the store
        await node.close()
        node = await Node.open(tmp_path)
        assert node.height == 2
        second = node.get_block(2)
        assert second is not None and second.batch_id == later.header_signature
        first = node.get_block(1)
        assert first is not None and second.previous_id == first.id
    finally:
        await node.close()


def _write_format_1(path: Path, records: list[CommitRecord]) -> None:
    """A store as format 1 wrote it: a block per final status, INVALID ones too, and
    records without a block number."""
    store = LmdbStore(path)
    store.write(records, len(records), 1)
    store.close()
    env = lmdb.open(str(path), max_dbs=8, map_size=1 << 30)
    with env.begin(write=True) as txn:
        meta, blocks = env.open_db(b"meta", txn=txn), env.open_db(b"blocks", txn=txn)
        chain = env.open_db(b"chain", txn=txn)
        txn.drop(chain, delete=True)
        txn.put(b"format", _U64.pack(1), db=meta)
        txn.delete(b"height", db=meta)
        for record in records:
            fields = cbor2.loads(encode_block(record))[:7]
            txn.put(_U64.pack(record.num), cbor2.dumps(fields), db=blocks)
    env.close()


def test_a_format_1_store_is_upgraded_its_invalid_batches_leave_the_chain(
    tmp_path: Path,
) -> None:
    ids = [f"{i:02x}" * 64 for i in range(1, 6)]
    invalid = (InvalidTx("cc" * 64, 'Verb is "inc" but name "x" not in state'),)
    records = [
        CommitRecord(1, ids[0], "COMMITTED", None, (), b"", (("aa" * 35, b"1"),)),
        CommitRecord(2, ids[1], invalid, None, (), b"", ()),
        CommitRecord(3, ids[2], "COMMITTED", None, (), b"", (("bb" * 35, b"2"),)),
        CommitRecord(4, ids[3], invalid, None, (), b"", ()),
        CommitRecord(5, ids[4], "COMMITTED", None, (), b"", ()),
    ]
    path = tmp_path / "store"
    _write_format_1(path, records)
    store = LmdbStore(path)
    try:
        assert store.meta().height == 3 and store.meta().events == 5
        assert [store.chain_seq(n) for n in (1, 2, 3, 4)] == [1, 3, 5, None]
        assert [store.get_block(n).block for n in range(1, 6)] == [1, 0, 2, 0, 3]  # type: ignore[union-attr]
    finally:
        store.close()


def _root_of_state(state: list[tuple[str, bytes]]) -> str:
    from tests.unit.node.test_merkle import reference_root

    return reference_root(dict(state))


async def test_genesis_block_and_headers_signed_by_a_persistent_key(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    try:
        genesis = node.get_block(0)
        assert genesis is not None and node.head == genesis.id
        assert genesis.previous_id == "0" * 16 and genesis.batch_id == ""
        record = node.committed.chain_record(0)
        assert record is not None
        header = header_fields(record.header)
        assert header.state_root_hash == EMPTY_ROOT and list(header.batch_ids) == []
        key = node.sealer.signer.public_key
        assert header.signer_public_key == key
        assert verify_signature(key, record.header, genesis.id)
        key_file = tmp_path / "validator.priv"
        assert key_file.stat().st_mode & 0o777 == 0o600
        batch = make_intkey_batch(SIGNER, [("set", "a", 1), ("set", "b", 2)])
        await node.submit([batch])
        await node.batch_statuses([batch.header_signature], wait=10)
        one = node.committed.chain_record(1)
        assert one is not None
        fields = header_fields(one.header)
        assert fields.previous_block_id == genesis.id
        assert fields.state_root_hash == _root_of_state(await node.list_state())
        assert verify_signature(key, one.header, one.signature)
        await node.close()
        node = await Node.open(tmp_path)
        assert node.sealer.signer.public_key == key  # the same key after a restart
        again = node.get_block(0)
        assert again is not None and again.id == genesis.id
        later = make_intkey_batch(SIGNER, [("inc", "a", 1)])
        await node.submit([later])
        await node.batch_statuses([later.header_signature], wait=10)
        two = node.committed.chain_record(2)
        assert two is not None
        assert header_fields(two.header).previous_block_id == one.signature
        assert header_fields(two.header).state_root_hash == _root_of_state(await node.list_state())
    finally:
        await node.close()


async def test_a_format_1_data_directory_gets_a_genesis_block_and_signed_blocks(
    tmp_path: Path,
) -> None:
    a, b = "1cf126" + "aa" * 32, "1cf126" + "bb" * 32
    records = [
        CommitRecord(1, "01" * 64, "COMMITTED", None, (), b"", ((a, b"1"),)),
        CommitRecord(2, "02" * 64, (InvalidTx("03" * 64, "no"),), None, (), b"", ()),
        CommitRecord(3, "04" * 64, "COMMITTED", None, (), b"", ((a, b"2"), (b, b"3"))),
    ]
    _write_format_1(tmp_path / "store", records)
    node = await Node.open(tmp_path)
    try:
        assert node.height == 2
        blocks = [node.committed.chain_record(n) for n in (0, 1, 2)]
        assert all(r is not None for r in blocks)
        roots = [header_fields(r.header).state_root_hash for r in blocks if r is not None]
        assert roots == [
            EMPTY_ROOT,
            _root_of_state([(a, b"1")]),
            _root_of_state([(a, b"2"), (b, b"3")]),
        ]
        ids = [r.signature for r in blocks if r is not None]
        assert [header_fields(r.header).previous_block_id for r in blocks if r is not None] == [
            "0" * 16,
            *ids[:2],
        ]
        assert node.head == ids[2]
        found = node.find_block(ids[1])
        assert found is not None and found.num == 1
    finally:
        await node.close()


@pytest.mark.parametrize("where", ["memory", "unwritten", "store", "half"])
async def test_state_at_every_block_of_the_chain(tmp_path: Path, where: str) -> None:
    node = await Node.open(
        None if where == "memory" else tmp_path,
        store_interval_s=3600 if where in ("unwritten", "half") else 0.01,
    )
    try:
        names = ["n0", "n1", "n2", "n3"]
        model: dict[str, int] = {}
        expected: list[dict[str, int]] = [{}]  # the state after each block
        for step in range(24):
            name = names[(step * 7) % len(names)]
            verb = "inc" if name in model else "set"
            batch = make_intkey_batch(SIGNER, [(verb, name, step + 1)])
            await node.submit([batch])
            await node.batch_statuses([batch.header_signature], wait=10)
            model[name] = model.get(name, 0) + step + 1
            expected.append(dict(model))
            if where == "half" and step == 11:
                await node.snapshot()
        if where == "store":
            await node.snapshot()
        assert node.height == 24
        for block, state in enumerate(expected):
            for name in names:
                data = await node.get_state(make_address(name), head=block)
                value = None if data is None else cbor2.loads(data)[name]
                assert value == state.get(name), (block, name)
            listed = await node.list_state(NAMESPACE, head=block)
            assert sorted(a for a, _ in listed) == sorted(make_address(n) for n in state)
            page = await node.list_state(NAMESPACE, head=block, limit=1)
            assert page == sorted(listed)[:1]
    finally:
        await node.close()
