"""The one place the pipeline writes batch state on behalf of a service.

The submitter and the follower never call the store directly: every change
they make to a batch (taken for submission, accepted, delayed, rejected,
ambiguous, and every status the ledger reports) goes through
:class:`Recorder`. That keeps the mapping from ledger outcomes to store
states in one module, and gives high availability one place to add fencing
(every write conditional on still holding the service's claim).

Under high availability every write is fenced (see ``docs/ha.md``): the
recorder is built with ``fences`` (service id → the claim's
:class:`~ledgerq.model.Fence`, or None when this instance does not hold it).
A submission's writes all carry the fence it was taken under, so nothing it
records lands once the claim moved on, even if this instance took the
service back since; a write for a service not held raises
:class:`~ledgerq.errors.FencedOffError` without touching the store. A
ledger status the follower read for a service no longer held is dropped (the
new holder's follower reads it too).

After a write that frees a service for its next batch (a final status,
``Unknown``, ``Delayed``) the recorder calls every registered *unlock
listener* with the service id, in the same task, so the queue source can
hand out that service's next batch at once instead of at its next poll.

Store states written (seed *one-round serial queuer*, with the ask-before-resend
rule of ``docs/gateway.md``, "Ambiguous submissions"):

========================  ==================================================
event                     batch afterwards
========================  ==================================================
taken for submission      ``{submitted, None}`` (or its old status)
ledger accepted           ``{submitted, Pending}``
busy after every retry    ``{not submitted, Delayed}``, attempt time kept
unjudged after retries    ``{not submitted, Delayed}``, error ``http_<status>``
                          (a 404, 401/403, a proxy's 4xx: never final)
ledger rejected           ``Invalid`` with the ledger's message (final): only
                          a judgement of the batch (Sawtooth's rejection
                          codes, Splinter's batch-level rejection)
ambiguous failure         ``{submitted}``, status kept, submission error
                          ``ambiguous``: the service stays locked, the batch
                          is not queued; the ledger is asked at once
ledger: COMMITTED         ``Committed`` (final)
ledger: INVALID           ``Invalid`` with its transactions (final)
ledger: PENDING           ``{submitted, Pending}``
ledger: VALID (Splinter)  ``{submitted, Pending}``: not final, followed until
                          Committed (clients see ``PENDING``)
ledger: UNKNOWN           ``{not submitted, Unknown}``: queued again, first
========================  ==================================================

Under the parallel queuer (``docs/queuer.md``) the same events write the
same states, per batch instead of per service: a service's batches that do
not conflict are in flight together, each recorded as above. One state is
not written here but kept by the store in the transaction of the write that
changes it:

========================  ==================================================
event                     batch afterwards
========================  ==================================================
accepted while an earlier ``{not submitted, None}``, *held*: ``blocked_by``
open batch conflicts      names the latest such batch; not queued
the batch it is held by   ``blocked_by`` recomputed: the next earlier open
becomes final             conflicting batch, or none (queued)
========================  ==================================================

A write that makes a batch final (or ``Unknown``, ``Delayed``) wakes its
service as before; under the parallel queuer that is also what releases the
batches it held.

``Unknown`` is written only when the *ledger* says UNKNOWN; an ambiguous
outcome (timeout, reset after sending, a 5xx other than 503, a POST
abandoned because the claim is lapsing) never clears ``submitted``, so
nothing is resent before the ledger was asked. After recording one, the
recorder calls every *ask listener* with the batch and service ids: the
follower asks the ledger about that batch at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ledgerq.clock import Clock, now_ms
from ledgerq.errors import FencedOffError, LedgerqError
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    Fence,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TrackingBatch,
    TransactionReceipt,
    Valid,
)

log = logging.getLogger(__name__)

#: Next batches read ahead (``Recorder.accepted``) kept at most.
_MAX_READ_AHEAD = 100_000

UnlockListener = Callable[[str], None]
FenceSource = Callable[[str], Fence | None]
AcceptListener = Callable[[str, str], None]
AskListener = Callable[[str, str], None]


class NextTake(Protocol):
    """A submission slot reserved for a service's next batch (the submitter's)."""

    def hold(self, batch: TrackingBatch) -> None:
        """``batch`` is about to be recorded taken: nothing else may take or ask about it."""
        ...

    def start(self) -> None:
        """The store shows the held batch taken: submit it (POST, no further write first)."""
        ...

    def cancel(self) -> None:
        """Nothing was taken: the slot and the service are free again."""
        ...


class NextTaker(Protocol):
    """Who submits a batch recorded taken with its predecessor's final status."""

    def reserve(self, service_id: str) -> NextTake | None:
        """A slot for the service's next batch, or ``None`` when the usual path
        must decide (no slot, the service busy or not serial, stopping...)."""
        ...

    def takes_next(self, service_id: str) -> bool:
        """Whether :meth:`reserve` can ever give ``service_id`` a slot (a
        serial service): if not, its next batch is not read ahead."""
        ...

    def reserve_freed(self, service_id: str, most: int) -> FreedTake | None:
        """Up to ``most`` slots for the batches a final status of the
        parallel service ``service_id`` frees, or ``None`` (not parallel, no
        slot, stopping...)."""
        ...


