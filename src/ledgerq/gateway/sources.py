"""What the monitor pulls, from the store's listings.

:class:`StoreMonitorSource` finds the batches the monitor follows from the
store's listings: every ``Pending`` batch, and (every ``scan_every_ms``)
``{submitted, None}`` batches whose last attempt is older than the stale
cut-off.

Under high availability it follows only the services this instance claims
(``services``), and a service just taken over from another instance is
*adopted*: its ``{submitted, None}`` batch, left by the previous holder, is
asked of the ledger at the next poll, however recent its attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

from ledgerq.model import BatchStatusName, TrackingBatch, TrackingBatchList


class ListingStore(Protocol):
    async def list_batches_by_status(self, status: Any) -> TrackingBatchList: ...

    async def list_batches(
        self,
        *,
        service_id: str | None = None,
        status: Any = None,
        limit: int = 100,
        after_seq: int | None = None,
    ) -> TrackingBatchList: ...


class StoreMonitorSource:
    def __init__(
        self,
        store: ListingStore,
        *,
        scan_limit: int = 1000,
        scan_every_ms: int = 10_000,
        services: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.store = store
        self._services = services
        self._adopted: set[str] = set()
        self.scan_limit = scan_limit
        #: The stale scan reads every batch without a status, so it runs at
        #: most this often rather than on every poll.
        self.scan_every_ms = scan_every_ms
        self._last_scan: int | None = None

    async def monitored_batches(
        self, *, now: int, stale_before: int, limit: int
    ) -> Sequence[TrackingBatch]:
        mine = None if self._services is None else frozenset(self._services())
        pending = (await self.store.list_batches_by_status(BatchStatusName.PENDING)).batches
        if mine is not None:
            pending = tuple(b for b in pending if b.service_id in mine)
        out = list(pending[:limit])
        adopted, self._adopted = self._adopted, set()
        if self._last_scan is not None and now - self._last_scan < self.scan_every_ms:
            for service_id in sorted(adopted):
                page = await self.store.list_batches(
                    service_id=service_id, status="none", limit=self.scan_limit
                )
                out.extend(b for b in page.batches if b.submitted)
            return out[:limit]
        self._last_scan = now
        after: int | None = None
        # {submitted, None} batches are rare (one per service at most, and
        # only between taking and the ledger's answer); new ones are many.
        while len(out) < limit:
            page = await self.store.list_batches(
                status="none", limit=self.scan_limit, after_seq=after
            )
            for b in page.batches:
                taken = b.last_attempt_at if b.last_attempt_at is not None else b.created_at
                if not b.submitted or (mine is not None and b.service_id not in mine):
                    continue
                if taken < stale_before or b.service_id in adopted:
                    out.append(b)
            if len(page.batches) < self.scan_limit or page.batches[-1].seq is None:
                break
            after = page.batches[-1].seq
        return out[:limit]

    def adopt(self, service_ids: Iterable[str]) -> None:
        """Services taken over: check their in-flight batches at the next poll."""
        self._adopted.update(service_ids)
