"""The node's on-disk store: committed state and history in LMDB.

Everything that grows with the node's history lives here, not in memory:
the committed state, every final status (with the batch's fingerprint and
block), the committed transaction ids, and the blocks (one per final status:
the batch, its writes, its outcome). One LMDB environment, ``store/`` in the
data directory, with these databases:

==========  ===========================  =========================================
database    key                          value
==========  ===========================  =========================================
``meta``    ``applied``, ``events``,     journal records covered, last block
            ``batch_high``               number, highest worker batch number
``state``   address (35 bytes)           the value
``batches`` batch id (64 bytes)          block number, fingerprint, outcome
``txns``    transaction id (64 bytes)    block number, index in its batch
``blocks``  block number (8 bytes, BE)   CBOR ``[batch id, outcome, batch, writes]``
``filter``  chunk number (4 bytes, BE)   64 KiB of the key filter
==========  ===========================  =========================================

The ``filter`` database holds a checkpoint of the
:class:`~ledgerq.node.idfilter.KeyFilter` of every batch id, transaction id
and address stored: a lookup of a key never stored (every new batch and
transaction, every new name) is answered from memory, without a read of the
store. The filter lives in memory; a write adds its keys to it and, once
``FILTER_CHECKPOINT`` blocks were written since the last checkpoint, puts
the chunks that changed since, with the block number they cover
(``filter_through`` in ``meta``), in the same transaction. Opening the
store loads the checkpoint and adds the keys of the blocks after it (read in
order from ``blocks``), so the filter covers every stored key after any
crash. A store written before the filter existed gets one, built from its
keys, the first time it is opened. (The changed filter blocks are not put
in every write: that would rewrite most of the filter's pages in every
store transaction.)

:meth:`LmdbStore.write` applies one group of commits, and moves ``applied``,
in **one** LMDB transaction: a commit and its state changes reach the store
together or not at all. The environment is opened with ``sync`` (data pages
are fsynced at each write) and without ``metasync``: a crash keeps the store
consistent but may take back the last write, which the journal still holds
(see :mod:`ledgerq.node.committed`). Writes run in a thread; reads may run
on the event loop at the same time (LMDB readers never wait for the writer).

Opening refuses, with a :class:`~ledgerq.errors.NodeDataError`, a ``data.mdb``
shorter than its pages (a read through the map past the end of the file is a
``SIGBUS``) and pages LMDB finds corrupt while opening.

:class:`DictStore` is the same store in dictionaries, for a node without a
data directory.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import cbor2
import lmdb

from ledgerq.errors import NodeDataError
from ledgerq.failpoints import failpoint
from ledgerq.node.commit import INVALID, FinalStatus
from ledgerq.node.idfilter import BLOCK_BYTES, DEFAULT_BLOCKS, KeyFilter
from ledgerq.node.ordering.messages import InvalidTx, KVSDatum, KVSKey, TxFingerprint

STORE_FORMAT = 2
#: Records of the final-status log upgraded per write transaction (format 1 to 2).
_UPGRADE_CHUNK = 1_000
_BATCH = struct.Struct(">QqqB")  # block, fingerprint (batch, tx; -1: none), outcome kind
_TXN = struct.Struct(">QH")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
#: Bytes per stored chunk of the key filter.
FILTER_CHUNK = 64 * 1024
#: Blocks written between two checkpoints of the key filter (what an open reads again).
FILTER_CHECKPOINT = 20_000
_BLOCKS_PER_CHUNK = FILTER_CHUNK // BLOCK_BYTES
_COMMITTED, _INVALID = 0, 1
#: Key prefix of the Merkle tree's nodes (LMDB takes no empty key: the root's path).
_NODE = b"/"
_NO_NODES: Mapping[bytes, bytes] = {}
#: Virtual size of the memory map (LMDB's ceiling for the file, not memory used).
DEFAULT_MAP_SIZE = 256 << 30
_MADV_DONTNEED = 4  # Linux
#: Store operations (a read, a commit's puts) between two looks at the mapped pages.
CHECK_EVERY_TOUCHES = 32
#: File pages mapped in since the last release that make the next look release them.
RELEASE_ABOVE_BYTES = 8 << 20


class MappedPages:
    """Unmaps, from this process, the store's file pages its reads mapped in.

    LMDB reads through a read-only shared memory map of ``data.mdb``; every
    page a read or a write's B-tree descent touches stays mapped and counts in
    the process's RSS (as file pages, ``RssFile``) until the kernel takes it
    back, so the node's RSS grows with the store while its heap does not.
    ``madvise(MADV_DONTNEED)`` on a shared file mapping drops the process's
    page-table entries only: the pages stay in the page cache, their contents
    are the file's (dirty ones stay dirty), and the next access maps them
    again (a minor fault). Linux only; elsewhere nothing is released.

    How much one access maps is not one page: a fault maps the neighbours
    already in the page cache too (the kernel's fault-around, 64 KiB), and a
    page written with ``pwrite`` may sit in a large folio (up to 2 MiB on
    ext4), which a fault maps whole; ``MADV_RANDOM`` (LMDB's ``NORDAHEAD``)
    stops neither. A random key's lookup in a large store maps anything
    from the fault-around to a whole folio, so a time-based release bounds
    nothing (a busy node maps the whole store within a second), and a count
    of operations bounds it only as well as the folios' sizes allow, which
    grow with the store. So the kernel's own count decides: :meth:`touch`
    after every read and every commit written, and every ``every``
    operations a look at the process's resident shared pages
    (``/proc/self/statm``, one cheap read, which counts the file pages
    mapped in); once they exceed what they were right after the last
    release by ``limit`` bytes, a release (cheap as well; the refaults of
    the B-trees' upper pages then cost little per operation). Where
    ``statm`` cannot be read, every look releases.
    Nothing is released while :attr:`pinned` (a restart's replay: each
    replayed record reads tens of KiB of store pages that the next records
    read again); letting go releases at once.
    """

    def __init__(
        self,
        data_file: Path,
        *,
        every: int = CHECK_EVERY_TOUCHES,
        limit: int = RELEASE_ABOVE_BYTES,
    ) -> None:
        self._range: tuple[int, int] | None = None
        self._madvise = None
        self.every = every
        self.limit = limit
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._base = 0  # resident shared pages right after the last release
        self._statm: int | None = None
        self._touched = 0
        self._pinned = False
        self.released = 0  # calls that succeeded
        if not sys.platform.startswith("linux"):
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            madvise = libc.madvise
        except (OSError, AttributeError):
            return
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        madvise.restype = ctypes.c_int
        self._madvise = madvise
        self._range = _mapping_of(data_file)
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None
        self._base = self._shared() or 0

    def _shared(self) -> int | None:
        """Resident shared pages of the process (file pages mapped in), or None."""
        if self._statm is None:
            return None
        try:
            return int(os.pread(self._statm, 128, 0).split()[2])
        except (OSError, ValueError, IndexError):
            return None

    @property
    def pinned(self) -> bool:
        return self._pinned

    @pinned.setter
    def pinned(self, pinned: bool) -> None:
        was, self._pinned = self._pinned, pinned
        if was and not pinned:
            self.release()

    def touch(self, operations: int = 1) -> None:
        """Count store operations (from any thread); every ``every``, look and release
        if more than ``limit`` bytes were mapped in since the last release."""
        self._touched += operations
        if self._touched < self.every:
            return
        self._touched = 0
        if self._range is None or self._pinned:
            return
        shared = self._shared()
        if shared is None or (shared - self._base) * self._page > self.limit:
            self.release()

    def release(self) -> None:
        """Unmap every page of the store mapped in, unless pinned."""
        self._touched = 0
        if self._range is None or self._madvise is None or self._pinned:
            return
        start, end = self._range
        if self._madvise(start, end - start, _MADV_DONTNEED) == 0:
            self.released += 1
        self._base = self._shared() or 0

    def close(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None


#: What LMDB raises on pages that are not what its B-trees say they are.
_DAMAGED = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.BadChecksumError,
    lmdb.InvalidError,
)


def _way_out(path: Path) -> str:
    return (
        f"restore {path} from a backup, or move it aside: the node rebuilds its store "
        "from a journal that still starts at record 1 (journal-000000000001.log)"
    )


def _check_size(path: Path, env: Any) -> None:
    """Refuse a ``data.mdb`` shorter than its pages: LMDB reads through a memory map,
    and a read past the end of the file kills the process (``SIGBUS``)."""
    data_file = path / "data.mdb"
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = data_file.stat().st_size
    if size < needed:
        raise NodeDataError(
            f"the node store's {data_file} is cut short ({size} bytes; its pages need "
            f"{needed}); {_way_out(path)}"
        )


def _mapping_of(data_file: Path) -> tuple[int, int] | None:
    """The address range of this process's mapping of ``data_file`` (the largest)."""
    try:
        wanted = os.stat(data_file)
        found: tuple[int, int] | None = None
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or not fields[1].startswith("r"):
                    continue
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                if int(fields[4]) != wanted.st_ino or os.makedev(major, minor) != wanted.st_dev:
                    continue
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if found is None or high - low > found[1] - found[0]:
                    found = (low, high)
        return found
    except (OSError, ValueError):
        return None


class CommitRecord(NamedTuple):
    """One final status as the store keeps it: ``num`` is its event number; a
    COMMITTED batch's record is also block ``block`` of the chain (0: in no block)."""

    num: int
    batch_id: str
    status: FinalStatus
    fingerprint: TxFingerprint | None
    tx_ids: tuple[str, ...]
    batch: bytes  # the serialized Batch
    writes: tuple[tuple[KVSKey, KVSDatum], ...]
    block: int = 0
    header: bytes = b""  # the block's serialized BlockHeader
    signature: str = ""  # the block's id


class StoredBatch(NamedTuple):
    block: int  # the event number of its final status (its record in ``blocks``)
    fingerprint: TxFingerprint | None
    status: FinalStatus


class Meta(NamedTuple):
    applied: int = 0  # journal records whose outcome the store holds
    events: int = 0  # final statuses so far (the last record of ``blocks``)
    batch_high: int = 0  # the highest worker batch number in the store
    height: int = 0  # the number of the chain's latest block


class Store(Protocol):
    def meta(self) -> Meta: ...
    def get_state(self, address: KVSKey) -> KVSDatum | None: ...
    def state_page(self, prefix: str, start: str, limit: int) -> list[tuple[KVSKey, KVSDatum]]: ...
    def get_batch(self, batch_id: str) -> StoredBatch | None: ...
    def get_txn(self, tx_id: str) -> tuple[int, int] | None: ...
    def get_block(self, num: int) -> CommitRecord | None: ...
    def chain_seq(self, block: int) -> int | None: ...
    def block_num(self, block_id: str) -> int | None: ...
    def genesis(self) -> tuple[bytes, str] | None: ...
    def clear_merkle(self) -> None: ...
    def reseal(
        self,
        records: Sequence[CommitRecord],
        nodes: Mapping[bytes, bytes],
        genesis: tuple[bytes, str] | None,
        genesis_state: Sequence[tuple[KVSKey, KVSDatum]] = (),
    ) -> None: ...
    def get_node(self, path: bytes) -> bytes | None: ...
    def get_state_at(self, address: KVSKey, block: int) -> KVSDatum | None: ...
    def state_page_at(
        self, prefix: str, start: str, limit: int, block: int
    ) -> list[tuple[KVSKey, KVSDatum]]: ...
    def write(
        self,
        records: Sequence[CommitRecord],
        applied: int,
        batch_high: int,
        nodes: Mapping[bytes, bytes] = ...,
    ) -> None: ...
    def after_write(self) -> None: ...
    def pin_pages(self, pinned: bool) -> None: ...
    def blocks_from(self, num: int, *, reverse: bool = False) -> Iterator[CommitRecord]: ...
    def close(self) -> None: ...


def _status_value(status: FinalStatus) -> tuple[int, list[list[Any]]]:
    if isinstance(status, str):
        return _COMMITTED, []
    return _INVALID, [[t.id, t.message, t.extended_data] for t in status]


def _status_of(kind: int, invalid: list[list[Any]]) -> FinalStatus:
    if kind == _COMMITTED:
        return "COMMITTED"
    return tuple(InvalidTx(str(i), str(m), bytes(d)) for i, m, d in invalid)


def _fp(batch: int, tx: int) -> TxFingerprint | None:
    return None if batch < 0 else TxFingerprint(batch, tx)


def encode_block(record: CommitRecord) -> bytes:
    kind, invalid = _status_value(record.status)
    fp = record.fingerprint
    return cbor2.dumps(
        [
            record.batch_id,
            kind,
            invalid,
            record.batch,
            [[a, v] for a, v in record.writes],
            list(record.tx_ids),
            [-1, -1] if fp is None else [fp.batch, fp.tx],
            record.block,
            record.header,
            record.signature,
        ]
    )


def decode_block(num: int, data: bytes) -> CommitRecord:
    fields = cbor2.loads(data)
    batch_id, kind, invalid, batch, writes, tx_ids, (fb, ft) = fields[:7]
    return CommitRecord(
        num,
        batch_id,
        _status_of(kind, invalid),
        _fp(fb, ft),
        tuple(tx_ids),
        batch,
        tuple((a, v) for a, v in writes),
        fields[7] if len(fields) > 7 else 0,
        fields[8] if len(fields) > 8 else b"",
        fields[9] if len(fields) > 9 else "",
    )


class LmdbStore:
    """The store in an LMDB environment at ``path`` (created if missing)."""

    def __init__(
        self, path: Path, *, map_size: int = DEFAULT_MAP_SIZE, filter_blocks: int = DEFAULT_BLOCKS
    ) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._env = lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=16,
                sync=True,
                metasync=False,
                readahead=False,
                meminit=False,
            )
        except (OSError, lmdb.Error) as exc:
            raise NodeDataError(f"cannot open the node store in {path}: {exc}") from exc
        try:
            _check_size(path, self._env)
            self._open(path, filter_blocks)
        except BaseException as exc:
            self._env.close()
            if isinstance(exc, _DAMAGED):
                raise NodeDataError(
                    f"the node store in {path} is damaged ({exc}); {_way_out(path)}"
                ) from exc
            if isinstance(exc, lmdb.Error):
                raise NodeDataError(f"cannot open the node store in {path}: {exc}") from exc
            raise

    def _open(self, path: Path, filter_blocks: int) -> None:
        env = self._env
        self._meta = env.open_db(b"meta")
        self._state = env.open_db(b"state")
        self._batches = env.open_db(b"batches")
        self._txns = env.open_db(b"txns")
        self._blocks = env.open_db(b"blocks")
        self._chain = env.open_db(b"chain")
        self._block_ids = env.open_db(b"block_ids")
        self._merkle = env.open_db(b"merkle")
        self._history = env.open_db(b"history")
        self._filter_db = env.open_db(b"filter")
        with env.begin(write=True) as txn:
            found = txn.get(b"format", db=self._meta)
            if found is None:
                txn.put(b"format", _U64.pack(STORE_FORMAT), db=self._meta)
                version = STORE_FORMAT
            else:
                version = _U64.unpack(found)[0]
        if version == 1:
            self._upgrade_from_1()
        elif version != STORE_FORMAT:
            raise NodeDataError(
                f"the node store in {path} has format {version}, this ledgerq reads "
                f"formats 1 and {STORE_FORMAT}"
            )
        self._filter = self._load_filter(filter_blocks)
        self._read = env.begin()
        self._pages = MappedPages(path / "data.mdb")

    def _upgrade_from_1(self) -> None:
        """Format 1 numbered a block per final status, INVALID ones too: give the
        COMMITTED records block numbers (1, 2, ... in commit order) and index them in
        ``chain``. In transactions of :data:`_UPGRADE_CHUNK` records, each with its
        progress (``upgraded``, ``height`` in ``meta``), so a crash resumes it."""
        env, meta = self._env, self._meta
        with env.begin() as txn:
            done = txn.get(b"upgraded", db=meta)
            height = txn.get(b"height", db=meta)
        through = 0 if done is None else _U64.unpack(done)[0]
        count = 0 if height is None else _U64.unpack(height)[0]
        while True:
            with env.begin(write=True) as txn:
                cursor = txn.cursor(db=self._blocks)
                moved = 0
                if cursor.set_range(_U64.pack(through + 1)):
                    for key, value in cursor:
                        record = decode_block(_U64.unpack(key)[0], bytes(value))
                        if isinstance(record.status, str):
                            count += 1
                            record = record._replace(block=count)
                            txn.put(_U64.pack(count), key, db=self._chain)
                        txn.put(key, encode_block(record), db=self._blocks)
                        through = record.num
                        moved += 1
                        if moved >= _UPGRADE_CHUNK:
                            break
                txn.put(b"upgraded", _U64.pack(through), db=meta)
                txn.put(b"height", _U64.pack(count), db=meta)
                if moved < _UPGRADE_CHUNK:
                    txn.put(b"format", _U64.pack(STORE_FORMAT), db=meta)
                    txn.delete(b"upgraded", db=meta)
                    return

    def _load_filter(self, blocks: int) -> KeyFilter:
        """The key filter: its checkpoint plus the blocks after it; built from the
        stored keys if there is none (or one of another size)."""
        keys = KeyFilter(blocks)
        self._filter_dirty: set[int] = set()
        with self._env.begin() as txn:
            found = txn.get(b"filter_blocks", db=self._meta)
            through = txn.get(b"filter_through", db=self._meta)
            if found is not None and through is not None and _U64.unpack(found)[0] == blocks:
                for key, value in txn.cursor(db=self._filter_db):
                    keys.set_chunk(_U32.unpack(key)[0] * FILTER_CHUNK, bytes(value))
                self._filter_through = _U64.unpack(through)[0]
                cursor = txn.cursor(db=self._blocks)
                if cursor.set_range(_U64.pack(self._filter_through + 1)):
                    for key, value in cursor:
                        record = decode_block(_U64.unpack(key)[0], bytes(value))
                        self._add_keys(keys, record)
                        self._filter_through = record.num
                return keys
        with self._env.begin(write=True) as txn:
            for db in (self._batches, self._txns, self._state):
                for key in txn.cursor(db=db).iternext(values=False):
                    keys.add(bytes(key))
            events = txn.get(b"events", db=self._meta)
            self._filter_through = 0 if events is None else _U64.unpack(events)[0]
            self._checkpoint_filter(txn, keys, everything=True)
            txn.put(b"filter_blocks", _U64.pack(blocks), db=self._meta)
        return keys

    def _add_keys(self, keys: KeyFilter, record: CommitRecord) -> None:
        dirty = self._filter_dirty
        dirty.add(keys.add(bytes.fromhex(record.batch_id)) // _BLOCKS_PER_CHUNK)
        if isinstance(record.status, str) and record.status != INVALID:
            for tid in record.tx_ids:
                dirty.add(keys.add(bytes.fromhex(tid)) // _BLOCKS_PER_CHUNK)
            for address, _ in record.writes:
                dirty.add(keys.add(bytes.fromhex(address)) // _BLOCKS_PER_CHUNK)

    def _checkpoint_filter(self, txn: Any, keys: KeyFilter, *, everything: bool = False) -> None:
        """Put the filter's chunks changed since the last checkpoint (in ``txn``)."""
        chunks = len(keys.bits) // FILTER_CHUNK or 1
        size = min(FILTER_CHUNK, len(keys.bits))
        for index in range(chunks) if everything else sorted(self._filter_dirty):
            txn.put(_U32.pack(index), keys.chunk(index * size, size), db=self._filter_db)
        txn.put(b"filter_through", _U64.pack(self._filter_through), db=self._meta)
        self._filter_dirty.clear()

    def _refresh(self) -> None:
        """See the latest write (a read transaction is a snapshot)."""
        self._read.abort()
        self._read = self._env.begin()

    # --- reading (event loop) ---------------------------------------------------

    def meta(self) -> Meta:
        txn, db = self._read, self._meta
        values = [txn.get(k, db=db) for k in (b"applied", b"events", b"batch_high", b"height")]
        self._pages.touch()
        return Meta(*(0 if v is None else _U64.unpack(v)[0] for v in values))

    def get_state(self, address: KVSKey) -> KVSDatum | None:
        key = bytes.fromhex(address)
        if not self._filter.may_contain(key):
            return None
        value = self._read.get(key, db=self._state)
        self._pages.touch()
        return None if value is None else bytes(value)

    def state_page(self, prefix: str, start: str, limit: int) -> list[tuple[KVSKey, KVSDatum]]:
        """Up to ``limit`` entries under ``prefix`` from ``start`` on, in address order."""
        low = max(prefix, start)
        seek = bytes.fromhex(low[: len(low) // 2 * 2])
        out: list[tuple[KVSKey, KVSDatum]] = []
        with self._env.begin() as txn:
            cursor = txn.cursor(db=self._state)
            if not cursor.set_range(seek):
                return out
            for key, value in cursor:
                address = bytes(key).hex()
                if address < low:
                    continue
                if not address.startswith(prefix):
                    break
                out.append((address, bytes(value)))
                if len(out) >= limit:
                    break
        self._pages.touch(1 + len(out) // 64)
        return out

    def get_batch(self, batch_id: str) -> StoredBatch | None:
        key = bytes.fromhex(batch_id)
        if not self._filter.may_contain(key):
            return None
        value = self._read.get(key, db=self._batches)
        self._pages.touch()
        if value is None:
            return None
        value = bytes(value)
        block, fb, ft, kind = _BATCH.unpack_from(value)
        invalid = cbor2.loads(value[_BATCH.size :]) if kind == _INVALID else []
        return StoredBatch(block, _fp(fb, ft), _status_of(kind, invalid))

    def get_txn(self, tx_id: str) -> tuple[int, int] | None:
        key = bytes.fromhex(tx_id)
        if not self._filter.may_contain(key):
            return None
        value = self._read.get(key, db=self._txns)
        self._pages.touch()
        return None if value is None else _TXN.unpack(value)

    def get_block(self, num: int) -> CommitRecord | None:
        value = self._read.get(_U64.pack(num), db=self._blocks)
        self._pages.touch()
        return None if value is None else decode_block(num, bytes(value))

    def chain_seq(self, block: int) -> int | None:
        """The event number of block ``block``'s record."""
        value = self._read.get(_U64.pack(block), db=self._chain)
        self._pages.touch()
        return None if value is None else _U64.unpack(value)[0]

    def block_num(self, block_id: str) -> int | None:
        try:
            key = bytes.fromhex(block_id)
        except ValueError:
            return None
        value = self._read.get(key, db=self._block_ids) if key else None
        self._pages.touch()
        return None if value is None else _U64.unpack(value)[0]

    def genesis(self) -> tuple[bytes, str] | None:
        value = self._read.get(b"genesis", db=self._meta)
        if value is None:
            return None
        header, signature = cbor2.loads(bytes(value))
        return header, signature

    def clear_merkle(self) -> None:
        """Drop every node of the Merkle tree (before the chain is sealed again)."""
        with self._env.begin(write=True) as txn:
            txn.drop(self._merkle, delete=False)
        self._refresh()

    def reseal(
        self,
        records: Sequence[CommitRecord],
        nodes: Mapping[bytes, bytes],
        genesis: tuple[bytes, str] | None,
        genesis_state: Sequence[tuple[KVSKey, KVSDatum]] = (),
    ) -> None:
        """Records given their headers (and their writes' versions), the tree's
        nodes, the state the genesis block starts with and at last the genesis
        block (see :func:`ledgerq.node.chain.seal_store`), in one transaction."""
        with self._env.begin(write=True) as txn:
            history = self._history
            for address, datum in genesis_state:
                txn.put(bytes.fromhex(address) + _U64.pack(0), datum, db=history)
            for record in records:
                txn.put(_U64.pack(record.num), encode_block(record), db=self._blocks)
                if record.block:
                    txn.put(
                        bytes.fromhex(record.signature),
                        _U64.pack(record.block),
                        db=self._block_ids,
                    )
                    version = _U64.pack(record.block)
                    for address, datum in record.writes:
                        txn.put(bytes.fromhex(address) + version, datum, db=history)
            for path, node in nodes.items():
                txn.put(_NODE + path, node, db=self._merkle)
            if genesis is not None:
                header, signature = genesis
                txn.put(b"genesis", cbor2.dumps([header, signature]), db=self._meta)
                txn.put(bytes.fromhex(signature), _U64.pack(0), db=self._block_ids)
        self._env.sync(True)
        self._refresh()

    def get_node(self, path: bytes) -> bytes | None:
        """A stored node of the state's Merkle tree (see :mod:`ledgerq.node.merkle`)."""
        value = self._read.get(_NODE + path, db=self._merkle)
        self._pages.touch()
        return None if value is None else bytes(value)

    def get_state_at(self, address: KVSKey, block: int) -> KVSDatum | None:
        """The value at ``address`` as of block ``block`` (its latest version then)."""
        key = bytes.fromhex(address)
        with self._env.begin() as txn:
            found = _version_at(txn.cursor(db=self._history), key, block)
        self._pages.touch()
        return found

    def state_page_at(
        self, prefix: str, start: str, limit: int, block: int
    ) -> list[tuple[KVSKey, KVSDatum]]:
        """:meth:`state_page` as of block ``block``: each address's latest version
        then, two seeks per address however many versions it has."""
        low = max(prefix, start)
        seek = bytes.fromhex(low[: len(low) // 2 * 2])
        out: list[tuple[KVSKey, KVSDatum]] = []
        with self._env.begin() as txn:
            cursor = txn.cursor(db=self._history)
            if not cursor.set_range(seek):
                return out
            while len(out) < limit:
                key = bytes(cursor.key())
                address = key[:35]
                text = address.hex()
                if text < low:
                    if not cursor.set_range(address + _LAST_VERSION):
                        break
                    continue
                if not text.startswith(prefix):
                    break
                value = _version_at(cursor, address, block)
                if value is not None:
                    out.append((text, value))
                if not cursor.set_range(address + _LAST_VERSION):
                    break
        self._pages.touch(1 + len(out) // 16)
        return out

    # --- writing (a thread) -------------------------------------------------------

    def write(
        self,
        records: Sequence[CommitRecord],
        applied: int,
        batch_high: int,
        nodes: Mapping[bytes, bytes] = _NO_NODES,
    ) -> None:
        keys = self._filter
        with self._env.begin(write=True) as txn:
            state, batches, txns, blocks = self._state, self._batches, self._txns, self._blocks
            chain, block_ids, history = self._chain, self._block_ids, self._history
            last = None
            height = None
            pages = self._pages
            # Each key's bytes serve its put and the filter (before the commit: the
            # filter may hold more than the store, never less); the filter's chunk of
            # each key is marked for the next checkpoint.
            add, dirty, put = keys.add, self._filter_dirty, txn.put
            for record in records:
                last = num = record.num
                kind, invalid = _status_value(record.status)
                fp = record.fingerprint
                value = _BATCH.pack(
                    num, -1 if fp is None else fp.batch, -1 if fp is None else fp.tx, kind
                )
                if invalid:
                    value += cbor2.dumps(invalid)
                key = bytes.fromhex(record.batch_id)
                put(key, value, db=batches)
                dirty.add(add(key) // _BLOCKS_PER_CHUNK)
                put(_U64.pack(num), encode_block(record), db=blocks, append=True)
                if record.block:
                    height = record.block
                    put(_U64.pack(height), _U64.pack(num), db=chain, append=True)
                    put(bytes.fromhex(record.signature), _U64.pack(height), db=block_ids)
                if kind == _COMMITTED:
                    for index, tid in enumerate(record.tx_ids):
                        key = bytes.fromhex(tid)
                        put(key, _TXN.pack(num, index), db=txns)
                        dirty.add(add(key) // _BLOCKS_PER_CHUNK)
                    version = _U64.pack(record.block)
                    for address, datum in record.writes:
                        key = bytes.fromhex(address)
                        put(key, datum, db=state)
                        put(key + version, datum, db=history)
                        dirty.add(add(key) // _BLOCKS_PER_CHUNK)
                # A batch id and its transactions' ids and addresses: a random page each.
                pages.touch(1 + len(record.tx_ids) + 2 * len(record.writes))
            merkle = self._merkle
            for path, node in nodes.items():
                put(_NODE + path, node, db=merkle)
            pages.touch(len(nodes))
            if last is not None and last - self._filter_through >= FILTER_CHECKPOINT:
                self._filter_through = last
                pages.touch(len(self._filter_dirty))
                self._checkpoint_filter(txn, keys)
            meta = self._meta
            txn.put(b"applied", _U64.pack(applied), db=meta)
            txn.put(b"batch_high", _U64.pack(batch_high), db=meta)
            if last is not None:
                txn.put(b"events", _U64.pack(last), db=meta)
            if height is not None:
                txn.put(b"height", _U64.pack(height), db=meta)
            failpoint("node_store_write")
        failpoint("node_store_written")
        # The transaction's descents mapped its random leaves (most of the pages the
        # node maps: the key filter spares the event loop's reads): unmap them now
        # rather than leave them until the next look finds them over the limit.
        self._pages.release()

    def after_write(self) -> None:
        """On the event loop, once :meth:`write` returned: let reads see it."""
        self._refresh()

    def pin_pages(self, pinned: bool) -> None:
        """Keep the store's mapped pages (``pinned``) or release them again as it is used."""
        self._pages.pinned = pinned

    def import_legacy(
        self,
        *,
        state: dict[KVSKey, KVSDatum],
        statuses: dict[str, FinalStatus],
        transactions: Iterable[str],
        applied: int,
        events: int,
        batch_high: int,
    ) -> None:
        """Load what an earlier node's snapshot held (no blocks: number 0)."""
        keys = self._filter
        with self._env.begin(write=True) as txn:
            for address, datum in state.items():
                txn.put(bytes.fromhex(address), datum, db=self._state)
                keys.add(bytes.fromhex(address))
            for batch_id, status in statuses.items():
                kind, invalid = _status_value(status)
                value = _BATCH.pack(0, -1, -1, kind) + (cbor2.dumps(invalid) if invalid else b"")
                txn.put(bytes.fromhex(batch_id), value, db=self._batches)
                keys.add(bytes.fromhex(batch_id))
            for tid in transactions:
                txn.put(bytes.fromhex(tid), _TXN.pack(0, 0), db=self._txns)
                keys.add(bytes.fromhex(tid))
            self._filter_through = events
            self._checkpoint_filter(txn, keys, everything=True)
            for key, number in ((b"applied", applied), (b"events", events)):
                txn.put(key, _U64.pack(number), db=self._meta)
            txn.put(b"batch_high", _U64.pack(batch_high), db=self._meta)
        self._env.sync(True)
        self._refresh()

    def close(self) -> None:
        self._pages.close()
        self._read.abort()
        self._env.sync(True)
        self._env.close()

    def blocks_from(self, num: int, *, reverse: bool = False) -> Iterator[CommitRecord]:
        """Blocks from ``num`` on (or down, ``reverse``), in number order."""
        with self._env.begin() as txn:
            cursor = txn.cursor(db=self._blocks)
            if reverse:
                if not cursor.set_range(_U64.pack(num)):
                    if not cursor.last():
                        return
                elif _U64.unpack(cursor.key())[0] > num and not cursor.prev():
                    return
                items = cursor.iterprev()
            else:
                if not cursor.set_range(_U64.pack(num)):
                    return
                items = cursor.iternext()
            for key, value in items:
                self._pages.touch()
                yield decode_block(_U64.unpack(key)[0], bytes(value))


#: Seeks past every version of an address (a block number is 8 bytes).
_LAST_VERSION = b"\xff" * 8


def _version_at(cursor: Any, address: bytes, block: int) -> KVSDatum | None:
    """The latest version of ``address`` at or before ``block`` (the cursor is left
    somewhere among its versions)."""
    if cursor.set_range(address + _U64.pack(block + 1)):
        if not cursor.prev():
            return None
    elif not cursor.last():
        return None
    key = cursor.key()
    if bytes(key[:35]) != address:
        return None
    return bytes(cursor.value())


class DictStore:
    """The same store in dictionaries: a node without a data directory."""

    def __init__(self) -> None:
        self._meta = Meta()
        self._state: dict[KVSKey, KVSDatum] = {}
        self._batches: dict[str, StoredBatch] = {}
        self._txns: dict[str, tuple[int, int]] = {}
        self._blocks: dict[int, CommitRecord] = {}
        self._chain: dict[int, int] = {}
        self._block_ids: dict[str, int] = {}
        self._nodes: dict[bytes, bytes] = {}
        self._genesis: tuple[bytes, str] | None = None
        #: Address -> its versions, (block, value) in block order.
        self._history: dict[KVSKey, list[tuple[int, KVSDatum]]] = {}

    def meta(self) -> Meta:
        return self._meta

    def get_state(self, address: KVSKey) -> KVSDatum | None:
        return self._state.get(address)

    def state_page(self, prefix: str, start: str, limit: int) -> list[tuple[KVSKey, KVSDatum]]:
        low = max(prefix, start)
        found = sorted(a for a in self._state if a >= low and a.startswith(prefix))
        return [(a, self._state[a]) for a in found[:limit]]

    def get_batch(self, batch_id: str) -> StoredBatch | None:
        return self._batches.get(batch_id)

    def get_txn(self, tx_id: str) -> tuple[int, int] | None:
        return self._txns.get(tx_id)

    def get_block(self, num: int) -> CommitRecord | None:
        return self._blocks.get(num)

    def chain_seq(self, block: int) -> int | None:
        return self._chain.get(block)

    def block_num(self, block_id: str) -> int | None:
        return self._block_ids.get(block_id)

    def genesis(self) -> tuple[bytes, str] | None:
        return self._genesis

    def clear_merkle(self) -> None:
        self._nodes.clear()

    def reseal(
        self,
        records: Sequence[CommitRecord],
        nodes: Mapping[bytes, bytes],
        genesis: tuple[bytes, str] | None,
        genesis_state: Sequence[tuple[KVSKey, KVSDatum]] = (),
    ) -> None:
        for address, datum in genesis_state:
            self._history.setdefault(address, []).insert(0, (0, datum))
        for record in records:
            self._blocks[record.num] = record
            if record.block:
                self._block_ids[record.signature] = record.block
                for address, datum in record.writes:
                    self._history.setdefault(address, []).append((record.block, datum))
        self._nodes.update(nodes)
        if genesis is not None:
            self._genesis = genesis
            self._block_ids[genesis[1]] = 0

    def get_node(self, path: bytes) -> bytes | None:
        return self._nodes.get(path)

    def get_state_at(self, address: KVSKey, block: int) -> KVSDatum | None:
        found = None
        for version, value in self._history.get(address, ()):
            if version > block:
                break
            found = value
        return found

    def state_page_at(
        self, prefix: str, start: str, limit: int, block: int
    ) -> list[tuple[KVSKey, KVSDatum]]:
        low = max(prefix, start)
        out = []
        for address in sorted(a for a in self._history if a >= low and a.startswith(prefix)):
            value = self.get_state_at(address, block)
            if value is not None:
                out.append((address, value))
                if len(out) >= limit:
                    break
        return out

    def write(
        self,
        records: Sequence[CommitRecord],
        applied: int,
        batch_high: int,
        nodes: Mapping[bytes, bytes] = _NO_NODES,
    ) -> None:
        events, height = self._meta.events, self._meta.height
        self._nodes.update(nodes)
        for record in records:
            events = record.num
            if record.block:
                height = record.block
                self._chain[height] = record.num
                self._block_ids[record.signature] = height
            self._batches[record.batch_id] = StoredBatch(
                record.num, record.fingerprint, record.status
            )
            self._blocks[record.num] = record
            if isinstance(record.status, str) and record.status != INVALID:
                for index, tid in enumerate(record.tx_ids):
                    self._txns[tid] = (record.num, index)
                self._state.update(record.writes)
                for address, datum in record.writes:
                    self._history.setdefault(address, []).append((record.block, datum))
        self._meta = Meta(applied, events, batch_high, height)

    def after_write(self) -> None:
        return None

    def pin_pages(self, pinned: bool) -> None:
        return None

    def close(self) -> None:
        return None

    def blocks_from(self, num: int, *, reverse: bool = False) -> Iterator[CommitRecord]:
        if reverse:
            nums = range(min(num, self._meta.events), 0, -1)
        else:
            nums = range(max(num, 1), self._meta.events + 1)
        for n in nums:
            yield self._blocks[n]
