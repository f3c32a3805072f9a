"""The node's write-ahead journal and snapshots.

* The journal is a sequence of records, numbered from 1, in segment files
  ``journal-<first record>.log``. A record is one serialized Sawtooth
  ``Batch`` plus an optional ``resubmission`` fingerprint, framed as
  ``length, crc32, flags`` so a torn tail (a crash mid-write) is detected and
  cut off on open.
* :meth:`Journal.append` is a group commit: concurrent callers share one
  ``write`` + ``fsync``; each returns once its records are on disk. The
  ``on_durable`` callback sees the records of each flush in record order.
* A snapshot (``snapshot.bin``, written to a temporary file, fsynced, then
  renamed) holds what replaying records ``1..records`` produced; segments
  wholly covered by it are deleted.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerq.errors import NodeDataError
from ledgerq.node.messages import TxFingerprint

_FRAME = struct.Struct(">IIB")
_RESUB = struct.Struct(">QQ")
_HAS_RESUB = 1
SNAPSHOT_FORMAT = 2


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    batch: bytes
    resubmission: TxFingerprint | None = None

    def encode(self) -> bytes:
        body = b""
        flags = 0
        if self.resubmission is not None:
            flags |= _HAS_RESUB
            body = _RESUB.pack(*self.resubmission)
        body += self.batch
        return _FRAME.pack(len(body), zlib.crc32(body), flags) + body


class Journal:
    def __init__(self, directory: Path, on_durable: Callable[[Sequence[Record]], None]) -> None:
        self.directory = directory
        self._on_durable = on_durable
        self._buffer: list[Record] = []
        self._flushing = False
        self._flushed: asyncio.Event = asyncio.Event()
        self._file: Any = None
        self.last_seq = 0
        self._durable_seq = 0

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
        """Records with ``seq > after`` in order; cuts a torn tail off the last segment."""
        segments = self.segments()
        seq = None
        if segments and segments[0][0] > after + 1:
            raise NodeDataError(
                f"the journal starts at record {segments[0][0]} but the snapshot covers only "
                f"{after}: records are missing from {self.directory}"
            )
        for index, (first, path) in enumerate(segments):
            if seq is not None and first != seq + 1:
                raise NodeDataError(f"journal segment {path.name} does not follow record {seq}")
            seq = first - 1
            data = path.read_bytes()
            pos = 0
            while pos < len(data):
                if pos + _FRAME.size > len(data):
                    break
                length, crc, flags = _FRAME.unpack_from(data, pos)
                body = data[pos + _FRAME.size : pos + _FRAME.size + length]
                if len(body) != length or zlib.crc32(body) != crc:
                    break
                pos += _FRAME.size + length
                seq += 1
                if seq <= after:
                    continue
                resub = None
                if flags & _HAS_RESUB:
                    resub = TxFingerprint(*_RESUB.unpack_from(body))
                    body = body[_RESUB.size :]
                yield Record(seq, body, resub)
            if pos < len(data):
                if index != len(segments) - 1:
                    raise NodeDataError(f"journal segment {path.name} is corrupt at byte {pos}")
                with path.open("r+b") as f:  # a torn last write: cut it off
                    f.truncate(pos)
        self.last_seq = max(self.last_seq, seq or 0, after)

    # --- writing ----------------------------------------------------------------

    def open_segment(self) -> None:
        """Start a new segment for the records after ``last_seq``."""
        if self._file is not None:
            self._file.close()
        path = self.directory / f"journal-{self.last_seq + 1:012d}.log"
        self._file = path.open("ab")
        _fsync_dir(self.directory)

    async def append(self, batches: Sequence[tuple[bytes, TxFingerprint | None]]) -> None:
        """Append records and return once they are on disk (group commit)."""
        if not batches:
            return
        target = self.last_seq + len(batches)
        for batch, resub in batches:
            self.last_seq += 1
            self._buffer.append(Record(self.last_seq, batch, resub))
        while self._durable_seq < target:
            if self._flushing:
                await asyncio.wait_for(self._flushed.wait(), 60)
                continue
            await self._flush()

    async def _flush(self) -> None:
        self._flushing = True
        try:
            records, self._buffer = self._buffer, []
            data = b"".join(r.encode() for r in records)
            file = self._file
            await asyncio.to_thread(_write_and_sync, file, data)
            self._durable_seq = records[-1].seq
            self._on_durable(records)
        finally:
            self._flushing = False
            flushed, self._flushed = self._flushed, asyncio.Event()
            flushed.set()

    def drop_covered(self, records: int) -> None:
        """Delete the segments whose every record is covered by a snapshot."""
        segments = self.segments()
        for (_, path), (next_first, _) in itertools.pairwise(segments):
            if next_first - 1 <= records:
                path.unlink()

    @property
    def flushing(self) -> bool:
        return self._flushing

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _write_and_sync(file: Any, data: bytes) -> None:
    file.write(data)
    file.flush()
    os.fsync(file.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_snapshot(content: dict[str, Any]) -> bytes:
    return pickle.dumps({"format": SNAPSHOT_FORMAT, **content}, protocol=pickle.HIGHEST_PROTOCOL)


def write_snapshot(directory: Path, blob: bytes) -> None:
    """Write ``snapshot.bin`` atomically (temporary file, fsync, rename)."""
    tmp = directory / f"snapshot.{os.getpid()}.tmp"
    with tmp.open("wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(directory / "snapshot.bin")
    _fsync_dir(directory)


def read_snapshot(directory: Path) -> dict[str, Any] | None:
    for stale in directory.glob("snapshot.*.tmp"):  # left by a crash mid-snapshot
        stale.unlink()
    path = directory / "snapshot.bin"
    if not path.exists():
        return None
    try:
        with path.open("rb") as f:
            content = pickle.load(f)
    except Exception as exc:
        raise NodeDataError(
            f"{path} is unreadable ({exc!r}); restore it or remove the directory"
        ) from exc
    if not isinstance(content, dict) or content.get("format") != SNAPSHOT_FORMAT:
        raise NodeDataError(f"{path} has an unknown format; it was not written by this ledgerq")
    return content
