"""What every backend shares: input checks, id resolution and row assembly.

Backends check their input here before touching the database, so a bad value
raises the same ``StoreInputError`` on every backend and nothing is written.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from ledgerq.errors import (
    ControlRefusedError,
    DuplicateBatchError,
    ServiceNotFoundError,
    StoreError,
    StoreInputError,
)
from ledgerq.model import (
    CANCELLED,
    MAX_FAMILY_NAME_LENGTH,
    MAX_FAMILY_VERSION_LENGTH,
    MAX_SERVICE_ID_LENGTH,
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    Fence,
    Invalid,
    InvalidTransaction,
    SubmissionError,
    TrackingBatch,
    TrackingTransaction,
    TransactionReceipt,
    ValidTransaction,
    status_from_name,
)
from ledgerq.queue.parallel import BatchAccess
from ledgerq.store.base import (
    DATA_CHANGE_PREFIX,
    NO_STATUS,
    DependencyPath,
    DependencyState,
    ServiceAction,
    ServiceControl,
    StatusFilter,
)

MAX_BATCH_ID_LENGTH = 128
MAX_DATA_CHANGE_ID_LENGTH = 256
MAX_PUBLIC_KEY_LENGTH = 70
MAX_ERROR_TYPE_LENGTH = 64
MAX_LIST_LIMIT = 10_000

#: Statuses after which the batch is not submitted again by the queuer until
#: it picks it up: writing one of them clears ``submitted``.
UNSUBMITTED_STATUSES = frozenset({BatchStatusName.UNKNOWN, BatchStatusName.DELAYED})


def _check_text(what: str, value: object, max_length: int, *, where: str = "") -> None:
    if not isinstance(value, str) or value == "":
        raise StoreInputError(f"{what} must be a non-empty string{where}; got {value!r}")
    if len(value) > max_length:
        raise StoreInputError(
            f"{what} is {len(value)} characters long{where}; the store holds at most "
            f"{max_length}: shorten it"
        )


def check_service_id(service_id: str) -> None:
    _check_text("service_id", service_id, MAX_SERVICE_ID_LENGTH)


def check_next_open_pairs(pairs: Sequence[tuple[str, str]]) -> None:
    """``next_open_batches``' argument: valid service ids, one pair per service."""
    services = [service_id for service_id, _ in pairs]
    for service_id in services:
        check_service_id(service_id)
    if len(set(services)) != len(services):
        raise StoreInputError("next_open_batches takes one (service, after) pair per service")


