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

Key prefixes (a label's ``read_prefixes`` and ``write_prefixes``) lock every
key under them that this shard owns, known or not yet, with the same rules
as single keys — reads share, writes exclude:

* A write prefix at ``T`` is a pending write to every key under it: a read
  of such a key after ``T`` waits until ``KVSPrefixDone(T)`` says what ``T``
  wrote under it here (those values become ``T``'s writes to those keys; the
  other keys are unchanged by ``T``), and no later write to such a key is
  folded before then.
* A read prefix at ``T`` is a lazy read of every key under it: a
  ``KVSReadRequest(T, key, actual=True)`` for a key under it is answered as
  the read of a single key, and until ``KVSPrefixDone(T)`` releases the
  prefix no write after ``T`` to a key under it is folded (``T`` may still
  want the value before it).
* Overlapping prefixes and single keys combine: a key's previous write is
  the latest among its own writes and the pending writes of the prefixes
  that cover it. With no prefix locked the shard does exactly what it does
  for single keys alone.

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
    KVSPrefixDone,
    KVSRead,
    KVSReadRequest,
    KVSWrite,
    TxFingerprint,
    UnknownMessageError,
    UpdateSeenAll,
    covered,
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


class _Prefix:
    """Markers of one key prefix: open reads and pending writes, sorted; and
    the keys whose folding waits for its earliest marker (``parked``: key ->
    the write that waits, ``queue``: the same as a heap by that write)."""

    __slots__ = ("parked", "queue", "reads", "writes")

    def __init__(self) -> None:
        self.reads: list[TxFingerprint] = []
        self.writes: list[TxFingerprint] = []
        self.parked: dict[KVSKey, TxFingerprint] = {}
        self.queue: list[tuple[TxFingerprint, KVSKey]] = []

    def floor(self) -> TxFingerprint | None:
        """The earliest marker: no write after it to a key under the prefix folds."""
        reads, writes = self.reads, self.writes
        if reads and writes:
            return min(reads[0], writes[0])
        return reads[0] if reads else writes[0] if writes else None

    def park(self, key: KVSKey, ts: TxFingerprint) -> None:
        if self.parked.get(key) != ts:
            self.parked[key] = ts
            heapq.heappush(self.queue, (ts, key))


class _PrefixWait:
    """A read's previous write is the pending write prefix of ``writer``."""

    __slots__ = ("writer",)

    def __init__(self, writer: TxFingerprint) -> None:
        self.writer = writer


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
        self._early: dict[TxFingerprint, list[KVSReadRequest | KVSWrite | KVSPrefixDone]] = {}
        self._blocked: list[tuple[TxFingerprint, KVSKey]] = []  # reads waiting on seen_all
        self._dirty: set[KVSKey] = set()  # keys with known writes not yet folded
        # Prefixes locked here, the prefixes each fingerprint holds (reads,
        # writes, its executor), how many prefixes of each length are locked
        # (to find those covering a key), and the requested reads waiting for
        # a fingerprint's write prefixes, by that fingerprint.
        self._prefixes: dict[KVSKey, _Prefix] = {}
        self._prefix_locks: dict[
            TxFingerprint, tuple[frozenset[KVSKey], frozenset[KVSKey], Address]
        ] = {}
        self._prefix_lengths: dict[int, int] = {}
        self._prefix_readers: dict[TxFingerprint, list[tuple[KVSKey, TxFingerprint]]] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            KVSAcquireLock: self._on_acquire_lock,
            KVSReadRequest: self._on_read_request,
            KVSWrite: self._on_write,
            KVSPrefixDone: self._on_prefix_done,
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
        return sum(len(t.writes) + len(t.reads) for t in self._keys.values()) + sum(
            len(p.writes) + len(p.reads) for p in self._prefixes.values()
        )

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
        if msg.read_prefixes or msg.write_prefixes:
            self._lock_prefixes(msg)
            count += 1  # released by KVSPrefixDone
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
        tl = self._keys.get(msg.key)
        read = None if tl is None else tl.reads.get(ts)
        if read is None and msg.actual and ts in self._prefix_locks:
            tl, read = self._read_under_prefix(ts, msg.key, tl)
        if tl is None or read is None or read.requested:
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

    def _on_prefix_done(self, msg: KVSPrefixDone) -> None:
        ts = msg.timestamp
        if ts not in self._locked:
            self._early.setdefault(ts, []).append(msg)
            return
        reads, writes, _ = self._prefix_locks.pop(ts)
        keys = self._keys
        for key, datum in msg.written:
            if not covered(key, writes):
                raise RuntimeError(f"shard {self.index}: {key} written at {ts} under no prefix")
            tl = keys.get(key)
            if tl is None:
                tl = keys[key] = _Timeline()
            elif ts in tl.writes:
                raise RuntimeError(f"shard {self.index}: {key} written twice at {ts}")
            tl.writes[ts] = datum
            insort(tl.wfps, ts)
        prefixes = self._prefixes
        for prefix in reads:
            marks = prefixes[prefix].reads
            del marks[bisect_left(marks, ts)]
        for prefix in writes:
            marks = prefixes[prefix].writes
            del marks[bisect_left(marks, ts)]
        self._done(ts)
        # The reads that waited for these writes, then what may fold now.
        for key, rts in self._prefix_readers.pop(ts, ()):
            tl = keys.get(key)
            read = None if tl is None else tl.reads.get(rts)
            if tl is not None and read is not None and read.requested:
                self._try_read(key, tl, rts)
        for key, _ in msg.written:
            tl = keys.get(key)
            if tl is not None:
                self._compact(key, tl)
        for prefix in reads | writes:
            self._unpark(prefix)

    # --- prefixes ------------------------------------------------------------

    def _lock_prefixes(self, msg: KVSAcquireLock) -> None:
        ts = msg.timestamp
        for prefix in msg.read_prefixes:
            insort(self._prefix(prefix).reads, ts)
        for prefix in msg.write_prefixes:
            insort(self._prefix(prefix).writes, ts)
        self._prefix_locks[ts] = (msg.read_prefixes, msg.write_prefixes, msg.executor)

    def _prefix(self, prefix: KVSKey) -> _Prefix:
        found = self._prefixes.get(prefix)
        if found is None:
            found = self._prefixes[prefix] = _Prefix()
            length = len(prefix)
            self._prefix_lengths[length] = self._prefix_lengths.get(length, 0) + 1
        return found

    def _unpark(self, prefix: KVSKey) -> None:
        """Fold what waited for the prefix's earliest marker, now released;
        forget the prefix once nothing is locked or parked on it."""
        found = self._prefixes[prefix]
        floor = found.floor()
        queue, parked, keys = found.queue, found.parked, self._keys
        while queue and (floor is None or queue[0][0] <= floor):
            ts, key = heapq.heappop(queue)
            if parked.get(key) == ts:
                del parked[key]
                tl = keys.get(key)
                if tl is not None:
                    self._compact(key, tl)
        if floor is None and not queue:
            del self._prefixes[prefix]
            length = len(prefix)
            left = self._prefix_lengths[length] - 1
            if left:
                self._prefix_lengths[length] = left
            else:
                del self._prefix_lengths[length]

    def _covering(self, key: KVSKey) -> Iterator[_Prefix]:
        prefixes = self._prefixes
        size = len(key)
        for length in self._prefix_lengths:
            if length <= size:
                found = prefixes.get(key[:length])
                if found is not None:
                    yield found

    def _prefix_write_before(self, key: KVSKey, ts: TxFingerprint) -> TxFingerprint | None:
        """The latest pending prefix write before ``ts`` covering ``key``."""
        latest: TxFingerprint | None = None
        for found in self._covering(key):
            i = bisect_left(found.writes, ts) - 1
            if i >= 0 and (latest is None or found.writes[i] > latest):
                latest = found.writes[i]
        return latest

    def _prefix_floor(self, key: KVSKey) -> tuple[TxFingerprint, _Prefix] | None:
        """The earliest prefix marker covering ``key`` (no later write to it may
        fold) and the prefix that holds it."""
        lowest: tuple[TxFingerprint, _Prefix] | None = None
        for found in self._covering(key):
            floor = found.floor()
            if floor is not None and (lowest is None or floor < lowest[0]):
                lowest = (floor, found)
        return lowest

    def _read_under_prefix(
        self, ts: TxFingerprint, key: KVSKey, tl: _Timeline | None
    ) -> tuple[_Timeline | None, _Read | None]:
        """A read marker for ``key`` at ``ts`` if a read prefix ``ts`` holds covers it."""
        reads, _, executor = self._prefix_locks[ts]
        if not covered(key, reads):
            return tl, None
        if tl is None:
            tl = self._keys[key] = _Timeline()
        read = tl.reads[ts] = _Read(executor, False)
        insort(tl.rfps, ts)
        self._locked[ts] += 1
        return tl, read

    # --- machinery ---------------------------------------------------------

    def _value_before(self, key: KVSKey, tl: _Timeline, ts: TxFingerprint) -> object:
        wfps, writes = tl.wfps, tl.writes
        i = bisect_left(wfps, ts) - 1
        # A pending prefix write covering the key is a pending write to it.
        pending = self._prefix_write_before(key, ts) if self._prefixes else None
        while i >= 0:
            wts = wfps[i]
            if pending is not None and wts < pending:
                return _PrefixWait(pending)
            value = writes[wts]
            if value is _PENDING:
                return _PENDING
            if value is not _UNCHANGED:
                return value
            i -= 1
        if pending is not None:
            return _PrefixWait(pending)
        value = self.state.get(key)
        return value if value is not None else self._base(key)

    def _try_read(self, key: KVSKey, tl: _Timeline, ts: TxFingerprint) -> None:
        if ts > self.seen_all:
            return  # the UpdateSeenAll that passes ts retries it (it is in _blocked)
        value = self._value_before(key, tl, ts)
        if value is _PENDING:
            return  # the KVSWrite that resolves it retries
        if type(value) is _PrefixWait:
            # The KVSPrefixDone of that write retries it.
            self._prefix_readers.setdefault(value.writer, []).append((key, ts))
            return
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
        floor = self._prefix_floor(key) if self._prefixes else None
        while wfps:
            ts = wfps[0]
            if ts > seen or (tl.rfps and tl.rfps[0] < ts):
                break
            if floor is not None and floor[0] < ts:
                floor[1].park(key, ts)  # folded once that marker is released
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
