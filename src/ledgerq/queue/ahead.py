"""Reading a serial service's next batch ahead, while its batch waits at the ledger.

When the ledger accepts batch *n* of a serial service, the producer reads the
batch the serial queuer would pick once *n* is final
(:meth:`NextReader.next_open_batch`), so that *n*'s final status and the
next batch's take land in one transaction (``docs/gateway.md``, "The
commit → next POST gap"). The reads of many services are one query
(``next_open_batches``); first, without a read, the batch inserted after *n*
in this process (:class:`Successors`) is tried: a guess the conditional take
checks in its own transaction before it lands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from ledgerq.model import TrackingBatch

#: Batches :class:`Successors` holds at most, and their bytes (the signed
#: batch and the payloads); past either, it starts again empty.
MAX_SUCCESSORS = 10_000
MAX_SUCCESSOR_BYTES = 64 * 1024 * 1024


def _size(batch: TrackingBatch) -> int:
    return len(batch.serialized_batch) + sum(len(t.payload) for t in batch.transactions)


class Successors:
    """Per batch inserted through this process, the batch of its service
    inserted right after it, as stored (filled by the API's
    :class:`~ledgerq.store.group.GroupInserter`).

    The guess :meth:`NextReader.next_open_batch` tries before reading
    the store: after batch *n* of a serial service was taken, the next open
    batch is usually the one inserted after it. A guess is never trusted: a
    conditional take of it (``BatchWrite.after``) lands only if the store,
    in the take's own transaction, finds it the service's next batch
    (``next_open_checks``); otherwise the take is refused and the usual path
    runs. A stored batch never changes but for its state, which the check
    reads. Bounded: at ``max_size`` batches (or services), or ``max_bytes``,
    it forgets everything.
    """

    def __init__(
        self, max_size: int = MAX_SUCCESSORS, max_bytes: int = MAX_SUCCESSOR_BYTES
    ) -> None:
        self._max_size = max_size
        self._max_bytes = max_bytes
        self._after: dict[str, TrackingBatch] = {}
        self._last: dict[str, str] = {}
        self._bytes = 0

    def added(self, batches: Sequence[TrackingBatch]) -> None:
        """``batches`` were inserted (committed), in this order."""
        size = sum(_size(b) for b in batches)
        if (
            len(self._after) + len(batches) > self._max_size
            or len(self._last) + len(batches) > self._max_size
            or self._bytes + size > self._max_bytes
        ):
            self._after.clear()
            self._last.clear()
            self._bytes = 0
            if len(batches) > self._max_size or size > self._max_bytes:
                return
        last = self._last
        after = self._after
        for b in batches:
            before = last.get(b.service_id)
            if before is not None:
                after[before] = b
            last[b.service_id] = b.batch_header
        # Counted whole (a first batch of a service holds nothing yet): an
        # upper bound of what is held until the next start again.
        self._bytes += size

    def pop(self, batch_id: str) -> TrackingBatch | None:
        """The batch inserted after ``batch_id`` in its service, if known (once)."""
        found = self._after.pop(batch_id, None)
        if found is not None:
            self._bytes -= _size(found)
        return found

    def __len__(self) -> int:
        return len(self._after)


class NextOpenStore(Protocol):
    """The store role of the read-ahead."""

    async def next_open_batches(self, pairs: Sequence[tuple[str, str]]) -> dict[str, TrackingBatch]:
        """The batch of each ``(service_id, after)`` pair the serial queuer
        would pick once ``after`` is final, if never taken, by service id."""
        ...


class NextReader:
    """The store's next open batches, read together: the calls that arrive
    while one read is under way share the next one (one pair per service
    per read; a second pair of a service waits for the read after)."""

    def __init__(
        self,
        store: NextOpenStore,
        successors: Successors | None = None,
        *,
        max_group: int = 512,
    ) -> None:
        self._store = store
        self.successors = successors if successors is not None else Successors()
        self._max_group = max_group
        self._reads: list[tuple[str, str, asyncio.Future[TrackingBatch | None]]] = []
        self._reading = False

    async def next_open_batch(self, service_id: str, after: str) -> TrackingBatch | None:
        """The batch of ``service_id`` the serial queuer would pick once
        ``after`` is final (if one never taken), or ``None``."""
        guess = self.successors.pop(after)
        if guess is not None and guess.service_id == service_id:
            # Checked by the conditional take itself (Successors): no read.
            return guess
        future: asyncio.Future[TrackingBatch | None] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._reads.append((service_id, after, future))
        if not self._reading:
            self._reading = True
            asyncio.get_running_loop().create_task(self._read_loop())
        return await asyncio.shield(future)

    async def _read_loop(self) -> None:
        try:
            while self._reads:
                group: dict[str, tuple[str, asyncio.Future[TrackingBatch | None]]] = {}
                later = []
                for service_id, after, future in self._reads:
                    if service_id in group or len(group) >= self._max_group:
                        later.append((service_id, after, future))
                    else:
                        group[service_id] = (after, future)
                self._reads = later
                try:
                    found = await self._store.next_open_batches(
                        [(service_id, after) for service_id, (after, _) in group.items()]
                    )
                except Exception as exc:
                    for _, future in group.values():
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for service_id, (_, future) in group.items():
                    if not future.done():
                        future.set_result(found.get(service_id))
        finally:
            self._reading = False