def check_new_batches(batches: Sequence[TrackingBatch]) -> None:
    """Refuse values the schema cannot hold and duplicates within the call."""
    batch_keys: set[str] = set()
    dc_keys: set[tuple[str, str]] = set()
    txn_keys: set[tuple[str, str]] = set()
    for batch in batches:
        check_service_id(batch.service_id)
        where = f" (batch {batch.batch_header[:16]!r}…)" if batch.batch_header else ""
        _check_text("batch_header", batch.batch_header, MAX_BATCH_ID_LENGTH)
        if batch.data_change_id is not None:
            _check_text(
                "data_change_id", batch.data_change_id, MAX_DATA_CHANGE_ID_LENGTH, where=where
            )
        _check_text(
            "signer_public_key", batch.signer_public_key, MAX_PUBLIC_KEY_LENGTH, where=where
        )
        if batch.created_at < 0:
            raise StoreInputError(f"created_at must be >= 0 ms{where}; got {batch.created_at}")
        if batch.submitted or batch.batch_status is not None or batch.submission_error:
            raise StoreInputError(
                f"add_batches takes new batches only{where}: submitted, batch_status and "
                "submission_error must be unset; record progress with "
                "change_batch_to_submitted / update_batch_status"
            )
        if not batch.transactions:
            raise StoreInputError(f"a batch needs at least one transaction{where}")
        if batch.batch_header in batch_keys:
            raise DuplicateBatchError(
                f"batch {batch.batch_header} appears twice in this request; send it once",
                batch_id=batch.batch_header,
                service_id=batch.service_id,
            )
        batch_keys.add(batch.batch_header)
        if batch.data_change_id is not None:
            dc = (batch.service_id, batch.data_change_id)
            if dc in dc_keys:
                raise DuplicateBatchError(
                    f"data change id {batch.data_change_id!r} appears twice in service "
                    f"{batch.service_id!r} in this request; data change ids are unique per service",
                    batch_id=batch.batch_header,
                    data_change_id=batch.data_change_id,
                    service_id=batch.service_id,
                )
            dc_keys.add(dc)
        for txn in batch.transactions:
            _check_text(
                "transaction_header", txn.transaction_header, MAX_BATCH_ID_LENGTH, where=where
            )
            _check_text("family_name", txn.family_name, MAX_FAMILY_NAME_LENGTH, where=where)
            _check_text(
                "family_version", txn.family_version, MAX_FAMILY_VERSION_LENGTH, where=where
            )
            _check_text(
                "transaction signer_public_key",
                txn.signer_public_key,
                MAX_PUBLIC_KEY_LENGTH,
                where=where,
            )
            if txn.service_id != batch.service_id:
                raise StoreInputError(
                    f"transaction {txn.transaction_header} has service_id {txn.service_id!r} "
                    f"but its batch has {batch.service_id!r}; they must match"
                )
            tkey = (batch.service_id, txn.transaction_header)
            if tkey in txn_keys:
                raise DuplicateBatchError(
                    f"transaction {txn.transaction_header} appears twice in service "
                    f"{batch.service_id!r} in this request",
                    batch_id=batch.batch_header,
                    service_id=batch.service_id,
                    transaction_id=txn.transaction_header,
                )
            txn_keys.add(tkey)


def duplicate_batch(batch: TrackingBatch, owner_service: str) -> DuplicateBatchError:
    """The refusal of ``batch``, whose id is already tracked in ``owner_service``.

    A batch id (the header signature) names one batch in one service.
    """
    if owner_service == batch.service_id:
        message = (
            f"batch {batch.batch_header} is already tracked in service "
            f"{batch.service_id!r}; nothing was added"
        )
    else:
        message = (
            f"batch {batch.batch_header} is already tracked in service {owner_service!r}, "
            f"so it cannot be added to service {batch.service_id!r}; a batch belongs to one "
            "service: nothing was added"
        )
    return DuplicateBatchError(message, batch_id=batch.batch_header, service_id=owner_service)


def check_receipts(receipts: Iterable[TransactionReceipt]) -> None:
    for receipt in receipts:
        _check_text("receipt transaction_id", receipt.transaction_id, MAX_BATCH_ID_LENGTH)


def check_submission_error(error: SubmissionError | None) -> None:
    if error is not None:
        _check_text("submission error_type", error.error_type, MAX_ERROR_TYPE_LENGTH)


def prepare_update(write: BatchWrite) -> list[TransactionReceipt]:
    """Check a status write (``attempt=False``); the receipts it writes."""
    if isinstance(write.status, BatchStatusName | str):
        raise StoreInputError("a status update takes a BatchStatus (with its details), not a name")
    receipts = receipts_to_write(write.status, write.transaction_receipts)
    check_receipts(receipts)
    check_submission_error(write.submission_error)
    return receipts


class SeedWrites:
    """The seed's two writes, each one :class:`~ledgerq.model.BatchWrite`
    through the store's ``apply_writes`` (its one write verb)."""

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        raise NotImplementedError

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
        status = None if dlt_status is None else status_name_of(dlt_status)
        receipts = tuple(transaction_receipts or ())
        await self._apply_one(
            BatchWrite(service_id, batch_id, status, receipts, submission_error, True, now, fence)
        )

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
        receipts = tuple(transaction_receipts or ())
        await self._apply_one(
            BatchWrite(service_id, id, status, receipts, submission_error, now=now, fence=fence)
        )

    async def _apply_one(self, write: BatchWrite) -> None:
        [error] = await self.apply_writes([write])
        if error is not None:
            raise error


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise StoreInputError(f"limit must be between 1 and {MAX_LIST_LIMIT}; got {limit}")


