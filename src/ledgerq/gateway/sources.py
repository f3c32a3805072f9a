"""What the monitor pulls from the store.

:class:`StoreMonitorSource` finds the batches the monitor follows with one
indexed read of the busy batches (``list_in_flight``): every ``Pending``
batch, and every batch marked ``submitted`` whose last attempt is older than
the stale cut-off — taken for a first attempt (no status) or for a
resubmission after ``Unknown`` or ``Delayed``: a submitter that died
between taking it and recording the ledger's answer leaves it so.

Under high availability it follows only the services this instance claims
(``services``), and a service just taken over from another instance is
*adopted*: its submitted batch, left by the previous holder, is asked of the
ledger at the next poll, however recent its attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol

from ledgerq.model import BatchStatusName, TrackingBatch


class InFlightStore(Protocol):
    async def list_in_flight(self, *, limit: int = 10_000) -> list[TrackingBatch]: ...


class StoreMonitorSource:
    def __init__(
        self,
        store: InFlightStore,
        *,
        services: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.store = store
        self._services = services
        self._adopted: set[str] = set()

    async def monitored_batches(
        self, *, now: int, stale_before: int, limit: int
    ) -> Sequence[TrackingBatch]:
        mine = None if self._services is None else frozenset(self._services())
        adopted, self._adopted = self._adopted, set()
        out: list[TrackingBatch] = []
        # One indexed read of the busy batches only (few: at most one in
        # flight per service), lean.
        for b in await self.store.list_in_flight(limit=limit):
            if mine is not None and b.service_id not in mine:
                continue
            if b.status_name is BatchStatusName.PENDING:
                out.append(b)
                continue
            taken = b.last_attempt_at if b.last_attempt_at is not None else b.created_at
            if taken < stale_before or b.service_id in adopted:
                out.append(b)
        return out

    def adopt(self, service_ids: Iterable[str]) -> None:
        """Services taken over: check their in-flight batches at the next poll."""
        self._adopted.update(service_ids)
