"""What the follower reads from the store.

:class:`StoreMonitorSource` finds the batches the follower follows with one
indexed read of the busy batches (``list_in_flight``): every ``Pending``
batch, and every batch marked ``submitted`` — taken for a first attempt (no
status) or for a resubmission after ``Unknown`` or ``Delayed``, or left
ambiguous (the ledger may have it). The follower asks the ledger about every
such batch that no submitter of this process holds, at once: its submitter
died, the answer was ambiguous, or the service was taken over from another
instance.

Under high availability it follows only the services this instance claims
(``services``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from ledgerq.model import TrackingBatch


class InFlightStore(Protocol):
    async def list_in_flight(
        self, *, limit: int = 10_000, services: Collection[str] | None = None
    ) -> list[TrackingBatch]: ...


class StoreMonitorSource:
    def __init__(
        self,
        store: InFlightStore,
        *,
        services: Callable[[], Collection[str] | None] | None = None,
    ) -> None:
        self.store = store
        self._services = services

    async def monitored_batches(
        self, *, limit: int, services: Collection[str] | None = None
    ) -> Sequence[TrackingBatch]:
        held = None if self._services is None else self._services()
        mine = None if held is None else frozenset(held)
        # One indexed read of the busy batches only (few: at most one in
        # flight per service), narrow; of the services asked for only.
        if services is None:
            found = await self.store.list_in_flight(limit=limit)
        else:
            wanted = set(services) if mine is None else mine & set(services)
            if not wanted:
                return []
            found = await self.store.list_in_flight(limit=limit, services=wanted)
        return [b for b in found if mine is None or b.service_id in mine]
