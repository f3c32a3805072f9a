"""The one-round serial queuer: which batches to submit next.

:func:`select_round` is the reference statement of the rules (the later,
Markdown version of the seed's *one-round serial queuer strategy*; every
difference between the two seed versions is listed in ``docs/queuer.md``).
The store backends compute the same round with one set-based query
(:class:`RoundStore.queue_round`); the property tests hold them equal.

What a caller relies on:

* **At most one batch per service** per round, and none for a *locked*
  service. A service is locked while any of its non-final batches is held by
  the submitter or the ledger (``submitted = true``, or status ``Pending``),
  or is ``Unknown``/``Delayed`` and not the one being resubmitted.
* **Resubmission first.** If the first ``{submitted = false, Unknown |
  Delayed}`` batch of a service (in acceptance order) is ``Unknown``, or
  ``Delayed`` with its delay window over, that batch is the service's pick,
  and nothing else of the service is queued. A ``Delayed`` batch still inside
  its window locks the service.
* **Otherwise the oldest.** When every non-final batch of a service is
  ``{submitted = false, None}``, the pick is the first in acceptance order.
* **Final batches** (``Committed``, ``Valid``, ``Invalid``) are never queued
  and never lock anything.
* **Acceptance order** is ``seq``. The seed's key (``created_at``, then the
  alphabetically first ``batch_header``) orders only services in which some
  batch has no ``seq`` -- batches that never went through a store, since the
  store gives every batch a unique ``seq`` when it accepts it -- and breaks
  ties between equal ``seq`` values, which a store never produces.
* **The delay window** of a ``Delayed`` batch is over when
  ``last_attempt_at <= now - delay_window_ms`` (the seed's
  ``last_submitted_at <= now - 15 seconds``). A ``Delayed`` batch without a
  recorded attempt has nothing to wait for and is due.
* **Round order**: ``Unknown`` picks, then ``Delayed`` picks, then new
  batches (the order of the seed's first version); within each, by the
  acceptance order of the pick, so the service that has waited longest goes
  first.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledgerq.model import BatchStatusName, TrackingBatch

#: The seed's delay window: 15 seconds after the last submission attempt.
DEFAULT_DELAY_WINDOW_MS = 15_000


class RoundStore(Protocol):
    """The store role the queuer needs: compute a round set-based."""

    async def queue_round(
        self,
        *,
        now: int,
        delay_window_ms: int,
        services: Collection[str] | None = None,
        limit: int | None = None,
        narrow: bool = False,
        claimant: str | None = None,
    ) -> list[TrackingBatch]:
        """The round :func:`select_round` would return over every tracked batch.

        ``services`` restricts the round to those service ids (``None``: all);
        ``claimant`` instead to the services the claims table gives that
        gateway instance (PostgreSQL only: high availability);
        ``limit`` keeps only the first ``limit`` picks in round order. A
        ``narrow`` round may leave out each pick's ``serialized_batch`` (empty),
        ``transactions`` (empty) and submission error (``None``); everything
        the rules read (ids, ``seq``, ``submitted``, status, attempts, times)
        is there. Load the full batches with :meth:`get_batches_by_seq`.
        """
        ...

    async def get_batches_by_seq(self, seqs: Collection[int]) -> list[TrackingBatch]:
        """The batches with these ``seq``s, fully loaded, in ``seq`` order;
        ``seq``s the store no longer holds are left out."""
        ...


class ServiceState(enum.Enum):
    """Why a service has, or has not, a pick in the round."""

    #: Every non-final batch is new; the oldest is queued.
    READY = "ready"
    #: An ``Unknown`` or window-expired ``Delayed`` batch is queued again.
    RESUBMIT = "resubmit"
    #: A batch is with the submitter or the ledger (``submitted`` or ``Pending``).
    IN_FLIGHT = "in flight"
    #: A ``Delayed`` batch waits for its delay window to pass.
    DELAY_WINDOW = "delay window"
    #: Nothing to do: no non-final batch.
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class ServiceDecision:
    state: ServiceState
    #: The batch to queue (``READY`` and ``RESUBMIT`` only).
    pick: TrackingBatch | None = None
    #: The batch that locks the service (``IN_FLIGHT`` and ``DELAY_WINDOW``).
    blocker: TrackingBatch | None = None


def delay_window_over(batch: TrackingBatch, *, now: int, delay_window_ms: int) -> bool:
    """True when a ``Delayed`` batch may be submitted again."""
    if batch.last_attempt_at is None:
        return True
    return batch.last_attempt_at <= now - delay_window_ms


def decide_service(
    batches: Sequence[TrackingBatch], *, now: int, delay_window_ms: int
) -> ServiceDecision:
    """Apply the rules to the batches of one service (any order, finals allowed)."""
    live = [b for b in batches if not b.is_final]
    if not live:
        return ServiceDecision(ServiceState.IDLE)
    key = acceptance_key(live)
    in_flight = [b for b in live if b.submitted or b.status_name is BatchStatusName.PENDING]
    if in_flight:
        # Checked before resubmission: a retry must never run beside a batch
        # the submitter or the ledger still holds (two in flight).
        return ServiceDecision(ServiceState.IN_FLIGHT, blocker=min(in_flight, key=key))
    # Not submitted, not Pending, not final: Unknown or Delayed.
    stalled = [b for b in live if b.batch_status is not None]
    if stalled:
        first = min(stalled, key=key)
        if first.status_name is BatchStatusName.UNKNOWN or delay_window_over(
            first, now=now, delay_window_ms=delay_window_ms
        ):
            return ServiceDecision(ServiceState.RESUBMIT, pick=first)
        return ServiceDecision(ServiceState.DELAY_WINDOW, blocker=first)
    return ServiceDecision(ServiceState.READY, pick=min(live, key=key))


def select_round(
    batches: Iterable[TrackingBatch],
    *,
    now: int,
    delay_window_ms: int = DEFAULT_DELAY_WINDOW_MS,
    services: Collection[str] | None = None,
) -> list[TrackingBatch]:
    """The round to queue: one pick per unlocked service, in round order.

    ``batches`` may hold every tracked batch, final ones included; ``services``
    restricts the round to those service ids.
    """
    if delay_window_ms < 0:
        raise ValueError(f"delay_window_ms must be >= 0, got {delay_window_ms}")
    wanted = None if services is None else frozenset(services)
    by_service: dict[str, list[TrackingBatch]] = {}
    for batch in batches:
        if batch.is_final or (wanted is not None and batch.service_id not in wanted):
            continue
        by_service.setdefault(batch.service_id, []).append(batch)
    picks = []
    for group in by_service.values():
        decision = decide_service(group, now=now, delay_window_ms=delay_window_ms)
        if decision.pick is not None:
            picks.append(decision.pick)
    picks.sort(key=round_order_key)
    return picks


_CLASS = {BatchStatusName.UNKNOWN: 0, BatchStatusName.DELAYED: 1}


def round_order_key(batch: TrackingBatch) -> tuple[int, bool, int, int, str, str]:
    """Sort key of picks in a round: class, acceptance order, then the seed's key."""
    status = batch.status_name
    cls = 2 if status is None else _CLASS.get(status, 3)
    return (
        cls,
        batch.seq is None,
        batch.seq or 0,
        batch.created_at,
        batch.batch_header,
        batch.service_id,
    )


def _seq_key(batch: TrackingBatch) -> tuple[int, int, str]:
    assert batch.seq is not None
    return (batch.seq, batch.created_at, batch.batch_header)


def _seed_key(batch: TrackingBatch) -> tuple[int, int, str]:
    return (0, batch.created_at, batch.batch_header)


def acceptance_key(
    group: Sequence[TrackingBatch],
) -> Callable[[TrackingBatch], tuple[int, int, str]]:
    """Acceptance order within one service: ``seq``, or the seed's key if any lacks one."""
    if all(b.seq is not None for b in group):
        return _seq_key
    return _seed_key
