"""The node's write-ahead journal.

* The journal is a sequence of records numbered from 1, in segment files
  ``journal-<first record>.log``. A record is one serialized Sawtooth
  ``Batch`` with how the node decided to order it: plainly, as a
  ``resubmission`` of an earlier ordering, or refused (``refusal``: the
  message of the INVALID status it will get without being executed).
* :meth:`Journal.append` is a group commit: concurrent callers share one
  ``write`` + ``fsync``; each returns once its records are on disk. A flush
  writes one **group**: a header (magic, body length, number of its first
  record, record count) and the records, with one CRC-32 over the header
  fields and the body. So every byte of the file is checked, and every group
  says which records it holds. The ``on_durable`` callback sees the records of
  each flush in record order.
* A flush that fails (a full disk, an I/O error) **breaks** the journal:
  its group is cut off the file again (best effort; what is left of it is a
  torn tail), and that append, every appender waiting for it and every later
  one raise the same :class:`OSError`. Nothing is written after a failed
  group: a later group would leave a hole that no restart could read past,
  and its records would have been acknowledged by a node that reported
  itself stopped.
* :meth:`Journal.open_segment` asks for a new segment; the next flush starts
  it, named after the first record it writes, so a segment's name is always
  the number of its first record, whatever appenders are waiting meanwhile.
* Reading (:meth:`Journal.replay`) checks that segments and groups follow each
  other without gaps. A group that fails its check is **corruption** — the
  node refuses to start, naming the segment and the byte offset — unless it
  is a **torn tail**: the last group of the last segment, nothing valid after
  it, and cut short by the end of the file or holding an all-zero 512-byte
  sector (what a crash in the middle of a write leaves). A torn tail was never
  acknowledged (its fsync did not return); it is cut off with a warning.
  Damage followed by a valid group (or by the next segment) whose first
  record the store already covers is skipped with a warning: the records it
  held are in the store, and a replay does not read them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerq.errors import NodeDataError
from ledgerq.failpoints import failpoint
from ledgerq.node.ordering.messages import TxFingerprint

log = logging.getLogger(__name__)

MAGIC = b"LQJ2"
#: magic, body length, first record, record count, crc32(everything but the crc, + body)
_GROUP = struct.Struct(">4sIQII")
_CHECKED = struct.Struct(">4sIQI")  # the header fields the crc covers
_RECORD = struct.Struct(">IB")  # payload length, flags
_RESUB = struct.Struct(">QQ")
_REASON = struct.Struct(">H")
_HAS_RESUB = 1
_REFUSED = 2
_SECTOR = 512


@dataclass(frozen=True, slots=True)
class Record:
    """One journaled batch: ``seq`` is its number (0 until appended)."""

    seq: int
    batch: bytes
    resubmission: TxFingerprint | None = None
    refusal: str | None = None

    def encode(self) -> bytes:
        flags = 0
        head = b""
        if self.resubmission is not None:
            flags |= _HAS_RESUB
            head += _RESUB.pack(*self.resubmission)
        if self.refusal is not None:
            flags |= _REFUSED
            reason = self.refusal.encode()[:65535]
            head += _REASON.pack(len(reason)) + reason
        payload = head + self.batch
        return _RECORD.pack(len(payload), flags) + payload


def _decode_records(body: bytes, first: int, count: int) -> list[Record] | None:
    records = []
    pos = 0
    for seq in range(first, first + count):
        if pos + _RECORD.size > len(body):
            return None
        length, flags = _RECORD.unpack_from(body, pos)
        pos += _RECORD.size
        payload = body[pos : pos + length]
        if len(payload) != length:
            return None
        pos += length
        resub = None
        refusal = None
        at = 0
        if flags & _HAS_RESUB:
            resub = TxFingerprint(*_RESUB.unpack_from(payload, at))
            at += _RESUB.size
        if flags & _REFUSED:
            (size,) = _REASON.unpack_from(payload, at)
            at += _REASON.size
            refusal = payload[at : at + size].decode(errors="replace")
            at += size
        records.append(Record(seq, payload[at:], resub, refusal))
    return records if pos == len(body) else None


def encode_group(records: Sequence[Record]) -> bytes:
    body = b"".join(r.encode() for r in records)
    checked = _CHECKED.pack(MAGIC, len(body), records[0].seq, len(records))
    return (
        _GROUP.pack(
            MAGIC, len(body), records[0].seq, len(records), zlib.crc32(body, zlib.crc32(checked))
        )
        + body
    )


def _read_group(data: bytes, pos: int) -> tuple[int, list[Record]] | None:
    """The group at ``pos`` (its end and records) if it is whole and checks out."""
    if pos + _GROUP.size > len(data):
        return None
    magic, length, first, count, crc = _GROUP.unpack_from(data, pos)
    end = pos + _GROUP.size + length
    if magic != MAGIC or end > len(data) or count == 0:
        return None
    body = data[pos + _GROUP.size : end]
    if zlib.crc32(body, zlib.crc32(_CHECKED.pack(magic, length, first, count))) != crc:
        return None
    records = _decode_records(body, first, count)
    return None if records is None else (end, records)


def _valid_group_after(data: bytes, pos: int) -> int | None:
    """The offset of a valid group starting after ``pos``, if any."""
    at = data.find(MAGIC, pos + 1)
    while at != -1:
        if _read_group(data, at) is not None:
            return at
        at = data.find(MAGIC, at + 1)
    return None


def _covered_damage(
    path: Path, data: bytes, pos: int, after: int, following: int | None
) -> tuple[int, int] | None:
    """Where to read on past a bad group at ``pos`` when every record it can hold is
    one the store covers (``<= after``): (offset, record expected there), or None.

    The next valid group in the segment, or else the next segment, says which
    record follows the damage; only records the store holds are skipped.
    """
    at = _valid_group_after(data, pos)
    if at is not None:
        resume, first = at, _GROUP.unpack_from(data, at)[2]
    elif following is not None:
        resume, first = len(data), following
    else:
        return None
    if first - 1 > after:
        return None
    log.warning(
        "journal segment %s is damaged from offset %d to %d, before record %d: the store "
        "holds every record up to %d, so nothing there is needed; skipped",
        path.name,
        pos,
        resume,
        first,
        after,
    )
    return resume, first


def _looks_torn(data: bytes, pos: int) -> bool:
    """A crash mid-write: the group runs past the end of the file or holds a zero sector."""
    if pos + _GROUP.size > len(data):
        return True
    _, length, _, _, _ = _GROUP.unpack_from(data, pos)
    end = pos + _GROUP.size + length
    if end > len(data):
        return True
    start = (pos // _SECTOR + 1) * _SECTOR
    zero = bytes(_SECTOR)
    for sector in range(start, end - _SECTOR + 1, _SECTOR):
        if data[sector : sector + _SECTOR] == zero:
            return True
    return data[pos : pos + _GROUP.size] == bytes(_GROUP.size)


class Journal:
    def __init__(self, directory: Path, on_durable: Callable[[Sequence[Record]], None]) -> None:
        self.directory = directory
        self._on_durable = on_durable
        self._buffer: list[Record] = []
        self._flushing = False
        self._flushed: asyncio.Event = asyncio.Event()
        self._file: Any = None
        self._rotate = True
        self.last_seq = 0
        self._durable_seq = 0
        self._failure: OSError | None = None  # a failed flush: nothing more is written
        self._size = 0  # bytes synced in the current segment

    # --- reading --------------------------------------------------------------

    def segments(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.glob("journal-*.log"):
            try:
                found.append((int(path.stem.split("-", 1)[1]), path))
            except ValueError:
                continue
        return sorted(found)

    def replay(self, after: int) -> Iterator[Record]:
        """Records with ``seq > after`` in order; cuts a torn tail off the last segment.

        Raises :class:`NodeDataError` on a gap or on corruption.
        """
        segments = self.segments()
        expected: int | None = None
        if segments and segments[0][0] > after + 1:
            raise NodeDataError(
                f"the journal starts at record {segments[0][0]} but the store covers only "
                f"{after}: records are missing from {self.directory}"
            )
        for index, (first, path) in enumerate(segments):
            if expected is not None and first != expected:
                raise NodeDataError(
                    f"journal segment {path.name} does not follow record {expected - 1}: "
                    f"records are missing from {self.directory}"
                )
            expected = first
            data = path.read_bytes()
            pos = 0
            while pos < len(data):
                group = _read_group(data, pos)
                if group is None:
                    following = segments[index + 1][0] if index + 1 < len(segments) else None
                    resume = _covered_damage(path, data, pos, after, following)
                    if resume is not None:
                        pos, expected = resume
                        continue
                    self._bad_group(path, data, pos, last=following is None)
                    break
                end, records = group
                if records[0].seq != expected:
                    raise NodeDataError(
                        f"journal segment {path.name} is corrupt at offset {pos}: it holds "
                        f"record {records[0].seq} where record {expected} belongs"
                    )
                for record in records:
                    if record.seq > after:
                        yield record
                expected += len(records)
                pos = end
        self.last_seq = max(self.last_seq, (expected or 1) - 1, after)
        self._durable_seq = self.last_seq

    def _bad_group(self, path: Path, data: bytes, pos: int, *, last: bool) -> None:
        if last and _valid_group_after(data, pos) is None and _looks_torn(data, pos):
            log.warning(
                "journal segment %s ends with a torn write at offset %d (%d bytes, never "
                "acknowledged): cut off",
                path.name,
                pos,
                len(data) - pos,
            )
            with path.open("r+b") as f:
                f.truncate(pos)
                f.flush()
                os.fsync(f.fileno())
            return
        raise NodeDataError(
            f"journal segment {path.name} is corrupt at offset {pos} (of {len(data)} bytes): "
            "a checksum does not match. The records from there on cannot be trusted; "
            f"restore {path} from a backup, or move the data directory aside"
        )

    # --- writing ----------------------------------------------------------------

    def open_segment(self) -> None:
        """Start a new segment with the next record written (the next flush does it)."""
        self._rotate = True

    async def append(self, records: Sequence[Record]) -> None:
        """Append records (their ``seq`` is assigned here) and return once they are on disk."""
        if not records:
            return
        self._check_failure()
        target = self.last_seq + len(records)
        for record in records:
            self.last_seq += 1
            self._buffer.append(
                Record(self.last_seq, record.batch, record.resubmission, record.refusal)
            )
        while self._durable_seq < target:
            if self._flushing:
                await asyncio.wait_for(self._flushed.wait(), 60)
                self._check_failure()
                continue
            await self._flush()

    def _check_failure(self) -> None:
        if self._failure is not None:
            raise OSError(self._failure.errno, self._failure.strerror)

    async def _flush(self) -> None:
        self._flushing = True
        try:
            records, self._buffer = self._buffer, []
            group = encode_group(records)
            try:
                if self._rotate or self._file is None:
                    self._start_segment(records[0].seq)
                await asyncio.to_thread(_write_and_sync, self._file, group)
            except OSError as exc:
                self._failure = exc
                self._buffer.clear()  # their appenders raise too
                if self._file is not None:
                    await asyncio.to_thread(_cut_back, self._file, self._size)
                raise
            self._size += len(group)
            failpoint("node_journal_synced")
            self._durable_seq = records[-1].seq
            self._on_durable(records)
        finally:
            self._flushing = False
            flushed, self._flushed = self._flushed, asyncio.Event()
            flushed.set()

    def _start_segment(self, first: int) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        # Unbuffered: a failed write leaves nothing in a buffer for close() to write.
        self._file = (self.directory / f"journal-{first:012d}.log").open("ab", buffering=0)
        self._size = self._file.seek(0, os.SEEK_END)
        fsync_dir(self.directory)
        self._rotate = False

    def drop_covered(self, records: int) -> None:
        """Delete the segments whose every record is at or below ``records``."""
        segments = self.segments()
        for (_, path), (next_first, _) in itertools.pairwise(segments):
            if next_first - 1 <= records:
                path.unlink()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _write_and_sync(file: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[file.write(view) :]
    os.fsync(file.fileno())


def _cut_back(file: Any, size: int) -> None:
    """After a failed group: cut the file back to the groups that were synced (best
    effort: if this fails too, the group's remains are a torn tail, cut at restart)."""
    try:
        os.ftruncate(file.fileno(), size)
        os.fsync(file.fileno())
    except OSError as exc:
        log.warning("cannot cut a failed journal write off %s: %s", file.name, exc)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
