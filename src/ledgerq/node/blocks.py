"""The node's "blocks": what its ``/subscriptions`` websocket reports.

The node commits one batch at a time, in order, and each COMMITTED batch is
a block of its own; an INVALID batch is in no block:

* ``block_num`` is the block's number in the chain (1, 2, 3, ... across
  restarts), counting COMMITTED batches only (``GET /events`` numbers every
  final status instead).
* ``block_id`` is 128 hex digits: the block number (16 hex digits) followed
  by the first 112 hex digits of ``sha512("<block_num>:<batch id>")``. It is
  deterministic (a restart that replays the journal yields the same ids) and
  it lets a lookup find the block by number.
* ``previous_block_id`` is the id of block ``block_num - 1``; block 1 follows
  :data:`NULL_BLOCK_ID` (Sawtooth's genesis predecessor).
* ``state_changes`` are the commit's writes, ``SET`` with base64 values. The
  node's transaction families never delete, so there is no ``DELETE``.

:class:`BlockLog` keeps the most recent blocks (a bounded number), so
``get_block_deltas`` can answer for them and a slow subscriber can catch up.
"""

from __future__ import annotations

import base64
import hashlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ledgerq.node.commit import StatusEvent
from ledgerq.node.ordering.messages import KVSDatum, KVSKey

NULL_BLOCK_ID = "0" * 16


def block_id(num: int, batch_id: str) -> str:
    digest = hashlib.sha512(f"{num}:{batch_id}".encode()).hexdigest()
    return f"{num:016x}{digest[:112]}"


@dataclass(frozen=True, slots=True)
class Block:
    num: int
    batch_id: str
    previous_batch_id: str | None  # None: block 1, or a predecessor the node no longer knows
    writes: tuple[tuple[KVSKey, KVSDatum], ...]

    @property
    def id(self) -> str:
        return block_id(self.num, self.batch_id)

    @property
    def previous_id(self) -> str:
        if self.previous_batch_id is None:
            return NULL_BLOCK_ID
        return block_id(self.num - 1, self.previous_batch_id)

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

    def __init__(self, size: int, *, last_batch_id: str | None = None) -> None:
        # Plain tuples: one is kept per commit on the hot path.
        self._entries: deque[tuple[int, str, str | None, tuple[tuple[str, bytes], ...]]]
        self._entries = deque(maxlen=size)
        self.last_batch_id = last_batch_id

    def extend(self, events: Iterable[StatusEvent]) -> None:
        entries, previous = self._entries, self.last_batch_id
        for event in events:
            if event.block:
                entries.append((event.block, event.info.id, previous, event.writes))
                previous = event.info.id
        self.last_batch_id = previous

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

    def get(self, block_id_: str) -> Block | None:
        """The block with this id if it is still kept."""
        entries = self._entries
        try:
            num = int(block_id_[:16], 16)
        except ValueError:
            return None
        if not entries or len(block_id_) != 128:
            return None
        index = num - entries[0][0]
        if not 0 <= index < len(entries):
            return None
        block = Block(*entries[index])
        return block if block.id == block_id_ else None
