"""A fixed-size filter of the keys in the node's store: "never stored" without a disk read.

Most lookups the node makes are for keys that are *not* in its store: every
new batch id and transaction id is checked against history (a batch is run
once; a transaction committed in one batch refuses another), and an intkey
``set`` of a new name reads its address first. In a store of a million
batches each such miss is a descent to a random B-tree leaf, a page fault
that maps tens of KiB of the store into the process (see
:class:`ledgerq.node.disk.MappedPages`) and a third of the event loop's
time over REST. :class:`KeyFilter` answers most of them from memory.

It is a *blocked Bloom filter*: ``blocks`` blocks of 512 bits; a key sets
``BITS`` bits in one block, chosen from its last 64 bits (batch and
transaction ids are signatures, addresses end in a hash: those bits are
uniform). :meth:`may_contain` is ``False`` only for a key never added, so a
``False`` skips the store and a ``True`` asks it. Memory is fixed
(``blocks`` × 64 bytes, 16 MiB by default) whatever the history; the false
positive rate grows with it: about 0.005 % at 3 million keys (1,000,000
single-transaction batches: a batch id, a transaction id and an address
each), about 5 % at 20 million, and a false positive costs only the disk
read the filter saves otherwise.

The store (:mod:`ledgerq.node.disk`) keeps a checkpoint of it with the
block number it covers; opening the store adds the keys of the blocks
written after it, so the filter covers the stored keys whatever the moment
of a crash.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Bits set per key (in one block).
BITS = 4
BLOCK_BYTES = 64
_BLOCK_BITS = BLOCK_BYTES * 8
#: Blocks by default: 16 MiB.
DEFAULT_BLOCKS = 1 << 18


class KeyFilter:
    def __init__(self, blocks: int = DEFAULT_BLOCKS, data: bytes | None = None) -> None:
        if blocks <= 0 or blocks & (blocks - 1):
            raise ValueError(f"blocks must be a power of two, not {blocks}")
        self.blocks = blocks
        self._mask = blocks - 1
        self._shift = blocks.bit_length() - 1
        self.bits = bytearray(blocks * BLOCK_BYTES) if data is None else bytearray(data)
        if len(self.bits) != blocks * BLOCK_BYTES:
            raise ValueError(f"{len(self.bits)} bytes for {blocks} blocks")

    # The BITS (4) positions of a key, unrolled: this runs for every key the store
    # writes and every lookup it answers (tens of thousands a second). Position i is
    # bit ``(h >> 9 * i) & 511`` of the key's block, ``h`` the key's last 64 bits
    # past the block number: byte ``block * 64 + ((h >> (9 * i + 3)) & 63)``, bit
    # ``(h >> 9 * i) & 7`` of it.

    def add(self, key: bytes) -> int:
        """Add ``key``; answers the block it changed."""
        h = int.from_bytes(key[-8:], "big")
        block = h & self._mask
        h >>= self._shift
        base = block << 6
        bits = self.bits
        bits[base + ((h >> 3) & 63)] |= 1 << (h & 7)
        bits[base + ((h >> 12) & 63)] |= 1 << ((h >> 9) & 7)
        bits[base + ((h >> 21) & 63)] |= 1 << ((h >> 18) & 7)
        bits[base + ((h >> 30) & 63)] |= 1 << ((h >> 27) & 7)
        return block

    def add_all(self, keys: Iterable[bytes]) -> set[int]:
        return {self.add(key) for key in keys}

    def may_contain(self, key: bytes) -> bool:
        h = int.from_bytes(key[-8:], "big")
        base = (h & self._mask) << 6
        h >>= self._shift
        bits = self.bits
        return bool(
            (bits[base + ((h >> 3) & 63)] >> (h & 7)) & 1
            and (bits[base + ((h >> 12) & 63)] >> ((h >> 9) & 7)) & 1
            and (bits[base + ((h >> 21) & 63)] >> ((h >> 18) & 7)) & 1
            and (bits[base + ((h >> 30) & 63)] >> ((h >> 27) & 7)) & 1
        )

    def chunk(self, start: int, size: int) -> bytes:
        return bytes(self.bits[start : start + size])

    def set_chunk(self, start: int, data: bytes) -> None:
        if start + len(data) > len(self.bits):
            raise ValueError(f"{len(data)} bytes at {start}: past the filter's end")
        self.bits[start : start + len(data)] = data
