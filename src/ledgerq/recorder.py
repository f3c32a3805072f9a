"""The one place the pipeline writes batch state on behalf of a service.

The submitter and the monitor never call the store directly: every change
they make to a batch (taken for submission, accepted, delayed, rejected,
ambiguous, and every status the ledger reports) goes through
:class:`Recorder`. That keeps the mapping from ledger outcomes to store
states in one module, and gives high availability one place to add fencing
(every write conditional on still holding the service's claim).

After a write that frees a service for its next batch (a final status,
``Unknown``, ``Delayed``) the recorder calls every registered *unlock
listener* with the service id, in the same task, so the queue source can
hand out that service's next batch at once instead of at its next poll.

Store states written (seed *one-round serial queuer*):

========================  ==============================================
event                     batch afterwards
========================  ==============================================
taken for submission      ``{submitted, None}`` (or its old status)
ledger accepted           ``{submitted, Pending}``
busy after every retry    ``{not submitted, Delayed}``, attempt time kept
ledger rejected (4xx)     ``Invalid`` with the ledger's message (final)
ambiguous failure         ``{not submitted, Unknown}``: asked, then resent
ledger: COMMITTED         ``Committed`` (final)
ledger: INVALID           ``Invalid`` with its transactions (final)
ledger: PENDING           ``{submitted, Pending}``
ledger: UNKNOWN           ``{not submitted, Unknown}``
========================  ==============================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from ledgerq.clock import Clock, now_ms
from ledgerq.dlt.base import LedgerBatchStatus
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TrackingBatch,
    TransactionReceipt,
    Unknown,
)

log = logging.getLogger(__name__)

UnlockListener = Callable[[str], None]
AcceptListener = Callable[[str, str], None]


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
    ) -> None: ...


def _receipts(status: BatchStatus) -> list[TransactionReceipt]:
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


class Recorder:
    def __init__(self, store: StatusWriter, *, clock: Clock = now_ms) -> None:
        self._store = store
        self._clock = clock
        self._listeners: list[UnlockListener] = []
        self._accept_listeners: list[AcceptListener] = []

    def add_unlock_listener(self, listener: UnlockListener) -> None:
        """``listener(service_id)`` after a write that lets the service move on."""
        self._listeners.append(listener)

    def add_accept_listener(self, listener: AcceptListener) -> None:
        """``listener(batch_id, service_id)`` once a batch is recorded ``Pending``."""
        self._accept_listeners.append(listener)

    def _unlocked(self, service_id: str) -> None:
        for listener in self._listeners:
            listener(service_id)

    # -- submitter -----------------------------------------------------------

    async def submitting(self, batch: TrackingBatch) -> None:
        """The submitter took ``batch``: ``submitted`` guards it from the queuer."""
        await self._store.change_batch_to_submitted(
            batch.batch_id, batch.service_id, None, None, None, now=self._clock()
        )

    async def accepted(self, batch: TrackingBatch) -> None:
        await self._write(batch.batch_id, batch.service_id, Pending(), None)
        for listener in self._accept_listeners:
            listener(batch.batch_id, batch.service_id)

    async def delayed(self, batch: TrackingBatch, message: str) -> None:
        # Recorded as an attempt, so its time (which starts the delay window)
        # is the end of the retries, not the start.
        await self._store.change_batch_to_submitted(
            batch.batch_id,
            batch.service_id,
            None,
            BatchStatusName.DELAYED,
            SubmissionError("busy", message),
            now=self._clock(),
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
        )

    async def ambiguous(self, batch: TrackingBatch, message: str) -> None:
        await self._write(
            batch.batch_id, batch.service_id, Unknown(), SubmissionError("ambiguous", message)
        )

    # -- monitor -------------------------------------------------------------

    async def ledger_status(self, service_id: str, status: LedgerBatchStatus) -> None:
        """Apply what the ledger said about one batch of ``service_id``."""
        await self._write(status.batch_id, service_id, status.status, None)

    async def _write(
        self,
        batch_id: str,
        service_id: str,
        status: BatchStatus,
        error: SubmissionError | None,
    ) -> None:
        await self._store.update_batch_status(
            batch_id, service_id, status, _receipts(status), error, now=self._clock()
        )
        if status.is_final or status.name in (BatchStatusName.UNKNOWN, BatchStatusName.DELAYED):
            self._unlocked(service_id)
