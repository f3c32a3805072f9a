"""The batch tracking store over SQL, written once for every dialect.

A backend (:mod:`ledgerq.store.sqlite`, :mod:`ledgerq.store.postgres`)
supplies transactions, a session that runs the dialect's named queries, and
the one set-based insert that differs between dialects; everything else — the
order of statements in each operation, the lifecycle rules, error messages —
lives here, so both backends behave the same by construction.

Each public method is one database transaction.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from ledgerq.clock import Clock, now_ms
from ledgerq.errors import (
    WRITE_REFUSALS,
    BatchNotFoundError,
    DuplicateBatchError,
    FencedOffError,
    StatusTransitionError,
    StoreError,
)
from ledgerq.model import (
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    Fence,
    TrackingBatch,
    TrackingBatchList,
    TransactionReceipt,
)
from ledgerq.queue.parallel import BatchAccess, check_per_service, conflict_between
from ledgerq.store import common
from ledgerq.store.base import (
    DATA_CHANGE_PREFIX,
    NO_STATUS,
    DependencyPath,
    DependencyState,
    ServiceAction,
    ServiceActionKind,
    ServiceControl,
    ServiceSummary,
    StatusFilter,
)
from ledgerq.store.migrate import MigrationResult

T = TypeVar("T")
Row = tuple[Any, ...]

#: Rounds of at most this many listed services (and loads of at most this
#: many batches) are short reads.
SHORT_ROUND_SERVICES = 64
Params = Mapping[str, Any]


class Session(Protocol):
    """Runs named queries inside one open transaction."""

    async def execute(self, name: str, params: Params) -> int:
        """Run a statement; return the affected row count."""
        ...

    async def executemany(self, name: str, rows: Sequence[Params]) -> None: ...

    async def fetchall(self, name: str, params: Params) -> list[Row]: ...

    async def fetchone(self, name: str, params: Params) -> Row | None: ...

    async def fetchall_many(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Each query's rows, run in list order (PostgreSQL sends them at once)."""
        ...

    async def fetchall_committing(self, name: str, params: Params) -> list[Row]:
        """``name``'s rows as the transaction's last statement (PostgreSQL
        sends the ``COMMIT`` with it)."""
        ...


class ConflictError(Exception):
    """A unique key was taken; the caller rolls back and names the offender."""


