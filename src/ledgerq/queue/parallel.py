"""The per-key parallel queuer: which batches to submit next.

:func:`select_parallel_round` is the reference statement of the rules, beside
the one-round serial queuer's (:mod:`ledgerq.queue.serial`). The store
backends compute the same round set-based
(:class:`ParallelRoundStore.parallel_round`); the property tests hold them
equal. ``docs/queuer.md`` explains both strategies and when to choose which.

What a caller relies on:

* **Access sets.** A batch *reads* the union of its transactions' declared
  ``inputs`` and *writes* the union of their ``outputs`` (Sawtooth
  ``TransactionHeader``; the validator refuses any access outside them).
  Entries are addresses or address prefixes; two entries *overlap* when one is
  a prefix of the other (the empty entry overlaps everything). An entry is
  compared by its leading hex characters in lower case, up to the first other
  character and at most :data:`MAX_LOCK_LENGTH` of them (a Sawtooth address
  is 70 hex characters): cutting an entry leaves a prefix of it, which only
  adds overlaps. A transaction whose inputs or outputs are not known
  (``None``: tracked before they were recorded, or built by hand) reads or
  writes everything.
* **Conflict.** An earlier batch ``a`` and a later batch ``b`` of the same
  service conflict when ``a`` writes an entry that overlaps one ``b`` reads or
  writes, or ``a`` reads an entry that overlaps one ``b`` writes, or a
  transaction of ``b`` lists a transaction of ``a`` in its ``dependencies``.
  Two reads never conflict. Services never conflict with each other.
* **Blocked.** A non-final batch is *blocked* while an earlier non-final batch of
  its service conflicts with it — whatever that batch's state: new, in
  flight, ``Unknown``, ``Delayed`` (in its window or not). Every non-final
  batch holds its locks; a final one (``Committed``, ``Valid``, ``Invalid``)
  holds nothing. ``Invalid`` releases its locks like ``Committed``: later
  batches that read what it would have written are submitted anyway, as the
  serial queuer submits the next batch after an ``Invalid`` one.
* **Eligible.** A non-final batch is eligible when it is not blocked, not in
  flight (``submitted``, or ``Pending``), not ``Delayed`` inside its delay
  window, and not in ``exclude`` (batches the caller has handed out and the
  store may not show as taken yet).
* **Picks per service.** A service's picks are its eligible batches first in
  (class, acceptance order), class being ``Unknown`` (0), window-expired
  ``Delayed`` (1), new (2): resubmissions go first, as in the serial queuer.
  A round has at most ``per_service`` of them (default one). Eligible
  batches of one service never conflict with each other (each has no
  earlier non-final conflicting batch), so they may all be in flight
  together. A caller that hands the picks out asks again for the service
  (with them in ``exclude``) to get its next eligible batches.
* **Round order** is by place within the service first (every service's
  first pick, then every second pick, ...), then the serial queuer's
  (:func:`ledgerq.queue.serial.round_order_key`): with one pick per service,
  exactly the serial round's order, and a service with many ready batches
  takes no second place before every other service had its first.
  **Acceptance order** is the serial queuer's.

Under these rules two conflicting batches are never in flight together, and a
batch never reaches the ledger before an earlier conflicting batch of its
service is final (``docs/queuer.md``, "Safety").
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledgerq.model import BatchStatusName, TrackingBatch
from ledgerq.queue.serial import (
    DEFAULT_DELAY_WINDOW_MS,
    acceptance_key,
    delay_window_over,
    round_order_key,
)

#: Entries are compared by at most this many characters, a Sawtooth address's
#: length; a longer one is cut to a prefix of itself, which only adds overlaps.
MAX_LOCK_LENGTH = 70
#: The entry of a transaction whose inputs or outputs are not known.
EVERYTHING = ""


class ParallelRoundStore(Protocol):
    """The store role the parallel queuer needs: compute a round set-based."""

    async def parallel_round(
        self,
        *,
        now: int,
        delay_window_ms: int,
        services: Collection[str] | None = None,
        limit: int | None = None,
        narrow: bool = False,
        exclude: Collection[int] = (),
        per_service: int = 1,
    ) -> list[TrackingBatch]:
        """The round :func:`select_parallel_round` would return over every
        tracked batch, ``exclude`` being ``seq``s, with at most
        ``per_service`` picks per service. ``services``, ``limit`` and
        ``narrow`` as in :meth:`ledgerq.queue.serial.RoundStore.queue_round`."""
        ...


_HEX_RUN = re.compile(r"[0-9a-f]*")


def lock_entry(address: str) -> str:
    """An address as the queuer compares it: its leading hex characters in
    lower case, at most :data:`MAX_LOCK_LENGTH` of them (a prefix of it)."""
    match = _HEX_RUN.match(address.lower())
    assert match is not None  # "*" matches the empty string
    return match.group()[:MAX_LOCK_LENGTH]


def overlap(a: str, b: str) -> bool:
    """Whether two entries overlap: one is a prefix of the other."""
    return a.startswith(b) or b.startswith(a)


def _cover(entries: Iterable[str]) -> tuple[str, ...]:
    """The entries without those another entry is a prefix of, sorted.

    An entry overlaps whatever a longer entry starting with it overlaps, so
    dropping the longer one changes no conflict.
    """
    kept: list[str] = []
    for entry in sorted(set(entries)):
        # Sorted: a prefix comes right before the entries it covers.
        if kept and entry.startswith(kept[-1]):
            continue
        kept.append(entry)
    return tuple(kept)


@dataclass(frozen=True, slots=True)
class BatchAccess:
    """What a batch may read and write, and which transactions it follows.

    ``reads`` and ``writes`` are the smallest sets of entries with the same
    overlaps as the batch's declared ones (``reads`` without what ``writes``
    covers: a read adds no conflict a write of the same entry does not).
    ``after`` are the transaction ids its transactions depend on, outside
    the batch itself.
    """

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    @classmethod
    def of(cls, batch: TrackingBatch) -> BatchAccess:
        reads: set[str] = set()
        writes: set[str] = set()
        after: set[str] = set()
        own = {t.transaction_header for t in batch.transactions}
        for t in batch.transactions:
            reads.update((EVERYTHING,) if t.inputs is None else (lock_entry(a) for a in t.inputs))
            writes.update(
                (EVERYTHING,) if t.outputs is None else (lock_entry(a) for a in t.outputs)
            )
            after.update(d for d in t.dependencies if d not in own)
        w = _cover(writes)
        r = _cover(reads)
        return cls(
            reads=tuple(x for x in r if not any(x.startswith(y) for y in w)),
            writes=w,
            after=tuple(sorted(after)),
        )


class ConflictKind(enum.StrEnum):
    """How an earlier batch blocks a later one."""

    #: The earlier batch writes an entry the later one reads or writes.
    WRITES = "writes"
    #: The earlier batch reads an entry the later one writes.
    READS = "reads"
    #: A transaction of the later batch depends on one of the earlier batch.
    DEPENDS = "depends"


@dataclass(frozen=True, slots=True)
class Conflict:
    """Why a batch waits: ``blocker``, an earlier non-final batch of its service."""

    blocker: TrackingBatch
    kind: ConflictKind
    #: The earlier batch's entry (``WRITES``/``READS``) or the transaction id
    #: depended on (``DEPENDS``).
    what: str


def conflict(
    earlier: TrackingBatch, earlier_access: BatchAccess, later_access: BatchAccess
) -> Conflict | None:
    """How ``earlier`` blocks a later batch of its service, or ``None``.

    ``earlier`` needs its transactions for ``DEPENDS``.
    """
    found = conflict_between(
        earlier_access, (t.transaction_header for t in earlier.transactions), later_access
    )
    return None if found is None else Conflict(earlier, *found)


def conflict_between(
    earlier: BatchAccess, earlier_transactions: Iterable[str], later: BatchAccess
) -> tuple[ConflictKind, str] | None:
    """How a batch with access ``earlier`` (and these transaction ids) blocks a
    later one with access ``later``: the kind and the entry (or the
    transaction id depended on); ``None`` if they do not conflict."""
    later_all = later.writes + later.reads
    for entry in earlier.writes:
        if any(overlap(entry, x) for x in later_all):
            return ConflictKind.WRITES, entry
    for entry in earlier.reads:
        if any(overlap(entry, x) for x in later.writes):
            return ConflictKind.READS, entry
    if later.after:
        wanted = set(later.after)
        for tid in earlier_transactions:
            if tid in wanted:
                return ConflictKind.DEPENDS, tid
    return None


class Wait(enum.Enum):
    """Why a non-final batch that is not in flight is not eligible."""

    #: An earlier non-final batch of the service conflicts with it.
    BLOCKED = "blocked"
    #: ``Delayed``, inside its delay window.
    DELAY_WINDOW = "delay window"
    #: In the caller's ``exclude``.
    EXCLUDED = "excluded"


@dataclass(frozen=True, slots=True)
class Waiting:
    """A batch that is not in flight and not eligible, and why."""

    batch: TrackingBatch
    why: Wait
    conflict: Conflict | None = None


@dataclass(frozen=True, slots=True)
class ParallelDecision:
    """The rules applied to one service."""

    #: The batch to queue, if any.
    pick: TrackingBatch | None
    #: Its non-final batches with the submitter or the ledger.
    in_flight: tuple[TrackingBatch, ...] = ()
    #: The first batch in acceptance order that is neither in flight nor
    #: eligible, and why.
    waiting: Waiting | None = None
    #: Every eligible batch, in acceptance order (``pick`` is one of them).
    eligible: tuple[TrackingBatch, ...] = ()


def _class(batch: TrackingBatch) -> int:
    status = batch.status_name
    if status is BatchStatusName.UNKNOWN:
        return 0
    if status is BatchStatusName.DELAYED:
        return 1
    return 2


def _in_flight(batch: TrackingBatch) -> bool:
    return batch.submitted or batch.status_name is BatchStatusName.PENDING


def decide_service_parallel(
    batches: Sequence[TrackingBatch],
    *,
    now: int,
    delay_window_ms: int,
    exclude: Collection[int] = (),
) -> ParallelDecision:
    """Apply the rules to the batches of one service (any order, finals allowed).

    Batches need their transactions (access sets, dependencies).
    """
    live = [b for b in batches if not b.is_final]
    if not live:
        return ParallelDecision(None)
    key: Callable[[TrackingBatch], tuple[int, int, str]] = acceptance_key(live)
    live.sort(key=key)
    access = [BatchAccess.of(b) for b in live]
    in_flight: list[TrackingBatch] = []
    eligible: list[TrackingBatch] = []
    waiting: Waiting | None = None
    for i, batch in enumerate(live):
        if _in_flight(batch):
            in_flight.append(batch)
            continue
        blocker = _latest_conflict(live, access, i)
        why: Wait | None = None
        if blocker is not None:
            why = Wait.BLOCKED
        elif batch.status_name is BatchStatusName.DELAYED and not delay_window_over(
            batch, now=now, delay_window_ms=delay_window_ms
        ):
            why = Wait.DELAY_WINDOW
        elif batch.seq is not None and batch.seq in exclude:
            why = Wait.EXCLUDED
        if why is None:
            eligible.append(batch)
        elif waiting is None:
            waiting = Waiting(batch, why, blocker)
    pick = min(eligible, key=lambda b: (_class(b), key(b))) if eligible else None
    return ParallelDecision(pick, tuple(in_flight), waiting, tuple(eligible))


def _latest_conflict(
    live: Sequence[TrackingBatch], access: Sequence[BatchAccess], i: int
) -> Conflict | None:
    """The conflict with the latest earlier batch that conflicts with ``live[i]``."""
    for j in range(i - 1, -1, -1):
        found = conflict(live[j], access[j], access[i])
        if found is not None:
            return found
    return None


def select_parallel_round(
    batches: Iterable[TrackingBatch],
    *,
    now: int,
    delay_window_ms: int = DEFAULT_DELAY_WINDOW_MS,
    services: Collection[str] | None = None,
    exclude: Collection[int] = (),
    per_service: int = 1,
) -> list[TrackingBatch]:
    """The round to queue: each service's first ``per_service`` picks, in
    round order (place in the service, then the serial round's order).

    ``batches`` may hold every tracked batch, final ones included, with their
    transactions; ``services`` restricts the round to those service ids;
    ``exclude`` are ``seq``s never picked (they still hold their locks).
    """
    if delay_window_ms < 0:
        raise ValueError(f"delay_window_ms must be >= 0, got {delay_window_ms}")
    check_per_service(per_service)
    wanted = None if services is None else frozenset(services)
    skip = frozenset(exclude)
    by_service: dict[str, list[TrackingBatch]] = {}
    for batch in batches:
        if batch.is_final or (wanted is not None and batch.service_id not in wanted):
            continue
        by_service.setdefault(batch.service_id, []).append(batch)
    placed: list[tuple[int, TrackingBatch]] = []
    for group in by_service.values():
        decision = decide_service_parallel(
            group, now=now, delay_window_ms=delay_window_ms, exclude=skip
        )
        key = acceptance_key(group)  # as decide_service_parallel orders them
        ranked = sorted(decision.eligible, key=lambda b: (_class(b), key(b)))
        placed += enumerate(ranked[:per_service])
    placed.sort(key=lambda p: (p[0], round_order_key(p[1])))
    return [batch for _, batch in placed]


def check_per_service(per_service: int) -> None:
    """Refuse a ``per_service`` below one."""
    if per_service < 1:
        raise ValueError(f"per_service must be at least 1, got {per_service}")
