"""The batch tracking store interface: what every backend promises.

Every backend (SQLite, PostgreSQL, in-memory) implements
:class:`BatchTrackingStore` with the same semantics, checked by one contract
test suite. Components depend on the narrow role protocols
(:class:`BatchAcceptor`, :class:`BatchReader`, :class:`GroupWriter`) rather
than on the whole store.

Semantics a caller relies on (details in ``docs/store.md``):

* ``id`` arguments take a batch id, or a data change id prefixed with
  :data:`DATA_CHANGE_PREFIX` (``"dc:"``); batch ids are hex and never start
  with it.
* Every write is one database transaction: it lands entirely or not at all.
* ``add_batches`` assigns ``seq`` in list order; per service, ``seq`` order is
  commit order (concurrent writers to one service are serialized), so a
  reader never sees a batch of a service before an earlier-``seq`` one of
  that service appears.
* Methods that depend on time take ``now`` (ms); ``None`` means the store's
  clock.
* Listings are ordered by ``seq`` (acceptance order).
* Every write of a batch's state is a :class:`~ledgerq.model.BatchWrite`
  applied by ``apply_writes``; the seed's two writes are one such write each.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol, Self

from ledgerq.errors import StoreError
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    Fence,
    SubmissionError,
    TrackingBatch,
    TrackingBatchList,
    TransactionReceipt,
)
from ledgerq.queue.parallel import ParallelRoundStore
from ledgerq.queue.serial import RoundStore

#: Prefix that marks an ``id`` argument as a data change id.
DATA_CHANGE_PREFIX = "dc:"

#: ``list_batches(status=NO_STATUS)`` selects batches without a ledger status.
NO_STATUS: Literal["none"] = "none"

StatusFilter = BatchStatusName | Literal["none"]


@dataclass(frozen=True, slots=True)
class ServiceControl:
    """What operators and halts have done to a service (no row: nothing).

    A *paused* service takes nothing new (what is in flight is followed to
    its end) until resumed; a *halted* one stopped at ``halted_batch_id``,
    the batch the ledger judged ``Invalid`` under ``on_invalid = halt``,
    until an operator resumes it past that batch.
    """

    service_id: str
    paused: bool = False
    halted_batch_id: str | None = None
    halted_reason: str | None = None
    halted_at: int | None = None

    @property
    def stopped(self) -> bool:
        """Whether the service takes nothing new."""
        return self.paused or self.halted_batch_id is not None


#: Operator actions on a service, and the halt the gateway records itself.
ServiceActionKind = Literal["pause", "resume", "skip", "cancel", "halt"]


@dataclass(frozen=True, slots=True)
class ServiceAction:
    """One recorded action on a service: who (a token's name, or ``gateway``
    for a halt), when (ms), which batches, and what it said."""

    id: int
    service_id: str
    action: str
    actor: str
    at: int
    batch_ids: tuple[str, ...] = ()
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class DependencyState:
    """The batch that tracks a transaction another one declares it depends on."""

    transaction_id: str
    service_id: str
    batch_id: str
    seq: int
    status: BatchStatusName | None
    submitted: bool
    #: Cancelled by an operator (stored ``Invalid``).
    cancelled: bool = False

    @property
    def committed(self) -> bool:
        return self.status in (BatchStatusName.COMMITTED, BatchStatusName.VALID)

    @property
    def failed(self) -> bool:
        """Judged ``Invalid`` by the ledger, or cancelled: its dependents fail too."""
        return self.status is BatchStatusName.INVALID


@dataclass(frozen=True, slots=True)
class DependencyPath:
    """What decides whether a batch may go (``dependency_path``): from the
    batch, each batch's first declared dependency (in transaction order, then
    declaration order, outside that batch) whose tracked batch is not
    committed, followed while that batch is open (not sent: not submitted,
    no status or ``Delayed``/``Unknown``)."""

    #: ``steps[i]``: that dependency of the batch before it (the batch
    #: itself for ``steps[0]``) and its batch (the lowest ``seq`` if several
    #: track it; a dependency any batch committed is committed).
    steps: tuple[DependencyState, ...]
    #: The dependencies of the last batch on the path (the batch itself if
    #: no step) that no batch tracks, in order.
    untracked: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ServiceSummary:
    """One service as the store sees it.

    ``queue_depth`` counts non-final batches; ``head_batch_id`` is the
    non-final batch with the lowest ``seq``; ``in_flight_batch_id`` is a
    non-final batch marked ``submitted`` (the submitter holds it), if any.
    ``in_flight`` counts the non-final batches with the submitter or the
    ledger (``submitted`` or ``Pending``). ``next_batch_id`` is the first
    non-final batch that is not: the one to submit next. If an earlier
    non-final batch of the service conflicts with it (the parallel queuer's
    rule), ``blocker_batch_id`` is the latest such batch, ``blocker_kind`` how
    (``writes``, ``reads``, ``depends``: see
    :class:`ledgerq.queue.parallel.ConflictKind`) and ``blocker_on`` the entry (or
    transaction id) they conflict on.

    What stops the service, if anything: ``paused`` by an operator
    (``paused_by`` the actor of the pause that took effect, ``paused_at``
    its time); halted at ``halted_batch_id`` (``on_invalid = halt``, with
    ``halted_reason`` and ``halted_at``); ``next_waits_for`` what the next
    batch waits for before it may go (a declared dependency: its submission
    error of type ``dependency``).
    """

    service_id: str
    queue_depth: int
    head_batch_id: str | None
    in_flight_batch_id: str | None
    total: int
    in_flight: int = 0
    next_batch_id: str | None = None
    blocker_batch_id: str | None = None
    blocker_kind: str | None = None
    blocker_on: str | None = None
    paused: bool = False
    paused_by: str | None = None
    paused_at: int | None = None
    halted_batch_id: str | None = None
    halted_reason: str | None = None
    halted_at: int | None = None
    next_waits_for: str | None = None


class BatchAcceptor(Protocol):
    """What the API needs to accept batches."""

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        """Store new batches atomically; return them with ``seq`` and ``created_at`` set.

        Raises ``DuplicateBatchError`` (naming the offender) when a batch id
        is already tracked (in any service: a batch belongs to one), or a data
        change id or transaction id is already tracked in its service, or any
        of them is repeated within the call, and ``StoreInputError`` for values the schema
        cannot hold; the store is then unchanged.
        """
        ...


class BatchReader(Protocol):
    """Read side: lookups and listings, in ``seq`` order."""

    async def get_batch(self, id: str, service_id: str) -> TrackingBatch | None: ...

    async def get_batch_status(self, id: str, service_id: str) -> BatchStatus | None: ...

    async def get_batches_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        """The batches with these ids, whatever service tracks them (a batch id
        belongs to one service), fully loaded, in ``seq`` order; unknown ids
        are left out."""
        ...

    async def get_batch_statuses_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        """As :meth:`get_batches_by_id`, but the transactions and the body
        (``serialized_batch``) may be left out (an ``Invalid`` batch keeps its
        invalid transactions)."""
        ...

    async def get_final_batch_statuses_by_id(
        self, batch_ids: Collection[str]
    ) -> list[TrackingBatch]:
        """As :meth:`get_batch_statuses_by_id`, only the batches in a final
        state (``Committed``, ``Valid``, ``Invalid``): what the parked status
        requests' refresher reads, a pending batch costing it no row."""
        ...

    async def list_batches_by_status(
        self, status: BatchStatus | BatchStatusName
    ) -> TrackingBatchList: ...

    async def get_unsubmitted_batches(self) -> TrackingBatchList: ...

    async def get_failed_batches(self) -> TrackingBatchList: ...

    async def list_in_flight(
        self, *, limit: int = 10_000, services: Collection[str] | None = None
    ) -> list[TrackingBatch]:
        """Non-final batches the ledger has or may have (``Pending``, or
        ``submitted``: taken for a first attempt, or for a resubmission after
        ``Unknown`` or ``Delayed``), in ``seq`` order, narrow: without blobs,
        transactions or submission errors; with ``services``, of those
        services only. What the monitor follows."""
        ...

    async def list_batches(
        self,
        *,
        service_id: str | None = None,
        status: StatusFilter | None = None,
        limit: int = 100,
        after_seq: int | None = None,
    ) -> TrackingBatchList: ...

    async def list_services(
        self, *, limit: int = 1000, after: str | None = None, service_id: str | None = None
    ) -> list[ServiceSummary]:
        """Services with batches, in id order, ``limit`` after ``after``;
        with ``service_id``, that one service only (none if it has no batch)."""
        ...

    async def status_counts(self) -> dict[str, int]:
        """Batches per status name; ``"none"`` counts batches without one."""
        ...