def check_round(
    delay_window_ms: int,
    limit: int | None,
    *,
    services: object = None,
    claimant: str | None = None,
    dialect: str = "",
) -> None:
    """Arguments of ``queue_round``."""
    if claimant is not None:
        if services is not None:
            raise StoreInputError("a round takes services or a claimant, not both")
        if dialect != "postgresql":
            raise StoreError(
                f"a round over a claimant's services reached the {dialect or 'memory'} store, "
                "which has no claims; that needs the PostgreSQL store shared by several gateway "
                "instances"
            )
    if delay_window_ms < 0:
        raise StoreInputError(f"delay_window_ms must be >= 0; got {delay_window_ms}")
    if limit is not None and limit < 1:
        raise StoreInputError(f"limit must be at least 1 (or None for no limit); got {limit}")


def parse_id(id: str) -> tuple[str | None, str | None]:
    """Split an ``id`` argument into ``(batch_id, data_change_id)``; one is None."""
    if id.startswith(DATA_CHANGE_PREFIX):
        return None, id[len(DATA_CHANGE_PREFIX) :]
    return id, None


def parse_status_filter(status: StatusFilter | str | None) -> str | None:
    """The stored status name to filter on; ``"none"`` stays ``"none"``."""
    if status is None:
        return None
    if isinstance(status, BatchStatusName):
        return status.value
    if status.lower() == NO_STATUS:
        return NO_STATUS
    return BatchStatusName.parse(status).value


def status_name_of(status: BatchStatus | BatchStatusName | str) -> BatchStatusName:
    if isinstance(status, BatchStatusName):
        return status
    if isinstance(status, str):
        try:
            return BatchStatusName.parse(status)
        except ValueError as exc:
            raise StoreInputError(str(exc)) from exc
    return status.name


def already_recorded(current: BatchStatusName | None, name: BatchStatusName) -> bool:
    """Whether writing status ``name`` over ``current`` changes nothing: the
    same final status again (a repeated answer of the ledger). Such a write is
    not made: the status, its time (which retention counts from) and the
    submission's checks stay as the first answer left them, and a halt is
    not recorded twice."""
    return current is name and name.is_final


def status_effects(name: BatchStatusName | None, submitted: bool) -> bool:
    """The ``submitted`` flag after writing status ``name``.

    ``Unknown`` and ``Delayed`` mean the ledger does not hold the batch: the
    queuer must see it as waiting for resubmission (seed 001), so the flag is
    cleared; any other status leaves it as it was.
    """
    if name in UNSUBMITTED_STATUSES:
        return False
    return submitted


def receipts_to_write(
    status: BatchStatus | None, receipts: Iterable[TransactionReceipt]
) -> list[TransactionReceipt]:
    """The receipts a status update writes, one per transaction id (last wins).

    An ``Invalid`` status's transactions are kept as failed receipts unless
    the caller passed a receipt for that transaction.
    """
    by_id: dict[str, TransactionReceipt] = {}
    for receipt in receipts:
        by_id[receipt.transaction_id] = receipt
    if isinstance(status, Invalid):
        for txn in status.transactions:
            if txn.transaction_id not in by_id:
                by_id[txn.transaction_id] = TransactionReceipt(
                    transaction_id=txn.transaction_id,
                    result_valid=False,
                    error_message=txn.error_message,
                    error_data=txn.error_data,
                    serialized_receipt=b"",
                    external_status=txn.external_error_status,
                    external_error_message=txn.external_error_message,
                )
    return list(by_id.values())


