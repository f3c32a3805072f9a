"""The node's "blocks": what its ``/subscriptions`` websocket reports.

The node commits one batch at a time, in order, and each COMMITTED batch is
a block of its own; an INVALID batch is in no block:

* ``block_num`` is the block's number in the chain (1, 2, 3, ... across
  restarts), counting COMMITTED batches only (``GET /events`` numbers every
  final status instead).
* ``block_id`` is the block's id: the node's signature of its header
  (:mod:`ledgerq.node.chain`), deterministic across restarts.
* ``previous_block_id`` is the id of block ``block_num - 1``; block 1 follows
  the genesis block (0), which follows :data:`NULL_BLOCK_ID`.
* ``state_changes`` are the commit's writes, ``SET`` with base64 values. The
  node's transaction families never delete, so there is no ``DELETE``.

:class:`BlockLog` keeps the most recent blocks (a bounded number), so
``get_block_deltas`` can answer for them and a slow subscriber can catch up.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ledgerq.node.chain import NULL_BLOCK_ID, header_fields
from ledgerq.node.disk import CommitRecord
from ledgerq.node.ordering.messages import KVSDatum, KVSKey

__all__ = ["NULL_BLOCK_ID", "Block", "BlockLog"]


@dataclass(frozen=True, slots=True)
class Block:
    num: int
    batch_id: str  # "" for the genesis block
    id: str
    previous_id: str
    writes: tuple[tuple[KVSKey, KVSDatum], ...]

    @classmethod
    def of(cls, record: CommitRecord) -> Block:
        previous = header_fields(record.header).previous_block_id
        return cls(record.block, record.batch_id, record.signature, previous, record.writes)

    def to_json(self, prefixes: Sequence[str] = ()) -> dict[str, Any]:
        """The spec's event message; changes filtered by ``prefixes`` (none: all)."""
        return {
            "block_num": self.num,
            "block_id": self.id,
            "previous_block_id": self.previous_id,
            "state_changes": [
                {"type": "SET", "value": base64.b64encode(value).decode(), "address": address}
                for address, value in self.writes
                if not prefixes or address.startswith(tuple(prefixes))
            ],
        }


class BlockLog:
    """The last ``size`` blocks, appended in commit order."""

    def __init__(self, size: int, *, last_id: str = NULL_BLOCK_ID) -> None:
        # Plain tuples: one is kept per commit on the hot path.
        self._entries: deque[tuple[int, str, str, str, tuple[tuple[str, bytes], ...]]]
        self._entries = deque(maxlen=size)
        self.last_id = last_id

    def extend(self, records: Iterable[CommitRecord]) -> None:
        entries, previous = self._entries, self.last_id
        for record in records:
            if record.block:
                entries.append(
                    (record.block, record.batch_id, record.signature, previous, record.writes)
                )
                previous = record.signature
        self.last_id = previous

    @property
    def oldest(self) -> int | None:
        """The number of the oldest block kept (None: none yet)."""
        return self._entries[0][0] if self._entries else None

    def after(self, num: int) -> list[Block]:
        """The kept blocks numbered above ``num``, oldest first."""
        entries = self._entries
        if not entries or entries[-1][0] <= num:
            return []
        start = max(0, num + 1 - entries[0][0])
        return [Block(*entries[i]) for i in range(start, len(entries))]