class ControlStore(Protocol):
    """Operator control of services, and what declared dependencies need."""

    async def service_controls(
        self, service_ids: Collection[str] | None = None
    ) -> dict[str, ServiceControl]:
        """The controls of ``service_ids`` that have any; ``None``: of every
        service paused or halted."""
        ...

    async def control_service(
        self,
        service_id: str,
        action: ServiceActionKind,
        *,
        actor: str,
        batch_ids: Sequence[str] = (),
        now: int | None = None,
    ) -> ServiceAction:
        """Apply an operator action in one transaction and record it:

        * ``pause``: take nothing new (idempotent);
        * ``resume``: undo a pause (refused unless paused);
        * ``skip``: resume a halted service past its ``Invalid`` batch, which
          ``batch_ids`` must name (refused unless halted at that batch);
        * ``cancel``: make ``batch_ids`` (of this service) final, recorded
          ``Invalid`` with a ``cancelled`` submission error naming ``actor``
          and the time; all or none, and only batches that cannot be on the
          ledger: not submitted, and no status or ``Delayed``/``Unknown``.

        Raises :class:`~ledgerq.errors.ServiceNotFoundError` for a service
        without batches, :class:`~ledgerq.errors.ControlRefusedError` for an
        action its state refuses (the message says why),
        :class:`~ledgerq.errors.BatchNotFoundError` for a batch not of it.
        """
        ...

    async def service_actions(
        self, service_id: str, *, limit: int = 100, before: int | None = None
    ) -> list[ServiceAction]:
        """Its recorded actions, newest first (ids below ``before``)."""
        ...

    async def batches_following(
        self, service_id: str, after: str | None, *, limit: int
    ) -> list[TrackingBatch]:
        """The first ``limit`` non-final batches of the service after batch
        ``after`` (``None``: from its first), in acceptance order, fully
        loaded, whatever their state; none if ``after`` is not tracked: the
        pipelined strategy's walk."""
        ...

    async def dependency_states(
        self, transaction_ids: Collection[str]
    ) -> dict[str, DependencyState]:
        """The tracked batches of these transaction ids (any service), by
        transaction id; untracked ids are left out."""
        ...

    async def dependency_path(
        self, service_id: str, batch_id: str, max_steps: int
    ) -> DependencyPath | None:
        """The :class:`DependencyPath` of a batch, at most ``max_steps``
        steps long (a cycle repeats until then), in one read; ``None`` if the
        batch is not tracked."""
        ...