def build_status(
    name: str | None,
    transaction_ids: Sequence[str],
    invalid: Sequence[InvalidTransaction],
) -> BatchStatus | None:
    """Rebuild a status: Valid/Committed list every transaction of the batch in
    order (a batch is atomic); Invalid lists the failed receipts."""
    if name is None:
        return None
    status_name = BatchStatusName(name)
    return status_from_name(
        status_name,
        valid=tuple(ValidTransaction(t) for t in transaction_ids),
        invalid=tuple(invalid),
    )


# Row shapes the SQL backends select, in column order:
#   batch:   seq, service_id, batch_id, data_change_id, signer_public_key, trace,
#            serialized_batch, submitted, created_at, last_attempt_at, attempts,
#            status, error_type, error_message
#   txn:     seq, transaction_id, family_name, family_version, payload,
#            signer_public_key, service_id, inputs, outputs, dependencies
#            (the last three: arrays on PostgreSQL, JSON text on SQLite, or NULL)
#   invalid: seq, transaction_id, error_message, error_data, external_status,
#            external_error_message
def assemble(
    batch_rows: Sequence[Sequence[Any]],
    txn_rows: Iterable[Sequence[Any]],
    invalid_rows: Iterable[Sequence[Any]],
) -> list[TrackingBatch]:
    """Build batches from the rows of the three hydration queries."""
    from ledgerq.model import TrackingTransaction

    txns: dict[int, list[TrackingTransaction]] = {}
    for seq, tid, fam, ver, payload, key, sid, inputs, outputs, deps in txn_rows:
        txns.setdefault(seq, []).append(
            TrackingTransaction(
                family_name=fam,
                family_version=ver,
                transaction_header=tid,
                payload=bytes(payload),
                signer_public_key=key,
                service_id=sid,
                inputs=_texts(inputs),
                outputs=_texts(outputs),
                dependencies=_texts(deps) or (),
            )
        )
    invalid: dict[int, list[InvalidTransaction]] = {}
    for seq, tid, msg, data, ext_status, ext_msg in invalid_rows:
        invalid.setdefault(seq, []).append(
            InvalidTransaction(
                transaction_id=tid,
                error_message=msg,
                error_data=None if data is None else bytes(data),
                external_error_status=ext_status,
                external_error_message=ext_msg,
            )
        )
    out: list[TrackingBatch] = []
    for row in batch_rows:
        (seq, sid, bid, dc, key, trace, blob, submitted, created, last, attempts, status) = row[:12]
        err_type, err_msg = row[12], row[13]
        batch_txns = tuple(txns.get(seq, ()))
        out.append(
            TrackingBatch(
                service_id=sid,
                batch_header=bid,
                data_change_id=dc,
                signer_public_key=key,
                trace=bool(trace),
                serialized_batch=bytes(blob),
                submitted=bool(submitted),
                created_at=created,
                transactions=batch_txns,
                batch_status=build_status(
                    status, [t.transaction_header for t in batch_txns], invalid.get(seq, ())
                ),
                submission_error=(
                    None if err_type is None else SubmissionError(err_type, err_msg or "")
                ),
                seq=seq,
                last_attempt_at=last,
                attempts=attempts,
            )
        )
    return out


def _texts(value: Any) -> tuple[str, ...] | None:
    """A stored list of strings: an array, JSON text, or NULL."""
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return tuple(value)


def json_texts(values: Sequence[str] | None) -> str | None:
    """A list of strings as SQLite stores it (JSON text), or NULL."""
    return None if values is None else json.dumps(list(values))


#: Dependencies longer than a transaction id can name no tracked transaction.
_MAX_DEPENDENCY_LENGTH = MAX_BATCH_ID_LENGTH


def lock_rows(batch: TrackingBatch, access: BatchAccess | None = None) -> list[tuple[str, str]]:
    """The ``(mode, entry)`` lock rows of a new batch (``batch_locks``).

    ``r``/``w``: the batch's normalized reads and writes
    (:class:`ledgerq.queue.parallel.BatchAccess`, ``access`` if the caller
    has it); ``d``: the transaction ids it depends on outside itself.
    """
    if access is None:
        access = BatchAccess.of(batch)
    rows = [("w", e) for e in access.writes] + [("r", e) for e in access.reads]
    rows += [("d", d) for d in access.after if len(d) <= _MAX_DEPENDENCY_LENGTH]
    return rows


