"""The running node: ordering machine, commit stage, journal and events.

See :mod:`ledgerq.node` for the API a caller relies on. One driver task runs
the (synchronous) ordering machine whenever there is work, in slices of a
bounded number of messages so HTTP handlers stay responsive, then commits
what is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from itertools import islice
from pathlib import Path

from ledgerq.clock import Clock, now_ms
from ledgerq.codec import ParsedBatch, decode_batch
from ledgerq.errors import NodeBusyError, NodeError
from ledgerq.node.blocks import Block, BlockLog
from ledgerq.node.families import FamilyRegistry, default_registry
from ledgerq.node.journal import (
    Journal,
    Record,
    encode_snapshot,
    read_snapshot,
    write_snapshot,
)
from ledgerq.node.ledger import (
    COMMITTED,
    PENDING,
    UNKNOWN,
    BatchStatusInfo,
    FinalStatus,
    Ledger,
    StatusEvent,
    final_info,
)
from ledgerq.node.machine import OrderingMachine
from ledgerq.node.messages import WORKER, ExecutionSummary, KVSDatum, RequestLogs, TxFingerprint
from ledgerq.node.sawtooth import batch_candidate

log = logging.getLogger(__name__)

_SLICE = 20_000  # messages per driver slice before yielding to the event loop
_WAIT_CAP_S = 300.0
#: A snapshot is also written this long after the last one if anything committed since,
#: so a quiet node does not leave a long journal to replay.
_SNAPSHOT_INTERVAL_MS = 60_000


class Node:
    """A Sawtooth-compatible ledger node running in this process."""

    def __init__(
        self,
        data_dir: Path | None,
        *,
        shards: int,
        ephemeral: bool,
        max_pending: int,
        commit_delay_ms: int,
        snapshot_every: int,
        event_buffer: int,
        block_buffer: int,
        clock: Clock,
        registry: FamilyRegistry,
    ) -> None:
        self.data_dir = data_dir
        self.ephemeral = ephemeral
        self.max_pending = max_pending
        self._snapshot_every = snapshot_every
        self._clock = clock
        self._registry = registry
        snapshot = read_snapshot(data_dir) if data_dir is not None else None
        snap = snapshot or {}
        state: dict[str, bytes] = snap.get("state", {})
        self._snapshot_records: int = snap.get("records", 0)
        self.ledger = Ledger(
            clock=clock,
            commit_delay_ms=commit_delay_ms,
            state=state,
            statuses=snap.get("statuses", {}),
            submissions=self._snapshot_records,
            event_seq=snap.get("event_seq", 0),
        )
        self.machine = OrderingMachine(
            self.ledger, shards=shards, state=state, clock=clock, first_batch=snap.get("batch", 0)
        )
        self._journal = Journal(data_dir, self._on_durable) if data_dir is not None else None
        self._pushed = self._snapshot_records
        self._to_push: dict[int, tuple[ParsedBatch, TxFingerprint | None]] = {}
        self._unjournaled: dict[int, tuple[bytes, TxFingerprint | None]] = {}
        self._pending_ids: set[str] = set()
        self._committed_txs: set[str] = snap.get("committed_txs", set())
        self._tx_ids: dict[str, tuple[str, ...]] = {}  # batch id -> its transactions, in flight
        self._held: dict[str, tuple[ParsedBatch, TxFingerprint | None, set[str]]] = {}
        self._waiting_on: defaultdict[str, list[str]] = defaultdict(list)
        self._waiters: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)
        # (seq, batch id, stored status): plain tuples, see ledger.FinalStatus.
        self._events: deque[tuple[int, str, FinalStatus]] = deque(maxlen=event_buffer)
        #: Recent commits as websocket "blocks" (see :mod:`ledgerq.node.blocks`).
        self.blocks = BlockLog(block_buffer, last_batch_id=snap.get("last_batch"))
        self._event_signal = asyncio.Event()
        self._wake = asyncio.Event()
        self._next_commit_at: int | None = None
        self._closed = False
        self._driver: asyncio.Task[None] | None = None
        self._snapshot_lock = asyncio.Lock()
        self._snapshot_at = clock()

    @classmethod
    async def open(
        cls,
        data_dir: Path | None,
        *,
        shards: int = 4,
        ephemeral: bool = False,
        max_pending: int = 100_000,
        commit_delay_ms: int = 0,
        snapshot_every: int = 50_000,
        event_buffer: int = 100_000,
        block_buffer: int = 10_000,
        clock: Clock = now_ms,
        registry: FamilyRegistry | None = None,
    ) -> Node:
        if data_dir is not None:
            data_dir = Path(data_dir)
            data_dir.mkdir(parents=True, exist_ok=True)
        node = cls(
            data_dir,
            shards=shards,
            ephemeral=ephemeral,
            max_pending=max_pending,
            commit_delay_ms=commit_delay_ms,
            snapshot_every=snapshot_every,
            event_buffer=event_buffer,
            block_buffer=block_buffer,
            clock=clock,
            registry=registry or default_registry(),
        )
        await node._recover()
        node._driver = asyncio.get_running_loop().create_task(node._drive(), name="node-driver")
        return node

    async def _recover(self) -> None:
        journal = self._journal
        if journal is None:
            return
        delay, self.ledger.commit_delay_ms = self.ledger.commit_delay_ms, 0
        replayed = 0
        for record in journal.replay(self._snapshot_records):
            batch = decode_batch(record.batch, verify=False)
            self._pending_ids.add(batch.header_signature)
            self._push(batch, record.resubmission, journaled=True)
            replayed += 1
            if replayed % 5_000 == 0:
                self.machine.run()
                await self._commit_ready()
        self.machine.run()
        await self._commit_ready()
        self.ledger.commit_delay_ms = delay
        journal.open_segment()
        if replayed:
            log.info("node recovered %d journal records after the snapshot", replayed)

    # --- submitting ---------------------------------------------------------------

    async def submit(
        self, batches: Sequence[ParsedBatch], *, resubmission: TxFingerprint | None = None
    ) -> None:
        """Accept batches for ordering; returns once they are journaled.

        Batches already pending or final are disregarded (unless
        ``resubmission`` names their latest ordering, see the worker).
        Raises :class:`NodeBusyError` when the pending queue is full.
        """
        if self._closed:
            raise NodeError("the node is closed")
        fresh: list[ParsedBatch] = []
        seen: set[str] = set()
        for batch in batches:
            bid = batch.header_signature
            if bid in seen or bid in self._pending_ids:
                continue
            if bid in self.ledger.statuses and resubmission is None:
                continue
            if resubmission is not None:
                # Decided here, not only by the worker, so that a journaled request is
                # one the worker orders: replay after a restart (whose worker has no
                # history) then reaches the same outcome.
                latest = self.machine.worker.ordered(bid)
                if latest is not None and latest > resubmission:
                    continue
            seen.add(bid)
            fresh.append(batch)
        if not fresh:
            return
        if len(self._pending_ids) + len(fresh) > self.max_pending:
            raise NodeBusyError(
                f"the node has {len(self._pending_ids)} batches pending (limit "
                f"{self.max_pending}); resubmit once some have committed"
            )
        self._pending_ids.update(seen)
        admitted: list[tuple[ParsedBatch, TxFingerprint | None]] = []
        for batch in fresh:
            missing = self._missing_dependencies(batch)
            if missing:
                self._hold(batch, resubmission, missing)
            else:
                admitted.append((batch, resubmission))
        await self._admit(admitted)

    async def _admit(self, batches: Sequence[tuple[ParsedBatch, TxFingerprint | None]]) -> None:
        """Journal (durable mode) then hand batches to the worker, in this order."""
        if not batches:
            return
        journal = self._journal
        if journal is not None and not self.ephemeral:
            first = journal.last_seq + 1
            for i, entry in enumerate(batches):
                self._to_push[first + i] = entry
            try:
                await journal.append([(b.serialized, resub) for b, resub in batches])
            except OSError as exc:
                # The journal's tail is now unknown: accepting more could lose them.
                self._closed = True
                self._pending_ids.difference_update(b.header_signature for b, _ in batches)
                raise NodeError(
                    f"the node cannot write its journal in {self.data_dir} ({exc}); "
                    "it stopped accepting batches: fix the disk and restart it"
                ) from exc
        else:
            for batch, resub in batches:
                self._push(batch, resub, journaled=journal is None)
        self._wake.set()

    # --- transaction dependencies (Sawtooth's pending queue) -------------------------

    def _missing_dependencies(self, batch: ParsedBatch) -> set[str]:
        """Dependencies neither committed nor earlier in the same batch."""
        missing: set[str] = set()
        earlier: set[str] = set()
        for tx in batch.transactions:
            for dep in tx.header.dependencies:
                if dep not in earlier and dep not in self._committed_txs:
                    missing.add(dep)
            earlier.add(tx.header_signature)
        return missing

    def _hold(self, batch: ParsedBatch, resub: TxFingerprint | None, missing: set[str]) -> None:
        bid = batch.header_signature
        self._held[bid] = (batch, resub, missing)
        for dep in missing:
            self._waiting_on[dep].append(bid)

    def _release(
        self, committed_txs: Iterable[str]
    ) -> list[tuple[ParsedBatch, TxFingerprint | None]]:
        released = []
        for tx in committed_txs:
            for bid in self._waiting_on.pop(tx, ()):
                held = self._held.get(bid)
                if held is None:
                    continue
                held[2].discard(tx)
                if not held[2]:
                    del self._held[bid]
                    released.append((held[0], held[1]))
        return released

    def _on_durable(self, records: Sequence[Record]) -> None:
        for record in records:
            pushed = self._to_push.pop(record.seq, None)
            if pushed is not None:  # None: written at commit (ephemeral mode)
                self._push(pushed[0], pushed[1], journaled=True)

    def _push(
        self, batch: ParsedBatch, resubmission: TxFingerprint | None, *, journaled: bool
    ) -> None:
        self._pushed += 1
        self._tx_ids[batch.header_signature] = batch.transaction_ids
        if not journaled:
            self._unjournaled[self._pushed] = (batch.serialized, resubmission)
        self.machine.submit(batch_candidate(batch, self._registry), resubmission)

    # --- driving ------------------------------------------------------------------

    async def _drive(self) -> None:
        while not self._closed:
            timeout = 1.0
            if self._next_commit_at is not None:
                timeout = max(0.0, min(timeout, (self._next_commit_at - self._clock()) / 1000))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            try:
                while not self.machine.run(_SLICE):
                    await self._commit_ready()
                    await asyncio.sleep(0)
                await self._commit_ready()
                await self._maybe_snapshot()
            except Exception:
                log.exception("the node's driver failed; the node stops accepting batches")
                self._closed = True
                raise

    async def _commit_ready(self) -> None:
        ready, self._next_commit_at = self.ledger.take_ready(self._clock())
        if not ready:
            return
        journal = self._journal
        if journal is not None and self._unjournaled:
            items = [self._unjournaled.pop(slot.seq) for slot in ready]
            await journal.append(items)
        events = self.ledger.commit(ready)
        for slot in ready:
            if slot.summary is None:  # disregarded by the worker: it was already ordered
                self._pending_ids.discard(slot.tx_id)
        newly_committed: list[str] = []
        for event in events:
            bid = event.info.id
            txs = self._tx_ids.pop(bid, ())
            if event.info.status == COMMITTED:
                self._committed_txs.update(txs)
                newly_committed.extend(txs)
            self._pending_ids.discard(bid)
            for fut in self._waiters.pop(bid, ()):
                if not fut.done():
                    fut.set_result(None)
        if events:
            self._events.extend(
                (e.seq, e.info.id, e.info.invalid_transactions or e.info.status) for e in events
            )
            self.blocks.extend(events)
            signal, self._event_signal = self._event_signal, asyncio.Event()
            signal.set()
        if self._held and newly_committed:
            await self._admit(self._release(newly_committed))

    async def _maybe_snapshot(self, *, force: bool = False) -> None:
        journal = self.data_dir is not None and self._journal
        if not journal:
            return
        records = self.ledger.committed
        if records == self._snapshot_records:
            return
        due = self._clock() - self._snapshot_at >= _SNAPSHOT_INTERVAL_MS
        if not force and not due and records - self._snapshot_records < self._snapshot_every:
            return
        await self._snapshot()

    async def snapshot(self) -> None:
        """Write a snapshot of what has committed so far (a no-op without a data dir)."""
        if self._journal is not None:
            await self._snapshot()

    async def _snapshot(self) -> None:
        async with self._snapshot_lock:  # one writer of snapshot.bin at a time
            await self._write_snapshot()

    async def _write_snapshot(self) -> None:
        journal = self._journal
        assert journal is not None and self.data_dir is not None
        content = {
            "records": self.ledger.committed,
            "state": self.ledger.state,
            "statuses": self.ledger.statuses,
            "event_seq": self.ledger.event_seq,
            "last_batch": self.blocks.last_batch_id,
            "committed_txs": self._committed_txs,
            "batch": self.machine.worker.batch_number + 1,
        }
        blob = encode_snapshot(content)
        records = self.ledger.committed
        await asyncio.to_thread(write_snapshot, self.data_dir, blob)
        self._snapshot_records = records
        self._snapshot_at = self._clock()
        if not journal.flushing:
            journal.open_segment()
            journal.drop_covered(records)

    # --- reading ------------------------------------------------------------------

    def status(self, batch_id: str) -> BatchStatusInfo:
        stored = self.ledger.statuses.get(batch_id)
        if stored is not None and batch_id not in self._pending_ids:
            return final_info(batch_id, stored)
        if batch_id in self._pending_ids:
            return BatchStatusInfo(batch_id, PENDING)
        return BatchStatusInfo(batch_id, UNKNOWN)

    async def batch_statuses(
        self, ids: Iterable[str], wait: float | None = None
    ) -> dict[str, BatchStatusInfo]:
        """Statuses by id; with ``wait`` (seconds, capped at 300), until all are final."""
        ids = list(dict.fromkeys(ids))
        if wait:
            futures = []
            loop = asyncio.get_running_loop()
            for bid in ids:
                if self.status(bid).status in (PENDING, UNKNOWN):
                    fut: asyncio.Future[None] = loop.create_future()
                    self._waiters[bid].append(fut)
                    futures.append((bid, fut))
            if futures:
                try:
                    await asyncio.wait([f for _, f in futures], timeout=min(wait, _WAIT_CAP_S))
                finally:
                    for bid, fut in futures:
                        if not fut.done():
                            fut.cancel()
                            waiting = self._waiters.get(bid)
                            if waiting is not None:
                                with contextlib.suppress(ValueError):
                                    waiting.remove(fut)
                                if not waiting:
                                    del self._waiters[bid]
        return {bid: self.status(bid) for bid in ids}

    async def get_state(self, address: str) -> bytes | None:
        """The committed value at a full address, or ``None``."""
        return self.ledger.state.get(address)

    async def list_state(self, prefix: str = "") -> list[tuple[str, KVSDatum]]:
        """Committed entries whose address starts with ``prefix``, sorted by address."""
        return sorted((a, v) for a, v in self.ledger.state.items() if a.startswith(prefix))

    async def request_logs(self, fingerprint: TxFingerprint) -> ExecutionSummary | None:
        """``RequestLogs`` to the worker; its ``SendLog`` answer (``None`` if unknown)."""
        self.machine.send(WORKER, RequestLogs(fingerprint))
        self.machine.run()
        self._wake.set()
        answer = self.ledger.logs.pop(fingerprint, None)
        return None if answer is None else answer.summary

    def fingerprint_of(self, batch_id: str) -> TxFingerprint | None:
        return self.machine.worker.ordered(batch_id)

    @property
    def head(self) -> str:
        """A stand-in for Sawtooth's chain head: the number of commits, as 128 hex digits."""
        return f"{self.ledger.event_seq:0128x}"

    async def subscribe(self, after: int | None = None) -> AsyncIterator[StatusEvent]:
        """Final-status events with ``seq > after`` (default: from now on), as they happen.

        Events older than the buffer (``event_buffer``) are gone; a resume
        from before them starts at the oldest kept.
        """
        last = self.ledger.event_seq if after is None else after
        while True:
            events = self._events
            if events and events[-1][0] > last:
                start = max(0, last + 1 - events[0][0])
                for seq, bid, stored in list(islice(events, start, None)):
                    last = seq
                    yield StatusEvent(seq, final_info(bid, stored))
                continue
            if self._closed:
                return
            signal = self._event_signal
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signal.wait(), 15)

    async def follow_blocks(self, after: int | None = None) -> AsyncGenerator[Block, None]:
        """Blocks (commits) numbered above ``after`` (default: from now on), as they happen.

        Ends when the node closes. A follower slower than ``block_buffer``
        blocks skips to the oldest kept.
        """
        last = self.ledger.event_seq if after is None else after
        while True:
            blocks = self.blocks.after(last)
            if blocks:
                for block in blocks:
                    last = block.num
                    yield block
                continue
            if self._closed:
                return
            signal = self._event_signal
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signal.wait(), 15)

    # --- closing ------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the driver, write a snapshot, close the journal."""
        if self._closed and self._driver is None:
            return
        self._closed = True
        self._wake.set()
        signal, self._event_signal = self._event_signal, asyncio.Event()
        signal.set()
        if self._driver is not None:
            driver, self._driver = self._driver, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(driver, 30)
        if self._journal is not None:
            await self._maybe_snapshot(force=True)
            self._journal.close()
        for futures in self._waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