class Backend(Protocol):
    dialect: str

    def run(
        self,
        body: Callable[[Session], Coroutine[Any, Any, T]],
        *,
        write: bool,
        short: bool = False,
    ) -> Awaitable[T]:
        """``body(session)`` in one transaction: commits when it returns, rolls
        back when it raises. ``body`` awaits nothing but its session (SQLite
        runs it whole in one go). ``short``: a read of a few indexed rows
        (SQLite may run it on the calling thread)."""
        ...

    def prepare_insert(self, batches: Sequence[TrackingBatch]) -> Any:
        """What :meth:`insert_batches` writes of ``batches``, worked out before
        its transaction (computation only): the transaction holds the
        services' locks on PostgreSQL and the file's single writer on SQLite,
        so whatever can be computed before it is."""
        ...

    async def insert_batches(self, session: Session, prepared: Any) -> list[int]:
        """Insert the batches :meth:`prepare_insert` prepared, and their
        transactions, set-based; return their seqs in list order. Raise
        :class:`ConflictError` when a unique key is taken."""
        ...

    def seqs_param(self, seqs: Sequence[int]) -> Any:
        """A list of seqs as the dialect's hydration queries take it."""
        ...

    def texts_param(self, values: Sequence[str]) -> Any:
        """A list of strings (service ids) as the dialect's queries take it."""
        ...

    def keys_param(self, keys: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """``(service_id, batch_id)`` pairs as ``batch_states`` takes them."""
        ...

    async def connect(self) -> None: ...

    async def migrate(self, *, apply: bool, url: str) -> MigrationResult:
        """Apply pending migrations (``apply``) or refuse an outdated schema."""
        ...

    async def keep_lock_entries(self) -> bool:
        """Compute the lock entries of every open batch and keep them from now
        on, for the database; whether this call turned them on."""
        ...

    async def warm(self) -> None:
        """Prepare for a gateway's first requests (connections, plans)."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Attempt:
    """A checked ``change_batch_to_submitted``."""

    write: BatchWrite
    name: BatchStatusName | None
    receipts: list[TransactionReceipt]
    at: int


def _write_of(step: _Attempt | tuple[BatchWrite, list[TransactionReceipt]]) -> BatchWrite:
    return step.write if isinstance(step, _Attempt) else step[0]


def _waves(
    steps: Sequence[tuple[int, _Attempt | tuple[BatchWrite, list[TransactionReceipt]]]],
) -> list[list[tuple[int, _Attempt | tuple[BatchWrite, list[TransactionReceipt]]]]]:
    """Split sorted steps into runs that touch each batch at most once, in order.

    A write by data change id gets a wave of its own (its batch is known
    only once resolved).
    """
    waves: list[list[tuple[int, _Attempt | tuple[BatchWrite, list[TransactionReceipt]]]]] = []
    seen: set[tuple[str, str]] = set()
    for item in steps:
        w = _write_of(item[1])
        key = (w.service_id, w.id)
        by_dc = w.id.startswith(DATA_CHANGE_PREFIX)
        if not waves or key in seen or by_dc:
            waves.append([])
            seen = set()
        waves[-1].append(item)
        seen.add(key)
        if by_dc:
            seen.add(("", ""))  # nothing joins a wave by data change id
    return waves


#: Statements a group's writes defer, in the order one write issues them.
_DEFERRED_ORDER = (
    "record_attempt",
    "write_status",
    "write_status_checked",
    "upsert_receipt",
    "upsert_submission_error",
)


class _DeferredSession:
    """A session for a wave of group writes: the batch and claim rows come
    from one read per wave; the writes' statements are collected, then run
    set-based (``executemany``), statement kind by statement kind."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.states: dict[tuple[str, str], Row] = {}
        self.claims: set[tuple[str, str, int]] = set()
        #: The wave's services that take nothing new (paused or halted).
        self.stopped: set[str] = set()
        #: The rows lock_group_rows locked (PostgreSQL), when it ran in this wave.
        self.locked: list[Row] = []
        self._pending: dict[str, list[Params]] = {name: [] for name in _DEFERRED_ORDER}

    def mark(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self._pending.items()}

    def reset(self, mark: dict[str, int]) -> None:
        for name, rows in self._pending.items():
            del rows[mark[name] :]

    async def execute(self, name: str, params: Params) -> int:
        pending = self._pending.get(name)
        if pending is None:
            # Not one of a write's usual statements (a halt's): run it now.
            return await self._session.execute(name, params)
        pending.append(params)
        return 1

    async def executemany(self, name: str, rows: Sequence[Params]) -> None:
        self._pending[name].extend(rows)

    async def fetchone(self, name: str, params: Params) -> Row | None:
        if name == "batch_state":
            return self.states.get((params["service_id"], params["batch_id"]))
        if name == "lock_claim":
            key = (params["service_id"], params["instance_id"], params["epoch"])
            return (key[2],) if key in self.claims else None
        return await self._session.fetchone(name, params)

    async def fetchall(self, name: str, params: Params) -> list[Row]:
        return await self._session.fetchall(name, params)

    async def fetchall_many(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        return await self._session.fetchall_many(calls)

    async def fetchall_committing(self, name: str, params: Params) -> list[Row]:
        return await self._session.fetchall_committing(name, params)

    async def flush(self) -> None:
        for name in _DEFERRED_ORDER:
            rows = self._pending[name]
            if rows:
                await self._session.executemany(name, rows)


#: The batch columns of a batch read (``get_batch``'s), before any joined ones.
_BATCH_COLUMNS = 14


def _makes_final(write: BatchWrite) -> bool:
    return write.status is not None and write.status.is_final


class SqlStore(common.SeedWrites):
    """:class:`~ledgerq.store.base.BatchTrackingStore` over a SQL backend."""

    def __init__(self, backend: Backend, *, clock: Clock = now_ms) -> None:
        self._backend = backend
        self._clock = clock
        self.dialect = backend.dialect
        #: Lock entries and blockers are known to be kept (keep_lock_entries).
        self._lock_entries_kept = False

    async def keep_lock_entries(self) -> None:
        """Keep the parallel queuer's lock entries and blockers from now on.

        PostgreSQL and SQLite keep them only once a store asked for them
        (``lock_entries_kept``, docs/store.md): the first call computes them
        for every open batch and turns them on for the database, for good.
        """
        if self._lock_entries_kept:
            return
        await self._backend.keep_lock_entries()
        self._lock_entries_kept = True

    async def warm(self) -> None:
        """Prepare the backend for a gateway's first requests, where it can
        (PostgreSQL: ``PostgresBackend.warm``)."""
        await self._backend.warm()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._backend.close()

    def _now(self, now: int | None) -> int:
        return self._clock() if now is None else now

    # -- writes ---------------------------------------------------------------

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        common.check_new_batches(batches)
        if not batches:
            return []
        at = self._now(now)
        rows = [common.with_defaults(b, at) for b in batches]
        prepared = self._backend.prepare_insert(rows)
        try:
            seqs = await self._backend.run(
                lambda session: self._backend.insert_batches(session, prepared), write=True
            )
        except ConflictError as exc:
            raise await self._name_duplicate(rows) from exc
        return [
            TrackingBatch(
                service_id=b.service_id,
                batch_header=b.batch_header,
                data_change_id=b.data_change_id,
                signer_public_key=b.signer_public_key,
                trace=b.trace,
                serialized_batch=b.serialized_batch,
                created_at=b.created_at,
                transactions=b.transactions,
                seq=seq,
            )
            for b, seq in zip(rows, seqs, strict=True)
        ]

    async def _name_duplicate(self, batches: Sequence[TrackingBatch]) -> DuplicateBatchError:
        return await self._backend.run(
            lambda session: self._find_duplicate(session, batches), write=False
        )

    async def _find_duplicate(
        self, session: Session, batches: Sequence[TrackingBatch]
    ) -> DuplicateBatchError:
        for b in batches:
            found = await session.fetchone("batch_owner", {"batch_id": b.batch_header})
            if found:
                return common.duplicate_batch(b, found[0])
            if b.data_change_id is not None:
                owner = await session.fetchone(
                    "data_change_id_owner",
                    {"service_id": b.service_id, "data_change_id": b.data_change_id},
                )
                if owner:
                    return DuplicateBatchError(
                        f"data change id {b.data_change_id!r} is already used by batch "
                        f"{owner[0]} in service {b.service_id!r}; nothing was added",
                        batch_id=b.batch_header,
                        data_change_id=b.data_change_id,
                        service_id=b.service_id,
                    )
            for t in b.transactions:
                owner = await session.fetchone(
                    "transaction_owner",
                    {"service_id": b.service_id, "transaction_id": t.transaction_header},
                )
                if owner:
                    return DuplicateBatchError(
                        f"transaction {t.transaction_header} of batch {b.batch_header} is "
                        f"already tracked in batch {owner[0]} of service {b.service_id!r}; "
                        "nothing was added",
                        batch_id=b.batch_header,
                        service_id=b.service_id,
                        transaction_id=t.transaction_header,
                    )
        # A concurrent writer inserted and then removed the key; the call is safe to retry.
        return DuplicateBatchError("a batch of this request was added concurrently; retry")

    async def _lock_batch(
        self, session: Session, id: str, service_id: str, fence: Fence | None = None
    ) -> Row:
        """Resolve an id to ``(batch_id, status, submitted)``, locking the row.

        With a ``fence``, also check that its instance still holds the
        service's claim at its epoch, and keep the claim row share-locked until
        the transaction ends: the claim cannot move while this write is in
        progress, and a write after it moved raises ``FencedOffError``.
        """
        common.check_service_id(service_id)
        if fence is not None and self.dialect != "postgresql":
            common.check_no_fence(fence, self.dialect)
        batch_id, dc = common.parse_id(id)
        if batch_id is not None:
            row = await session.fetchone(
                "batch_state", {"service_id": service_id, "batch_id": batch_id}
            )
        else:
            row = await session.fetchone(
                "batch_state_by_data_change_id",
                {"service_id": service_id, "data_change_id": dc},
            )
        if row is None:
            raise BatchNotFoundError(
                f"no batch {id!r} is tracked in service {service_id!r}; check the id "
                "(data change ids take the 'dc:' prefix) and the service id"
            )
        if fence is not None:
            held = await session.fetchone(
                "lock_claim",
                {
                    "service_id": service_id,
                    "instance_id": fence.instance_id,
                    "epoch": fence.epoch,
                },
            )
            if held is None:
                raise FencedOffError(
                    f"instance {fence.instance_id} no longer holds the claim on service "
                    f"{service_id!r} at epoch {fence.epoch}; the write to batch {id} did not "
                    "land: drop the batch, the service's new holder takes it over"
                )
        return row

    async def _write_status(
        self,
        session: Session,
        service_id: str,
        batch_id: str,
        current: str | None,
        submitted: bool,
        name: BatchStatusName,
        at: int,
        *,
        check: bool,
    ) -> bool:
        """Write status ``name``; ``check`` counts it as a monitor check (an
        attempt's status is none: it leaves the submission row as
        ``record_attempt`` wrote it). A final status already recorded is not
        written again (:func:`ledgerq.store.common.already_recorded`):
        returns whether it was written."""
        if current is not None and BatchStatusName(current).is_final and not name.is_final:
            raise StatusTransitionError(
                f"batch {batch_id} of service {service_id!r} is {current}, which is final; "
                f"it cannot become {name.value}"
            )
        if common.already_recorded(None if current is None else BatchStatusName(current), name):
            return False
        await session.execute(
            "write_status_checked" if check else "write_status",
            {
                "service_id": service_id,
                "batch_id": batch_id,
                "status": name.value,
                "final": name.is_final,
                "submitted": common.status_effects(name, bool(submitted)),
                "now": at,
            },
        )
        return True

    async def _write_receipts(
        self, session: Session, service_id: str, receipts: list[TransactionReceipt], at: int
    ) -> None:
        if receipts:
            await session.executemany(
                "upsert_receipt",
                [
                    {
                        "service_id": service_id,
                        "transaction_id": r.transaction_id,
                        "result_valid": r.result_valid,
                        "error_message": r.error_message,
                        "error_data": r.error_data,
                        "serialized_receipt": r.serialized_receipt,
                        "external_status": r.external_status,
                        "external_error_message": r.external_error_message,
                        "now": at,
                    }
                    for r in receipts
                ],
            )

    async def _update_one(
        self, session: Session, w: BatchWrite, receipts: list[TransactionReceipt], at: int
    ) -> None:
        service_id = w.service_id
        batch_id, current, submitted = await self._lock_batch(session, w.id, service_id, w.fence)
        key = {"service_id": service_id, "batch_id": batch_id}
        status = w.status
        written = False
        if status is not None:
            name = status if isinstance(status, BatchStatusName) else status.name
            written = await self._write_status(
                session, service_id, batch_id, current, submitted, name, at, check=True
            )
        await self._write_receipts(session, service_id, receipts, at)
        error = w.submission_error
        if error is not None:
            await session.execute(
                "upsert_submission_error",
                {
                    **key,
                    "error_type": error.error_type,
                    "error_message": error.error_message,
                    "now": at,
                },
            )
        if (
            w.halt is not None
            and written
            and status is not None
            and status.name is BatchStatusName.INVALID
        ):
            await self._record_halt(session, service_id, batch_id, w.halt, at)

    async def _record_halt(
        self, session: Session, service_id: str, batch_id: str, reason: str, at: int
    ) -> None:
        await session.execute(
            "set_halted",
            {"service_id": service_id, "batch_id": batch_id, "reason": reason, "now": at},
        )
        await self._record_action(session, service_id, "halt", "gateway", [batch_id], reason, at)

    async def _record_action(
        self,
        session: Session,
        service_id: str,
        action: str,
        actor: str,
        batch_ids: Sequence[str],
        detail: str | None,
        at: int,
    ) -> int:
        row = await session.fetchone(
            "insert_service_action",
            {
                "service_id": service_id,
                "action": action,
                "actor": actor,
                "batch_ids": self._backend.texts_param(batch_ids),
                "detail": detail,
                "now": at,
            },
        )
        assert row is not None
        return int(row[0])

    def _prepare_attempt(self, write: BatchWrite) -> _Attempt:
        name = None if write.status is None else common.status_name_of(write.status)
        receipts = common.receipts_to_write(None, write.transaction_receipts)
        common.check_receipts(receipts)
        common.check_submission_error(write.submission_error)
        return _Attempt(write, name, receipts, self._now(write.now))

    async def _attempt_one(self, session: _DeferredSession, attempt: _Attempt) -> None:
        w = attempt.write
        service_id = w.service_id
        bid, current, _ = await self._lock_batch(session, w.id, service_id, w.fence)
        if current is not None and BatchStatusName(current).is_final:
            raise StatusTransitionError(
                f"batch {bid} of service {service_id!r} is {current}, which is final; "
                "it is never submitted again"
            )
        if attempt.name is None and service_id in session.stopped:
            raise StatusTransitionError(
                f"service {service_id!r} is paused or halted: batch {bid} is not taken"
            )
        error = w.submission_error
        await session.execute(
            "record_attempt",
            {
                "service_id": service_id,
                "batch_id": bid,
                "error_type": error and error.error_type,
                "error_message": error and error.error_message,
                "now": attempt.at,
            },
        )
        if attempt.name is not None:
            await self._write_status(
                session, service_id, bid, current, True, attempt.name, attempt.at, check=False
            )
        await self._write_receipts(session, service_id, attempt.receipts, attempt.at)

    async def next_open_batch(self, service_id: str, after: str) -> TrackingBatch | None:
        return (await self.next_open_batches([(service_id, after)])).get(service_id)

    async def next_open_batches(self, pairs: Sequence[tuple[str, str]]) -> dict[str, TrackingBatch]:
        common.check_next_open_pairs(pairs)
        if not pairs:
            return {}
        if self.dialect == "postgresql":
            params: dict[str, Any] = {
                "service_ids": self._backend.texts_param([p[0] for p in pairs]),
                "afters": self._backend.texts_param([p[1] for p in pairs]),
            }
        else:
            params = {"keys": json.dumps([list(p) for p in pairs])}
        # One statement: the batches with their transactions, one row each.
        rows = await self._fetchall(
            "next_open_batches", params, short=len(pairs) <= SHORT_ROUND_SERVICES
        )
        batch_rows: list[Row] = []
        txns: list[Row] = []
        for r in rows:
            if not batch_rows or batch_rows[-1][0] != r[0]:
                batch_rows.append(r[:_BATCH_COLUMNS])
            if r[_BATCH_COLUMNS] is not None:
                txns.append((r[0], *r[_BATCH_COLUMNS:]))
        # Only batches without a status come back: none is Invalid.
        found = common.assemble(batch_rows, txns, ())
        return {b.service_id: b for b in found}

    def _takes_param(self, takes: Sequence[BatchWrite]) -> dict[str, Any]:
        triples = [(w.service_id, w.id, w.after or "") for w in takes]
        if self.dialect == "postgresql":
            return {
                "service_ids": self._backend.texts_param([t[0] for t in triples]),
                "batch_ids": self._backend.texts_param([t[1] for t in triples]),
                "afters": self._backend.texts_param([t[2] for t in triples]),
            }
        return {"keys": json.dumps(triples)}

    @staticmethod
    def _check_take(
        w: BatchWrite,
        writes: Sequence[BatchWrite],
        indexes: Sequence[int],
        results: Sequence[StoreError | None],
        allowed: set[tuple[str, str]],
    ) -> None:
        """Refuse a conditional take unless the queuer would pick its batch once
        the group's writes landed: it was the next open batch after ``after``
        before the group (``allowed``, read with the group's rows), and the
        group's only other writes of the service made ``after`` final."""
        finished = False
        others = False
        for j in indexes:
            o = writes[j]
            if o is w:
                continue
            if o.id == w.after and not o.attempt and _makes_final(o) and results[j] is None:
                finished = True
            else:
                others = True
        if not finished or others or (w.service_id, w.id) not in allowed:
            raise StatusTransitionError(
                f"batch {w.id} of service {w.service_id!r} is not the service's next batch "
                f"after {w.after} (that one is not made final here, or another batch comes "
                "first or holds the service); nothing was written"
            )

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        results: list[StoreError | None] = [None] * len(writes)
        steps: list[tuple[int, _Attempt | tuple[BatchWrite, list[TransactionReceipt]]]] = []
        takes: list[tuple[int, _Attempt]] = []
        for i, w in enumerate(writes):
            try:
                if w.attempt and w.after is not None:
                    takes.append((i, self._prepare_attempt(w)))
                elif w.attempt:
                    steps.append((i, self._prepare_attempt(w)))
                else:
                    steps.append((i, (w, common.prepare_update(w))))
            except WRITE_REFUSALS as exc:
                results[i] = exc

        # Final statuses that take the batches they free (PostgreSQL only).
        frees = (
            [i for i, w in enumerate(writes) if w.take_freed > 0 and _makes_final(w)]
            if self.takes_freed
            else []
        )

        async def body(session: Session) -> list[StoreError | None]:
            waves = _waves(steps)
            take_writes = [a.write for _, a in takes]
            if takes:
                # Conditional takes join the last wave, after its writes,
                # unless it writes one of their batches already.
                keys = {(w.service_id, w.id) for w in take_writes}
                if not waves or any(
                    (_write_of(step).service_id, _write_of(step).id) in keys
                    for _, step in waves[-1]
                ):
                    waves.append([])
            allowed: set[tuple[str, str]] = set()
            locked: list[Row] = []
            stopped: set[str] = set()
            # The group's writes of each service a take is of.
            of_service: dict[str, list[int]] = {w.service_id: [] for w in take_writes}
            if takes:
                for j, o in enumerate(writes):
                    found = of_service.get(o.service_id)
                    if found is not None:
                        found.append(j)
            for n, wave in enumerate(waves):
                # The writes of a wave touch distinct batches: their rows are
                # read and locked in one query, their statements deferred
                # and run set-based, kind by kind, in the order one write
                # issues them. The first wave's reads also lock what the
                # whole group makes final, first (_lock_calls), and check
                # which takes may land (before any write of the group).
                wave_takes = takes if n == len(waves) - 1 else []
                deferred = _DeferredSession(session)
                checked = await self._prefetch(
                    session,
                    deferred,
                    [_write_of(step) for _, step in wave] + [a.write for _, a in wave_takes],
                    # The takes' rows too: locked in key order with the rest.
                    group=[_write_of(step) for _, step in steps] + take_writes if n == 0 else None,
                    single_wave=len(waves) == 1,
                    takes=take_writes if n == 0 else (),
                )
                if checked is not None:
                    allowed = checked
                if n == 0:
                    locked = deferred.locked
                for i, step in wave:
                    mark = deferred.mark()
                    try:
                        if isinstance(step, _Attempt):
                            await self._attempt_one(deferred, step)
                        else:
                            w, receipts = step
                            await self._update_one(deferred, w, receipts, self._now(w.now))
                    except WRITE_REFUSALS as exc:
                        deferred.reset(mark)
                        results[i] = exc
                for i, attempt in wave_takes:
                    mark = deferred.mark()
                    try:
                        w = attempt.write
                        self._check_take(w, writes, of_service[w.service_id], results, allowed)
                        await self._attempt_one(deferred, attempt)
                    except WRITE_REFUSALS as exc:
                        deferred.reset(mark)
                        results[i] = exc
                await deferred.flush()
                stopped |= deferred.stopped
            taking = [i for i in frees if writes[i].service_id not in stopped]
            if taking:
                await self._take_freed(session, writes, taking, results, locked)
            return results

        if not steps and not takes:
            return results
        # Lock order (service, batch), the same for every group: two groups
        # never deadlock; writes of one batch keep their order (stable sort).
        steps.sort(key=lambda step: _write_of(step[1]).service_id + "\0" + _write_of(step[1]).id)
        return await self._backend.run(body, write=True)

    @property
    def takes_freed(self) -> bool:
        """Whether :attr:`BatchWrite.take_freed` takes anything here (PostgreSQL)."""
        return self.dialect == "postgresql"

    async def _take_freed(
        self,
        session: Session,
        writes: Sequence[BatchWrite],
        frees: Sequence[int],
        results: Sequence[StoreError | None],
        locked: Sequence[Row],
    ) -> None:
        """After a group's writes, in its transaction: the batches its final
        statuses with ``take_freed`` free, recorded taken (``take_freed``,
        sent with the ``COMMIT``). Candidates: the rows ``lock_group_rows``
        locked whose blocker (before the writes) is one of those batches;
        only a status that landed takes (its fence held)."""
        seq_of = {(r[0], r[1]): r[4] for r in locked}
        by_blocker: dict[int, list[int]] = {}
        for r in locked:
            if r[5] is not None:
                by_blocker.setdefault(int(r[5]), []).append(int(r[4]))
        seqs: list[int] = []
        reqs: list[int] = []
        limits: list[int] = []
        nows: list[int] = []
        targets: dict[int, BatchWrite] = {}
        for i in frees:
            w = writes[i]
            seq = seq_of.get((w.service_id, w.id))
            if results[i] is not None or seq is None:
                continue
            for candidate in by_blocker.get(int(seq), ()):
                seqs.append(candidate)
                reqs.append(i)
                limits.append(w.take_freed)
                nows.append(self._now(w.now))
            targets[i] = w
        if not seqs:
            return
        rows = await session.fetchall_committing(
            "take_freed",
            {
                "seq": self._backend.seqs_param(seqs),
                "req": self._backend.seqs_param(reqs),
                "take": self._backend.seqs_param(limits),
                "now": self._backend.seqs_param(nows),
            },
        )
        batch_rows: list[Row] = []
        txns: list[Row] = []
        for r in rows:
            if not batch_rows or batch_rows[-1][0] != r[0]:
                batch_rows.append(tuple(r[:_BATCH_COLUMNS]))
            if r[_BATCH_COLUMNS] is not None:
                txns.append((r[0], *r[_BATCH_COLUMNS:]))
        req_of = dict(zip(seqs, reqs, strict=True))
        for batch in common.assemble(batch_rows, txns, ()):
            assert batch.seq is not None
            target = targets[req_of[batch.seq]]
            if target.freed is not None:
                target.freed.append(batch)

    def _lock_calls(self, writes: Sequence[BatchWrite]) -> list[tuple[str, Params]]:
        """The statements that lock what a group making batches final writes,
        before anything else.

        PostgreSQL only (SQLite has one writer). Lock order (docs/ha.md):
        the ``queue_heads`` rows of the services it finishes batches in, then
        its batch rows and the batches they block (which the release trigger
        re-points), both in key order, then (per wave) the claim rows. The
        last call, when there is one, is ``lock_group_rows``: the locked
        rows' states.
        """
        finishing = sorted({w.service_id for w in writes if _makes_final(w)})
        if not finishing or self.dialect != "postgresql":
            return []
        calls: list[tuple[str, Params]] = [
            ("lock_finishing_heads", {"service_ids": self._backend.texts_param(finishing)})
        ]
        keys = sorted(
            {(w.service_id, w.id) for w in writes if not w.id.startswith(DATA_CHANGE_PREFIX)}
        )
        if keys:
            calls.append(("lock_group_rows", self._backend.keys_param(keys)))
        return calls

    async def _prefetch(
        self,
        session: Session,
        deferred: _DeferredSession,
        writes: Sequence[BatchWrite],
        *,
        group: Sequence[BatchWrite] | None = None,
        single_wave: bool = False,
        takes: Sequence[BatchWrite] = (),
    ) -> set[tuple[str, str]] | None:
        """Read and lock a wave's batch rows and claims; with ``group`` (the
        first wave), lock what the whole group makes final before them. All
        in one message on PostgreSQL, in lock order. With ``takes``, also
        return which of those conditional takes' batches are the next open
        batch of their service after their ``after`` (``next_open_checks``)."""
        calls = self._lock_calls(group) if group is not None else []
        # The rows lock_group_rows locked are the wave's when it is the only one.
        rows_locked = single_wave and bool(calls) and calls[-1][0] == "lock_group_rows"
        keys = sorted(
            {(w.service_id, w.id) for w in writes if not w.id.startswith(DATA_CHANGE_PREFIX)}
        )
        if keys and not rows_locked:
            calls.append(("batch_states", self._backend.keys_param(keys)))
        states_at = len(calls) - 1 if keys or rows_locked else None
        fences = sorted(
            {(w.service_id, w.fence.instance_id, w.fence.epoch) for w in writes if w.fence}
        )
        # Only PostgreSQL has claims; elsewhere the first fenced write refuses.
        claims_at = None
        if fences and self.dialect == "postgresql":
            calls.append(
                (
                    "lock_claims",
                    {
                        "service_ids": self._backend.texts_param([f[0] for f in fences]),
                        "instance_ids": self._backend.texts_param([f[1] for f in fences]),
                        "epochs": self._backend.seqs_param([f[2] for f in fences]),
                    },
                )
            )
            claims_at = len(calls) - 1
        # Takes, and final statuses that take what they free, of services
        # that take nothing new: refused (_attempt_one, apply_writes).
        taking = sorted(
            {
                w.service_id
                for w in [*writes, *takes]
                if (w.attempt and w.status is None) or w.take_freed > 0
            }
        )
        stopped_at = None
        if taking:
            calls.append(("stopped_of", {"service_ids": self._backend.texts_param(taking)}))
            stopped_at = len(calls) - 1
        if takes:
            calls.append(("next_open_checks", self._takes_param(takes)))
        if not calls:
            return None
        results = await session.fetchall_many(calls)
        if stopped_at is not None:
            deferred.stopped = {r[0] for r in results[stopped_at] if r[1]}
        for (name, _), rows in zip(calls, results, strict=True):
            if name == "lock_group_rows":
                deferred.locked = rows
        if states_at is not None:
            deferred.states = {(r[0], r[1]): (r[1], r[2], r[3]) for r in results[states_at]}
        if claims_at is not None:
            deferred.claims = {(r[0], r[1], int(r[2])) for r in results[claims_at]}
        if takes:
            return {(r[0], r[1]) for r in results[-1]}
        return None

    async def clean_stale_records(self, submitted_by: int) -> int:
        params = {"cutoff": submitted_by}

        async def body(session: Session) -> int:
            await session.execute("clean_stale_receipts", params)
            await session.execute("clean_orphan_receipts", params)
            return await session.execute("clean_stale_batches", params)

        return await self._backend.run(body, write=True)

    # -- queuer ---------------------------------------------------------------

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
        """The one-round serial queuer's round in one statement (plus hydration).

        Equal to :func:`ledgerq.queue.serial.select_round` over every tracked batch;
        ``narrow`` rounds leave the blobs out (see :class:`ledgerq.queue.serial.RoundStore`).
        """
        common.check_round(
            delay_window_ms, limit, services=services, claimant=claimant, dialect=self.dialect
        )
        params: dict[str, Any] = {
            "now": now,
            "delay_window_ms": delay_window_ms,
            "limit": limit,
            "narrow": narrow,
        }
        name = "queue_round"
        if claimant is not None:
            params["claimant"] = claimant
            name = "queue_round_claimed"
        if services is not None:
            wanted = sorted(set(services))
            if not wanted:
                return []
            params["services"] = self._backend.texts_param(wanted)
            name = "queue_round_services"
        # A round of a few woken services is a short read.
        short = services is not None and len(params["services"]) <= SHORT_ROUND_SERVICES
        if not narrow:
            return await self._list(name, params, short=short)

        async def body(session: Session) -> list[TrackingBatch]:
            return common.assemble(await session.fetchall(name, params), (), ())

        return await self._backend.run(body, write=False, short=short)

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
        """The parallel queuer's round in one statement (plus hydration).

        Equal to :func:`ledgerq.queue.parallel.select_parallel_round` over
        every tracked batch.
        """
        common.check_round(delay_window_ms, limit)
        check_per_service(per_service)
        # Blockers are what this round reads: kept from now on.
        await self.keep_lock_entries()
        params: dict[str, Any] = {
            "now": now,
            "delay_window_ms": delay_window_ms,
            "limit": limit,
            "narrow": narrow,
            "exclude": self._backend.seqs_param(sorted(set(exclude))),
            "per_service": per_service,
        }
        name = "parallel_round"
        if services is not None:
            wanted = sorted(set(services))
            if not wanted:
                return []
            params["services"] = self._backend.texts_param(wanted)
            name = "parallel_round_services"
        if per_service == 1:
            # Without ranking the candidates, which costs a sort of every
            # candidate over many services (docs/design-notes.md).
            name += "_first"
        short = services is not None and len(params["services"]) <= SHORT_ROUND_SERVICES
        if not narrow:
            return await self._list(name, params, short=short)

        async def body(session: Session) -> list[TrackingBatch]:
            return common.assemble(await session.fetchall(name, params), (), ())

        return await self._backend.run(body, write=False, short=short)

    async def get_batches_by_seq(self, seqs: Collection[int]) -> list[TrackingBatch]:
        """The batches with these ``seq``s, fully loaded, in ``seq`` order."""
        wanted = sorted(set(seqs))
        if not wanted:
            return []
        return await self._list(
            "get_batches_by_seq",
            {"seqs": self._backend.seqs_param(wanted)},
            short=len(wanted) <= SHORT_ROUND_SERVICES,
        )

    async def get_batches_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        """The batches with these ids, whatever their service, fully loaded, in ``seq`` order."""
        wanted = sorted(set(batch_ids))
        if not wanted:
            return []
        return await self._list(
            "get_batches_by_id", {"ids": self._backend.texts_param(wanted)}, short=True
        )

    async def get_batch_statuses_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        """As :meth:`get_batches_by_id` without the transactions and with an
        empty ``serialized_batch`` (an ``Invalid`` batch keeps its invalid
        transactions): what a status answer needs."""
        return await self._statuses_by_id("get_batch_statuses_by_id", batch_ids)

    async def get_final_batch_statuses_by_id(
        self, batch_ids: Collection[str]
    ) -> list[TrackingBatch]:
        """As :meth:`get_batch_statuses_by_id`, only the batches in a final
        state: a pending batch costs no row."""
        return await self._statuses_by_id("get_final_batch_statuses_by_id", batch_ids)

    async def _statuses_by_id(self, query: str, batch_ids: Collection[str]) -> list[TrackingBatch]:
        wanted = sorted(set(batch_ids))
        if not wanted:
            return []

        async def body(session: Session) -> list[TrackingBatch]:
            rows = await session.fetchall(query, {"ids": self._backend.texts_param(wanted)})
            invalid_seqs = [r[0] for r in rows if r[11] == BatchStatusName.INVALID.value]
            invalid: list[Row] = []
            if invalid_seqs:
                invalid = await session.fetchall(
                    "hydrate_invalid", {"seqs": self._backend.seqs_param(invalid_seqs)}
                )
            return common.assemble(rows, (), invalid)

        return await self._backend.run(body, write=False, short=True)

    # -- reads ----------------------------------------------------------------

    async def _hydrate(self, session: Session, rows: list[Row]) -> list[TrackingBatch]:
        if not rows:
            return []
        seqs = [r[0] for r in rows]
        txns = await session.fetchall(
            "hydrate_transactions", {"seqs": self._backend.seqs_param(seqs)}
        )
        invalid_seqs = [r[0] for r in rows if r[11] == BatchStatusName.INVALID.value]
        invalid: list[Row] = []
        if invalid_seqs:
            invalid = await session.fetchall(
                "hydrate_invalid", {"seqs": self._backend.seqs_param(invalid_seqs)}
            )
        return common.assemble(rows, txns, invalid)

    async def _list(self, name: str, params: Params, *, short: bool = False) -> list[TrackingBatch]:
        async def body(session: Session) -> list[TrackingBatch]:
            return await self._hydrate(session, await session.fetchall(name, params))

        return await self._backend.run(body, write=False, short=short)

    async def _fetchall(self, name: str, params: Params, *, short: bool = False) -> list[Row]:
        return await self._backend.run(lambda s: s.fetchall(name, params), write=False, short=short)

    async def get_batch(self, id: str, service_id: str) -> TrackingBatch | None:
        common.check_service_id(service_id)
        batch_id, dc = common.parse_id(id)
        if batch_id is not None:
            found = await self._list(
                "get_batch", {"service_id": service_id, "batch_id": batch_id}, short=True
            )
        else:
            found = await self._list(
                "get_batch_by_data_change_id", {"service_id": service_id, "data_change_id": dc}
            )
        return found[0] if found else None

    async def get_batch_status(self, id: str, service_id: str) -> BatchStatus | None:
        batch = await self.get_batch(id, service_id)
        return None if batch is None else batch.batch_status

    async def list_batches_by_status(
        self, status: BatchStatus | BatchStatusName
    ) -> TrackingBatchList:
        name = common.status_name_of(status)
        return TrackingBatchList(
            tuple(await self._list("list_batches_by_status", {"status": name.value}))
        )

    async def list_in_flight(
        self, *, limit: int = 10_000, services: Collection[str] | None = None
    ) -> list[TrackingBatch]:
        """Non-final batches that are ``Pending`` or ``submitted``, in ``seq``
        order, narrow (no blobs, no transactions, no errors); with
        ``services``, of those services only."""
        common.check_limit(limit)
        params: dict[str, Any] = {"limit": limit}
        name = "list_in_flight"
        if services is not None:
            wanted = sorted(set(services))
            for service_id in wanted:
                common.check_service_id(service_id)
            if not wanted:
                return []
            params["services"] = self._backend.texts_param(wanted)
            name = "list_in_flight_services"
        # Reads the busy index only: short.
        rows = await self._fetchall(name, params, short=True)
        return common.assemble(rows, (), ())

    async def get_unsubmitted_batches(self) -> TrackingBatchList:
        return TrackingBatchList(tuple(await self._list("get_unsubmitted_batches", {})))

    async def get_failed_batches(self) -> TrackingBatchList:
        return TrackingBatchList(tuple(await self._list("get_failed_batches", {})))

    async def list_batches(
        self,
        *,
        service_id: str | None = None,
        status: StatusFilter | None = None,
        limit: int = 100,
        after_seq: int | None = None,
    ) -> TrackingBatchList:
        common.check_limit(limit)
        wanted = common.parse_status_filter(status)
        params = {
            "service_id": service_id,
            # "none" selects batches without a status: NULL in the query.
            "status": None if wanted == NO_STATUS else wanted,
            "limit": limit,
            "after_seq": after_seq or 0,
        }
        name = "list_batches"
        if service_id is not None:
            name += "_service"
        if wanted is not None:
            name += "_status"
        return TrackingBatchList(tuple(await self._list(name, params)))

    async def list_services(
        self, *, limit: int = 1000, after: str | None = None, service_id: str | None = None
    ) -> list[ServiceSummary]:
        common.check_limit(limit)
        params = {"after": after, "limit": limit, "service_id": service_id}

        async def body(session: Session) -> list[ServiceSummary]:
            rows = await session.fetchall("list_services", params)
            blocked = {r[6]: r[8] for r in rows if r[8] is not None}  # next seq -> blocker seq
            conflicts = await self._conflicts(session, blocked) if blocked else {}
            out = []
            for row in rows:
                sid, depth, head, flight, total, count, next_seq, next_id, _, blocker_id = row[:10]
                paused, paused_by, paused_at, halted_id, halted_reason, halted_at, waits = row[10:]
                kind, on = conflicts.get(next_seq, (None, None))
                out.append(
                    ServiceSummary(
                        service_id=sid,
                        queue_depth=int(depth),
                        head_batch_id=head,
                        in_flight_batch_id=flight,
                        total=int(total),
                        in_flight=int(count),
                        next_batch_id=next_id,
                        blocker_batch_id=blocker_id,
                        blocker_kind=kind,
                        blocker_on=on,
                        paused=bool(paused),
                        paused_by=paused_by,
                        paused_at=None if paused_at is None else int(paused_at),
                        halted_batch_id=halted_id,
                        halted_reason=halted_reason,
                        halted_at=None if halted_at is None else int(halted_at),
                        next_waits_for=waits,
                    )
                )
            return out

        return await self._backend.run(body, write=False)

    async def _conflicts(
        self, session: Session, blocked: Mapping[int, int]
    ) -> dict[int, tuple[str, str]]:
        """For next batch seq → blocker seq: how the blocker blocks it (kind, entry)."""
        seqs = sorted({*blocked, *blocked.values()})
        rows = await session.fetchall("locks_of", {"seqs": self._backend.seqs_param(seqs)})
        entries: dict[int, dict[str, list[str]]] = {}
        for seq, mode, entry in rows:
            entries.setdefault(seq, {}).setdefault(mode, []).append(entry)
        blockers = sorted(set(blocked.values()))
        txns: dict[int, list[str]] = {}
        for seq, tid in await session.fetchall(
            "transaction_ids_of", {"seqs": self._backend.seqs_param(blockers)}
        ):
            txns.setdefault(seq, []).append(tid)

        def access(seq: int) -> BatchAccess:
            e = entries.get(seq, {})
            return BatchAccess(tuple(e.get("r", ())), tuple(e.get("w", ())), tuple(e.get("d", ())))

        out: dict[int, tuple[str, str]] = {}
        for later, earlier in blocked.items():
            found = conflict_between(access(earlier), txns.get(earlier, ()), access(later))
            if found is not None:
                out[later] = (found[0].value, found[1])
        return out

    async def batches_following(
        self, service_id: str, after: str | None, *, limit: int
    ) -> list[TrackingBatch]:
        common.check_service_id(service_id)
        rows = await self._fetchall(
            "batches_following",
            {"service_id": service_id, "after": after, "limit": limit},
            short=True,
        )
        heads: dict[Any, Row] = {}
        for r in rows:
            heads.setdefault(r[0], r[:_BATCH_COLUMNS])
        txns = [(r[0], *r[_BATCH_COLUMNS:]) for r in rows if r[_BATCH_COLUMNS] is not None]
        # Not final: no invalid transactions to read.
        return common.assemble(list(heads.values()), txns, ())

    # -- operator control and declared dependencies --------------------------

    async def service_controls(
        self, service_ids: Collection[str] | None = None
    ) -> dict[str, ServiceControl]:
        if service_ids is None:
            rows = await self._fetchall("stopped_services", {})
        else:
            wanted = sorted(set(service_ids))
            if not wanted:
                return {}
            rows = await self._fetchall(
                "service_controls_of", {"service_ids": self._backend.texts_param(wanted)}
            )
        return {r[0]: common.service_control(r) for r in rows}

    async def control_service(
        self,
        service_id: str,
        action: ServiceActionKind,
        *,
        actor: str,
        batch_ids: Sequence[str] = (),
        now: int | None = None,
    ) -> ServiceAction:
        common.check_service_id(service_id)
        at = self._now(now)
        ids = list(dict.fromkeys(batch_ids))

        async def body(session: Session) -> ServiceAction:
            if await session.fetchone("service_exists", {"service_id": service_id}) is None:
                raise common.no_such_service(service_id)
            # A cancel locks batch rows, as takes do, and never the control
            # row, which takes lock after their batch rows.
            row = (
                None
                if action == "cancel"
                else await session.fetchone("lock_service_control", {"service_id": service_id})
            )
            control = common.service_control((service_id, *row) if row else (service_id,))
            detail = common.check_control(control, action, ids)
            if action in ("pause", "resume"):
                params = {"service_id": service_id, "paused": action == "pause", "now": at}
                await session.execute("set_paused", params)
            elif action == "skip":
                await session.execute("clear_halted", {"service_id": service_id, "now": at})
            elif action == "cancel":
                detail = await self._cancel(session, service_id, ids, actor, at)
            action_id = await self._record_action(
                session, service_id, action, actor, ids, detail, at
            )
            return ServiceAction(action_id, service_id, action, actor, at, tuple(ids), detail)

        return await self._backend.run(body, write=True)

    async def _cancel(
        self, session: Session, service_id: str, batch_ids: Sequence[str], actor: str, at: int
    ) -> str:
        """Cancel every batch of ``batch_ids`` or none: each locked and
        checked first, then recorded ``Invalid`` with its reason."""
        states = []
        for batch_id in batch_ids:
            row = await session.fetchone(
                "batch_state", {"service_id": service_id, "batch_id": batch_id}
            )
            if row is None:
                raise BatchNotFoundError(
                    f"no batch {batch_id!r} is tracked in service {service_id!r}; nothing "
                    "was cancelled"
                )
            states.append((batch_id, row[1], bool(row[2])))
        common.check_cancellable(service_id, states)
        message = common.cancelled_message(actor, at)
        for batch_id in batch_ids:
            tids = [
                r[0]
                for r in await session.fetchall(
                    "transaction_ids_of_batch", {"service_id": service_id, "batch_id": batch_id}
                )
            ]
            write = common.cancel_write(service_id, batch_id, tids, message, at)
            await self._update_one(session, write, common.prepare_update(write), at)
        return message

    async def service_actions(
        self, service_id: str, *, limit: int = 100, before: int | None = None
    ) -> list[ServiceAction]:
        common.check_service_id(service_id)
        common.check_limit(limit)
        rows = await self._fetchall(
            "service_actions", {"service_id": service_id, "before": before, "limit": limit}
        )
        return [common.service_action(r) for r in rows]

    async def dependency_states(
        self, transaction_ids: Collection[str]
    ) -> dict[str, DependencyState]:
        wanted = sorted(set(transaction_ids))
        if not wanted:
            return {}
        rows = await self._fetchall(
            "dependency_states", {"ids": self._backend.texts_param(wanted)}, short=True
        )
        return {r[0]: common.dependency_state(r) for r in rows}

    async def dependency_path(
        self, service_id: str, batch_id: str, max_steps: int
    ) -> DependencyPath | None:
        rows = await self._fetchall(
            "dependency_path",
            {"service_id": service_id, "batch_id": batch_id, "max_steps": max_steps},
            short=True,
        )
        return common.dependency_path(rows)

    async def status_counts(self) -> dict[str, int]:
        rows = await self._fetchall("status_counts", {})
        return {str(name): int(count) for name, count in rows}


__all__ = ["Backend", "ConflictError", "Session", "SqlStore"]