def dependencies_within(
    batches: Sequence[TrackingBatch],
    seqs: Sequence[int],
    accesses: Sequence[BatchAccess] | None = None,
) -> dict[int, int]:
    """For the batches of one ``add_batches`` call (``seqs`` in list order):
    seq → the latest earlier batch of the call, in the same service, holding a
    transaction it depends on. ``accesses``: the batches' accesses, if the
    caller has them."""
    owner: dict[tuple[str, str], int] = {}
    found: dict[int, int] = {}
    for n, (seq, batch) in enumerate(zip(seqs, batches, strict=True)):
        access = BatchAccess.of(batch) if accesses is None else accesses[n]
        for dep in access.after:
            earlier = owner.get((batch.service_id, dep))
            if earlier is not None:
                found[seq] = max(found.get(seq, 0), earlier)
        for t in batch.transactions:
            owner[(batch.service_id, t.transaction_header)] = seq
    return found


def with_defaults(batch: TrackingBatch, now: int) -> TrackingBatch:
    """``created_at`` 0 means "now"."""
    return batch if batch.created_at else replace(batch, created_at=now)


def check_no_fence(fence: Fence | None, dialect: str) -> None:
    """Stores without claims take no fence: a fence there is a wiring mistake."""
    if fence is not None:
        raise StoreError(
            f"a fenced write reached the {dialect} store, which has no claims; fencing needs "
            "the PostgreSQL store shared by several gateway instances"
        )


def open_accesses(rows: Iterable[Sequence[Any]]) -> list[tuple[int, str, list[tuple[str, str]]]]:
    """``(seq, service_id, lock rows)`` per open batch, from its transactions'
    rows (``open_batch_access``, in seq and position order; inputs, outputs and
    dependencies as sequences or ``None``)."""
    out: list[tuple[int, str, list[tuple[str, str]]]] = []
    for seq, group in itertools.groupby(rows, key=lambda r: int(r[0])):
        txns = list(group)
        service_id = str(txns[0][1])
        batch = TrackingBatch(
            service_id=service_id,
            batch_header=str(txns[0][2]),
            data_change_id=None,
            signer_public_key="",
            trace=False,
            serialized_batch=b"",
            transactions=tuple(
                TrackingTransaction(
                    family_name="",
                    family_version="",
                    transaction_header=str(t[3]),
                    payload=b"",
                    signer_public_key="",
                    service_id=service_id,
                    inputs=None if t[4] is None else tuple(t[4]),
                    outputs=None if t[5] is None else tuple(t[5]),
                    dependencies=tuple(t[6] or ()),
                )
                for t in txns
            ),
        )
        out.append((seq, service_id, lock_rows(batch)))
    return out


# -- operator control and declared dependencies ------------------------------


def service_control(row: Sequence[Any]) -> ServiceControl:
    """A ``service_controls`` row (service_id, paused, halted_batch_id,
    halted_reason, halted_at); a service id alone: no control."""
    if len(row) == 1:
        return ServiceControl(row[0])
    sid, paused, halted_batch_id, halted_reason, halted_at = row
    return ServiceControl(
        sid,
        bool(paused),
        halted_batch_id,
        halted_reason,
        None if halted_at is None else int(halted_at),
    )


def service_action(row: Sequence[Any]) -> ServiceAction:
    """A ``service_actions`` row; batch ids an array (PostgreSQL) or JSON text."""
    aid, sid, action, actor, at, batch_ids, detail = row
    ids = json.loads(batch_ids) if isinstance(batch_ids, str) else list(batch_ids or ())
    return ServiceAction(int(aid), sid, action, actor, int(at), tuple(ids), detail)