class SeedWriter(Protocol):
    """The seed's two writes, each one :class:`~ledgerq.model.BatchWrite`
    through ``apply_writes`` (:class:`ledgerq.store.common.SeedWrites`)."""

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
        """Record an attempt: ``submitted``, one more attempt, its time."""
        ...

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
        """Record what the ledger said of the batch (or a submission error)."""
        ...


class GroupWriter(Protocol):
    """Group commit: many pipeline writes in one transaction."""

    @property
    def takes_freed(self) -> bool:
        """Whether a final status with ``take_freed`` takes the batches it
        frees here (PostgreSQL); elsewhere it takes none."""
        ...

    async def next_open_batch(self, service_id: str, after: str) -> TrackingBatch | None:
        """The batch of ``service_id`` the serial queuer would pick once batch
        ``after`` is final, fully loaded, if it is a batch never taken: the
        service's first non-final batch other than ``after``, not submitted,
        without a status, while no non-final batch of the service other than
        ``after`` is submitted or has a status. ``None`` otherwise (nothing
        left, a resubmission due, or the service locked by another batch)."""
        ...

    async def next_open_batches(self, pairs: Sequence[tuple[str, str]]) -> dict[str, TrackingBatch]:
        """:meth:`next_open_batch` for many ``(service_id, after)`` pairs in
        one query, at most one pair per service (else ``StoreInputError``):
        the batches found, by service id."""
        ...

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        """Apply ``writes`` in order in one transaction (one commit).

        Each write behaves as its single call would; one that call would
        refuse (:data:`WRITE_REFUSALS`: unknown batch, fenced off, final
        status, bad input) changes nothing and its error is returned in its
        place, while the others land. Any other failure (the database) fails
        the whole group: nothing lands and the error is raised.
        """
        ...


class BatchTrackingStore(
    BatchAcceptor,
    BatchReader,
    SeedWriter,
    GroupWriter,
    ControlStore,
    RoundStore,
    ParallelRoundStore,
    Protocol,
):
    """Every operation of the seed, plus the listings the API needs."""

    #: ``"sqlite"``, ``"postgresql"`` or ``"memory"``.
    dialect: str

    async def clean_stale_records(self, submitted_by: int) -> int:
        """Delete final batches whose final status was recorded before ``submitted_by`` (ms).

        Their transactions, receipts, submission and status rows go too; a
        non-final batch is never deleted. Receipts of untracked transactions
        last updated before the cut-off are deleted as well. Returns the
        number of batches deleted.
        """
        ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
