"""The batch tracking model: the seed's structs as immutable, typed values.

These values cross every boundary of the gateway (codec → store → queuer →
submitter → follower). They are plain frozen dataclasses; no driver type ever
appears in them.

Conventions a caller relies on:

* ``batch_header`` *is* the batch id (the batch header signature, 128 hex
  characters for secp256k1); ``transaction_header`` is the transaction id.
* ``service_id`` is never ``None``: ledgers without services (plain Sawtooth)
  use :data:`NO_SERVICE`, a value no Splinter service id can take.
* Timestamps are integer **milliseconds** since the Unix epoch (UTC). The seed
  used whole seconds, which cannot order sub-second events; see
  ``docs/schema.md``.
* ``seq`` is the store's acceptance order: strictly increasing in the order
  batches were accepted, across requests and within one ``BatchList``. It is
  ``None`` until the batch has been stored.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

#: Stands in for the service id of ledgers without services. Splinter service
#: ids are ``circuit::service`` with alphanumeric parts, so a leading ``#``
#: can never collide with one.
NO_SERVICE = "#none"

#: Longest accepted service id: a Splinter circuit id (11 characters), ``::``
#: and a service id (4 characters) make 17, the seed's VARCHAR(17). We allow
#: more room for Sawtooth-only deployments that name their scopes freely.
MAX_SERVICE_ID_LENGTH = 64
#: What a service id holds: letters, digits and ``. _ - : ~ @ +``, starting
#: with a letter or digit (Grid's ``circuit::service`` fits; ``#`` of
#: :data:`NO_SERVICE` does not).
SERVICE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-:~@+]*")


def service_id_problem(service_id: str) -> str | None:
    """Why ``service_id`` is refused, or ``None`` if it is acceptable."""
    if len(service_id) > MAX_SERVICE_ID_LENGTH:
        return f"service_id is longer than {MAX_SERVICE_ID_LENGTH} characters"
    if not SERVICE_ID_RE.fullmatch(service_id):
        return (
            "service_id must start with a letter or digit and hold only letters, digits "
            "and . _ - : ~ @ +"
        )
    return None


#: Longest family name and version the store holds (the seed's columns).
MAX_FAMILY_NAME_LENGTH = 128
MAX_FAMILY_VERSION_LENGTH = 16


class BatchStatusName(enum.StrEnum):
    """The status of a batch without its transaction details."""

    UNKNOWN = "Unknown"
    PENDING = "Pending"
    DELAYED = "Delayed"
    INVALID = "Invalid"
    VALID = "Valid"
    COMMITTED = "Committed"

    @property
    def is_final(self) -> bool:
        return self in _FINAL

    @classmethod
    def parse(cls, value: str) -> BatchStatusName:
        """Accept ``Committed``, ``committed`` or ``COMMITTED``."""
        for member in cls:
            if member.value.lower() == value.strip().lower():
                return member
        valid = ", ".join(m.value for m in cls)
        raise ValueError(f"unknown batch status {value!r}; expected one of {valid}")


_FINAL = frozenset({BatchStatusName.INVALID, BatchStatusName.VALID, BatchStatusName.COMMITTED})


@dataclass(frozen=True, slots=True)
class InvalidTransaction:
    transaction_id: str
    # Errors from the DLT itself.
    error_message: str | None = None
    error_data: bytes | None = None
    # Other errors, such as a 404 when attempting to submit to the DLT.
    external_error_status: str | None = None
    external_error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ValidTransaction:
    transaction_id: str


@dataclass(frozen=True, slots=True)
class _Status:
    name: ClassVar[BatchStatusName]

    @property
    def is_final(self) -> bool:
        return self.name.is_final


@dataclass(frozen=True, slots=True)
class Unknown(_Status):
    """The ledger does not know the batch (it lost it, or never got it)."""

    name: ClassVar[BatchStatusName] = BatchStatusName.UNKNOWN


@dataclass(frozen=True, slots=True)
class Pending(_Status):
    """The ledger has the batch and has not decided yet."""

    name: ClassVar[BatchStatusName] = BatchStatusName.PENDING


@dataclass(frozen=True, slots=True)
class Delayed(_Status):
    """The ledger was busy (503/429) after every retry; wait out the delay window."""

    name: ClassVar[BatchStatusName] = BatchStatusName.DELAYED


@dataclass(frozen=True, slots=True)
class Invalid(_Status):
    """Final: the ledger rejected the batch; never resubmitted."""

    transactions: tuple[InvalidTransaction, ...] = ()
    name: ClassVar[BatchStatusName] = BatchStatusName.INVALID


@dataclass(frozen=True, slots=True)
class Valid(_Status):
    """Final: the ledger validated the batch."""

    transactions: tuple[ValidTransaction, ...] = ()
    name: ClassVar[BatchStatusName] = BatchStatusName.VALID


@dataclass(frozen=True, slots=True)
class Committed(_Status):
    """Final: the batch is on the ledger."""

    transactions: tuple[ValidTransaction, ...] = ()
    name: ClassVar[BatchStatusName] = BatchStatusName.COMMITTED


BatchStatus: TypeAlias = Unknown | Pending | Delayed | Invalid | Valid | Committed


def status_from_name(
    name: BatchStatusName,
    *,
    valid: tuple[ValidTransaction, ...] = (),
    invalid: tuple[InvalidTransaction, ...] = (),
) -> BatchStatus:
    """Build a status from its name and, for final ones, its transactions."""
    match name:
        case BatchStatusName.UNKNOWN:
            return Unknown()
        case BatchStatusName.PENDING:
            return Pending()
        case BatchStatusName.DELAYED:
            return Delayed()
        case BatchStatusName.INVALID:
            return Invalid(invalid)
        case BatchStatusName.VALID:
            return Valid(valid)
        case BatchStatusName.COMMITTED:
            return Committed(valid)


@dataclass(frozen=True, slots=True)
class SubmissionError:
    error_type: str
    error_message: str


#: The submission error type (and external error status) of what a declared
#: dependency causes: a batch waiting for one, or failed because one failed.
DEPENDENCY = "dependency"
#: The submission error type of a batch an operator cancelled (stored ``Invalid``).
CANCELLED = "cancelled"
#: ledgerq's own status of a cancelled batch (:attr:`TrackingBatch.tracking_status`).
CANCELLED_STATUS = "Cancelled"


@dataclass(frozen=True, slots=True)
class TrackingTransaction:
    family_name: str
    family_version: str
    transaction_header: str
    payload: bytes
    signer_public_key: str
    service_id: str
    # ledgerq additions (not in the seed): the state the transaction header
    # declares, as sent. ``inputs`` may be read and ``outputs`` written
    # (addresses or address prefixes); ``dependencies`` are ids of
    # transactions that must be applied first. ``None``: not known (a
    # transaction tracked before they were recorded, or built by hand), which
    # the parallel queuer treats as reading and writing every address.
    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None
    dependencies: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TransactionReceipt:
    transaction_id: str
    result_valid: bool
    error_message: str | None = None
    error_data: bytes | None = None
    # The seed typed this String in the struct and BYTEA in the table; it is
    # the ledger's serialized receipt, so bytes.
    serialized_receipt: bytes = b""
    external_status: str | None = None
    external_error_message: str | None = None


@dataclass(frozen=True, slots=True)
class TrackingBatch:
    service_id: str
    batch_header: str
    data_change_id: str | None
    signer_public_key: str
    trace: bool
    serialized_batch: bytes
    submitted: bool = False
    created_at: int = 0
    transactions: tuple[TrackingTransaction, ...] = ()
    batch_status: BatchStatus | None = None
    submission_error: SubmissionError | None = None
    # ledgerq additions (not in the seed), filled in by the store:
    seq: int | None = None
    #: When the submitter last finished an attempt (ms); starts the delay window.
    last_attempt_at: int | None = None
    #: How many submission attempts were recorded.
    attempts: int = 0

    @property
    def batch_id(self) -> str:
        return self.batch_header

    @property
    def status_name(self) -> BatchStatusName | None:
        return None if self.batch_status is None else self.batch_status.name

    @property
    def is_final(self) -> bool:
        return self.batch_status is not None and self.batch_status.is_final

    @property
    def cancelled(self) -> bool:
        """Cancelled by an operator: ``Invalid``, with a ``cancelled`` submission error."""
        return (
            self.batch_status is not None
            and self.batch_status.name is BatchStatusName.INVALID
            and self.submission_error is not None
            and self.submission_error.error_type == CANCELLED
        )

    @property
    def tracking_status(self) -> str | None:
        """ledgerq's own status of the batch: its status name, or ``Cancelled``
        for a batch an operator cancelled (the ledger never saw it; Sawtooth's
        shape says ``INVALID``)."""
        if self.batch_status is None:
            return None
        return CANCELLED_STATUS if self.cancelled else self.batch_status.name.value


@dataclass(frozen=True, slots=True)
class Fence:
    """The claim a write on behalf of a service is made under.

    A fenced store write lands only if ``instance_id`` still holds the claim on
    the batch's service at ``epoch``; the epoch grows on every hand-over, so an
    instance that lost a claim (even one it later took back) cannot write with
    the fence it held before. Used by PostgreSQL stores shared by several
    gateway instances; single-instance stores take ``fence=None``.
    """

    instance_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class BatchWrite:
    """One write of a batch's state: the store's one write verb (``apply_writes``).

    ``attempt=False`` writes what the ledger (or a submission's outcome) said:
    ``status`` (a :data:`BatchStatus` with its details, or None to leave it),
    its receipts and ``submission_error``. ``attempt=True`` records an attempt
    (``submitted``, one more attempt, its time), with ``status`` a name or
    None. Under high availability ``fence`` is the claim the write is made
    under; the store's clock is used when ``now`` is None.
    """

    service_id: str
    id: str
    status: BatchStatus | BatchStatusName | None = None
    transaction_receipts: tuple[TransactionReceipt, ...] = ()
    submission_error: SubmissionError | None = None
    attempt: bool = False
    now: int | None = None
    fence: Fence | None = None
    #: A *conditional take* (``attempt=True`` only): applied after the
    #: group's other writes, and only if batch ``after`` of the service is
    #: final by then and this batch is what the serial queuer would pick
    #: (the service's first non-final batch, not submitted, without a status,
    #: and no non-final batch of the service submitted or with a status);
    #: otherwise refused with ``StatusTransitionError``, nothing written. A
    #: final status and the next batch's ``submitted`` in one transaction
    #: (``docs/gateway.md``, "The commit → next POST gap").
    after: str | None = None
    #: A final status (``attempt=False``) that *takes what it frees*: after
    #: the group's writes, in its transaction, up to this many of the batches
    #: this one blocked that are free by then (not final, no blocker left,
    #: never taken, no status, declaring no dependency) are recorded taken
    #: (an attempt, under this write's fence), first in acceptance order,
    #: and appended, fully loaded, to :attr:`freed`. Only where the store's
    #: ``takes_freed`` says so; elsewhere nothing is taken.
    take_freed: int = 0
    #: Where the batches taken by :attr:`take_freed` go (the caller's list).
    freed: list[TrackingBatch] | None = field(default=None, compare=False)
    #: An ``Invalid`` status that halts its service (``on_invalid = halt``):
    #: in the same transaction, the service is recorded halted at this batch
    #: with this reason, and the halt among its actions.
    halt: str | None = None

    @property
    def frees_service(self) -> bool:
        """Whether the service may move on once this write lands: a final
        status, or one that makes the batch resendable (``Unknown``,
        ``Delayed``)."""
        status = self.status
        if status is None:
            return False
        name = status if isinstance(status, BatchStatusName) else status.name
        return name.is_final or name in (BatchStatusName.UNKNOWN, BatchStatusName.DELAYED)


@dataclass(frozen=True, slots=True)
class TrackingBatchList:
    batches: tuple[TrackingBatch, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[TrackingBatch]:
        return iter(self.batches)
