"""A scripted ledger for pipeline unit tests: its answers are the test's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from ledgerq.ledgers.base import (
    Accepted,
    CommitEvent,
    LedgerBatchStatus,
    SubmitResult,
)
from ledgerq.model import BatchStatus, Pending, Unknown


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
        #: Transactions outside the tracked batches the ledger has committed.
        self.committed_transactions: set[str] = set()
        self.transaction_asks: list[str] = []
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

    async def transaction_committed(self, transaction_id: str) -> bool:
        self.transaction_asks.append(transaction_id)
        return transaction_id in self.committed_transactions

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
