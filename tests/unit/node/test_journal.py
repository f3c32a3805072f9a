"""The journal: group commit, torn tails, gaps."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from ledgerq.errors import NodeDataError
from ledgerq.node.journal import Journal, Record
from ledgerq.node.ordering.messages import TxFingerprint


def collect() -> tuple[list[Record], object]:
    seen: list[Record] = []

    def on_durable(records: Sequence[Record]) -> None:
        seen.extend(records)

    return seen, on_durable


async def test_group_commit_keeps_order_and_survives_reopen(tmp_path: Path) -> None:
    seen, on_durable = collect()
    journal = Journal(tmp_path, on_durable)  # type: ignore[arg-type]
    journal.open_segment()
    await asyncio.gather(
        *(
            journal.append(
                [
                    Record(0, f"b{i}".encode(), None),
                    Record(0, f"c{i}".encode(), TxFingerprint(i, 1)),
                ]
            )
            for i in range(20)
        )
    )
    assert [r.seq for r in seen] == list(range(1, 41))
    journal.close()
    again = Journal(tmp_path, lambda records: None)
    replayed = list(again.replay(after=10))
    assert [r.seq for r in replayed] == list(range(11, 41))
    assert [(r.batch, r.resubmission) for r in replayed] == [
        (r.batch, r.resubmission) for r in seen[10:]
    ]


async def test_a_torn_tail_is_cut_and_appends_continue(tmp_path: Path) -> None:
    journal = Journal(tmp_path, lambda records: None)
    journal.open_segment()
    await journal.append([Record(0, b"one")])
    await journal.append([Record(0, b"two")])  # a flush of its own
    journal.close()
    segment = tmp_path / "journal-000000000001.log"
    segment.write_bytes(segment.read_bytes()[:-2])  # a crash in the middle of "two"
    again = Journal(tmp_path, lambda records: None)
    assert [r.batch for r in again.replay(after=0)] == [b"one"]
    again.open_segment()
    await again.append([Record(0, b"three")])
    again.close()
    third = Journal(tmp_path, lambda records: None)
    assert [(r.seq, r.batch) for r in third.replay(after=0)] == [(1, b"one"), (2, b"three")]


async def test_missing_records_are_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path, lambda records: None)
    journal.last_seq = 10
    journal.open_segment()
    await journal.append([Record(0, b"eleven")])
    journal.close()
    with pytest.raises(NodeDataError, match="records are missing"):
        list(Journal(tmp_path, lambda records: None).replay(after=5))
    assert [r.seq for r in Journal(tmp_path, lambda records: None).replay(after=10)] == [11]


async def test_a_segment_started_while_an_appender_waits_is_named_by_its_first_record(
    tmp_path: Path,
) -> None:
    """A new segment asked for between two flushes (as the node does after a snapshot)
    holds the records buffered meanwhile under their own numbers."""
    loop = asyncio.get_running_loop()
    journal: Journal

    def on_durable(records: Sequence[Record]) -> None:
        if records[-1].seq == 1:
            # Runs after this flush ends and before the waiting appender's flush starts.
            loop.call_soon(journal.open_segment)

    journal = Journal(tmp_path, on_durable)
    journal.open_segment()
    first = asyncio.create_task(journal.append([Record(0, b"one")]))
    await asyncio.sleep(0)  # "one" is being written
    waiting = asyncio.create_task(journal.append([Record(0, b"two"), Record(0, b"three")]))
    await asyncio.gather(first, waiting)
    await journal.append([Record(0, b"four")])
    journal.close()
    replayed = list(Journal(tmp_path, lambda records: None).replay(after=0))
    assert [(r.seq, r.batch) for r in replayed] == [
        (1, b"one"),
        (2, b"two"),
        (3, b"three"),
        (4, b"four"),
    ]
    assert [r.batch for r in Journal(tmp_path, lambda records: None).replay(after=3)] == [b"four"]


async def _two_groups(directory: Path) -> Path:
    journal = Journal(directory, lambda records: None)
    await journal.append([Record(0, b"a" * 3000)])
    await journal.append([Record(0, b"b" * 3000), Record(0, b"c" * 10)])
    journal.close()
    return directory / "journal-000000000001.log"


async def test_a_last_group_with_a_zeroed_sector_is_a_torn_write(tmp_path: Path) -> None:
    segment = await _two_groups(tmp_path)
    data = bytearray(segment.read_bytes())
    sector = (len(data) // 512 - 1) * 512  # inside the last group: written only in part
    data[sector : sector + 512] = bytes(512)
    segment.write_bytes(bytes(data))
    assert [r.batch for r in Journal(tmp_path, lambda records: None).replay(after=0)] == [
        b"a" * 3000
    ]
    assert segment.stat().st_size < len(data)  # cut at the torn group


async def test_a_flipped_bit_in_the_last_group_is_corruption_not_a_tear(tmp_path: Path) -> None:
    segment = await _two_groups(tmp_path)
    data = bytearray(segment.read_bytes())
    data[-7] ^= 0x10  # acknowledged bytes changed: nothing says the write was torn
    segment.write_bytes(bytes(data))
    with pytest.raises(NodeDataError, match=rf"{segment.name} is corrupt at offset \d+"):
        list(Journal(tmp_path, lambda records: None).replay(after=0))


async def test_a_bad_group_in_an_older_segment_is_corruption(tmp_path: Path) -> None:
    journal = Journal(tmp_path, lambda records: None)
    await journal.append([Record(0, b"old")])
    journal.open_segment()
    await journal.append([Record(0, b"new")])
    journal.close()
    old = tmp_path / "journal-000000000001.log"
    old.write_bytes(old.read_bytes()[:-1])  # cut short, but not the last segment
    with pytest.raises(NodeDataError, match=r"journal-000000000001\.log is corrupt"):
        list(Journal(tmp_path, lambda records: None).replay(after=0))


async def test_damage_to_records_the_store_holds_is_skipped(tmp_path: Path) -> None:
    """A bad group is refused only if the store may need what it held: one before a
    valid group (or the next segment) whose first record the store covers is not."""
    journal = Journal(tmp_path, lambda records: None)
    await journal.append([Record(0, b"a" * 3000)])
    await journal.append([Record(0, b"b" * 3000)])
    await journal.append([Record(0, b"c" * 10)])
    journal.open_segment()
    await journal.append([Record(0, b"d" * 10)])
    journal.close()
    old = tmp_path / "journal-000000000001.log"
    data = bytearray(old.read_bytes())
    data[100] ^= 0x10  # inside record 1
    old.write_bytes(bytes(data))
    with pytest.raises(NodeDataError, match=r"journal-000000000001\.log is corrupt at offset 0"):
        list(Journal(tmp_path, lambda records: None).replay(after=0))
    replayed = list(Journal(tmp_path, lambda records: None).replay(after=1))
    assert [r.seq for r in replayed] == [2, 3, 4]

    data[4000] ^= 0x10  # inside record 2 too: the next group holds record 3
    old.write_bytes(bytes(data))
    with pytest.raises(NodeDataError, match="corrupt"):
        list(Journal(tmp_path, lambda records: None).replay(after=1))
    assert [r.seq for r in Journal(tmp_path, lambda records: None).replay(after=2)] == [3, 4]

    old.write_bytes(bytes(data[:-5]))  # record 3 cut short: the next segment starts at 4
    with pytest.raises(NodeDataError, match="corrupt"):
        list(Journal(tmp_path, lambda records: None).replay(after=2))
    assert [r.seq for r in Journal(tmp_path, lambda records: None).replay(after=3)] == [4]
    assert old.stat().st_size == len(data) - 5  # skipped, not cut


async def test_refusals_and_resubmissions_survive_a_reopen(tmp_path: Path) -> None:
    journal = Journal(tmp_path, lambda records: None)
    await journal.append(
        [Record(0, b"x", TxFingerprint(3, 4)), Record(0, b"y", None, "tx\nalready in the chain")]
    )
    journal.close()
    assert list(Journal(tmp_path, lambda records: None).replay(after=0)) == [
        Record(1, b"x", TxFingerprint(3, 4)),
        Record(2, b"y", None, "tx\nalready in the chain"),
    ]
