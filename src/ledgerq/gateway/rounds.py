"""A round source for stores without a set-based ``queue_round``.

:func:`round_store` returns the store itself when it computes rounds in one
statement (:class:`~ledgerq.queuer.RoundStore`); otherwise a wrapper that
reads every tracked batch through ``list_batches`` and applies the reference
rules (:func:`~ledgerq.queuer.select_round`). The wrapper is correct but
reads the whole store per round: fine for small deployments and tests, not
for the throughput targets.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any, cast

from ledgerq.model import TrackingBatch
from ledgerq.queuer import select_round

log = logging.getLogger(__name__)

_PAGE = 1000


class ListingRounds:
    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def queue_round(
        self,
        *,
        now: int,
        delay_window_ms: int,
        services: Collection[str] | None = None,
        limit: int | None = None,
    ) -> list[TrackingBatch]:
        batches: list[TrackingBatch] = []
        after: int | None = None
        while True:
            page = await self._store.list_batches(limit=_PAGE, after_seq=after)
            batches += page.batches
            if len(page.batches) < _PAGE or page.batches[-1].seq is None:
                break
            after = page.batches[-1].seq
        picks = select_round(batches, now=now, delay_window_ms=delay_window_ms, services=services)
        return picks if limit is None else picks[:limit]


def round_store(store: Any) -> Any:
    """``store`` if it has ``queue_round``, else :class:`ListingRounds` around it."""
    if callable(getattr(store, "queue_round", None)):
        return store
    log.warning("the store has no set-based queue_round; computing rounds from listings")
    return cast(Any, ListingRounds(store))
