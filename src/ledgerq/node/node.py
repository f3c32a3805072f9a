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
import time
from collections import defaultdict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path

from ledgerq.clock import Clock, now_ms
from ledgerq.codec import ParsedBatch, decode_batch
from ledgerq.codec.signing import Signer
from ledgerq.errors import NodeBusyError, NodeError
from ledgerq.node.blocks import Block, BlockLog
from ledgerq.node.candidates import batch_candidate
from ledgerq.node.chain import Sealer, load_or_create_key, seal_store
from ledgerq.node.commit import (
    PENDING,
    UNKNOWN,
    BatchStatusInfo,
    FinalStatus,
    Ledger,
    StatusEvent,
    _Slot,
    final_info,
)
from ledgerq.node.committed import (
    STORE_TXN_COMMITS,
    STORE_TXN_KEYS,
    WRITE_KEYS,
    CommittedView,
)
from ledgerq.node.datadir import DataDirLock, lock_data_dir
from ledgerq.node.disk import CommitRecord, DictStore, LmdbStore, Store
from ledgerq.node.families import FamilyRegistry, default_registry
from ledgerq.node.idfilter import DEFAULT_BLOCKS
from ledgerq.node.journal import Journal, Record
from ledgerq.node.ordering.machine import OrderingMachine
from ledgerq.node.ordering.messages import (
    WORKER,
    ExecutionSummary,
    InvalidTx,
    KVSDatum,
    RequestLogs,
    TxFingerprint,
)
from ledgerq.node.snapshot import import_snapshot

log = logging.getLogger(__name__)

#: Most commits handed to the committed view at once (and so in one store transaction).
COMMIT_PART = STORE_TXN_COMMITS
#: Most commits not yet written to the store before ``submit`` answers busy.
MAX_UNWRITTEN = 10_000

