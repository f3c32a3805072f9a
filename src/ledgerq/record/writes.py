"""What each pipeline event writes: the seed's state machine, in one table.

Every change the pipeline makes to a batch is one
:class:`~ledgerq.model.BatchWrite` built here and applied by the
:class:`~ledgerq.record.completer.Completer`: the producer builds them from a
submission's outcome and from the ledger's statuses, the take-over from the
answers it read. Nothing else decides what a ledger answer means for the
store.

Store states written (seed *one-round serial queuer*, with the
ask-before-resend rule of ``docs/gateway.md``, "Ambiguous submissions"):

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
a dependency failed       ``Invalid``, never posted: every transaction's
                          external error names the failed dependency
waits for a dependency    state unchanged; submission error ``dependency``
                          says what it waits for (the lock reason)
========================  ==================================================

An ``Invalid`` status (from the ledger, a rejection or a failed dependency)
of a service whose ``on_invalid`` is ``halt`` also halts the service, in the
same transaction (``BatchWrite.halt``).

Under the parallel queuer (``docs/queuer.md``) the same events write the
same states, per batch instead of per service. One state is not written
here but kept by the store in the transaction of the write that changes it:
a batch accepted while an earlier open batch of its service conflicts with
it is *blocked* (``blocked_by`` names the latest such batch) and not queued;
once that batch is final, ``blocked_by`` is recomputed.

``Unknown`` is written only when the *ledger* says UNKNOWN; an ambiguous
outcome (timeout, reset after sending, a 5xx other than 503, a POST
abandoned because the claim is lapsing) never clears ``submitted``, so
nothing is resent before the ledger was asked.
"""

from __future__ import annotations

from ledgerq.ledgers.base import (
    Accepted,
    Ambiguous,
    Busy,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
)
from ledgerq.model import (
    DEPENDENCY,
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    Fence,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TrackingBatch,
    TransactionReceipt,
    Valid,
)


def receipts_of(status: BatchStatus) -> tuple[TransactionReceipt, ...]:
    """The receipts recorded with a ledger status."""
    if isinstance(status, Invalid):
        return tuple(
            TransactionReceipt(
                transaction_id=t.transaction_id,
                result_valid=False,
                error_message=t.error_message,
                error_data=t.error_data,
                external_status=t.external_error_status,
                external_error_message=t.external_error_message,
            )
            for t in status.transactions
        )
    if status.name in (BatchStatusName.COMMITTED, BatchStatusName.VALID):
        txs = getattr(status, "transactions", ())
        return tuple(TransactionReceipt(t.transaction_id, result_valid=True) for t in txs)
    return ()


def recorded_status(status: BatchStatus) -> BatchStatus:
    """What a ledger status is recorded as: Splinter's ``Valid`` (validated,
    not committed) is ``Pending``, followed until final; the rest as said."""
    return Pending() if isinstance(status, Valid) else status


def taken(batch: TrackingBatch, *, now: int, fence: Fence | None) -> BatchWrite:
    """A submission takes ``batch``: ``submitted`` guards it from the queuer."""
    return BatchWrite(batch.service_id, batch.batch_id, attempt=True, now=now, fence=fence)


def taken_after(batch: TrackingBatch, after: str, *, now: int, fence: Fence | None) -> BatchWrite:
    """``batch`` taken in the transaction that makes ``after`` final, if the
    store then finds it the service's next batch (a conditional take)."""
    return BatchWrite(
        batch.service_id, batch.batch_id, attempt=True, now=now, fence=fence, after=after
    )


def ledger_status(
    service_id: str,
    batch_id: str,
    status: BatchStatus,
    *,
    now: int | None,
    fence: Fence | None,
    take_freed: int = 0,
    freed: list[TrackingBatch] | None = None,
) -> BatchWrite:
    """What the ledger said of a batch."""
    written = recorded_status(status)
    return BatchWrite(
        service_id,
        batch_id,
        written,
        receipts_of(written),
        now=now,
        fence=fence,
        take_freed=take_freed,
        freed=freed,
    )


def outcome(
    batch: TrackingBatch, result: SubmitResult, attempts: int, *, now: int, fence: Fence | None
) -> BatchWrite:
    """What a submission's outcome (after its retries) writes."""
    service_id, batch_id = batch.service_id, batch.batch_id
    match result:
        case Accepted():
            return BatchWrite(service_id, batch_id, Pending(), now=now, fence=fence)
        case Busy(status=status, message=message):
            text = f"ledger busy ({status}) after {attempts} attempts: {message}"
            return _delayed(batch, text, "busy", now, fence)
        case Unreachable(message=message):
            text = f"ledger unreachable after {attempts} attempts: {message}"
            return _delayed(batch, text, "busy", now, fence)
        case Unjudged(status=status, message=message):
            text = f"refused without judging the batch after {attempts} attempts: {message}"
            return _delayed(batch, text, f"http_{status}", now, fence)
        case Rejected(status=status, message=message):
            # The rejection concerns the whole batch: recorded against every
            # transaction, as Grid records external errors.
            invalid = Invalid(
                tuple(
                    InvalidTransaction(
                        transaction_id=t.transaction_header,
                        external_error_status=str(status),
                        external_error_message=message,
                    )
                    for t in batch.transactions
                )
            )
            return BatchWrite(
                service_id,
                batch_id,
                invalid,
                receipts_of(invalid),
                SubmissionError(f"http_{status}", message),
                now=now,
                fence=fence,
            )
        case Ambiguous(message=message):
            # Status kept, submitted kept: only the ledger's answer moves it.
            return BatchWrite(
                service_id,
                batch_id,
                None,
                (),
                SubmissionError("ambiguous", message),
                now=now,
                fence=fence,
            )
    raise TypeError(f"not a submission result: {result!r}")


def dependency_failed(
    batch: TrackingBatch, reason: str, *, now: int, fence: Fence | None
) -> BatchWrite:
    """A batch whose dependency failed (judged ``Invalid``, or cancelled):
    ``Invalid`` without a POST, every transaction carrying the reason as its
    external error."""
    invalid = Invalid(
        tuple(
            InvalidTransaction(
                transaction_id=t.transaction_header,
                external_error_status=DEPENDENCY,
                external_error_message=reason,
            )
            for t in batch.transactions
        )
    )
    return BatchWrite(
        batch.service_id,
        batch.batch_id,
        invalid,
        receipts_of(invalid),
        SubmissionError(DEPENDENCY, reason),
        now=now,
        fence=fence,
    )


def waiting(batch: TrackingBatch, reason: str, *, now: int, fence: Fence | None) -> BatchWrite:
    """What a batch waits for before it may go (a dependency): shown as its
    service's lock reason; its state is unchanged."""
    return BatchWrite(
        batch.service_id,
        batch.batch_id,
        None,
        (),
        SubmissionError(DEPENDENCY, reason),
        now=now,
        fence=fence,
    )


def invalid_reason(status: BatchStatus) -> str:
    """What an ``Invalid`` status says, in one line (a halt's reason)."""
    if isinstance(status, Invalid):
        for t in status.transactions:
            message = t.error_message or t.external_error_message
            if message:
                return message
    return "the ledger judged the batch INVALID"


def _delayed(
    batch: TrackingBatch, message: str, error_type: str, now: int, fence: Fence | None
) -> BatchWrite:
    # Recorded as an attempt, so its time (which starts the delay window) is
    # the end of the retries, not the start.
    return BatchWrite(
        batch.service_id,
        batch.batch_id,
        BatchStatusName.DELAYED,
        (),
        SubmissionError(error_type, message),
        attempt=True,
        now=now,
        fence=fence,
    )
