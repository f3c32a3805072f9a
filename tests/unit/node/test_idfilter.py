"""The store's key filter: never a false "absent", kept with the store through a
reopen, and built for a store that has none."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.node import disk
from ledgerq.node.disk import CommitRecord, LmdbStore
from ledgerq.node.idfilter import KeyFilter


@given(st.lists(st.binary(min_size=8, max_size=64), max_size=200))
@settings(max_examples=50)
def test_every_key_added_may_be_contained(keys: list[bytes]) -> None:
    found = KeyFilter(blocks=64)
    for key in keys:
        found.add(key)
    assert all(found.may_contain(key) for key in keys)


def test_few_false_positives_when_lightly_filled() -> None:
    found = KeyFilter(blocks=1024)  # 64 KiB
    for _ in range(10_000):
        found.add(os.urandom(64))
    false = sum(found.may_contain(os.urandom(64)) for _ in range(10_000))
    assert false < 100  # about 0.1 % expected at 10 keys per block


def _reference_bits(blocks: int, keys: list[bytes]) -> bytearray:
    """The filter's bit layout as first written (stored checkpoints rely on it):
    block from the key's last 64 bits, then four 9-bit positions in that block."""
    bits = bytearray(blocks * 64)
    shift = blocks.bit_length() - 1
    for key in keys:
        h = int.from_bytes(key[-8:], "big")
        base = (h & (blocks - 1)) * 512
        h >>= shift
        for _ in range(4):
            p = base + (h & 511)
            bits[p >> 3] |= 1 << (p & 7)
            h >>= 9
    return bits


@given(st.lists(st.binary(min_size=8, max_size=64), max_size=100))
@settings(max_examples=50)
def test_the_bit_layout_is_that_of_stored_checkpoints(keys: list[bytes]) -> None:
    found = KeyFilter(blocks=256)
    for key in keys:
        found.add(key)
    assert found.bits == _reference_bits(256, keys)


def _record(num: int) -> CommitRecord:
    return CommitRecord(
        num,
        os.urandom(64).hex(),
        "COMMITTED",
        None,
        (os.urandom(64).hex(),),
        b"batch",
        ((os.urandom(35).hex(), b"value"),),
    )


def test_the_filter_is_stored_with_the_keys(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store", filter_blocks=256)
    records = [_record(n) for n in range(1, 501)]
    try:
        store.write(records, 500, 1)
        store.after_write()
    finally:
        store.close()
    again = LmdbStore(tmp_path / "store", filter_blocks=256)
    try:
        for record in records:
            assert again.get_batch(record.batch_id) is not None
            assert again.get_txn(record.tx_ids[0]) == (record.num, 0)
            assert again.get_state(record.writes[0][0]) == b"value"
        assert again.get_batch(os.urandom(64).hex()) is None
    finally:
        again.close()


def test_a_store_without_a_filter_gets_one_built_from_its_keys(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store", filter_blocks=256)
    records = [_record(n) for n in range(1, 201)]
    try:
        store.write(records, 200, 1)
    finally:
        store.close()
    # As written by a node before the filter: no filter database, no size in meta.
    env = lmdb.open(str(tmp_path / "store"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"filter", txn=txn), delete=True)
        txn.delete(b"filter_blocks", db=env.open_db(b"meta", txn=txn))
    env.close()
    again = LmdbStore(tmp_path / "store", filter_blocks=256)
    try:
        for record in records:
            assert again.get_batch(record.batch_id) is not None
            assert again.get_txn(record.tx_ids[0]) == (record.num, 0)
            assert again.get_state(record.writes[0][0]) == b"value"
    finally:
        again.close()
    # Another size: rebuilt as well.
    bigger = LmdbStore(tmp_path / "store", filter_blocks=1024)
    try:
        assert all(bigger.get_txn(r.tx_ids[0]) is not None for r in records)
    finally:
        bigger.close()


def test_the_keys_after_the_last_checkpoint_come_back_from_the_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "FILTER_CHECKPOINT", 100)
    store = LmdbStore(tmp_path / "store", filter_blocks=256)
    records = [_record(n) for n in range(1, 251)]
    try:
        for first in range(0, 250, 50):
            store.write(records[first : first + 50], first + 50, 1)
        assert store._filter_through == 200  # checkpointed at 100 and 200, not since
    finally:
        store._env.close()  # as a crash: no clean close
    again = LmdbStore(tmp_path / "store", filter_blocks=256)
    try:
        assert again._filter_through == 250
        for record in records:
            assert again.get_batch(record.batch_id) is not None
            assert again.get_txn(record.tx_ids[0]) == (record.num, 0)
            assert again.get_state(record.writes[0][0]) == b"value"
    finally:
        again.close()
