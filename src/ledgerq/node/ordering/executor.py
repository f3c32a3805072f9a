"""Executor: runs one candidate's code against the shards.

Semantics a caller relies on:

* The code (a generator, see :data:`~ledgerq.node.ordering.messages.Program`) yields
  the keys it reads. Eager reads are awaited (the shard sends them unasked);
  lazy reads are requested with ``KVSReadRequest(actual=True)`` the first time
  the code needs them. The executor never reads anything but ``KVSRead``.
* A read of a key outside the label's reads, a write outside its writes, or a
  will-write left without a value makes the candidate fail; so does an
  exception raised by the code (reported, not propagated).
* A key under one of the label's read prefixes is read as a lazy read: the
  first time the code needs it, ``KVSReadRequest(actual=True)`` to the shard
  that owns it. A key under one of its write prefixes may be written.
* At the end: one ``KVSWrite`` per write key of the label (``None`` for a
  may-write not taken, and for every write when the candidate failed, so a
  failed candidate leaves no trace), ``KVSReadRequest(actual=False)`` for each
  lazy read never requested, when the label names prefixes one
  ``KVSPrefixDone`` to every shard (with the values written under them at
  keys that shard owns; none when the candidate failed),
  ``ExecutionSummary`` to the issuer and ``ExecutorFinished`` to the
  curator. ``KVSRead`` messages for eager reads the code did not need may
  still arrive afterwards and are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ledgerq.node.ordering.messages import (
    Address,
    ExecuteTransaction,
    ExecutionSummary,
    ExecutorFinished,
    InvalidTx,
    KVSDatum,
    KVSKey,
    KVSPrefixDone,
    KVSRead,
    KVSReadRequest,
    KVSWrite,
    Program,
    ProgramResult,
    TransactionLabel,
    UnknownMessageError,
    covered,
)

Send = Callable[[Address, Any], None]
ShardOf = Callable[[KVSKey], Address]


class Executor:
    """One executor process; ``done`` is set once it has finished."""

    __slots__ = (
        "_awaiting",
        "_job",
        "_program",
        "_read",
        "_requested",
        "_send",
        "_shard_of",
        "_shards",
        "done",
        "epid",
    )

    def __init__(
        self, epid: int, send: Send, shard_of: ShardOf, shards: Sequence[Address] = ()
    ) -> None:
        self.epid = epid
        self._send = send
        self._shard_of = shard_of
        #: Every shard (a label's prefixes are locked on each): needed for prefixes.
        self._shards = shards
        self._job: ExecuteTransaction | None = None
        self._program: Program | None = None
        self._read: dict[KVSKey, KVSDatum | None] = {}
        self._requested: set[KVSKey] = set()
        self._awaiting: KVSKey | None = None
        self.done = False

    def handle(self, msg: object) -> None:
        if type(msg) is KVSRead:
            self._on_read(msg)
        elif type(msg) is ExecuteTransaction:
            self._on_execute(msg)
        else:
            raise UnknownMessageError(self, msg)

    def _on_execute(self, msg: ExecuteTransaction) -> None:
        if self._job is not None:
            raise RuntimeError(f"executor {self.epid} got a second ExecuteTransaction")
        if (msg.label.read_prefixes or msg.label.write_prefixes) and not self._shards:
            raise RuntimeError(f"executor {self.epid} knows no shards to end its prefixes on")
        self._job = msg
        try:
            self._program = msg.executable()
        except Exception as exc:  # the code is untrusted: its failure is a result
            self._finish(_failure(msg.tx_id, f"code failed to start: {exc!r}"))
            return
        self._advance(None, first=True)

    def _on_read(self, msg: KVSRead) -> None:
        if self.done:
            return
        self._read[msg.key] = msg.data
        if self._awaiting == msg.key:
            self._awaiting = None
            self._advance(msg.data)

    def _advance(self, value: KVSDatum | None, *, first: bool = False) -> None:
        job, program = self._job, self._program
        assert job is not None and program is not None
        label = job.label
        read = self._read
        try:
            key = next(program) if first else program.send(value)
            while True:
                if key in read:
                    key = program.send(read[key])
                    continue
                if key in label.lazy_read or (
                    key not in label.eager_read and covered(key, label.read_prefixes)
                ):
                    if key not in self._requested:
                        self._requested.add(key)
                        self._send(self._shard_of(key), KVSReadRequest(job.timestamp, key, True))
                elif key not in label.eager_read:
                    program.close()
                    self._finish(_failure(job.tx_id, f"read of {key} outside the label"))
                    return
                self._awaiting = key
                return
        except StopIteration as stop:
            result = stop.value
        except Exception as exc:  # the code is untrusted: its failure is a result
            result = _failure(job.tx_id, f"code raised {exc!r}")
        self._finish(result)

    def _finish(self, result: ProgramResult) -> None:
        job = self._job
        assert job is not None
        self.done = True
        label = job.label
        ts = job.timestamp
        writes = _checked_writes(label, result, job.tx_id)
        send, shard_of = self._send, self._shard_of
        written: list[tuple[KVSKey, KVSDatum]] = []
        for key in (*label.will_write, *label.may_write):
            datum = writes.get(key) if writes is not None else None
            if datum is not None:
                written.append((key, datum))
            send(shard_of(key), KVSWrite(ts, key, datum))
        for key in label.lazy_read:
            if key not in self._requested:
                send(shard_of(key), KVSReadRequest(ts, key, False))
        if label.read_prefixes or label.write_prefixes:
            under: dict[Address, list[tuple[KVSKey, KVSDatum]]] = {}
            if writes:
                single = label.will_write | label.may_write
                for key, datum in writes.items():
                    if datum is not None and key not in single:
                        written.append((key, datum))
                        under.setdefault(shard_of(key), []).append((key, datum))
            for shard in self._shards:
                send(shard, KVSPrefixDone(ts, tuple(under.get(shard, ()))))
        if writes is None and result.success:
            result = _failure(job.tx_id, "wrote outside the label or left a will-write empty")
        summary = ExecutionSummary(
            fingerprint=ts,
            tx_id=job.tx_id,
            success=result.success,
            values_read=tuple(self._read.items()),
            values_written=tuple(written),
            invalid=result.invalid,
            log=result.log,
        )
        send(job.issuer, summary)
        send(job.curator, ExecutorFinished(ts, str(ts), summary))


def _checked_writes(
    label: TransactionLabel, result: ProgramResult, tx_id: str
) -> dict[KVSKey, KVSDatum | None] | None:
    """The writes to apply, ``{}`` for a failure, ``None`` for a label violation."""
    if not result.success:
        return {}
    writes = dict(result.writes)
    allowed = label.will_write | label.may_write
    if not writes.keys() <= allowed:
        prefixes = label.write_prefixes
        if not all(key in allowed or covered(key, prefixes) for key in writes):
            return None
    for key in label.will_write:
        if writes.get(key) is None:
            return None
    return writes


def _failure(tx_id: str, message: str) -> ProgramResult:
    return ProgramResult(success=False, invalid=(InvalidTx(tx_id, message),), log=(message,))
