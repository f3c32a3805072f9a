"""Worker: the single mempool worker of V1 — orders, dispatches and curates.

Semantics a caller relies on:

* ``TransactionRequest`` → ``TransactionAck`` to the issuer, always. The
  orderings of an earlier run may be given as ``history``. The worker
  remembers the orderings of the last ``dedupe_window`` requests (all when
  ``None``): the duplicate check of V1's footnote ("it might be too expensive
  to check from genesis") covers that window; its owner keeps older ones. A new
  candidate gets the next :class:`TxFingerprint` (current batch number,
  next transaction number) in arrival order. A candidate already ordered is
  disregarded (ack with ``duplicate=True``) unless the request carries a
  ``resubmission`` fingerprint at or after the candidate's latest ordering —
  then it is ordered again (the spec: "unless the worker already has
  received a request for the same transaction candidate after the
  resubmission time stamp").
* A batch closes after ``batch_size`` transactions or at :meth:`tick`.
* For every ordered candidate: ``SpawnExecutor``; on ``ExecutorPIDAssigned``
  (executors go to candidates in fingerprint order) ``ExecuteTransaction`` to
  the executor and one ``KVSAcquireLock`` per shard holding part of the label;
  a label naming key prefixes locks on every shard (each owns part of the
  keys under a prefix).
* ``KVSLockAcquired`` is counted per fingerprint. :meth:`tick` sends
  ``UpdateSeenAll(T)`` to every shard for the greatest ``T`` such that every
  fingerprint up to ``T`` has all its locks recorded, and frees the
  bookkeeping below ``T``. Sending it from ``tick`` (the router calls it when
  idle) coalesces one per round instead of one per transaction; any delay is
  safe, only progress waits for it.
* ``ExecutorFinished`` stores the execution summary (the log) under its
  fingerprint; ``RequestLogs`` → ``SendLog`` with it (``None`` if unknown).
  Logs live as long as the process, as in V1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ledgerq.clock import Clock, now_ms
from ledgerq.node.ordering.messages import (
    SUPERVISOR,
    Address,
    ExecuteTransaction,
    ExecutionSummary,
    ExecutorFinished,
    ExecutorPIDAssigned,
    KVSAcquireLock,
    KVSKey,
    KVSLockAcquired,
    RequestLogs,
    SendLog,
    SpawnExecutor,
    TransactionAck,
    TransactionCandidate,
    TransactionRequest,
    TxFingerprint,
    UnknownMessageError,
    UpdateSeenAll,
)

Send = Callable[[Address, Any], None]
ShardIndex = Callable[[KVSKey], int]

_EMPTY: frozenset[str] = frozenset()
_K = TypeVar("_K")
_V = TypeVar("_V")


class Worker:
    address = "worker"

    def __init__(
        self,
        send: Send,
        shards: int,
        shard_index: ShardIndex,
        *,
        batch_size: int = 1024,
        clock: Clock = now_ms,
        first_batch: int = 0,
        keep_logs: int = 100_000,
        keep_log_entries: int = 400_000,
        history: Mapping[str, tuple[int, int]] | None = None,
        dedupe_window: int | None = None,
    ) -> None:
        self._send = send
        self._shards = shards
        self._shard_index = shard_index
        self._batch_size = batch_size
        self._clock = clock
        self.batch_number = first_batch
        self._batch_start = clock()
        self._tx_number = 0
        # Plain tuples, not TxFingerprint: the garbage collector untracks those.
        self._ordered: dict[str, tuple[int, int]] = dict(history or {})
        #: Orderings remembered: the most recent ``dedupe_window`` (None: all).
        self._dedupe_window = dedupe_window
        self._ordered_ids: deque[tuple[str, tuple[int, int]]] = deque(self._ordered.items())
        self._ordered_dropped = 0  # deleted from _ordered since it was last compacted
        self._awaiting_executor: deque[tuple[TxFingerprint, TransactionRequest]] = deque()
        self._order: deque[TxFingerprint] = deque()  # assigned, not yet passed by seen_all
        self._outstanding: dict[TxFingerprint, int] = {}  # locks not yet acknowledged
        self._sent_seen_all: TxFingerprint | None = None
        self._logs: dict[TxFingerprint, ExecutionSummary] = {}
        self._log_order: deque[TxFingerprint] = deque()
        self._keep_logs = keep_logs
        # A summary holds every value its batch read and wrote, so a count of
        # summaries alone bounds nothing for batches of many transactions:
        # the values kept are bounded too (the oldest summaries go first).
        self._keep_log_entries = keep_log_entries
        self._log_entries = 0
        self._logs_dropped = 0  # deleted from _logs since it was last compacted
        self._handlers: dict[type, Callable[[Any], None]] = {
            TransactionRequest: self._on_request,
            ExecutorPIDAssigned: self._on_pid,
            KVSLockAcquired: self._on_lock_acquired,
            ExecutorFinished: self._on_finished,
            RequestLogs: self._on_request_logs,
        }

    def handle(self, msg: object) -> None:
        try:
            handler = self._handlers[type(msg)]
        except KeyError:
            raise UnknownMessageError(self, msg) from None
        handler(msg)

    @property
    def seen_all(self) -> TxFingerprint | None:
        return self._sent_seen_all

    def ordered(self, tx_id: str) -> TxFingerprint | None:
        fp = self._ordered.get(tx_id)
        return None if fp is None else TxFingerprint(*fp)

    def orderings(self) -> dict[str, tuple[int, int]]:
        """The latest ordering of every candidate (what ``history`` restores)."""
        return dict(self._ordered)

    # --- handlers ----------------------------------------------------------

    def _on_request(self, msg: TransactionRequest) -> None:
        tx = msg.tx
        previous = self._ordered.get(tx.id)
        if previous is not None and (msg.resubmission is None or previous > msg.resubmission):
            self._send(
                msg.issuer,
                TransactionAck(tx.id, self.batch_number, self._batch_start, None, duplicate=True),
            )
            return
        fp = TxFingerprint(self.batch_number, self._tx_number)
        self._ordered[tx.id] = (fp.batch, fp.tx)
        window = self._dedupe_window
        if window is not None:
            ids = self._ordered_ids
            ids.append((tx.id, (fp.batch, fp.tx)))
            while len(ids) > window:
                old, at = ids.popleft()
                if self._ordered.get(old) == at:  # not ordered again since
                    del self._ordered[old]
                    self._ordered_dropped += 1
            if self._ordered_dropped > window // 2:
                self._ordered = _compact(self._ordered)
                self._ordered_dropped = 0
        self._send(msg.issuer, TransactionAck(tx.id, fp.batch, self._batch_start, fp))
        self._tx_number += 1
        if self._tx_number >= self._batch_size:
            self._close_batch()
        self._order.append(fp)
        self._outstanding[fp] = -1  # executor not assigned yet: locks not even sent
        self._awaiting_executor.append((fp, msg))
        self._send(SUPERVISOR, SpawnExecutor(self.address))

    def _on_pid(self, msg: ExecutorPIDAssigned) -> None:
        fp, request = self._awaiting_executor.popleft()
        tx: TransactionCandidate = request.tx
        label = tx.label
        self._send(
            msg.epid,
            ExecuteTransaction(tx.executable, label, fp, tx.id, self.address, request.issuer),
        )
        per_shard: dict[int, list[set[KVSKey]]] = {}
        index = self._shard_index
        for slot, keys in enumerate(
            (label.lazy_read, label.eager_read, label.will_write, label.may_write)
        ):
            for key in keys:
                sets = per_shard.get(index(key))
                if sets is None:
                    sets = per_shard[index(key)] = [set(), set(), set(), set()]
                sets[slot].add(key)
        read_prefixes, write_prefixes = label.read_prefixes, label.write_prefixes
        if read_prefixes or write_prefixes:
            # The keys under a prefix are spread over every shard: each locks
            # the part it owns.
            for shard in range(self._shards):
                if shard not in per_shard:
                    per_shard[shard] = [set(), set(), set(), set()]
        self._outstanding[fp] = len(per_shard)
        for shard, (lazy, eager, will, may) in per_shard.items():
            self._send(
                ("shard", shard),
                KVSAcquireLock(
                    frozenset(lazy) if lazy else _EMPTY,
                    frozenset(eager) if eager else _EMPTY,
                    frozenset(will) if will else _EMPTY,
                    frozenset(may) if may else _EMPTY,
                    self.address,
                    msg.epid,
                    fp,
                    read_prefixes,
                    write_prefixes,
                ),
            )

    def _on_lock_acquired(self, msg: KVSLockAcquired) -> None:
        self._outstanding[msg.fingerprint] -= 1

    def _on_finished(self, msg: ExecutorFinished) -> None:
        summary = msg.summary
        previous = self._logs.get(msg.fingerprint)
        if previous is not None:
            self._log_entries -= _log_weight(previous)
        else:
            self._log_order.append(msg.fingerprint)
        self._logs[msg.fingerprint] = summary
        self._log_entries += _log_weight(summary)
        order = self._log_order
        while len(order) > 1 and (
            len(order) > self._keep_logs or self._log_entries > self._keep_log_entries
        ):
            dropped = self._logs.pop(order.popleft(), None)
            if dropped is not None:
                self._log_entries -= _log_weight(dropped)
                self._logs_dropped += 1
        if self._logs_dropped > len(self._logs) // 2 + 1_000:
            self._logs = _compact(self._logs)
            self._logs_dropped = 0

    def _on_request_logs(self, msg: RequestLogs) -> None:
        self._send(msg.requester, SendLog(msg.fingerprint, self._logs.get(msg.fingerprint)))

    # --- periodic ------------------------------------------------------------

    def tick(self) -> bool:
        """Close the open batch and send ``UpdateSeenAll`` if it can advance.

        Returns whether anything was sent.
        """
        if self._tx_number:
            self._close_batch()
        order, outstanding = self._order, self._outstanding
        frontier = None
        while order and outstanding[order[0]] == 0:
            frontier = order.popleft()
            del outstanding[frontier]
        if frontier is None:
            return False
        self._sent_seen_all = frontier
        msg = UpdateSeenAll(frontier)
        for shard in range(self._shards):
            self._send(("shard", shard), msg)
        return True

    def _close_batch(self) -> None:
        self.batch_number += 1
        self._tx_number = 0
        self._batch_start = self._clock()


def _compact(table: dict[_K, _V]) -> dict[_K, _V]:
    """A copy of a window's dict sized for what it holds.

    A dict never reuses the slots of deleted entries: a window (inserts at
    one end, deletes at the other) uses them up and the dict then resizes to
    three times what it holds, so a window of 100,000 entries settles in a
    table of 2**19 slots (about 10 MiB) — and only after one and a half
    windows' worth of inserts, so the node's heap grew by it well after its
    windows were full. Copied every half window, it stays at 2**18 (5 MiB);
    a copy of 100,000 entries takes a few milliseconds.
    """
    return dict(table)


def _log_weight(summary: ExecutionSummary) -> int:
    """What a kept summary costs, counted in the values and lines it holds."""
    return (
        1
        + len(summary.values_read)
        + len(summary.values_written)
        + len(summary.invalid)
        + len(summary.log)
    )
