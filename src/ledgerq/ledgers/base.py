"""What every ledger client promises: one interface, typed results.

A submission ends in exactly one :data:`SubmitResult`:

* :class:`Accepted` — the ledger took the batch (HTTP 202);
* :class:`Busy` — the ledger refused for now (503 or 429); nothing was
  queued, so sending again later is safe; ``retry_after_ms`` carries the
  ledger's ``Retry-After`` when it gave one;
* :class:`Unreachable` — the request never reached the ledger (connection
  refused, DNS failure); as safe to resend as ``Busy``;
* :class:`Rejected` — the ledger *judged* the batch and refused it (Sawtooth's
  batch-rejection errors: an invalid batch or transaction, a body it cannot
  decode; a Splinter batch-level rejection); resending cannot help;
  ``message`` is the ledger's explanation;
* :class:`Unjudged` — the request was refused without a word about the
  batch: a wrong URL (404, 405), credentials (401, 403), a proxy's 408, 413
  or other 4xx. Nothing was queued, so sending again is safe, but it will
  keep failing until an operator fixes the cause: retried with backoff,
  never made final;
* :class:`Ambiguous` — the request may or may not have reached the ledger
  (timeout, connection reset after sending, 5xx other than 503). The caller
  must ask the ledger before sending again; a blind resend could reorder.
  :class:`Abandoned`, an ``Ambiguous`` the gateway itself ended (its claim on
  the service lapsing, ``docs/ha.md``), is handled the same way but says
  nothing about the ledger: it is not a ledger problem.

Statuses are read with :meth:`LedgerClient.batch_statuses`, which long-polls
for up to ``wait_s`` seconds and returns one :class:`LedgerBatchStatus` per
requested id, in the ledger's vocabulary mapped onto :mod:`ledgerq.model`
(``COMMITTED`` → :class:`~ledgerq.model.Committed`, ``INVALID`` →
:class:`~ledgerq.model.Invalid` with its transactions, ``PENDING``,
``UNKNOWN``; scabbard's ``Valid`` as :class:`~ledgerq.model.Valid`, which is
*not* final for the gateway: it follows the batch until ``Committed``). A
failed status read — transport, any HTTP error, a body not of the API's
shape — raises :class:`~ledgerq.errors.LedgerError`, never anything else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from ledgerq.model import BatchStatus


@dataclass(frozen=True, slots=True)
class Accepted:
    status: int = 202


@dataclass(frozen=True, slots=True)
class Busy:
    status: int
    message: str = ""
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Unreachable:
    message: str


@dataclass(frozen=True, slots=True)
class Rejected:
    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Unjudged:
    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Ambiguous:
    message: str
    status: int | None = None


@dataclass(frozen=True, slots=True)
class Abandoned(Ambiguous):
    """A POST the gateway gave up on itself, with no answer yet: its claim on
    the service lapsed (a paused process, renewals that could not reach the
    database). Ambiguous all the same, but nothing the ledger did."""


SubmitResult: TypeAlias = Accepted | Busy | Unreachable | Rejected | Unjudged | Ambiguous


@dataclass(frozen=True, slots=True)
class LedgerBatchStatus:
    batch_id: str
    status: BatchStatus


@dataclass(frozen=True, slots=True)
class CommitEvent:
    """A batch reached a final status on the ledger (from an event stream)."""

    batch_id: str
    status: BatchStatus
    event_id: str | None = None


class LedgerClient(Protocol):
    """One ledger, reached by one client; safe to share between tasks."""

    #: Short human name of the target, for logs (never contains credentials).
    description: str

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        """Send one serialized ``Batch`` (not a list) for ``service_id``."""
        ...

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        """The ledger's view of ``batch_ids``, waiting up to ``wait_s`` for them to be final."""
        ...

    async def transaction_committed(self, transaction_id: str) -> bool:
        """Whether the ledger has committed this transaction (a dependency
        ledgerq does not track): Sawtooth's ``GET /transactions/{id}`` knows
        only committed ones. Raises :class:`~ledgerq.errors.LedgerError` when
        the ledger cannot say."""
        ...

    def events(self) -> AsyncIterator[CommitEvent] | None:
        """A stream of final-status events, or ``None`` if the ledger has none."""
        ...

    def triggers(self) -> AsyncIterator[None] | None:
        """One item whenever the ledger may have news (a block committed), or ``None``.

        For ledgers that announce commits without saying which batches (a
        Sawtooth validator's ``/subscriptions`` websocket): each item asks for
        an early status poll. The iterator may end when the ledger turns out
        to have no announcements; polling on the interval then continues.
        """
        ...

    async def close(self) -> None: ...


def batch_list_bytes(serialized_batches: Sequence[bytes]) -> bytes:
    """Wrap serialized ``Batch`` messages in a ``BatchList`` (field 1, repeated).

    Protobuf encodes a repeated message field as its elements one after the
    other, each as tag ``0x0a`` + varint length + bytes, so no decoding is
    needed to forward stored batches.
    """
    out = bytearray()
    for data in serialized_batches:
        out.append(0x0A)
        n = len(data)
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        out += data
    return bytes(out)
