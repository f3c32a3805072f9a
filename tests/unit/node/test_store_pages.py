"""The store's mapped file pages leave the node's RSS after each write (Linux)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ledgerq.node.disk import CommitRecord, LmdbStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


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


def test_reads_map_pages_in_and_a_write_maps_them_out(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store")
    try:
        found = store._pages._range
        assert found is not None, "the data file's mapping was not found in /proc/self/maps"
        for first in range(1, 6_001, 2_000):
            store.write(_records(first, 2_000), first + 1_999, 0)
            store.after_write()
        for num in range(1, 6_001):  # every block page, through the map
            assert store.get_block(num) is not None
        before = _mapped_kib(found[0])
        assert before > 4 * 1024  # megabytes of the store mapped in by the reads
        store.write(_records(6_001, 10), 6_010, 0)
        store.after_write()
        after = _mapped_kib(found[0])
        assert after < before / 4
        # Still readable: the pages come back from the page cache.
        assert store.get_block(3).num == 3  # type: ignore[union-attr]
        assert store.get_batch(store.get_block(5_000).batch_id) is not None  # type: ignore[union-attr]
    finally:
        store.close()