def dependency_path(rows: Sequence[Sequence[Any]]) -> DependencyPath | None:
    """``dependency_path`` rows, the batch itself first; the last one's
    untracked dependencies an array (PostgreSQL) or JSON text."""
    if not rows:
        return None
    untracked = rows[-1][7]
    ids = json.loads(untracked) if isinstance(untracked, str) else list(untracked or ())
    return DependencyPath(
        tuple(dependency_state(r[:7]) for r in rows[1:]), tuple(dict.fromkeys(ids))
    )


def dependency_state(row: Sequence[Any]) -> DependencyState:
    """A ``dependency_states`` row."""
    tid, sid, bid, seq, status, submitted, error_type = row
    return DependencyState(
        tid,
        sid,
        bid,
        int(seq),
        None if status is None else BatchStatusName(status),
        bool(submitted),
        cancelled=error_type == CANCELLED,
    )


def no_such_service(service_id: str) -> ServiceNotFoundError:
    return ServiceNotFoundError(
        f"no batch of service {service_id!r} is tracked; check the service id"
    )


def check_control(control: ServiceControl, action: str, batch_ids: Sequence[str]) -> str | None:
    """Refuse an operator action the service's state does not allow; the
    action's detail (``pause`` of a paused service: said so)."""
    sid = control.service_id
    halted = control.halted_batch_id
    if action == "pause":
        return "already paused" if control.paused else None
    if action == "resume":
        if not control.paused:
            hint = (
                f"; it is halted at batch {halted}: resume it past that batch (skip)"
                if halted
                else ""
            )
            raise ControlRefusedError(f"service {sid!r} is not paused{hint}")
        return None
    if action == "skip":
        if halted is None:
            raise ControlRefusedError(f"service {sid!r} is not halted: there is nothing to skip")
        if list(batch_ids) != [halted]:
            raise ControlRefusedError(
                f"service {sid!r} is halted at batch {halted}; name that batch to resume "
                f"the service past it (got {', '.join(batch_ids) or 'none'})"
            )
        return f"resumed past invalid batch {halted}"
    if action == "cancel":
        if not batch_ids:
            raise ControlRefusedError("name the batches to cancel")
        return None
    raise StoreInputError(f"unknown action {action!r}: pause, resume, skip or cancel")


def check_cancellable(service_id: str, states: Sequence[tuple[str, str | None, bool]]) -> None:
    """Only a batch that cannot be on the ledger may be cancelled: not taken
    for submission, and no status, or ``Delayed`` / ``Unknown`` (the ledger
    has not got it). An ambiguous batch stays ``submitted`` until the ledger
    was asked, so it is refused here too."""
    for batch_id, status, submitted in states:
        name = None if status is None else BatchStatusName(status)
        if name is not None and name.is_final:
            raise ControlRefusedError(
                f"batch {batch_id} of service {service_id!r} is {name.value}, which is "
                "final; nothing was cancelled"
            )
        if submitted or name is BatchStatusName.PENDING:
            raise ControlRefusedError(
                f"batch {batch_id} of service {service_id!r} is in flight (taken for "
                "submission, or with the ledger): it may be on the ledger, so it cannot be "
                "cancelled; nothing was cancelled"
            )


def cancelled_message(actor: str, at: int) -> str:
    when = datetime.fromtimestamp(at / 1000, UTC).isoformat(timespec="seconds")
    return f"cancelled by {actor} at {when}"


def cancel_write(
    service_id: str, batch_id: str, transaction_ids: Sequence[str], message: str, at: int
) -> BatchWrite:
    """A cancellation, as the store records it: ``Invalid``, every
    transaction with the cancellation as its message, and a ``cancelled``
    submission error."""
    invalid = Invalid(tuple(InvalidTransaction(t, error_message=message) for t in transaction_ids))
    receipts = tuple(
        TransactionReceipt(t, result_valid=False, error_message=message) for t in transaction_ids
    )
    return BatchWrite(
        service_id, batch_id, invalid, receipts, SubmissionError(CANCELLED, message), now=at
    )
