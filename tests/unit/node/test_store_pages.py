"""The store's mapped file pages leave the node's RSS (Linux): once more than a limit
of them were mapped in (looked at every so many store operations), and never while a
restart replays the journal."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ledgerq.codec import Signer
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.node import Node
from ledgerq.node import node as node_module
from ledgerq.node.disk import CommitRecord, LmdbStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SIGNER = Signer.generate()


def _mapped_kib(start: int) -> int:
    """Resident KiB of this process's mapping that starts at ``start`` (smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            inside = int(head.split("-")[0], 16) == start
        elif inside and head == "Rss:":
            return int(line.split()[1])
    raise AssertionError("mapping not found")


def _records(first: int, count: int) -> list[CommitRecord]:
    out = []
    for num in range(first, first + count):
        key = os.urandom(64).hex()
        out.append(
            CommitRecord(
                num,
                key,
                "COMMITTED",
                None,
                (os.urandom(64).hex(),),
                b"b" * 400,
                ((os.urandom(35).hex(), b"v" * 16),),
            )
        )
    return out


def _store_with_pages_mapped(path: Path) -> tuple[LmdbStore, int]:
    store = LmdbStore(path)
    store._pages.every = 10**9  # nothing released while the pages are mapped in
    store._pages.limit = 0  # then anything mapped in is over the limit
    found = store._pages._range
    assert found is not None, "the data file's mapping was not found in /proc/self/maps"
    for first in range(1, 6_001, 2_000):
        store.write(_records(first, 2_000), first + 1_999, 0)
        store.after_write()
    for num in range(1, 6_001):  # every block page, through the map
        assert store.get_block(num) is not None
    store._pages.released = 0  # (each write released what it mapped, at its end)
    return store, found[0]


def test_operations_map_pages_in_and_enough_of_them_map_them_out(tmp_path: Path) -> None:
    store, start = _store_with_pages_mapped(tmp_path / "store")
    try:
        assert store._pages.released == 0
        before = _mapped_kib(start)
        assert before > 4 * 1024  # megabytes of the store mapped in by the reads
        store._pages.every = 100
        store._pages._touched = 0
        for num in range(1, 100):  # 99 operations: kept
            store.get_block(num)
        assert store._pages.released == 0
        assert _mapped_kib(start) > before / 2
        store.get_block(100)  # the 100th: released
        assert store._pages.released == 1
        assert _mapped_kib(start) < before / 4
        # Under the limit: looked at, not released.
        store._pages.limit = 1 << 40
        for num in range(1, 201):
            store.get_block(num)
        assert store._pages.released == 1
        # Still readable: the pages come back from the page cache.
        assert store.get_block(3).num == 3  # type: ignore[union-attr]
        assert store.get_batch(store.get_block(5_000).batch_id) is not None  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_write_unmaps_at_its_end_and_counts_its_commits_operations(tmp_path: Path) -> None:
    store, start = _store_with_pages_mapped(tmp_path / "store")
    try:
        before = _mapped_kib(start)
        store.write(_records(6_001, 9), 6_009, 0)  # 27 operations, under `every`
        assert store._pages.released == 1  # at the write's end
        assert _mapped_kib(start) < before / 4
        for num in range(1, 6_001):  # map the store's pages in again
            store.get_block(num)
        store._pages.released = 0
        store._pages.every = 30
        store._pages._touched = 0
        store.write(_records(6_010, 10), 6_019, 0)  # 3 each (batch, transaction, address)
        assert store._pages.released == 2  # at the 30th operation, and at the end
    finally:
        store.close()


def test_held_pages_stay_mapped_until_let_go(tmp_path: Path) -> None:
    store, start = _store_with_pages_mapped(tmp_path / "store")
    try:
        before = _mapped_kib(start)
        store._pages.every = 10
        store.pin_pages(True)
        store.write(_records(6_001, 10), 6_010, 0)
        for num in range(1, 100):
            store.get_block(num)
        assert store._pages.released == 0
        assert _mapped_kib(start) > before / 2
        store.pin_pages(False)  # let go: released at once
        assert store._pages.released == 1
        assert _mapped_kib(start) < before / 4
    finally:
        store.close()


async def test_a_restart_keeps_the_pages_mapped_while_it_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = tmp_path / "live"
    node = await Node.open(live, snapshot_every=10**6, store_interval_s=3600)
    batches = [make_intkey_batch(SIGNER, [("set", f"p{i}", i)]) for i in range(12)]
    try:
        await node.submit(batches[:4])
        await node.batch_statuses([b.header_signature for b in batches[:4]], wait=10)
        await node.snapshot()
        await node.submit(batches[4:])  # only in the journal
        infos = await node.batch_statuses([b.header_signature for b in batches], wait=10)
        assert {i.status for i in infos.values()} == {"COMMITTED"}
        shutil.copytree(live, tmp_path / "image")
    finally:
        await node.close()
    # Replay writes to the store after every replayed record.
    monkeypatch.setattr(node_module, "COMMIT_PART", 1)
    commit_ready = Node._commit_ready
    writes_while_replaying: list[bool] = []
    opening = [True]

    async def commit_and_write(self: Node) -> None:
        await commit_ready(self)
        if opening[0]:
            await self.committed.drain()

    write = LmdbStore.write
    released_while_replaying: list[int] = []

    def spy(self: LmdbStore, *args: Any) -> None:
        self._pages.every = 1  # any operation would release, were the pages not held
        self._pages.limit = 0
        write(self, *args)
        if opening[0]:
            writes_while_replaying.append(True)
            released_while_replaying.append(self._pages.released)

    monkeypatch.setattr(Node, "_commit_ready", commit_and_write)
    monkeypatch.setattr(LmdbStore, "write", spy)
    again = await Node.open(tmp_path / "image")
    opening[0] = False
    try:
        pages = again.store._pages  # type: ignore[attr-defined]
        assert len(writes_while_replaying) >= 8  # the store was written during replay
        assert set(released_while_replaying) == {0}  # none of those writes unmapped a page
        assert pages.released >= 1  # letting go once replayed did
        assert pages.pinned is False
        infos = await again.batch_statuses([b.header_signature for b in batches], wait=10)
        assert {i.status for i in infos.values()} == {"COMMITTED"}
    finally:
        await again.close()


def test_the_limit_is_the_processes_resident_file_pages(tmp_path: Path) -> None:
    store, start = _store_with_pages_mapped(tmp_path / "store")
    try:
        pages = store._pages
        pages.release()
        pages.every = 1
        pages.limit = 8 << 20
        released = pages.released
        for num in range(1, 6_001):
            store.get_block(num)
            if num % 250 == 0:
                assert _mapped_kib(start) < 8 * 1024 + 4 * 1024  # the limit, one read's worth
        assert pages.released > released
    finally:
        store.close()
