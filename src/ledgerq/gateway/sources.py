"""What the monitor pulls, from the store's listings.

:class:`StoreMonitorSource` finds the batches the monitor follows from the
store's listings: every ``Pending`` batch, and (every ``scan_every_ms``)
``{submitted, None}`` batches whose last attempt is older than the stale
cut-off.
"""

from __future__ import annotations

from collections.abc import Sequence
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
        self, store: ListingStore, *, scan_limit: int = 1000, scan_every_ms: int = 10_000
    ) -> None:
        self.store = store
        self.scan_limit = scan_limit
        #: The stale scan reads every batch without a status, so it runs at
        #: most this often rather than on every poll.
        self.scan_every_ms = scan_every_ms
        self._last_scan: int | None = None

    async def monitored_batches(
        self, *, now: int, stale_before: int, limit: int
    ) -> Sequence[TrackingBatch]:
        pending = (await self.store.list_batches_by_status(BatchStatusName.PENDING)).batches
        out = list(pending[:limit])
        if self._last_scan is not None and now - self._last_scan < self.scan_every_ms:
            return out
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
                if b.submitted and taken < stale_before:
                    out.append(b)
            if len(page.batches) < self.scan_limit or page.batches[-1].seq is None:
                break
            after = page.batches[-1].seq
        return out[:limit]
