"""In-memory batch tracking store, for unit tests of other components.

Same semantics as the SQL backends (the contract suite runs against it
unchanged), nothing persisted. Each method runs without awaiting, so it is
atomic with respect to other tasks on the event loop. Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Self

from ledgerq.clock import Clock, now_ms
from ledgerq.errors import (
    WRITE_REFUSALS,
    BatchNotFoundError,
    DuplicateBatchError,
    StatusTransitionError,
    StoreError,
)
from ledgerq.model import (
    CANCELLED,
    DEPENDENCY,
    BatchStatus,
    BatchStatusName,
    BatchWrite,
    InvalidTransaction,
    SubmissionError,
    TrackingBatch,
    TrackingBatchList,
    TransactionReceipt,
)
from ledgerq.queue.parallel import BatchAccess, conflict, select_parallel_round
from ledgerq.queue.serial import select_round
from ledgerq.store import common
from ledgerq.store.base import (
    NO_STATUS,
    DependencyPath,
    DependencyState,
    ServiceAction,
    ServiceActionKind,
    ServiceControl,
    ServiceSummary,
    StatusFilter,
)


@dataclass(slots=True)
class _Record:
    batch: TrackingBatch  # as added, with seq and created_at
    submitted: bool = False
    status: BatchStatusName | None = None
    status_updated_at: int | None = None
    error: SubmissionError | None = None
    has_submission: bool = False
    last_attempt_at: int | None = None
    attempts: int = 0
    times_checked: int = 0
    last_checked: int | None = None


@dataclass(slots=True)
class _Receipt:
    receipt: TransactionReceipt
    updated_at: int


@dataclass(slots=True)
class _State:
    records: dict[tuple[str, str], _Record] = field(default_factory=dict)
    by_dc: dict[tuple[str, str], str] = field(default_factory=dict)
    txn_owner: dict[tuple[str, str], str] = field(default_factory=dict)
    #: batch id -> the one service tracking it.
    batch_service: dict[str, str] = field(default_factory=dict)
    receipts: dict[tuple[str, str], _Receipt] = field(default_factory=dict)
    next_seq: int = 1
    controls: dict[str, ServiceControl] = field(default_factory=dict)
    actions: list[ServiceAction] = field(default_factory=list)


class MemoryStore(common.SeedWrites):
    """:class:`~ledgerq.store.base.BatchTrackingStore` in a few dicts."""

    dialect = "memory"
    #: A final status takes no batch it frees here (``BatchWrite.take_freed``).
    takes_freed = False

    def __init__(self, *, clock: Clock = now_ms) -> None:
        self._clock = clock
        self._s = _State()
        self._closed = False

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
        self._closed = True

    def _now(self, now: int | None) -> int:
        return self._clock() if now is None else now

    # -- writes ---------------------------------------------------------------

    async def add_batches(
        self, batches: list[TrackingBatch], *, now: int | None = None
    ) -> list[TrackingBatch]:
        common.check_new_batches(batches)
        at = self._now(now)
        s = self._s
        for b in batches:  # check everything first: all or nothing
            owner_service = s.batch_service.get(b.batch_header)
            if owner_service is not None:
                raise common.duplicate_batch(b, owner_service)
            if b.data_change_id is not None and (b.service_id, b.data_change_id) in s.by_dc:
                dc_owner = s.by_dc[(b.service_id, b.data_change_id)]
                raise DuplicateBatchError(
                    f"data change id {b.data_change_id!r} is already used by batch {dc_owner} "
                    f"in service {b.service_id!r}; nothing was added",
                    batch_id=b.batch_header,
                    data_change_id=b.data_change_id,
                    service_id=b.service_id,
                )
            for t in b.transactions:
                owner = s.txn_owner.get((b.service_id, t.transaction_header))
                if owner is not None:
                    raise DuplicateBatchError(
                        f"transaction {t.transaction_header} of batch {b.batch_header} is "
                        f"already tracked in batch {owner} of service {b.service_id!r}; "
                        "nothing was added",
                        batch_id=b.batch_header,
                        service_id=b.service_id,
                        transaction_id=t.transaction_header,
                    )
        added: list[TrackingBatch] = []
        for b in batches:
            stored = replace(common.with_defaults(b, at), seq=s.next_seq)
            s.next_seq += 1
            s.records[(b.service_id, b.batch_header)] = _Record(stored)
            s.batch_service[b.batch_header] = b.service_id
            if b.data_change_id is not None:
                s.by_dc[(b.service_id, b.data_change_id)] = b.batch_header
            for t in b.transactions:
                s.txn_owner[(b.service_id, t.transaction_header)] = b.batch_header
            added.append(stored)
        return added

    def _find(self, id: str, service_id: str) -> _Record | None:
        common.check_service_id(service_id)
        batch_id, dc = common.parse_id(id)
        if batch_id is None:
            assert dc is not None
            batch_id = self._s.by_dc.get((service_id, dc))
            if batch_id is None:
                return None
        return self._s.records.get((service_id, batch_id))

    def _lock(self, id: str, service_id: str) -> _Record:
        rec = self._find(id, service_id)
        if rec is None:
            raise BatchNotFoundError(
                f"no batch {id!r} is tracked in service {service_id!r}; check the id "
                "(data change ids take the 'dc:' prefix) and the service id"
            )
        return rec

    @staticmethod
    def _check_transition(rec: _Record, name: BatchStatusName) -> None:
        if rec.status is not None and rec.status.is_final and not name.is_final:
            raise StatusTransitionError(
                f"batch {rec.batch.batch_header} of service {rec.batch.service_id!r} is "
                f"{rec.status.value}, which is final; it cannot become {name.value}"
            )

    @staticmethod
    def _apply_status(rec: _Record, name: BatchStatusName, at: int) -> None:
        rec.status = name
        # updated_at only grows, as the SQL stores keep it (see docs/schema.md).
        prev = rec.status_updated_at
        rec.status_updated_at = at if prev is None else max(at, prev + 1)
        rec.submitted = common.status_effects(name, rec.submitted)
        if name is BatchStatusName.DELAYED:
            rec.last_attempt_at = at

    def _write_receipts(self, service_id: str, receipts: list[TransactionReceipt], at: int) -> None:
        for r in receipts:
            key = (service_id, r.transaction_id)
            old = self._s.receipts.get(key)
            self._s.receipts[key] = _Receipt(r, at if old is None else max(at, old.updated_at + 1))

    def _update_one(self, w: BatchWrite, receipts: list[TransactionReceipt], at: int) -> None:
        rec = self._lock(w.id, w.service_id)
        status = w.status
        written = False
        if status is not None:
            name = status if isinstance(status, BatchStatusName) else status.name
            self._check_transition(rec, name)
            written = not common.already_recorded(rec.status, name)
            if written:
                self._apply_status(rec, name, at)
                if rec.has_submission:
                    rec.times_checked += 1
                    rec.last_checked = at
        self._write_receipts(w.service_id, receipts, at)
        if w.submission_error is not None:
            if not rec.has_submission:
                rec.has_submission, rec.times_checked, rec.last_checked = True, 1, at
            rec.error = w.submission_error
        if w.halt is not None and written and rec.status is BatchStatusName.INVALID:
            control = self._control(w.service_id)
            self._s.controls[w.service_id] = replace(
                control, halted_batch_id=rec.batch.batch_header, halted_reason=w.halt, halted_at=at
            )
            self._act(w.service_id, "halt", "gateway", [rec.batch.batch_header], w.halt, at)

    def _control(self, service_id: str) -> ServiceControl:
        return self._s.controls.get(service_id) or ServiceControl(service_id)

    def _act(
        self,
        service_id: str,
        action: str,
        actor: str,
        batch_ids: Sequence[str],
        detail: str | None,
        at: int,
    ) -> ServiceAction:
        done = ServiceAction(
            len(self._s.actions) + 1, service_id, action, actor, at, tuple(batch_ids), detail
        )
        self._s.actions.append(done)
        return done

    def _attempt_one(self, w: BatchWrite) -> None:
        name = None if w.status is None else common.status_name_of(w.status)
        receipts = common.receipts_to_write(None, w.transaction_receipts)
        common.check_receipts(receipts)
        common.check_submission_error(w.submission_error)
        at = self._now(w.now)
        rec = self._lock(w.id, w.service_id)
        if rec.status is not None and rec.status.is_final:
            raise StatusTransitionError(
                f"batch {rec.batch.batch_header} of service {w.service_id!r} is "
                f"{rec.status.value}, which is final; it is never submitted again"
            )
        if name is None and self._control(w.service_id).stopped:
            raise StatusTransitionError(
                f"service {w.service_id!r} is paused or halted: batch "
                f"{rec.batch.batch_header} is not taken"
            )
        rec.submitted = True
        rec.attempts += 1
        rec.last_attempt_at = at
        if not rec.has_submission:
            rec.has_submission, rec.times_checked, rec.last_checked = True, 1, at
        rec.error = w.submission_error
        if name is not None:
            self._apply_status(rec, name, at)
        self._write_receipts(w.service_id, receipts, at)

    def _next_open(self, service_id: str, after: str) -> _Record | None:
        """The service's first non-final batch other than ``after`` if it was
        never taken and nothing else of the service (``after`` aside) is busy."""
        live = sorted(
            (
                r
                for (sid, bid), r in self._s.records.items()
                if sid == service_id and bid != after and not (r.status and r.status.is_final)
            ),
            key=lambda r: r.batch.seq or 0,
        )
        if not live or any(r.submitted or r.status is not None for r in live):
            return None
        return live[0]

    async def next_open_batch(self, service_id: str, after: str) -> TrackingBatch | None:
        return (await self.next_open_batches([(service_id, after)])).get(service_id)

    async def next_open_batches(self, pairs: Sequence[tuple[str, str]]) -> dict[str, TrackingBatch]:
        common.check_next_open_pairs(pairs)
        found = {}
        for service_id, after in pairs:
            rec = self._next_open(service_id, after)
            if rec is not None:
                found[service_id] = self._view(rec)
        return found

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]:
        results: list[StoreError | None] = [None] * len(writes)
        # Conditional takes after every other write of the group.
        order = [i for i, w in enumerate(writes) if w.after is None]
        order += [i for i, w in enumerate(writes) if w.after is not None]
        for i in order:
            w = writes[i]
            try:
                if w.attempt and w.after is not None:
                    after = self._find(w.after, w.service_id)
                    nxt = self._next_open(w.service_id, w.after)
                    if (
                        after is None
                        or after.status is None
                        or not after.status.is_final
                        or nxt is None
                        or nxt.batch.batch_header != w.id
                    ):
                        raise StatusTransitionError(
                            f"batch {w.id} of service {w.service_id!r} is not the service's "
                            f"next batch after {w.after}; nothing was written"
                        )
                common.check_no_fence(w.fence, "memory")
                if w.attempt:
                    self._attempt_one(w)
                else:
                    self._update_one(w, common.prepare_update(w), self._now(w.now))
            except WRITE_REFUSALS as exc:
                results[i] = exc
        return results

    async def clean_stale_records(self, submitted_by: int) -> int:
        s = self._s
        stale = [
            key
            for key, rec in s.records.items()
            if rec.status is not None
            and rec.status.is_final
            and rec.status_updated_at is not None
            and rec.status_updated_at < submitted_by
        ]
        for key in stale:
            rec = s.records.pop(key)
            b = rec.batch
            s.batch_service.pop(b.batch_header, None)
            if b.data_change_id is not None:
                s.by_dc.pop((b.service_id, b.data_change_id), None)
            for t in b.transactions:
                s.txn_owner.pop((b.service_id, t.transaction_header), None)
                s.receipts.pop((b.service_id, t.transaction_header), None)
        for rkey in [
            k for k, r in s.receipts.items() if r.updated_at < submitted_by and k not in s.txn_owner
        ]:
            del s.receipts[rkey]
        return len(stale)

    async def batches_following(
        self, service_id: str, after: str | None, *, limit: int
    ) -> list[TrackingBatch]:
        common.check_service_id(service_id)
        floor = 0
        if after is not None:
            before = self._s.records.get((service_id, after))
            if before is None:
                return []
            floor = before.batch.seq or 0
        later = [
            r
            for (sid, _), r in self._s.records.items()
            if sid == service_id
            and (r.batch.seq or 0) > floor
            and not (r.status and r.status.is_final)
        ]
        later.sort(key=lambda r: r.batch.seq or 0)
        return [self._view(r) for r in later[:limit]]

    # -- operator control and declared dependencies ---------------------------

    async def service_controls(
        self, service_ids: Collection[str] | None = None
    ) -> dict[str, ServiceControl]:
        controls = self._s.controls
        if service_ids is None:
            return {s: c for s, c in sorted(controls.items()) if c.stopped}
        return {s: controls[s] for s in sorted(set(service_ids)) if s in controls}

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
        if not any(sid == service_id for sid, _ in self._s.records):
            raise common.no_such_service(service_id)
        control = self._control(service_id)
        detail = common.check_control(control, action, ids)
        if action in ("pause", "resume"):
            self._s.controls[service_id] = replace(control, paused=action == "pause")
        elif action == "skip":
            self._s.controls[service_id] = replace(
                control, halted_batch_id=None, halted_reason=None, halted_at=None
            )
        elif action == "cancel":
            states = []
            for batch_id in ids:
                rec = self._s.records.get((service_id, batch_id))
                if rec is None:
                    raise BatchNotFoundError(
                        f"no batch {batch_id!r} is tracked in service {service_id!r}; nothing "
                        "was cancelled"
                    )
                states.append(
                    (batch_id, None if rec.status is None else rec.status.value, rec.submitted)
                )
            common.check_cancellable(service_id, states)
            detail = common.cancelled_message(actor, at)
            for batch_id in ids:
                rec = self._s.records[(service_id, batch_id)]
                tids = [t.transaction_header for t in rec.batch.transactions]
                write = common.cancel_write(service_id, batch_id, tids, detail, at)
                self._update_one(write, common.prepare_update(write), at)
        return self._act(service_id, action, actor, ids, detail, at)

    async def service_actions(
        self, service_id: str, *, limit: int = 100, before: int | None = None
    ) -> list[ServiceAction]:
        common.check_service_id(service_id)
        common.check_limit(limit)
        found = [
            a
            for a in reversed(self._s.actions)
            if a.service_id == service_id and (before is None or a.id < before)
        ]
        return found[:limit]

    async def dependency_states(
        self, transaction_ids: Collection[str]
    ) -> dict[str, DependencyState]:
        wanted = set(transaction_ids)
        out: dict[str, DependencyState] = {}
        for (sid, tid), bid in self._s.txn_owner.items():
            if tid in wanted:
                out[tid] = _dependency_state(tid, self._s.records[(sid, bid)])
        return out

    async def dependency_path(
        self, service_id: str, batch_id: str, max_steps: int
    ) -> DependencyPath | None:
        rec = self._s.records.get((service_id, batch_id))
        if rec is None:
            return None
        trackers: dict[str, list[_Record]] = {}
        for (sid, tid), bid in self._s.txn_owner.items():
            trackers.setdefault(tid, []).append(self._s.records[(sid, bid)])
        steps: list[DependencyState] = []
        while len(steps) < max_steps and (not steps or _open(rec)):
            step = _first_open_dependency(rec.batch, trackers)
            if step is None:
                break
            steps.append(_dependency_state(*step))
            rec = step[1]
        untracked = tuple(d for d in _dependencies(rec.batch) if d not in trackers)
        return DependencyPath(tuple(steps), untracked)

    # -- reads ----------------------------------------------------------------

    def _view(self, rec: _Record) -> TrackingBatch:
        b = rec.batch
        invalid: list[InvalidTransaction] = []
        if rec.status is BatchStatusName.INVALID:
            for t in b.transactions:
                found = self._s.receipts.get((b.service_id, t.transaction_header))
                if found is not None and not found.receipt.result_valid:
                    r = found.receipt
                    invalid.append(
                        InvalidTransaction(
                            transaction_id=r.transaction_id,
                            error_message=r.error_message,
                            error_data=r.error_data,
                            external_error_status=r.external_status,
                            external_error_message=r.external_error_message,
                        )
                    )
        return replace(
            b,
            submitted=rec.submitted,
            batch_status=common.build_status(
                None if rec.status is None else rec.status.value,
                [t.transaction_header for t in b.transactions],
                invalid,
            ),
            submission_error=rec.error,
            last_attempt_at=rec.last_attempt_at,
            attempts=rec.attempts,
        )

    def _ordered(self) -> list[_Record]:
        return sorted(self._s.records.values(), key=lambda r: r.batch.seq or 0)

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
        # Narrow or not, the memory store's batches are loaded already.
        common.check_round(delay_window_ms, limit, services=services, claimant=claimant)
        wanted = None if services is None else frozenset(services)
        open_ = [
            self._view(r)
            for r in self._ordered()
            if not (r.status is not None and r.status.is_final)
            and (wanted is None or r.batch.service_id in wanted)
        ]
        picks = select_round(open_, now=now, delay_window_ms=delay_window_ms)
        return picks if limit is None else picks[:limit]

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
        common.check_round(delay_window_ms, limit)
        wanted = None if services is None else frozenset(services)
        open_ = [
            self._view(r)
            for r in self._ordered()
            if not (r.status is not None and r.status.is_final)
            and (wanted is None or r.batch.service_id in wanted)
        ]
        picks = select_parallel_round(
            open_,
            now=now,
            delay_window_ms=delay_window_ms,
            exclude=exclude,
            per_service=per_service,
        )
        return picks if limit is None else picks[:limit]

    async def get_batches_by_seq(self, seqs: Collection[int]) -> list[TrackingBatch]:
        wanted = set(seqs)
        return [self._view(r) for r in self._ordered() if r.batch.seq in wanted]

    async def get_batches_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        s = self._s
        found = [s.records[(s.batch_service[i], i)] for i in set(batch_ids) if i in s.batch_service]
        return [self._view(r) for r in sorted(found, key=lambda r: r.batch.seq or 0)]

    async def get_batch_statuses_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]:
        return await self.get_batches_by_id(batch_ids)

    async def get_final_batch_statuses_by_id(
        self, batch_ids: Collection[str]
    ) -> list[TrackingBatch]:
        return [b for b in await self.get_batches_by_id(batch_ids) if b.is_final]

    async def get_batch(self, id: str, service_id: str) -> TrackingBatch | None:
        rec = self._find(id, service_id)
        return None if rec is None else self._view(rec)

    async def get_batch_status(self, id: str, service_id: str) -> BatchStatus | None:
        batch = await self.get_batch(id, service_id)
        return None if batch is None else batch.batch_status

    async def list_batches_by_status(
        self, status: BatchStatus | BatchStatusName
    ) -> TrackingBatchList:
        name = common.status_name_of(status)
        return TrackingBatchList(tuple(self._view(r) for r in self._ordered() if r.status is name))

    async def list_in_flight(
        self, *, limit: int = 10_000, services: Collection[str] | None = None
    ) -> list[TrackingBatch]:
        common.check_limit(limit)
        if services is not None:
            for service_id in services:
                common.check_service_id(service_id)
        wanted = None if services is None else frozenset(services)
        found = [
            self._view(r)
            for r in self._ordered()
            if (wanted is None or r.batch.service_id in wanted)
            and not (r.status is not None and r.status.is_final)
            and (r.status is BatchStatusName.PENDING or r.submitted)
        ]
        return found[:limit]

    async def get_unsubmitted_batches(self) -> TrackingBatchList:
        return TrackingBatchList(
            tuple(
                self._view(r)
                for r in self._ordered()
                if not r.submitted and not (r.status is not None and r.status.is_final)
            )
        )

    async def get_failed_batches(self) -> TrackingBatchList:
        def failed(r: _Record) -> bool:
            if r.status is BatchStatusName.INVALID:
                return True
            return r.error is not None and r.status not in (
                BatchStatusName.VALID,
                BatchStatusName.COMMITTED,
            )

        return TrackingBatchList(tuple(self._view(r) for r in self._ordered() if failed(r)))

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
        out: list[TrackingBatch] = []
        for r in self._ordered():
            if (r.batch.seq or 0) <= (after_seq or 0):
                continue
            if service_id is not None and r.batch.service_id != service_id:
                continue
            if wanted == NO_STATUS and r.status is not None:
                continue
            if wanted not in (None, NO_STATUS) and (r.status is None or r.status.value != wanted):
                continue
            out.append(self._view(r))
            if len(out) == limit:
                break
        return TrackingBatchList(tuple(out))

    async def list_services(
        self, *, limit: int = 1000, after: str | None = None, service_id: str | None = None
    ) -> list[ServiceSummary]:
        common.check_limit(limit)
        by_service: dict[str, list[_Record]] = {}
        for r in self._ordered():
            by_service.setdefault(r.batch.service_id, []).append(r)
        out: list[ServiceSummary] = []
        for sid in sorted(by_service):
            if (after is not None and sid <= after) or service_id not in (None, sid):
                continue
            recs = by_service[sid]
            open_ = [r for r in recs if not (r.status is not None and r.status.is_final)]
            flight = [r for r in open_ if r.submitted]
            moving = [r for r in open_ if r.submitted or r.status is BatchStatusName.PENDING]
            waiting = [i for i, r in enumerate(open_) if r not in moving]
            found = None
            if waiting:
                views = [self._view(r) for r in open_[: waiting[0] + 1]]
                later = BatchAccess.of(views[-1])
                for earlier in reversed(views[:-1]):
                    found = conflict(earlier, BatchAccess.of(earlier), later)
                    if found is not None:
                        break
            out.append(
                ServiceSummary(
                    service_id=sid,
                    queue_depth=len(open_),
                    head_batch_id=open_[0].batch.batch_header if open_ else None,
                    in_flight_batch_id=flight[0].batch.batch_header if flight else None,
                    total=len(recs),
                    in_flight=len(moving),
                    next_batch_id=open_[waiting[0]].batch.batch_header if waiting else None,
                    blocker_batch_id=None if found is None else found.blocker.batch_header,
                    blocker_kind=None if found is None else found.kind.value,
                    blocker_on=None if found is None else found.what,
                    **self._stops(sid, open_[waiting[0]] if waiting else None),
                )
            )
            if len(out) == limit:
                break
        return out

    def _stops(self, service_id: str, next_: _Record | None) -> dict[str, Any]:
        """What stops a service, as :class:`ServiceSummary` says it."""
        control = self._control(service_id)
        pause = None
        if control.paused:
            pause = next(
                (
                    a
                    for a in reversed(self._s.actions)
                    if a.service_id == service_id and a.action == "pause" and a.detail is None
                ),
                None,
            )
        error = None if next_ is None else next_.error
        return {
            "paused": control.paused,
            "paused_by": None if pause is None else pause.actor,
            "paused_at": None if pause is None else pause.at,
            "halted_batch_id": control.halted_batch_id,
            "halted_reason": control.halted_reason,
            "halted_at": control.halted_at,
            "next_waits_for": error.error_message
            if error is not None and error.error_type == DEPENDENCY
            else None,
        }

    async def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self._s.records.values():
            key = NO_STATUS if r.status is None else r.status.value
            counts[key] = counts.get(key, 0) + 1
        return counts


_COMMITTED = (BatchStatusName.COMMITTED, BatchStatusName.VALID)
_SENT = (*_COMMITTED, BatchStatusName.PENDING, BatchStatusName.INVALID)


def _dependency_state(transaction_id: str, rec: _Record) -> DependencyState:
    return DependencyState(
        transaction_id,
        rec.batch.service_id,
        rec.batch.batch_id,
        rec.batch.seq or 0,
        rec.status,
        rec.submitted,
        cancelled=rec.error is not None and rec.error.error_type == CANCELLED,
    )


def _open(rec: _Record) -> bool:
    """Not sent: not submitted, no status or ``Delayed``/``Unknown``."""
    return not rec.submitted and rec.status not in _SENT


def _dependencies(batch: TrackingBatch) -> list[str]:
    """The transaction ids ``batch`` depends on, outside itself, in order."""
    own = {t.transaction_header for t in batch.transactions}
    found: dict[str, None] = {}
    for t in batch.transactions:
        for d in t.dependencies:
            if d not in own:
                found.setdefault(d)
    return list(found)


def _first_open_dependency(
    batch: TrackingBatch, trackers: dict[str, list[_Record]]
) -> tuple[str, _Record] | None:
    """The first dependency of ``batch`` tracked and committed by no batch,
    with its batch of lowest ``seq``."""
    for d in _dependencies(batch):
        found = trackers.get(d)
        if found and not any(r.status in _COMMITTED for r in found):
            return d, min(found, key=lambda r: r.batch.seq or 0)
    return None
