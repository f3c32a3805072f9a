"""In-memory stand-ins for the store roles and a scripted ledger, for pipeline unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from ledgerq.errors import FencedOffError
from ledgerq.ledgers.base import (
    Accepted,
    CommitEvent,
    LedgerBatchStatus,
    SubmitResult,
)
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    Fence,
    Pending,
    SubmissionError,
    TrackingBatch,
    TrackingTransaction,
    TransactionReceipt,
    Unknown,
    status_from_name,
)


def batch(service_id: str, n: int) -> TrackingBatch:
    bid = f"{service_id}-{n:04d}".ljust(16, "0")
    return TrackingBatch(
        service_id=service_id,
        batch_header=bid,
        data_change_id=None,
        signer_public_key="02" + "a" * 64,
        trace=False,
        serialized_batch=bid.encode(),
        created_at=n,
        transactions=(
            TrackingTransaction("intkey", "1.0", f"tx-{bid}", b"p", "02" + "a" * 64, service_id),
        ),
        seq=n,
    )


@dataclass
class MemoryPipelineStore:
    """Just enough of the batch tracking store for the submitter and monitor."""

    batches: dict[str, TrackingBatch] = field(default_factory=dict)
    taken_at: dict[str, int] = field(default_factory=dict)
    errors: dict[str, SubmissionError | None] = field(default_factory=dict)
    writes: list[tuple[str, BatchStatusName | None]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: The fence of every write, in order; writes under a refused fence raise.
    fences: list[Fence | None] = field(default_factory=list)
    refused: set[Fence] = field(default_factory=set)

    def _check_fence(self, fence: Fence | None) -> None:
        self.fences.append(fence)
        if fence is not None and fence in self.refused:
            raise FencedOffError(f"{fence} is fenced off")

    def add(self, *batches: TrackingBatch) -> None:
        for b in batches:
            self.batches[b.batch_id] = b
        self.wake.set()

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
    ) -> None:
        self._check_fence(fence)
        b = self.batches[batch_id]
        self.taken_at[batch_id] = now or 0
        if dlt_status is None:
            self.batches[batch_id] = replace(b, submitted=True, last_attempt_at=now)
            self.writes.append((batch_id, None))
        else:
            await self.update_batch_status(
                batch_id,
                service_id,
                status_from_name(BatchStatusName(dlt_status)),
                submission_error=submission_error,
                now=now,
            )
            self.fences.pop()
            self.batches[batch_id] = replace(self.batches[batch_id], last_attempt_at=now)

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
    ) -> None:
        self._check_fence(fence)
        b = self.batches[id]
        assert b.service_id == service_id
        assert not b.is_final, f"{id} is final already"
        if status is None:
            # Only the submission error: status and submitted stay (an ambiguous outcome).
            self.batches[id] = replace(b, submission_error=submission_error)
        else:
            # As the stores: Unknown and Delayed clear submitted, others keep it.
            unsubmitted = status.name in (BatchStatusName.UNKNOWN, BatchStatusName.DELAYED)
            attempt = now if status.name is BatchStatusName.DELAYED else None
            self.batches[id] = replace(
                b,
                batch_status=status,
                submitted=b.submitted and not unsubmitted,
                last_attempt_at=attempt or b.last_attempt_at,
                submission_error=submission_error or b.submission_error,
            )
        self.errors[id] = submission_error
        self.writes.append((id, None if status is None else status.name))
        self.wake.set()

    # -- queue source (one round: the oldest open batch of each unlocked service)
    async def next_batches(
        self,
        limit: int,
        *,
        exclude: frozenset[str],
        timeout_s: float,
        exclude_batches: frozenset[str] = frozenset(),
    ) -> Sequence[TrackingBatch]:
        picks = self.round(exclude)
        if not picks:
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout_s)
            except TimeoutError:
                return ()
            picks = self.round(exclude)
        return picks[:limit]

    def round(self, exclude: frozenset[str]) -> list[TrackingBatch]:
        by_service: dict[str, list[TrackingBatch]] = {}
        for b in sorted(self.batches.values(), key=lambda b: b.seq or 0):
            if not b.is_final:
                by_service.setdefault(b.service_id, []).append(b)
        picks = []
        for service, open_ in by_service.items():
            if service in exclude:
                continue
            if any(b.submitted or b.status_name is BatchStatusName.PENDING for b in open_):
                continue
            if open_[0].status_name is BatchStatusName.DELAYED:
                continue  # delay window: tests move it by hand
            picks.append(open_[0])
        return picks

    # -- monitor source: what the ledger has or may have
    async def monitored_batches(self, *, limit: int) -> Sequence[TrackingBatch]:
        out = [
            b
            for b in self.batches.values()
            if not b.is_final and (b.submitted or b.status_name is BatchStatusName.PENDING)
        ]
        return out[:limit]


class ScriptedLedger:
    """A ledger whose answers tests choose; records what it was sent.

    Status reads with ``wait_s`` answer, as Sawtooth's, when none of their ids
    is pending (after :meth:`decide`), or after ``wait_s`` seconds.
    ``read_errors`` are raised by the next status reads, one each.
    """

    description = "scripted"

    def __init__(self) -> None:
        self.script: dict[str, list[SubmitResult]] = {}
        self.sent: list[str] = []
        self.statuses: dict[str, BatchStatus] = {}
        self.status_requests: list[tuple[str, tuple[str, ...]]] = []
        self.waits: list[float] = []
        self.event_queue: asyncio.Queue[CommitEvent] | None = None
        self.trigger_queue: asyncio.Queue[None] | None = None
        self.gate: asyncio.Event | None = None
        self.read_errors: list[Exception] = []
        self.parked = 0
        self.most_parked = 0
        self.posted = asyncio.Event()
        self._changed = asyncio.Condition()

    async def decide(self, batch_id: str, status: BatchStatus) -> None:
        """The ledger decides (or forgets) a batch: parked reads answer."""
        async with self._changed:
            self.statuses[batch_id] = status
            self._changed.notify_all()

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        self.sent.append(batch_id)
        self.posted.set()
        if self.gate is not None:
            await self.gate.wait()
        queue = self.script.get(batch_id)
        result = queue.pop(0) if queue else Accepted()
        if isinstance(result, Accepted):
            self.statuses.setdefault(batch_id, Pending())
        return result

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        self.status_requests.append((service_id, tuple(batch_ids)))
        self.waits.append(wait_s)
        if self.read_errors:
            raise self.read_errors.pop(0)

        def settled() -> bool:
            return not any(isinstance(self.statuses.get(i), Pending) for i in batch_ids)

        if wait_s > 0:
            self.parked += 1
            self.most_parked = max(self.most_parked, self.parked)
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(settled), wait_s)
            except TimeoutError:
                pass
            finally:
                self.parked -= 1
        return tuple(LedgerBatchStatus(i, self.statuses.get(i, Unknown())) for i in batch_ids)

    def events(self) -> AsyncIterator[CommitEvent] | None:
        if self.event_queue is None:
            return None
        return self._events(self.event_queue)

    @staticmethod
    async def _events(queue: asyncio.Queue[CommitEvent]) -> AsyncIterator[CommitEvent]:
        while True:
            yield await queue.get()

    def triggers(self) -> AsyncIterator[None] | None:
        if self.trigger_queue is None:
            return None
        return self._triggers(self.trigger_queue)

    @staticmethod
    async def _triggers(queue: asyncio.Queue[None]) -> AsyncIterator[None]:
        while True:
            yield await queue.get()

    async def close(self) -> None:
        pass