class FreedTake(Protocol):
    """Submission slots reserved for the batches a final status frees (the
    submitter's): :meth:`Submitter.reserve_freed`."""

    #: How many batches the final status may take.
    slots: int

    def start(self, batches: list[TrackingBatch]) -> None:
        """The store shows ``batches`` taken: submit each (POST, no further
        write first); the slots left over are free again."""
        ...

    def cancel(self) -> None:
        """Nothing was taken: every slot is free again."""
        ...


#: Batches a parallel service's final status takes along at most (the rest
#: of what it frees, if any, come from the queue source).
FREED_TAKE = 4


class FusedWriter(Protocol):
    """The store role of the commit → next POST merge (the group writer's)."""

    async def next_open_batch(self, service_id: str, after: str) -> TrackingBatch | None: ...

    async def status_then_take(
        self,
        id: str,
        service_id: str,
        status: BatchStatus,
        transaction_receipts: list[TransactionReceipt],
        next_batch_id: str,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> bool: ...

    @property
    def takes_freed(self) -> bool:
        """Whether :meth:`status_then_take_freed` can take anything."""
        ...

    async def status_then_take_freed(
        self,
        id: str,
        service_id: str,
        status: BatchStatus,
        transaction_receipts: list[TransactionReceipt],
        take: int,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> list[TrackingBatch]: ...


class StatusWriter(Protocol):
    """The store role the recorder needs."""

    async def change_batch_to_submitted(
        self,
        batch_id: str,
        service_id: str,
        transaction_receipts: list[TransactionReceipt] | None = None,
        dlt_status: str | BatchStatusName | None = None,
        submission_error: SubmissionError | None = None,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> None: ...

    async def update_batch_status(
        self,
        id: str,
        service_id: str,
        status: BatchStatus | None,
        transaction_receipts: list[TransactionReceipt] | None = None,
        submission_error: SubmissionError | None = None,
        *,
        now: int | None = None,
        fence: Fence | None = None,
    ) -> None: ...


def receipts_of(status: BatchStatus) -> list[TransactionReceipt]:
    """The receipts recorded with a ledger status (the recorder's, and a
    take-over's recording its answers on the claim thread)."""
    if isinstance(status, Invalid):
        return [
            TransactionReceipt(
                transaction_id=t.transaction_id,
                result_valid=False,
                error_message=t.error_message,
                error_data=t.error_data,
                external_status=t.external_error_status,
                external_error_message=t.external_error_message,
            )
            for t in status.transactions
        ]
    if status.name in (BatchStatusName.COMMITTED, BatchStatusName.VALID):
        txs = getattr(status, "transactions", ())
        return [TransactionReceipt(t.transaction_id, result_valid=True) for t in txs]
    return []


class _InOrder:
    """The per-batch write lock of :meth:`Recorder._in_order`: ``order`` maps a
    batch id to ``[lock, users]`` while any write of it is under way. A plain
    class rather than a generator-based context manager: it is entered on
    every write of every batch."""

    __slots__ = ("_batch_id", "_entry", "_order")

    def __init__(self, order: dict[str, list[Any]], batch_id: str) -> None:
        self._order = order
        self._batch_id = batch_id
        entry = order.get(batch_id)
        if entry is None:
            entry = order[batch_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        self._entry = entry

    def _leave(self) -> None:
        entry = self._entry
        entry[1] -= 1
        if entry[1] == 0:
            del self._order[self._batch_id]

    async def __aenter__(self) -> None:
        try:
            await self._entry[0].acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._entry[0].release()
        self._leave()


class Recorder:
    def __init__(
        self, store: StatusWriter, *, clock: Clock = now_ms, fences: FenceSource | None = None
    ) -> None:
        self._store = store
        self._clock = clock
        self._fences = fences
        # The fence each submission in progress was taken under.
        self._acting: dict[tuple[str, str], Fence] = {}
        self._listeners: list[UnlockListener] = []
        self._moved_on: list[UnlockListener] = []
        self._accept_listeners: list[AcceptListener] = []
        self._ask_listeners: list[AskListener] = []
        # Per batch: a lock and how many writes use it. This process's writes
        # of one batch land in the order they were made (a group commit would
        # otherwise let a later one overtake an earlier one still in flight).
        self._order: dict[str, list[Any]] = {}
        self._next_taker: NextTaker | None = None
        self._fused: FusedWriter | None = None
        #: Per batch at the ledger: its service's next batch, read ahead.
        self._next_of: dict[str, TrackingBatch] = {}
        #: Read-aheads under way, by the id of the batch at the ledger.
        self._reading: dict[str, asyncio.Task[TrackingBatch | None]] = {}
        #: Batches being recorded accepted: done once their submission ended.
        self._accepting: dict[str, asyncio.Future[None]] = {}

    def set_next_taker(self, taker: NextTaker, writer: FusedWriter) -> None:
        """Merge the commit → next POST path (``docs/gateway.md``): when the
        ledger says a batch is final, the same store transaction records the
        service's next batch taken (if it is the serial queuer's choice and
        ``taker`` reserves a slot for it), and ``taker`` submits it once that
        transaction committed."""
        self._next_taker = taker
        self._fused = writer

    def add_unlock_listener(self, listener: UnlockListener) -> None:
        """``listener(service_id)`` after a write that lets the service move on."""
        self._listeners.append(listener)

    def add_moved_on_listener(self, listener: UnlockListener) -> None:
        """``listener(service_id)`` after a write that made a batch final and
        took the service's next batch along (:meth:`set_next_taker`): the
        service moved on but stays locked, so unlock listeners are not called."""
        self._moved_on.append(listener)

    def add_accept_listener(self, listener: AcceptListener) -> None:
        """``listener(batch_id, service_id)`` once a batch is recorded ``Pending``."""
        self._accept_listeners.append(listener)

    def add_ask_listener(self, listener: AskListener) -> None:
        """``listener(batch_id, service_id)`` once a batch is recorded ambiguous:
        the ledger must be asked about it before anything else of its service moves."""
        self._ask_listeners.append(listener)

    def _fence(self, service_id: str) -> Fence | None:
        """The fence to write under now (None without HA)."""
        if self._fences is None:
            return None
        fence = self._fences(service_id)
        if fence is None:
            raise FencedOffError(
                f"this instance holds no valid claim on service {service_id!r}; nothing was "
                "written: the service's current holder takes care of it"
            )
        return fence

    def submission_fence(self, batch: TrackingBatch) -> Fence | None:
        """The fence ``batch``'s submission in progress was taken under (None without HA)."""
        return self.fence_of(batch.service_id, batch.batch_id)

    def fence_of(self, service_id: str, batch_id: str) -> Fence | None:
        """The fence the submission in progress of that batch was taken under."""
        return self._acting.get((service_id, batch_id))

    def _submission_fence(self, batch: TrackingBatch) -> Fence | None:
        fence = self._acting.pop((batch.service_id, batch.batch_id), None)
        return fence if fence is not None else self._fence(batch.service_id)

    def _in_order(self, batch_id: str) -> _InOrder:
        """Hold ``batch_id``'s writes in the order they were made.

        An ``UNKNOWN`` answer whose write is still in flight when the queue
        hands the batch out again must land before that submission's
        attempt, not after it: landing after, it would clear ``submitted``
        on a batch the ledger now holds, and free it for a second, unasked
        resend. (Taken without yielding when free, so the order is the order
        of the calls.)
        """
        return _InOrder(self._order, batch_id)

    def _unlocked(self, service_id: str) -> None:
        for listener in self._listeners:
            listener(service_id)

    # -- submitter -----------------------------------------------------------

    async def submitting(self, batch: TrackingBatch) -> None:
        """The submitter took ``batch``: ``submitted`` guards it from the queuer.

        Raises :class:`~ledgerq.errors.FencedOffError` (do not POST) when this
        instance does not hold the service's claim.
        """
        fence = self._fence(batch.service_id)
        async with self._in_order(batch.batch_id):
            await self._store.change_batch_to_submitted(
                batch.batch_id, batch.service_id, None, None, None, now=self._clock(), fence=fence
            )
        if fence is not None:
            self._acting[(batch.service_id, batch.batch_id)] = fence

    async def accepted(self, batch: TrackingBatch) -> None:
        """The ledger accepted ``batch``: it is followed from now on (its
        status read parked at once), and recorded ``Pending``.

        The read is not held up by the write: it is at the ledger before the
        batch can be committed there (20 ms after accepting, say), even when
        the write waits for a group or two. Its answer waits for the write
        instead (:meth:`ledger_status`), so the batch's writes land in order
        and its submission has ended when the answer is applied. The
        submitter hands the batch over (no longer ``held``) before calling
        this.
        """
        fence = self._submission_fence(batch)
        recorded = asyncio.get_running_loop().create_future()
        self._accepting[batch.batch_id] = recorded
        try:
            for listener in self._accept_listeners:
                listener(batch.batch_id, batch.service_id)
            if (
                self._fused is not None
                and self._next_taker is not None
                and self._next_taker.takes_next(batch.service_id)
            ):
                # While the batch waits at the ledger, not once it is final (the
                # store's check at the take decides whether this is still the
                # pick), and in a task of its own: the submission must end now.
                task = asyncio.get_running_loop().create_task(
                    self._read_next(batch.service_id, batch.batch_id)
                )
                self._reading[batch.batch_id] = task
                task.add_done_callback(lambda _t: self._reading.pop(batch.batch_id, None))
            await self._write(batch.batch_id, batch.service_id, Pending(), None, fence)
        finally:
            # Set as the submission ends (the submitter does nothing after this
            # returns but free its slot and the service), so an answer waiting
            # for it finds the service free for its next batch.
            del self._accepting[batch.batch_id]
            recorded.set_result(None)

    async def _read_next(self, service_id: str, batch_id: str) -> TrackingBatch | None:
        assert self._fused is not None
        try:
            nxt = await self._fused.next_open_batch(service_id, batch_id)
        except LedgerqError as exc:
            log.warning("cannot read the next batch of service %s: %s", service_id, exc)
            return None
        if nxt is not None:
            if len(self._next_of) >= _MAX_READ_AHEAD:
                self._next_of.clear()  # batches no longer followed here, say
            self._next_of[batch_id] = nxt
        return nxt

    async def delayed(self, batch: TrackingBatch, message: str, error_type: str = "busy") -> None:
        """Nothing was queued at the ledger (busy, unreachable, or refused unjudged):
        the service rests for the delay window, then the batch is sent again."""
        # Recorded as an attempt, so its time (which starts the delay window)
        # is the end of the retries, not the start.
        fence = self._submission_fence(batch)
        async with self._in_order(batch.batch_id):
            await self._store.change_batch_to_submitted(
                batch.batch_id,
                batch.service_id,
                None,
                BatchStatusName.DELAYED,
                SubmissionError(error_type, message),
                now=self._clock(),
                fence=fence,
            )
        self._unlocked(batch.service_id)

    async def rejected(self, batch: TrackingBatch, status: int, message: str) -> None:
        # The rejection concerns the whole batch: record it against every
        # transaction, as Grid records external errors.
        txs = tuple(
            InvalidTransaction(
                transaction_id=t.transaction_header,
                external_error_status=str(status),
                external_error_message=message,
            )
            for t in batch.transactions
        )
        await self._write(
            batch.batch_id,
            batch.service_id,
            Invalid(txs),
            SubmissionError(f"http_{status}", message),
            self._submission_fence(batch),
        )

    async def ambiguous(self, batch: TrackingBatch, message: str) -> None:
        """The ledger may or may not have ``batch``: keep it ``submitted`` (its
        service locked, the batch not queued) and have the ledger asked."""
        fence = self._submission_fence(batch)
        async with self._in_order(batch.batch_id):
            await self._store.update_batch_status(
                batch.batch_id,
                batch.service_id,
                None,
                [],
                SubmissionError("ambiguous", message),
                now=self._clock(),
                fence=fence,
            )
        for listener in self._ask_listeners:
            listener(batch.batch_id, batch.service_id)

    # -- follower -------------------------------------------------------------

    def _freed_take(self, service_id: str) -> FreedTake | None:
        """Slots for what a final status of ``service_id`` frees, when the
        store and the submitter take them along (a parallel service, on a
        store that can): see :meth:`_final_then_freed`."""
        if self._fused is None or self._next_taker is None or not self._fused.takes_freed:
            return None
        return self._next_taker.reserve_freed(service_id, FREED_TAKE)

    async def ledger_status(self, service_id: str, status: LedgerBatchStatus) -> None:
        """Apply what the ledger said about one batch of ``service_id``.

        Splinter's ``Valid`` (validated, not committed) is written ``Pending``:
        it is not final, and the batch is followed until ``Committed``.
        """
        written = Pending() if isinstance(status.status, Valid) else status.status
        recording = self._accepting.get(status.batch_id)
        if recording is not None:
            # Answered while its submission still records it accepted (the
            # read went out first): that write lands first, and the service
            # is free for its next batch once the submission has ended.
            await asyncio.shield(recording)
        ahead = (
            None
            if written.name is BatchStatusName.PENDING
            else self._next_of.pop(status.batch_id, None)
        )
        try:
            fence = self._fence(service_id)
            if written.is_final and ahead is None and status.batch_id in self._reading:
                # Read ahead, not back yet: sooner than the usual path's two commits.
                ahead = await asyncio.shield(self._reading[status.batch_id])
                self._next_of.pop(status.batch_id, None)
            freed = None
            if written.is_final and ahead is None and self._next_taker is not None:
                freed = self._freed_take(service_id)
            if freed is not None:
                await self._final_then_freed(status.batch_id, service_id, written, fence, freed)
            elif written.is_final and self._next_taker is not None:
                await self._final_then_next(status.batch_id, service_id, written, fence, ahead)
            else:
                await self._write(status.batch_id, service_id, written, None, fence)
        except FencedOffError as exc:
            log.info("status of batch %s not recorded: %s", status.batch_id[:16], exc)

    async def _final_then_next(
        self,
        batch_id: str,
        service_id: str,
        status: BatchStatus,
        fence: Fence | None,
        nxt: TrackingBatch | None,
    ) -> None:
        """Write ``status`` (final) and, in the same transaction, ``nxt`` (the
        service's next batch, read ahead while this one waited at the ledger)
        taken; then hand ``nxt`` to the submitter.

        Both rules of the two writes this replaces still hold, since they land
        together: the final status is durable before the next batch is posted,
        and the next batch's ``submitted`` before its POST. Whatever does not
        fit (nothing read ahead, no slot, the store finding another pick by
        the time the group runs) falls back to the usual path: the final
        status alone, then the queue source's pick. Nothing is read here: the
        final status never waits for a read.
        """
        assert self._next_taker is not None and self._fused is not None
        take = None if nxt is None else self._next_taker.reserve(service_id)
        if nxt is None or take is None:
            await self._write(batch_id, service_id, status, None, fence)
            return
        landed = False
        try:
            take.hold(nxt)
            async with self._in_order(batch_id), self._in_order(nxt.batch_id):
                landed = await self._fused.status_then_take(
                    batch_id,
                    service_id,
                    status,
                    receipts_of(status),
                    nxt.batch_id,
                    now=self._clock(),
                    fence=fence,
                )
        finally:
            if not landed:
                take.cancel()
        if not landed:
            self._unlocked(service_id)
            return
        if fence is not None:
            self._acting[(service_id, nxt.batch_id)] = fence
        take.start()
        for listener in self._moved_on:
            listener(service_id)

    async def _final_then_freed(
        self,
        batch_id: str,
        service_id: str,
        status: BatchStatus,
        fence: Fence | None,
        take: FreedTake,
    ) -> None:
        """Write ``status`` (final) and, in the same transaction, the batches
        it frees (those it held, free once it is final: a parallel service's)
        taken; then hand them to the submitter.

        The parallel strategy's form of the commit → next POST merge
        (``docs/queuer.md``): the final status is durable before a batch it
        held is posted, and each such batch's ``submitted`` before its POST,
        as with the two writes and the round this replaces. A batch held until
        this transaction was never offered by a round, so nothing else takes
        it. When it took as many as it could, more may be free: the queue
        source is woken as usual; when it took none, too.
        """
        assert self._fused is not None
        taken: list[TrackingBatch] = []
        try:
            async with self._in_order(batch_id):
                taken = await self._fused.status_then_take_freed(
                    batch_id,
                    service_id,
                    status,
                    receipts_of(status),
                    take.slots,
                    now=self._clock(),
                    fence=fence,
                )
        except BaseException:
            take.cancel()
            raise
        if fence is not None:
            for b in taken:
                self._acting[(service_id, b.batch_id)] = fence
        take.start(taken)
        if not taken or len(taken) >= take.slots:
            self._unlocked(service_id)
        else:
            for listener in self._moved_on:
                listener(service_id)

    async def _write(
        self,
        batch_id: str,
        service_id: str,
        status: BatchStatus,
        error: SubmissionError | None,
        fence: Fence | None,
    ) -> None:
        async with self._in_order(batch_id):
            await self._store.update_batch_status(
                batch_id,
                service_id,
                status,
                receipts_of(status),
                error,
                now=self._clock(),
                fence=fence,
            )
        if status.is_final or status.name in (BatchStatusName.UNKNOWN, BatchStatusName.DELAYED):
            self._unlocked(service_id)
