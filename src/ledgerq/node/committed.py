"""What the node has committed: the on-disk store plus the commits not yet in it.

The commit stage hands every group of commits to :meth:`CommittedView.add`
(on the event loop, in commit order); a writer task moves them to the store
(:mod:`ledgerq.node.disk`) in the background, one store transaction per
write, at most every ``write_interval_s`` (sooner when many are waiting).
A write of many commits is cut into store transactions of at most
``write_keys`` keys (:func:`store_keys`: a batch id, its transaction ids
and its writes) and ``write_commits`` commits (unless one :meth:`add`
brought more), at the boundaries of :meth:`add` calls (each with the
journal point it covers). (Bounded in keys alone, a writer that fell
behind merged the parts of single-transaction batches, 3 keys each, into
transactions of 4,000 commits.) LMDB keeps, for
the life of the environment, every page buffer a write transaction
dirtied, as many as the largest transaction dirtied: each key lands on a
random leaf of a B-tree, so a transaction dirties about one page per key
once the trees have more leaves than it has keys, and the number of keys
per transaction, not the number of commits (ten transactions per batch
are 21 keys a commit) nor the age of the node, bounds that memory.
Every read — state, a final status, a committed transaction, a block — looks
at the commits not yet written first, then at the store, so a read never
sees less than what has committed. Memory holds only those unwritten
commits: how many is bounded by the commit rate times the write time, and
:attr:`unwritten` lets the node refuse new batches when the store falls
behind.

Durability: the journal holds every record the store does not. After each
write the store's ``applied`` point moves; ``on_written`` is told the point
a crash can no longer take back (the previous write's: the store does not
fsync its meta page at each write), and the node deletes the journal
segments below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ledgerq.node.disk import CommitRecord, Store, StoredBatch
from ledgerq.node.ordering.messages import KVSDatum, KVSKey

log = logging.getLogger(__name__)

#: Most keys (see :func:`store_keys`) in one store transaction, unless one add() brought more.
STORE_TXN_KEYS = 12_000
#: Most commits in one store transaction, unless one add() brought more.
STORE_TXN_COMMITS = 1_000


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` (None elsewhere): hands the free pages inside every
    malloc arena back to the system."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return lambda: trim(0)


#: Keys a write puts at random places: its address in ``state``, its version in
#: ``history``, and a node of the Merkle tree on its path (those near the root are
#: shared by every write).
WRITE_KEYS = 3


def store_keys(record: CommitRecord) -> int:
    """The keys a commit puts at random places in the store's B-trees: its batch id,
    its block id, its transaction ids and its writes (its records are appended in
    order)."""
    return 2 + len(record.tx_ids) + WRITE_KEYS * len(record.writes)


class _Unwritten:
    """Commits not yet written (or being written) to the store."""

    __slots__ = (
        "applied",
        "batch_high",
        "chain",
        "cuts",
        "finals",
        "ids",
        "keys",
        "node_parts",
        "nodes",
        "records",
        "state",
        "txns",
    )

    def __init__(self, applied: int, batch_high: int) -> None:
        self.records: list[CommitRecord] = []
        self.chain: dict[int, CommitRecord] = {}  # block number -> its record
        self.ids: dict[str, int] = {}  # block id -> block number
        #: The Merkle tree's nodes the commits changed (all, and those of each add()).
        self.nodes: dict[bytes, bytes] = {}
        self.node_parts: list[dict[bytes, bytes]] = []
        self.state: dict[KVSKey, KVSDatum] = {}
        self.finals: dict[str, StoredBatch] = {}
        self.txns: dict[str, tuple[int, int]] = {}
        self.applied = applied
        self.batch_high = batch_high
        self.keys = 0  # store_keys() of the records
        # After each add(): (records so far, keys so far, applied, batch_high, node
        # parts so far), where a write may be cut.
        self.cuts: list[tuple[int, int, int, int, int]] = []


class CommittedView:
    def __init__(
        self,
        store: Store,
        *,
        write_interval_s: float = 0.2,
        write_batch: int = 20_000,
        write_keys: int = STORE_TXN_KEYS,
        write_commits: int = STORE_TXN_COMMITS,
        on_written: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        meta = store.meta()
        self._new = _Unwritten(meta.applied, meta.batch_high)
        self._writing: _Unwritten | None = None
        self._interval = write_interval_s
        self._write_batch = write_batch
        self._write_keys = write_keys
        self._write_commits = write_commits
        self._on_written = on_written
        self._durable = meta.applied
        self._last_written = meta.applied
        self._signal = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.failure: BaseException | None = None
        # One thread for every write: LMDB's page buffers are allocated and freed in
        # it, so they live in one malloc arena instead of in whichever of the default
        # executor's threads ran each write (each thread its own arena).
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="node-store-writer")
        self._trim = _malloc_trim()

    # --- adding (the commit stage) ----------------------------------------------

    def add(
        self,
        records: Sequence[CommitRecord],
        applied: int,
        batch_high: int,
        nodes: dict[bytes, bytes] | None = None,
    ) -> None:
        """Commits in order, the journal point they cover, and the Merkle tree's nodes
        they changed."""
        new = self._new
        new.applied = applied
        new.batch_high = max(new.batch_high, batch_high)
        keys = new.keys
        for record in records:
            keys += store_keys(record)
            new.records.append(record)
            new.finals[record.batch_id] = StoredBatch(record.num, record.fingerprint, record.status)
            if isinstance(record.status, str):  # COMMITTED
                new.chain[record.block] = record
                new.ids[record.signature] = record.block
                for index, tid in enumerate(record.tx_ids):
                    new.txns[tid] = (record.num, index)
                new.state.update(record.writes)
        if nodes:
            new.nodes.update(nodes)
            new.node_parts.append(nodes)
        new.keys = keys
        new.cuts.append((len(new.records), keys, applied, new.batch_high, len(new.node_parts)))
        if len(new.records) >= self._write_batch:
            self._signal.set()

    @property
    def unwritten(self) -> int:
        writing = self._writing
        return len(self._new.records) + (0 if writing is None else len(writing.records))

    # --- reading ------------------------------------------------------------------

    def get_state(self, address: KVSKey) -> KVSDatum | None:
        value = self._new.state.get(address)
        if value is not None:
            return value
        writing = self._writing
        if writing is not None:
            value = writing.state.get(address)
            if value is not None:
                return value
        return self.store.get_state(address)

    def state_page(self, prefix: str, start: str, limit: int) -> list[tuple[KVSKey, KVSDatum]]:
        """Entries under ``prefix`` from ``start`` on, in address order (store order)."""
        low = max(prefix, start)
        page = dict(self.store.state_page(prefix, start, limit))
        for layer in (self._writing, self._new):  # oldest first: newer values win
            if layer is not None:
                page.update(
                    (a, v) for a, v in layer.state.items() if a >= low and a.startswith(prefix)
                )
        return sorted(page.items())[:limit]

    def get_state_at(self, address: KVSKey, block: int) -> KVSDatum | None:
        """The value at ``address`` as of block ``block`` (its latest write then)."""
        for layer in (self._new, self._writing):
            if layer is None:
                continue
            for record in reversed(layer.records):
                if 0 < record.block <= block:
                    for written, value in reversed(record.writes):
                        if written == address:
                            return value
        return self.store.get_state_at(address, block)

    def state_page_at(
        self, prefix: str, start: str, limit: int, block: int
    ) -> list[tuple[KVSKey, KVSDatum]]:
        """:meth:`state_page` as of block ``block``."""
        low = max(prefix, start)
        page = dict(self.store.state_page_at(prefix, start, limit, block))
        for layer in (self._writing, self._new):  # oldest first: newer values win
            if layer is None:
                continue
            for record in layer.records:
                if 0 < record.block <= block:
                    page.update(
                        (a, v) for a, v in record.writes if a >= low and a.startswith(prefix)
                    )
        return sorted(page.items())[:limit]

    def final(self, batch_id: str) -> StoredBatch | None:
        found = self._new.finals.get(batch_id)
        if found is None and self._writing is not None:
            found = self._writing.finals.get(batch_id)
        return found if found is not None else self.store.get_batch(batch_id)

    def txn(self, tx_id: str) -> tuple[int, int] | None:
        """The block and position of a committed transaction."""
        found = self._new.txns.get(tx_id)
        if found is None and self._writing is not None:
            found = self._writing.txns.get(tx_id)
        return found if found is not None else self.store.get_txn(tx_id)

    def record(self, num: int) -> CommitRecord | None:
        """The record of final status (event) ``num``."""
        for layer in (self._new, self._writing):
            if layer is not None and layer.records:
                first = layer.records[0].num
                if first <= num < first + len(layer.records):
                    return layer.records[num - first]
        return self.store.get_block(num)

    def chain_record(self, block: int) -> CommitRecord | None:
        """The record of the batch block ``block`` holds (``None``: no such block);
        block 0's (the genesis block) has no batch."""
        if block == 0:
            genesis = self.store.genesis()
            if genesis is None:
                return None
            return CommitRecord(0, "", "COMMITTED", None, (), b"", (), 0, *genesis)
        for layer in (self._new, self._writing):
            if layer is not None:
                found = layer.chain.get(block)
                if found is not None:
                    return found
        seq = self.store.chain_seq(block)
        return None if seq is None else self.store.get_block(seq)

    def block_num(self, block_id: str) -> int | None:
        """The number of the block with this id."""
        for layer in (self._new, self._writing):
            if layer is not None:
                found = layer.ids.get(block_id)
                if found is not None:
                    return found
        return self.store.block_num(block_id)

    def get_node(self, path: bytes) -> bytes | None:
        """A node of the state's Merkle tree, as of the last commit added."""
        for layer in (self._new, self._writing):
            if layer is not None:
                found = layer.nodes.get(path)
                if found is not None:
                    return found
        return self.store.get_node(path)

    # --- writing ------------------------------------------------------------------

    async def run(self) -> None:
        """The writer: moves commits to the store until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._signal.wait(), self._interval)
            self._signal.clear()
            await self._write()

    async def _write(self) -> None:
        new = self._new
        if not new.records and new.applied == self._last_written:
            return
        self._idle.clear()
        self._writing, self._new = new, _Unwritten(new.applied, new.batch_high)
        # A thread cannot be stopped: when the writer is cancelled mid-write, the
        # write still finishes (and is accounted for) before the cancellation goes on,
        # so nothing closes the store under a write transaction.
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(loop.run_in_executor(self._thread, self._write_chunks, new))
        cancelled = False
        while not work.done():
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                cancelled = True
            except BaseException:
                break
        failure = asyncio.CancelledError() if work.cancelled() else work.exception()
        if failure is not None:
            self.failure = failure
            # Keep the commits readable; nothing more is written.
            self._new, self._writing = _merge(new, self._new), None
            self._idle.set()
            raise failure
        self._written(new)
        if cancelled:
            raise asyncio.CancelledError

    def _written(self, new: _Unwritten) -> None:
        self.store.after_write()
        self._writing = None
        durable, self._durable = self._durable, self._last_written
        self._last_written = new.applied
        self._idle.set()
        if self._on_written is not None:
            self._on_written(max(durable, self._durable))

    def _write_chunks(self, new: _Unwritten) -> None:
        """In the writer thread: one store transaction per chunk, each with its point."""
        start = start_keys = start_parts = 0
        last = (len(new.records), new.keys, new.applied, new.batch_high, len(new.node_parts))
        pending: tuple[int, int, int, int, int] | None = None  # the latest cut not written

        def write(cut: tuple[int, int, int, int, int]) -> None:
            nodes: dict[bytes, bytes] = {}
            for part in new.node_parts[start_parts : cut[4]]:
                nodes.update(part)
            self.store.write(new.records[start : cut[0]], cut[2], cut[3], nodes)

        for cut in new.cuts or [last]:
            if (
                pending is not None
                and pending[0] > start
                and (cut[1] - start_keys > self._write_keys or cut[0] - start > self._write_commits)
            ):
                write(pending)
                start, start_keys, start_parts = pending[0], pending[1], pending[4]
            pending = cut
        if pending is not None:
            write(pending)
        # What a write frees (its records' batches, LMDB's overflow pages, the key
        # filter's checkpoint) leaves free pages inside malloc's arenas, which glibc
        # keeps resident; give them back after each write.
        if self._trim is not None:
            self._trim()

    async def drain(self) -> None:
        """Write everything committed so far, and wait for it."""
        while self._writing is not None:
            await self._idle.wait()
        await self._write()

    def close(self) -> None:
        """Stop the writer's thread (once nothing is being written)."""
        self._thread.shutdown(wait=True)


def _merge(old: _Unwritten, new: _Unwritten) -> _Unwritten:
    merged = _Unwritten(new.applied, max(old.batch_high, new.batch_high))
    for layer in (old, new):
        offset, keys, parts = len(merged.records), merged.keys, len(merged.node_parts)
        merged.cuts += [(offset + n, keys + k, a, b, parts + p) for n, k, a, b, p in layer.cuts]
        merged.node_parts += layer.node_parts
        merged.nodes.update(layer.nodes)
        merged.ids.update(layer.ids)
        merged.keys += layer.keys
        merged.records += layer.records
        merged.state.update(layer.state)
        merged.finals.update(layer.finals)
        merged.txns.update(layer.txns)
        merged.chain.update(layer.chain)
    return merged
