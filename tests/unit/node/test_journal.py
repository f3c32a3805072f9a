"""The journal: group commit, torn tails, gaps."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from ledgerq.errors import NodeDataError
from ledgerq.node.journal import Journal, Record
from ledgerq.node.messages import TxFingerprint


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
            journal.append([(f"b{i}".encode(), None), (f"c{i}".encode(), TxFingerprint(i, 1))])
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
    await journal.append([(b"one", None), (b"two", None)])
    journal.close()
    segment = tmp_path / "journal-000000000001.log"
    segment.write_bytes(segment.read_bytes()[:-2])  # a crash in the middle of "two"
    again = Journal(tmp_path, lambda records: None)
    assert [r.batch for r in again.replay(after=0)] == [b"one"]
    again.open_segment()
    await again.append([(b"three", None)])
    again.close()
    third = Journal(tmp_path, lambda records: None)
    assert [(r.seq, r.batch) for r in third.replay(after=0)] == [(1, b"one"), (2, b"three")]


async def test_missing_records_are_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path, lambda records: None)
    journal.last_seq = 10
    journal.open_segment()
    await journal.append([(b"eleven", None)])
    journal.close()
    with pytest.raises(NodeDataError, match="records are missing"):
        list(Journal(tmp_path, lambda records: None).replay(after=5))
    assert [r.seq for r in Journal(tmp_path, lambda records: None).replay(after=10)] == [11]
