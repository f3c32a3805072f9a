"""Shard: one partition of the key-value state, as multi-version timelines.

Semantics a caller relies on:

* Every key has a timeline of markers by :class:`TxFingerprint`: read markers
  (eager: served as soon as possible; lazy: served after a
  ``KVSReadRequest(actual=True)``, dropped on ``actual=False``) and write
  markers (will- and may-writes), plus the values written at each timestamp.
* A read at ``T`` is answered (``KVSRead`` to the reader's executor) only
  when ``UpdateSeenAll >= T`` (no earlier lock can still arrive) and the
  unique previous write to that key has produced its value. A write whose
  datum is ``None`` ("unchanged", a may-write not taken) is skipped: readers
  see the write before it.
* ``KVSReadRequest`` and ``KVSWrite`` that arrive before the ``KVSAcquireLock``
  of their timestamp are held back until it arrives.
* Old versions are folded into ``state`` once no reader can need them
  (the write is known, ``UpdateSeenAll`` has passed it and no earlier read is
  outstanding), so memory follows the number of transactions in flight.
* A key neither on a timeline nor in ``state`` is read from ``base`` (the
  owner's committed state: a store). The owner calls :meth:`forget_through`
  once ``base`` holds every write up to a fingerprint; folded values that old
  are then dropped from memory, so ``state`` holds only what ``base`` does not
  have yet.
* A lock at or below the last ``UpdateSeenAll`` is a protocol violation and
  raises: the worker promised no such lock would come.

Deletion is not modelled: a value, once written, stays (intkey never deletes).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from ledgerq.node.ordering.messages import (
    Address,
    KVSAcquireLock,
    KVSDatum,
    KVSKey,
    KVSLockAcquired,
    KVSRead,
    KVSReadRequest,
    KVSWrite,
    TxFingerprint,
    UnknownMessageError,
    UpdateSeenAll,
)

Send = Callable[[Address, Any], None]
#: Reads the committed value of a key (``None``: no value).
StateReader = Callable[[KVSKey], "KVSDatum | None"]


def _nothing(key: KVSKey) -> KVSDatum | None:
    return None


class _Marker:
    __slots__ = ()


_PENDING: Final = _Marker()  # write lock recorded, value not yet known
_UNCHANGED: Final = _Marker()  # may-write resolved with no value
_BEFORE_ALL = TxFingerprint(-1, -1)


class _Read:
    __slots__ = ("executor", "requested")

    def __init__(self, executor: Address, requested: bool) -> None:
        self.executor = executor
        self.requested = requested


class _Timeline:
    """Markers of one key: writes by fingerprint (sorted) and reads."""

    __slots__ = ("reads", "rfps", "wfps", "writes")

    def __init__(self) -> None:
        self.writes: dict[TxFingerprint, object] = {}
        self.wfps: list[TxFingerprint] = []
        self.reads: dict[TxFingerprint, _Read] = {}
        self.rfps: list[TxFingerprint] = []


class Shard:
    """One shard engine; ``state`` is the folded (oldest needed) state."""

    def __init__(
        self,
        index: int,
        send: Send,
        state: Mapping[KVSKey, KVSDatum] | None = None,
        *,
        base: StateReader | None = None,
    ) -> None:
        self.index = index
        self._send = send
        self.state: dict[KVSKey, KVSDatum] = dict(state or {})
        self._base: StateReader = base if base is not None else _nothing
        # (fingerprint, key) of each fold, in fold order, and the fingerprint of the
        # value each key holds in ``state``: what forget_through may drop.
        self._folds: deque[tuple[TxFingerprint, KVSKey]] = deque()
        self._folded_at: dict[KVSKey, TxFingerprint] = {}
        self.seen_all = _BEFORE_ALL
        self._keys: dict[KVSKey, _Timeline] = {}
        self._locked: dict[TxFingerprint, int] = {}  # fingerprint -> open markers here
        self._early: dict[TxFingerprint, list[KVSReadRequest | KVSWrite]] = {}
        self._blocked: list[tuple[TxFingerprint, KVSKey]] = []  # reads waiting on seen_all
        self._dirty: set[KVSKey] = set()  # keys with known writes not yet folded
        self._handlers: dict[type, Callable[[Any], None]] = {
            KVSAcquireLock: self._on_acquire_lock,
            KVSReadRequest: self._on_read_request,
            KVSWrite: self._on_write,
            UpdateSeenAll: self._on_update_seen_all,
        }

    def handle(self, msg: object) -> None:
        try:
            handler = self._handlers[type(msg)]
        except KeyError:
            raise UnknownMessageError(self, msg) from None
        handler(msg)

    # --- inspection (tests, snapshots) -----------------------------------

    def pending_markers(self) -> int:
        return sum(len(t.writes) + len(t.reads) for t in self._keys.values())

    def items(self) -> Iterator[tuple[KVSKey, KVSDatum]]:
        return iter(self.state.items())

    def forget_through(self, fingerprint: TxFingerprint) -> None:
        """Drop folded values written at or before ``fingerprint``: ``base`` has them."""
        folds, folded_at, state = self._folds, self._folded_at, self.state
        while folds and folds[0][0] <= fingerprint:
            ts, key = folds.popleft()
            if folded_at.get(key) == ts:
                del folded_at[key]
                del state[key]

    # --- handlers ----------------------------------------------------------

    def _on_acquire_lock(self, msg: KVSAcquireLock) -> None:
        ts = msg.timestamp
        if ts <= self.seen_all:
            raise RuntimeError(
                f"shard {self.index}: lock at {ts} after UpdateSeenAll {self.seen_all}"
            )
        keys = self._keys
        count = 0
        for key, requested in _read_keys(msg):
            tl = keys.get(key)
            if tl is None:
                tl = keys[key] = _Timeline()
            tl.reads[ts] = _Read(msg.executor, requested)
            insort(tl.rfps, ts)
            count += 1
            if requested:
                heapq.heappush(self._blocked, (ts, key))
        for key in (*msg.will_write_keys, *msg.may_write_keys):
            tl = keys.get(key)
            if tl is None:
                tl = keys[key] = _Timeline()
            tl.writes[ts] = _PENDING
            insort(tl.wfps, ts)
            count += 1
        self._locked[ts] = count
        self._send(msg.curator, KVSLockAcquired(ts, self.index))
        if count == 0:
            del self._locked[ts]
        for early in self._early.pop(ts, ()):
            self.handle(early)

    def _on_read_request(self, msg: KVSReadRequest) -> None:
        ts = msg.timestamp
        if ts not in self._locked:
            self._early.setdefault(ts, []).append(msg)
            return
        tl = self._keys[msg.key]
        read = tl.reads.get(ts)
        if read is None or read.requested:
            raise RuntimeError(f"shard {self.index}: no lazy read of {msg.key} at {ts}")
        if msg.actual:
            read.requested = True
            if ts > self.seen_all:
                heapq.heappush(self._blocked, (ts, msg.key))
            else:
                self._try_read(msg.key, tl, ts)
        else:
            self._drop_read(msg.key, tl, ts)

    def _on_write(self, msg: KVSWrite) -> None:
        ts = msg.timestamp
        if ts not in self._locked:
            self._early.setdefault(ts, []).append(msg)
            return
        key = msg.key
        tl = self._keys[key]
        if tl.writes.get(ts) is not _PENDING:
            raise RuntimeError(f"shard {self.index}: no write lock on {key} at {ts}")
        tl.writes[ts] = _UNCHANGED if msg.datum is None else msg.datum
        self._done(ts)
        self._wake_after(key, tl, ts)
        self._compact(key, tl)

    def _on_update_seen_all(self, msg: UpdateSeenAll) -> None:
        if msg.timestamp <= self.seen_all:
            return
        self.seen_all = seen = msg.timestamp
        blocked = self._blocked
        keys = self._keys
        while blocked and blocked[0][0] <= seen:
            ts, key = heapq.heappop(blocked)
            tl = keys.get(key)
            if tl is not None and ts in tl.reads:
                self._try_read(key, tl, ts)
        if self._dirty:
            for key in list(self._dirty):
                tl = keys.get(key)
                if tl is not None:
                    self._compact(key, tl)

    # --- machinery ---------------------------------------------------------

    def _value_before(self, key: KVSKey, tl: _Timeline, ts: TxFingerprint) -> object:
        wfps, writes = tl.wfps, tl.writes
        i = bisect_left(wfps, ts) - 1
        while i >= 0:
            value = writes[wfps[i]]
            if value is _PENDING:
                return _PENDING
            if value is not _UNCHANGED:
                return value
            i -= 1
        value = self.state.get(key)
        return value if value is not None else self._base(key)

    def _try_read(self, key: KVSKey, tl: _Timeline, ts: TxFingerprint) -> None:
        if ts > self.seen_all:
            return  # the UpdateSeenAll that passes ts retries it (it is in _blocked)
        value = self._value_before(key, tl, ts)
        if value is _PENDING:
            return  # the KVSWrite that resolves it retries
        read = tl.reads.pop(ts)
        del tl.rfps[bisect_left(tl.rfps, ts)]
        self._send(read.executor, KVSRead(ts, key, value))  # type: ignore[arg-type]
        self._done(ts)
        self._compact(key, tl)

    def _drop_read(self, key: KVSKey, tl: _Timeline, ts: TxFingerprint) -> None:
        del tl.reads[ts]
        del tl.rfps[bisect_left(tl.rfps, ts)]
        self._done(ts)
        self._compact(key, tl)

    def _wake_after(self, key: KVSKey, tl: _Timeline, ts: TxFingerprint) -> None:
        """Retry the requested reads this write may have unblocked."""
        if not tl.rfps:
            return
        upper: TxFingerprint | None = None
        wfps, writes = tl.wfps, tl.writes
        for j in range(bisect_right(wfps, ts), len(wfps)):
            if writes[wfps[j]] is _PENDING:
                upper = wfps[j]
                break
        lo = bisect_right(tl.rfps, ts)
        hi = len(tl.rfps) if upper is None else bisect_right(tl.rfps, upper)
        for rts in tl.rfps[lo:hi]:
            read = tl.reads.get(rts)
            if read is not None and read.requested:
                self._try_read(key, tl, rts)

    def _compact(self, key: KVSKey, tl: _Timeline) -> None:
        """Fold known writes no reader can need into the base state."""
        wfps, writes, seen = tl.wfps, tl.writes, self.seen_all
        while wfps:
            ts = wfps[0]
            if ts > seen or (tl.rfps and tl.rfps[0] < ts):
                break
            value = writes[ts]
            if value is _PENDING:
                break
            del writes[ts]
            del wfps[0]
            if value is not _UNCHANGED:
                self.state[key] = value  # type: ignore[assignment]
                self._folded_at[key] = ts
                self._folds.append((ts, key))
        if not wfps and not tl.rfps:
            if self._keys.get(key) is tl:
                del self._keys[key]
            self._dirty.discard(key)
        elif wfps and writes[wfps[0]] is not _PENDING:
            self._dirty.add(key)
        else:
            self._dirty.discard(key)

    def _done(self, ts: TxFingerprint) -> None:
        left = self._locked[ts] - 1
        if left:
            self._locked[ts] = left
        else:
            del self._locked[ts]


def _read_keys(msg: KVSAcquireLock) -> Iterator[tuple[KVSKey, bool]]:
    for key in msg.eager_read_keys:
        yield key, True
    for key in msg.lazy_read_keys:
        yield key, False