#: The ``resubmission`` stamp of a request the node decided to order again: later than
#: any ordering, so the worker's rule ("not if ordered after the stamp") lets it through.
_ORDER_AGAIN = TxFingerprint(2**62, 0)
_SLICE = 20_000  # messages per driver slice before yielding to the event loop
_WAIT_CAP_S = 300.0


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
        replay_limit: int,
        dedupe_window: int,
        keep_logs: int,
        store_interval_s: float,
        filter_blocks: int,
        clock: Clock,
        registry: FamilyRegistry,
    ) -> None:
        self.data_dir = data_dir
        self.ephemeral = ephemeral
        self.max_pending = max_pending
        self._segment_records = snapshot_every
        self._clock = clock
        self._registry = registry
        self._lock: DataDirLock | None = None
        store: Store
        if data_dir is not None:
            store = LmdbStore(data_dir / "store", filter_blocks=filter_blocks)
            import_snapshot(data_dir, store)
        else:
            store = DictStore()
        self.store = store
        self.committed = CommittedView(
            store, write_interval_s=store_interval_s, on_written=self._on_written
        )
        self.sealer = self._open_chain(load_or_create_key(data_dir))
        meta = store.meta()
        self.ledger = Ledger(
            clock=clock,
            commit_delay_ms=commit_delay_ms,
            submissions=meta.applied,
            event_seq=meta.events,
            height=meta.height,
        )
        self.machine = OrderingMachine(
            self.ledger,
            shards=shards,
            clock=clock,
            first_batch=meta.batch_high + 1,
            base=self.committed.get_state,
            dedupe_window=dedupe_window,
            keep_logs=keep_logs,
        )
        self._journal = Journal(data_dir, self._on_durable) if data_dir is not None else None
        self._pushed = meta.applied
        self._to_push: dict[int, _Admitted] = {}
        self._unjournaled: dict[int, Record] = {}
        self._pending_ids: set[str] = set()
        #: Ordered batches not final yet, by id (for the store once they are).
        self._inflight: dict[str, ParsedBatch] = {}
        #: Transaction id -> the ordered, not yet final batch that holds it.
        self._inflight_txs: dict[str, str] = {}
        #: Held batches: (batch, resubmission, held since (ms), why: the refusal on expiry).
        self._held: dict[str, tuple[ParsedBatch, TxFingerprint | None, int, InvalidTx]] = {}
        self.max_held = 10_000
        self.held_expiry_ms = 300_000
        self.max_waiters = 10_000
        self.max_unwritten = MAX_UNWRITTEN
        self._parked = 0  # futures parked by batch_statuses(wait=)
        #: Transaction id -> held batches to look at again once a batch holding it is final.
        self._waiting_on: defaultdict[str, list[str]] = defaultdict(list)
        self._waiters: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)
        # (seq, batch id, stored status): plain tuples, see ledger.FinalStatus.
        self._events: deque[tuple[int, str, FinalStatus]] = deque(maxlen=event_buffer)
        self.replay_limit = replay_limit
        #: Recent blocks for the websocket (see :mod:`ledgerq.node.blocks`).
        self.blocks = BlockLog(block_buffer, last_id=self.sealer.previous)
        self._event_signal = asyncio.Event()
        self._wake = asyncio.Event()
        self._next_commit_at: int | None = None
        self._closed = False
        #: Why the node stopped accepting batches on its own (a disk it cannot write).
        self._failure: str | None = None
        self._driver: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._segment_first = 0

    def _open_chain(self, key: Signer) -> Sealer:
        """The block sealer, after the genesis block: made now if the store has none
        (a new store, or one a format-1 store was upgraded from, whose blocks are
        sealed now; see :func:`ledgerq.node.chain.seal_store`)."""
        store = self.store
        genesis = store.genesis()
        if genesis is None:
            return seal_store(store, key)
        meta = store.meta()
        last = self.committed.chain_record(meta.height)
        assert last is not None, f"the store has no block {meta.height}"
        return Sealer(key, self.committed.get_node, last.signature)

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
        event_buffer: int = 10_000,
        block_buffer: int = 1_000,
        replay_limit: int = 10_000,
        dedupe_window: int = 100_000,
        keep_logs: int = 100_000,
        store_interval_s: float = 0.2,
        max_held: int = 10_000,
        held_expiry_s: float = 300.0,
        max_waiters: int = 10_000,
        max_unwritten: int = MAX_UNWRITTEN,
        filter_blocks: int = DEFAULT_BLOCKS,
        clock: Clock = now_ms,
        registry: FamilyRegistry | None = None,
    ) -> Node:
        lock = None
        started = time.perf_counter()
        if data_dir is not None:
            data_dir = Path(data_dir)
            lock = lock_data_dir(data_dir)
        try:
            node = cls(
                data_dir,
                shards=shards,
                ephemeral=ephemeral,
                max_pending=max_pending,
                commit_delay_ms=commit_delay_ms,
                snapshot_every=snapshot_every,
                event_buffer=event_buffer,
                block_buffer=block_buffer,
                replay_limit=replay_limit,
                dedupe_window=dedupe_window,
                keep_logs=keep_logs,
                store_interval_s=store_interval_s,
                filter_blocks=filter_blocks,
                clock=clock,
                registry=registry or default_registry(),
            )
            node.max_held = max_held
            node.held_expiry_ms = int(held_expiry_s * 1000)
            node.max_waiters = max_waiters
            node.max_unwritten = max_unwritten
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        node._lock = lock
        loop = asyncio.get_running_loop()
        node._writer = loop.create_task(node._write_store(), name="node-store-writer")
        opened = time.perf_counter()
        try:
            await node._recover()
        except BaseException:
            await node.close()
            raise
        if data_dir is not None:
            log.info(
                "node start-up: store opened in %.2f s, journal replayed in %.2f s",
                opened - started,
                time.perf_counter() - opened,
            )
        node._driver = loop.create_task(node._drive(), name="node-driver")
        return node

    async def _recover(self) -> None:
        journal = self._journal
        if journal is None:
            return
        delay, self.ledger.commit_delay_ms = self.ledger.commit_delay_ms, 0
        replayed = 0
        handling = 0.0  # seconds spent on the records, not in reading the journal
        # Replayed records read the same store pages again and again: keep them mapped.
        self.store.pin_pages(True)
        try:
            for record in journal.replay(self.store.meta().applied):
                began = time.perf_counter()
                batch = decode_batch(record.batch, verify=False)
                self._pending_ids.add(batch.header_signature)
                self._push(_Admitted(batch, record.resubmission, _refusal(record)), journaled=True)
                replayed += 1
                if replayed % COMMIT_PART == 0:
                    self.machine.run()
                    await self._commit_ready()
                handling += time.perf_counter() - began
            began = time.perf_counter()
            self.machine.run()
            await self._commit_ready()
            handling += time.perf_counter() - began
        finally:
            self.store.pin_pages(False)
        self.ledger.commit_delay_ms = delay
        journal.open_segment()
        self._segment_first = journal.last_seq + 1
        if replayed:
            log.info("node recovered %d journal records after the store's last write", replayed)
            log.info(
                "node start-up: %d records replayed, %.2f s on them (the rest reading the journal)",
                replayed,
                handling,
            )

    # --- submitting ---------------------------------------------------------------

    def busy(self) -> str | None:
        """Why no batch at all could be accepted now, or ``None``.

        The checks of :meth:`submit` that need nothing from the batches: the
        REST API asks before it decodes and verifies a body, so a busy node
        answers at once instead of after the signature checks (which the
        client's retry would pay again)."""
        if len(self._pending_ids) >= self.max_pending:
            return (
                f"the node has {len(self._pending_ids)} batches pending (limit "
                f"{self.max_pending}); resubmit once some have committed"
            )
        if len(self._held) >= self.max_held:
            return (
                f"the node holds {len(self._held)} batches waiting on dependencies (limit "
                f"{self.max_held}); resubmit once some have committed or expired"
            )
        # The commits not yet in the store are in memory and a restart replays them:
        # accept no more than the store writer can keep up with.
        if self.committed.unwritten > self.max_unwritten:
            return (
                f"the node's store is {self.committed.unwritten} commits behind; "
                "resubmit in a moment"
            )
        return None

    async def submit(
        self, batches: Sequence[ParsedBatch], *, resubmission: TxFingerprint | None = None
    ) -> None:
        """Accept batches for ordering; returns once they are journaled.

        Batches already pending or final are disregarded (unless
        ``resubmission`` names their latest ordering, see the worker).
        Raises :class:`NodeBusyError` when the pending queue is full.
        """
        if self._closed:
            raise NodeError("the node is closed" if self._failure is None else self._failure)
        fresh: list[ParsedBatch] = []
        seen: set[str] = set()
        for batch in batches:
            bid = batch.header_signature
            if bid in seen or bid in self._pending_ids:
                continue
            if resubmission is None:
                if self.committed.final(bid) is not None:
                    continue
            else:
                # Decided here, once: a journaled resubmission is one the worker orders
                # (see _push), so a replay after a restart reaches the same outcome.
                latest = self.fingerprint_of(bid)
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
        busy = self.busy()
        if busy is not None:
            raise NodeBusyError(busy)
        self._pending_ids.update(seen)
        admitted = [a for a in (self._classify(b, resubmission) for b in fresh) if a is not None]
        await self._admit(admitted)

    def _classify(self, batch: ParsedBatch, resub: TxFingerprint | None) -> _Admitted | None:
        """Admit, refuse or hold a batch (``None``: held), as Sawtooth's block publisher.

        A transaction already committed by another batch refuses the batch
        ("already in the chain"); a dependency not committed, or a transaction
        that another ordered batch holds, holds it until that is settled.
        Runs without awaiting: what it registers is seen by the next caller.
        """
        bid = batch.header_signature
        earlier: set[str] = set()
        blockers: set[str] = set()
        why: InvalidTx | None = None
        for tx in batch.transactions:
            tid = tx.header_signature
            owner = self._committed_by(tid)
            if owner is not None and owner != bid:
                message = (
                    f"Transaction rejected as it is already in the chain: {tid} was "
                    f"committed in batch {owner}"
                )
                return _Admitted(batch, resub, InvalidTx(tid, message))
            holder = self._inflight_txs.get(tid)
            if holder is not None and holder != bid:
                blockers.add(tid)
                why = why or InvalidTx(
                    tid, f"Transaction {tid} is pending in batch {holder}, which did not settle"
                )
            for dep in tx.header.dependencies:
                if dep not in earlier and self.committed.txn(dep) is None:
                    blockers.add(dep)
                    why = why or InvalidTx(
                        tid,
                        f"Transaction rejected due to missing dependency, transaction {tid} "
                        f"depends on {dep}, which did not commit",
                    )
            earlier.add(tid)
        if blockers:
            assert why is not None
            since = self._held[bid][2] if bid in self._held else self._clock()
            self._held[bid] = (batch, resub, since, why)
            for tid in blockers:
                self._waiting_on[tid].append(bid)
            return None
        for tid in batch.transaction_ids:
            self._inflight_txs[tid] = bid
        return _Admitted(batch, resub)

    def _committed_by(self, tx_id: str) -> str | None:
        """The batch that committed a transaction, if one did."""
        where = self.committed.txn(tx_id)
        if where is None:
            return None
        record = self.committed.record(where[0])
        return "" if record is None else record.batch_id

    async def _admit(self, batches: Sequence[_Admitted]) -> None:
        """Journal (durable mode) then hand batches to the worker, in this order."""
        if not batches:
            return
        journal = self._journal
        if journal is not None and not self.ephemeral:
            first = journal.last_seq + 1
            for i, entry in enumerate(batches):
                self._to_push[first + i] = entry
            try:
                await journal.append([entry.record() for entry in batches])
            except OSError as exc:
                # The journal's tail is now unknown: accepting more could lose them.
                for entry in batches:
                    self._forget_pending(entry.batch)
                raise NodeError(
                    self._fail(f"cannot write its journal in {self.data_dir} ({exc})")
                ) from exc
        else:
            for entry in batches:
                self._push(entry, journaled=journal is None)
        self._wake.set()

    def _forget_pending(self, batch: ParsedBatch) -> None:
        bid = batch.header_signature
        self._pending_ids.discard(bid)
        for tid in batch.transaction_ids:
            if self._inflight_txs.get(tid) == bid:
                del self._inflight_txs[tid]

    # --- held batches (Sawtooth's pending queue) ----------------------------------

    def _release(self, final_txs: Iterable[str]) -> list[_Admitted]:
        """Look again at the batches held on transactions of batches now final."""
        released: list[_Admitted] = []
        for tid in final_txs:
            for bid in self._waiting_on.pop(tid, ()):
                held = self._held.get(bid)
                if held is None:
                    continue
                admitted = self._classify(held[0], held[1])
                if admitted is not None:
                    del self._held[bid]
                if admitted is not None:
                    released.append(admitted)
        return released

    def _expire_held(self) -> list[_Admitted]:
        """Held batches past ``held_expiry`` become INVALID, saying what they waited on."""
        deadline = self._clock() - self.held_expiry_ms
        expired = [bid for bid, held in self._held.items() if held[2] <= deadline]
        refused = []
        for bid in expired:
            batch, resub, _, why = self._held.pop(bid)
            seconds = self.held_expiry_ms / 1000
            message = f"{why.message} within {seconds:g} s (held batches expire)"
            refused.append(_Admitted(batch, resub, InvalidTx(why.id, message)))
        return refused

    def _on_durable(self, records: Sequence[Record]) -> None:
        for record in records:
            pushed = self._to_push.pop(record.seq, None)
            if pushed is not None:  # None: written at commit (ephemeral mode)
                self._push(pushed, journaled=True)

    def _push(self, entry: _Admitted, *, journaled: bool) -> None:
        batch = entry.batch
        bid = batch.header_signature
        self._pushed += 1
        self._inflight[bid] = batch
        if entry.refusal is None:
            for tid in batch.transaction_ids:
                self._inflight_txs.setdefault(tid, bid)  # replay registers here
        if not journaled:
            self._unjournaled[self._pushed] = entry.record()
        # A journaled resubmission was decided in submit(): the worker is to order it
        # whatever fingerprints this run gave the earlier orderings (a replay renumbers).
        resubmission = None if entry.resubmission is None else _ORDER_AGAIN
        self.machine.submit(batch_candidate(batch, self._registry, entry.refusal), resubmission)

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
                if self._held:
                    await self._admit(self._expire_held())
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
        for slot in ready:
            if slot.summary is None:  # disregarded by the worker: it was already ordered
                self._pending_ids.discard(slot.tx_id)
        final_txs: list[str] = []
        events: list[StatusEvent] = []
        # To the committed view in parts of at most COMMIT_PART slots and STORE_TXN_KEYS
        # keys, each with the journal point it covers: the store writes no larger
        # transactions than that (see ledgerq.node.committed).
        for slots in self._parts(ready):
            part = self.ledger.commit(slots)
            records: list[CommitRecord] = []
            for event in part:
                bid = event.info.id
                batch = self._inflight.pop(bid, None)
                txs = batch.transaction_ids if batch is not None else ()
                header, signature = b"", ""
                if event.block:
                    header, signature = self.sealer.seal(event.block, bid, event.writes)
                records.append(
                    CommitRecord(
                        event.seq,
                        bid,
                        event.info.invalid_transactions or event.info.status,
                        event.fingerprint,
                        txs,
                        batch.serialized if batch is not None else b"",
                        event.writes,
                        event.block,
                        header,
                        signature,
                    )
                )
                for tid in txs:
                    if self._inflight_txs.get(tid) == bid:
                        del self._inflight_txs[tid]
                final_txs.extend(txs)
                self._pending_ids.discard(bid)
                for fut in self._waiters.pop(bid, ()):
                    if not fut.done():
                        fut.set_result(None)
            self.committed.add(
                records,
                self.ledger.committed,
                self.machine.worker.batch_number,
                self.sealer.take_changes(),
            )
            self.blocks.extend(records)
            events += part
        if self.ledger.last_fingerprint is not None:
            self.machine.forget_through(self.ledger.last_fingerprint)
        if events:
            self._events.extend(
                (e.seq, e.info.id, e.info.invalid_transactions or e.info.status) for e in events
            )
            signal, self._event_signal = self._event_signal, asyncio.Event()
            signal.set()
        if self._held and final_txs:
            await self._admit(self._release(final_txs))

    def _parts(self, ready: list[_Slot]) -> Iterator[list[_Slot]]:
        part: list[_Slot] = []
        keys = 0
        for slot in ready:
            weight = 0
            summary = slot.summary
            if summary is not None:  # as store_keys() will count its record
                batch = self._inflight.get(slot.tx_id)
                txs = 0 if batch is None else len(batch.transaction_ids)
                weight = 2 + txs + WRITE_KEYS * len(summary.values_written)
            if part and (len(part) >= COMMIT_PART or keys + weight > STORE_TXN_KEYS):
                yield part
                part, keys = [], 0
            part.append(slot)
            keys += weight
        if part:
            yield part

    async def snapshot(self) -> None:
        """Write everything committed so far to the store, and wait for it."""
        await self.committed.drain()

    async def _write_store(self) -> None:
        try:
            await self.committed.run()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(f"cannot write its store in {self.data_dir} ({exc})")
            log.debug("the store write that failed", exc_info=True)
            self._wake.set()
            raise

    def _fail(self, why: str) -> str:
        """Stop accepting batches because of ``why`` (logged once, in one line); the
        refusal every later submit gets."""
        if self._failure is None:
            self._failure = (
                f"the node is closed: it {why}; it stopped accepting batches: fix the "
                "disk and restart it"
            )
            log.error("%s", self._failure)
        self._closed = True
        return self._failure

    def _on_written(self, durable: int) -> None:
        """The store holds every record up to ``durable`` for good: drop older segments."""
        journal = self._journal
        if journal is None:
            return
        if journal.last_seq + 1 - self._segment_first >= self._segment_records:
            journal.open_segment()
            self._segment_first = journal.last_seq + 1
        journal.drop_covered(durable)

    # --- reading ------------------------------------------------------------------

    def status(self, batch_id: str) -> BatchStatusInfo:
        if batch_id in self._pending_ids:
            return BatchStatusInfo(batch_id, PENDING)
        stored = self.committed.final(batch_id)
        if stored is not None:
            return final_info(batch_id, stored.status)
        return BatchStatusInfo(batch_id, UNKNOWN)

    async def batch_statuses(
        self, ids: Iterable[str], wait: float | None = None
    ) -> dict[str, BatchStatusInfo]:
        """Statuses by id; with ``wait`` (seconds, capped at 300), until none is PENDING.

        As Sawtooth's ``wait``: returns at once when no requested batch is
        PENDING (UNKNOWN ones are not waited for). At most ``max_waiters``
        futures are parked node-wide; past that a request answers at once.
        """
        ids = list(dict.fromkeys(ids))
        if wait:
            futures = []
            loop = asyncio.get_running_loop()
            pending = [bid for bid in ids if bid in self._pending_ids]
            if self._parked + len(pending) > self.max_waiters:
                pending = []
            for bid in pending:
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters[bid].append(fut)
                futures.append((bid, fut))
            if futures:
                self._parked += len(futures)
                try:
                    await asyncio.wait([f for _, f in futures], timeout=min(wait, _WAIT_CAP_S))
                finally:
                    self._parked -= len(futures)
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

    async def get_state(self, address: str, *, head: int | None = None) -> bytes | None:
        """The committed value at a full address, or ``None``; as of block ``head``
        if given (read from the state's history on disk)."""
        if head is None or head >= self.ledger.height:
            return self.committed.get_state(address)
        return self.committed.get_state_at(address, head)

    async def list_state(
        self, prefix: str = "", *, start: str = "", limit: int = 1000, head: int | None = None
    ) -> list[tuple[str, KVSDatum]]:
        """Up to ``limit`` committed entries under ``prefix`` from ``start``, by address;
        as of block ``head`` if given."""
        if head is None or head >= self.ledger.height:
            return self.committed.state_page(prefix, start, limit)
        return self.committed.state_page_at(prefix, start, limit, head)

    async def request_logs(self, fingerprint: TxFingerprint) -> ExecutionSummary | None:
        """``RequestLogs`` to the worker; its ``SendLog`` answer (``None`` if unknown)."""
        # One message to the worker, delivered now; its SendLog reaches the issuer with
        # the driver's next slice, not by running the whole machine here.
        answer = self.ledger.expect_log(fingerprint)
        self.machine.deliver(WORKER, RequestLogs(fingerprint))
        self._wake.set()
        try:
            log_answer = await asyncio.wait_for(answer, 10)
        finally:
            answer.cancel()
        return log_answer.summary

    @property
    def registry(self) -> FamilyRegistry:
        """The transaction families this node runs."""
        return self._registry

    @property
    def idle(self) -> bool:
        """Nothing pending, held or waited for: closing it now loses no one's work."""
        return not self._pending_ids and not self._held and not self._parked

    def fingerprint_of(self, batch_id: str) -> TxFingerprint | None:
        """The latest ordering of a batch (recent: the worker; older: the store)."""
        found = self.machine.worker.ordered(batch_id)
        if found is not None:
            return found
        stored = self.committed.final(batch_id)
        return None if stored is None else stored.fingerprint

    @property
    def height(self) -> int:
        """The number of the chain's latest block."""
        return self.ledger.height

    @property
    def head(self) -> str:
        """The id of the latest block (as ``/subscriptions`` and ``/blocks`` give it)."""
        return self.sealer.previous

    def get_block(self, num: int) -> Block | None:
        """Block ``num`` of the chain (0: genesis), from memory if recent, else from
        the store."""
        if not 0 <= num <= self.ledger.height:
            return None
        record = self.committed.chain_record(num)
        return None if record is None else Block.of(record)

    def find_block(self, wanted: str) -> Block | None:
        """The block with this id."""
        if len(wanted) != 128:
            return None
        num = self.committed.block_num(wanted)
        return None if num is None else self.get_block(num)

    async def subscribe(self, after: int | None = None) -> AsyncIterator[StatusEvent]:
        """Final-status events with ``seq > after`` (default: from now on), as they happen.

        Events older than the buffer (``event_buffer``) are gone; a resume
        from before them starts at the oldest kept.
        """
        head = self.ledger.event_seq
        last = head if after is None else max(after, head - self.replay_limit, 0)
        while True:
            events = self._events
            if events and events[-1][0] > last:
                while last + 1 < events[0][0]:  # older than the buffer: from the store
                    record = self.committed.record(last + 1)
                    last += 1
                    if record is not None:
                        yield StatusEvent(last, final_info(record.batch_id, record.status))
                    events = self._events
                    if not events:
                        break
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
        head = self.ledger.height
        last = head if after is None else max(after, head - self.replay_limit, 0)
        while True:
            oldest = self.blocks.oldest
            while oldest is not None and last + 1 < oldest:  # from the store
                block = self.get_block(last + 1)
                last += 1
                if block is not None:
                    yield block
                oldest = self.blocks.oldest
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
        """Stop the driver, write the store, close the journal and the store."""
        if self._closed and self._driver is None and self._writer is None:
            return
        self._closed = True
        self._wake.set()
        signal, self._event_signal = self._event_signal, asyncio.Event()
        signal.set()
        try:
            if self._driver is not None:
                driver, self._driver = self._driver, None
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(driver, 30)
            if self._writer is not None:
                writer, self._writer = self._writer, None
                writer.cancel()
                with contextlib.suppress(BaseException):
                    await writer
                if self.committed.failure is None:
                    await self.committed.drain()
        finally:
            if self._journal is not None:
                self._journal.close()
            self.committed.close()
            self.store.close()
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            for futures in self._waiters.values():
                for fut in futures:
                    if not fut.done():
                        fut.set_result(None)
            self._waiters.clear()


class _Admitted:
    """A batch on its way to the worker: how it is to be ordered."""

    __slots__ = ("batch", "refusal", "resubmission")

    def __init__(
        self,
        batch: ParsedBatch,
        resubmission: TxFingerprint | None = None,
        refusal: InvalidTx | None = None,
    ) -> None:
        self.batch = batch
        self.resubmission = resubmission
        self.refusal = refusal

    def record(self) -> Record:
        refusal = self.refusal
        reason = None if refusal is None else f"{refusal.id}\n{refusal.message}"
        return Record(0, self.batch.serialized, self.resubmission, reason)


def _refusal(record: Record) -> InvalidTx | None:
    if record.refusal is None:
        return None
    tid, _, message = record.refusal.partition("\n")
    return InvalidTx(tid, message)
