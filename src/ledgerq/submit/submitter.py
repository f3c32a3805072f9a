"""The batch submitter (Grid's ``batch_submitter.md``), on asyncio.

A *poller* pulls ready batches from a :class:`BatchSource` (the queuer) and
starts one task per batch, at most ``slots`` at a time, never the same batch
twice, and never two of one service unless ``parallel(service_id)`` says the
service is under the parallel strategy (its queue then hands out only
batches that do not conflict with those in flight). Each task POSTs through
the :class:`~ledgerq.ledgers.LedgerClient` (the client resolves the URL per
attempt) and reports its outcome to the
:class:`~ledgerq.record.recorder.Recorder`, which writes the store:

* before the first attempt the batch is marked ``submitted`` (so no queuer
  round hands it out again);
* ``Accepted`` → ``Pending``;
* ``Busy`` (503/429), ``Unreachable`` and ``Unjudged`` (a 4xx that says
  nothing of the batch: a wrong URL, credentials, a proxy) are retried with
  jittered exponential backoff (honouring ``Retry-After``, capped) up to
  ``max_retries`` times, then ``Delayed`` — the recorded attempt time starts
  the delay window, after which the batch is sent again; nothing becomes
  final because a URL is wrong;
* ``Rejected`` (the ledger judged the batch) → ``Invalid`` with the ledger's
  message;
* ``Ambiguous`` (timeout, reset after sending, 5xx other than 503) → the
  batch stays ``submitted`` with the ambiguity recorded; never resent here:
  the follower asks the ledger at once, and only the ledger's ``UNKNOWN``
  lets the queue hand it out again.
* Under high availability ``may_post(batch)`` is asked before **every**
  attempt, the first included: once it says no (the claim the batch was taken
  under is about to lapse), no further POST is made and the outcome is
  ``Ambiguous`` (recorded only if the claim still holds in the database);
  whoever holds the service then asks the ledger before anything is resent.
  See ``docs/ha.md``, "Safety".

Every submission logs at info level when taken and when finished, with the
batch and service ids, attempts and duration, so stuck batches show up.
Every answer is also reported to the
:class:`~ledgerq.ledgers.health.LedgerHealth`, which logs problems once per
burst and shows them per service.

:meth:`Submitter.stop` stops taking new batches and waits for the in-flight
ones to finish and be recorded (drain); :meth:`Submitter.run` then returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ledgerq.backoff import Backoff, Jitter, equal_jitter
from ledgerq.errors import ConfigError, FencedOffError, LedgerqError
from ledgerq.failpoints import failpoint
from ledgerq.ledgers.base import (
    Abandoned,
    Accepted,
    Ambiguous,
    Busy,
    LedgerClient,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
)
from ledgerq.ledgers.health import LedgerHealth
from ledgerq.model import TrackingBatch
from ledgerq.record.recorder import Recorder

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
#: Whether a submission may start another POST attempt (HA: claim still valid).
MayPost = Callable[[TrackingBatch], bool]


class BatchSource(Protocol):
    """The queue the submitter polls (the queuer's role)."""

    async def next_batches(
        self,
        limit: int,
        *,
        exclude: frozenset[str],
        timeout_s: float,
        exclude_batches: frozenset[str] = frozenset(),
    ) -> Sequence[TrackingBatch]:
        """Up to ``limit`` batches ready to submit, at most one per service,
        none of a serial service in ``exclude`` and none whose id is in
        ``exclude_batches``; waits up to ``timeout_s`` for work and returns an
        empty sequence if none came."""
        ...


@dataclass(frozen=True, slots=True)
class SubmitterSettings:
    #: Concurrent submissions (each its own task and HTTP request).
    slots: int = 256
    #: Retries of a Busy/Unreachable/Unjudged answer before recording Delayed.
    max_retries: int = 5
    backoff_initial_ms: int = 20
    backoff_max_ms: int = 2_000
    #: How long the poller waits for work before asking again (fallback only:
    #: the source wakes it as soon as a service is unlocked).
    poll_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ConfigError(f"submitter.slots must be at least 1, not {self.slots}")
        if self.max_retries < 0:
            raise ConfigError(f"submitter.max_retries must be >= 0, not {self.max_retries}")
        if self.backoff_initial_ms < 0 or self.backoff_max_ms < self.backoff_initial_ms:
            raise ConfigError("submitter.backoff_* must satisfy 0 <= initial <= max")


#: Answers after which nothing was queued at the ledger: sent again after a backoff.
_RETRIED = (Busy, Unreachable, Unjudged)

#: The outcome of a submission whose claim lapsed before its next attempt: an
#: earlier attempt may have reached the ledger, so it is asked first.
_CLAIM_LAPSING = Ambiguous(
    "this instance's claim on the service is about to lapse; no further attempt was made"
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a submission ended in, after retries."""

    result: SubmitResult
    attempts: int


class Submitter:
    def __init__(
        self,
        source: BatchSource,
        ledger: LedgerClient,
        recorder: Recorder,
        settings: SubmitterSettings | None = None,
        *,
        sleep: Sleep = asyncio.sleep,
        may_post: MayPost | None = None,
        health: LedgerHealth | None = None,
        jitter: Jitter = equal_jitter,
        parallel: Callable[[str], bool] = lambda _service_id: False,
        taken: Callable[[TrackingBatch], None] | None = None,
        released: Callable[[TrackingBatch], None] | None = None,
    ) -> None:
        self._source = source
        self.health = health or LedgerHealth(ledger.description)
        self._jitter = jitter
        self._may_post = may_post
        self._parallel = parallel
        # The queue is told once the store shows a batch as taken, or that a
        # batch it handed out will not be: either ends the queue's hold on it.
        self._taken = taken
        self._released = released
        self._ledger = ledger
        self._recorder = recorder
        self.settings = settings or SubmitterSettings()
        self._sleep = sleep
        self._in_flight: dict[str, str] = {}  # batch id -> service id
        #: Submissions in progress per service (the services of ``_in_flight``).
        self._busy: dict[str, int] = {}
        #: Batch ids being submitted right now (live; the follower leaves them alone).
        self.held_batches: set[str] = set()
        #: Called with a batch as a submission takes it, before anything is
        #: recorded: the follower forgets reads of it already under way, whose
        #: answers predate this submission; the metrics learn when it was
        #: accepted (by whichever process accepted it).
        self.take_listeners: list[Callable[[TrackingBatch], None]] = []
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self._stopped: asyncio.Future[None] | None = None
        #: Submissions ended so far (the exclusions of a pull are then stale).
        self._ended = 0
        self.submitted_total = 0
        #: Slots reserved for a service's next batch (``reserve``), not yet taken.
        self._reserved = 0
        #: The running poller's task group (None when not running).
        self._tasks: asyncio.TaskGroup | None = None
        #: Whether the queue source would let this serial service's next batch
        #: be taken outside it (nothing of the service handed out or queued).
        self.may_take: Callable[[str], bool] = lambda _service_id: True
        #: Told of each batch taken with its predecessor's final status (the
        #: queue source drops any pick of its service it still has).
        self.taken_elsewhere: Callable[[TrackingBatch], None] = lambda _batch: None
        #: Batches taken with their predecessor's final status (``reserve``
        #: and ``reserve_freed``); of those, the ones a parallel final freed.
        self.taken_with_final = 0
        self.taken_freed = 0

    @property
    def in_flight(self) -> dict[str, str]:
        """Batches with a submission in progress: batch id → service id (a copy)."""
        return dict(self._in_flight)

    @property
    def submitting(self) -> int:
        """Submissions in progress now."""
        return len(self._in_flight)

    def stop(self) -> None:
        """Take no new batches; :meth:`run` returns once in-flight ones are recorded."""
        self._stopping.set()
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        self._slot_free.set()

    def takes_next(self, service_id: str) -> bool:
        """Whether :meth:`reserve` can ever give ``service_id`` a slot: only a
        serial service's next batch is taken with its predecessor's final
        status (a parallel service's come from the queue source, so reading
        them ahead would be a store read per batch for nothing)."""
        return not self._parallel(service_id)

    def reserve(self, service_id: str) -> _NextTake | None:
        """A slot for ``service_id``'s next batch, to be recorded taken in the
        transaction that makes its predecessor final (the commit → next POST
        merge: :meth:`ledgerq.record.recorder.Recorder.set_next_taker`).

        ``None`` unless it is exactly what the poller would do: running and
        not stopping, a free slot, a serial service with no submission in
        progress, and nothing of it handed out or queued by the source. Until
        the reservation ends, the service counts as busy (the poller takes
        nothing of it) and the slot as used.
        """
        if (
            self._tasks is None
            or self._stopping.is_set()
            or service_id in self._busy
            or len(self._in_flight) + self._reserved >= self.settings.slots
            or self._parallel(service_id)
            or not self.may_take(service_id)
        ):
            return None
        self._reserved += 1
        self._busy[service_id] = 1
        return _NextTake(self, service_id)

    def reserve_freed(self, service_id: str, most: int) -> _FreedTake | None:
        """Up to ``most`` slots for the batches a final status of the
        parallel service ``service_id`` frees, to be recorded taken in the
        transaction of that status (:meth:`ledgerq.record.recorder.Recorder.
        _final_then_freed`). ``None`` when not running or stopping, for a
        serial service, or without a free slot. Until the reservation ends
        the slots count as used."""
        free = self.settings.slots - len(self._in_flight) - self._reserved
        if (
            self._tasks is None
            or self._stopping.is_set()
            or free <= 0
            or not self._parallel(service_id)
        ):
            return None
        slots = min(most, free)
        self._reserved += slots
        return _FreedTake(self, service_id, slots)

    def _start_freed(self, take: _FreedTake, batches: Sequence[TrackingBatch]) -> None:
        self._reserved -= take.slots
        for batch in batches:
            # As the poller does when it takes a batch (the store shows it
            # taken already: the follower drops reads of it made before).
            self._take(batch)
            self.taken_with_final += 1
            self.taken_freed += 1
            self._post_recorded(batch)
        if len(batches) < take.slots:
            self._slot_free.set()

    def _cancel_freed(self, take: _FreedTake) -> None:
        self._reserved -= take.slots
        self._slot_free.set()

    def _hold_next(self, take: _NextTake, batch: TrackingBatch) -> None:
        # As the poller does when it takes a batch, before anything is recorded.
        self._in_flight[batch.batch_id] = take.service_id
        self.held_batches.add(batch.batch_id)
        for listener in self.take_listeners:
            listener(batch)

    def _start_next(self, take: _NextTake, batch: TrackingBatch) -> None:
        self._reserved -= 1
        self.taken_with_final += 1
        self.taken_elsewhere(batch)
        self._post_recorded(batch)

    def _take(self, batch: TrackingBatch) -> None:
        """Count ``batch`` in flight: its slot, its service busy, held."""
        self._in_flight[batch.batch_id] = batch.service_id
        self._busy[batch.service_id] = self._busy.get(batch.service_id, 0) + 1
        self.held_batches.add(batch.batch_id)
        for listener in self.take_listeners:
            listener(batch)

    def _untake(self, batch: TrackingBatch) -> None:
        """Undo :meth:`_take` (the submission ended, or never started)."""
        del self._in_flight[batch.batch_id]
        left = self._busy[batch.service_id] - 1
        if left:
            self._busy[batch.service_id] = left
        else:
            del self._busy[batch.service_id]
        self.held_batches.discard(batch.batch_id)

    def _post_recorded(self, batch: TrackingBatch) -> None:
        """Submit a batch the store already shows taken. If the run ended
        meanwhile, the batch stays {submitted}: the follower asks the ledger
        about it before anything resends it."""
        try:
            if self._tasks is None:
                raise RuntimeError("the submitter's run ended")
            self._tasks.create_task(self._submit(batch, recorded=True))
        except RuntimeError:  # no run, or its task group is shutting down
            self._untake(batch)
            log.warning(
                "batch=%s service=%s taken as the submitter stopped; not posted (the "
                "ledger is asked about it)",
                batch.batch_id[:16],
                batch.service_id,
            )

    def _cancel_next(self, take: _NextTake, batch: TrackingBatch | None) -> None:
        self._reserved -= 1
        if batch is not None:
            del self._in_flight[batch.batch_id]
            self.held_batches.discard(batch.batch_id)
        del self._busy[take.service_id]
        self._ended += 1
        self._slot_free.set()

    async def run(self) -> None:
        self._stopped = None  # made on this run's loop by the first _next
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                await self._poll(tasks)
        finally:
            self._tasks = None

    async def _poll(self, tasks: asyncio.TaskGroup) -> None:
        while not self._stopping.is_set():
            free = self.settings.slots - len(self._in_flight) - self._reserved
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            batches = await self._next(free)
            for batch in batches:
                if self._stopping.is_set():
                    break
                busy = batch.service_id in self._busy
                if batch.batch_id in self._in_flight or (
                    busy and not self._parallel(batch.service_id)
                ):
                    # Never one batch twice, never two of a serial service.
                    if self._released is not None:
                        self._released(batch)
                    continue
                self._take(batch)
                tasks.create_task(self._submit(batch))

    async def _next(self, limit: int) -> Sequence[TrackingBatch]:
        exclude = frozenset(self._busy)
        exclude_batches = frozenset(self._in_flight)
        ended = self._ended
        try:
            # Work at hand (most calls, under load) is taken without a task
            # and a race: the source looks once and does not wait.
            ready = await self._source.next_batches(
                limit, exclude=exclude, timeout_s=0.0, exclude_batches=exclude_batches
            )
        except LedgerqError as exc:
            return await self._unreadable(exc)
        if ready or self._stopping.is_set():
            return ready
        if self._ended != ended:
            # A submission ended meanwhile: its service is free again.
            exclude = frozenset(self._busy)
            exclude_batches = frozenset(self._in_flight)
        # Stop must not wait for the source's timeout: race the two.
        fetch = asyncio.ensure_future(
            self._source.next_batches(
                limit,
                exclude=exclude,
                timeout_s=self.settings.poll_timeout_s,
                exclude_batches=exclude_batches,
            )
        )
        if self._stopped is None:
            # One future for the whole run, not a task per call.
            self._stopped = asyncio.get_running_loop().create_future()
            if self._stopping.is_set():
                self._stopped.set_result(None)
        racing: set[asyncio.Future[Any]] = {fetch, self._stopped}
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        if not fetch.done():
            fetch.cancel()
            return ()
        try:
            return fetch.result()
        except LedgerqError as exc:
            return await self._unreadable(exc)

    async def _unreadable(self, exc: LedgerqError) -> Sequence[TrackingBatch]:
        log.warning("cannot read the queue: %s; retrying", exc)
        await self._sleep(self.settings.poll_timeout_s)
        return ()

    async def _submit(self, batch: TrackingBatch, *, recorded: bool = False) -> None:
        """Submit ``batch``; ``recorded``: the store shows it taken already
        (with its predecessor's final status), so the POST comes first."""
        started = time.monotonic()
        # One line here and one when it ends, per batch, at INFO: the HA chaos
        # tests read them to know which POSTs a frozen gateway had under way
        # (bench._cluster.frozen_mid_post). A busy gateway's operator who does
        # not want them sets log_level = "warning".
        log.info("submission started batch=%s service=%s", batch.batch_id[:16], batch.service_id)
        outcome: Outcome | None = None
        taken_here = not recorded
        try:
            if not recorded:
                failpoint("submitting")
                await self._recorder.submitting(batch)
                recorded = True
                if self._taken is not None:
                    self._taken(batch)
            else:
                failpoint("taken_with_final")
            outcome = await self.attempt(batch)
            failpoint("before_record")
            await self._record(batch, outcome)
            failpoint("after_record")
            self.submitted_total += 1
        except LedgerqError as exc:
            # The store failed: the batch stays {submitted, ...} and the
            # follower's next scan asks the ledger about it. Fenced off, the
            # service moved to another instance (this one was paused, or
            # could not renew): expected under HA, the new holder asks the
            # ledger about the batch; not an error of this instance's.
            log.log(
                logging.WARNING if isinstance(exc, FencedOffError) else logging.ERROR,
                "submission of batch=%s service=%s not recorded: %s",
                batch.batch_id[:16],
                batch.service_id,
                exc,
            )
        finally:
            if taken_here and not recorded and self._released is not None:
                self._released(batch)
            self._untake(batch)
            self._ended += 1
            self._slot_free.set()
            log.info(
                "submission finished batch=%s service=%s result=%s attempts=%s in %.1f ms",
                batch.batch_id[:16],
                batch.service_id,
                type(outcome.result).__name__ if outcome else "error",
                outcome.attempts if outcome else "?",
                (time.monotonic() - started) * 1000,
            )

    async def attempt(self, batch: TrackingBatch) -> Outcome:
        """POST ``batch`` until it is accepted, rejected, ambiguous or out of retries."""
        s = self.settings
        backoff = Backoff(s.backoff_initial_ms / 1000, s.backoff_max_ms / 1000, self._jitter)
        attempts = 0
        while True:
            if self._may_post is not None and not self._may_post(batch):
                return Outcome(_CLAIM_LAPSING, attempts)
            attempts += 1
            failpoint("before_post")
            result = await self._ledger.submit(
                batch.service_id, batch.batch_id, batch.serialized_batch
            )
            failpoint("after_response")
            self._report(batch.service_id, result)
            if not isinstance(result, _RETRIED) or attempts > s.max_retries:
                return Outcome(result, attempts)
            if self._stopping.is_set():
                # Draining: record Delayed now rather than keep retrying.
                return Outcome(result, attempts)
            wait_s = backoff.delay(attempts)
            if isinstance(result, Busy) and result.retry_after_ms is not None:
                wait_s = max(wait_s, result.retry_after_ms / 1000)
            await self._sleep(min(wait_s, backoff.max_s))

    def _report(self, service_id: str, result: SubmitResult) -> None:
        match result:
            case Accepted() | Rejected():
                self.health.ok("submit", service_id)
            case Abandoned():
                # Ended by this instance (its claim lapsing), not the ledger:
                # no ledger problem on the dashboard or /services for it.
                pass
            case Busy(status=status, message=message):
                self.health.problem("submit", service_id, f"HTTP {status}", message)
            case Unjudged(status=status, message=message):
                self.health.problem("submit", service_id, f"HTTP {status}", message)
            case Unreachable(message=message):
                self.health.problem("submit", service_id, "unreachable", message)
            case Ambiguous(message=message, status=status):
                cause = "ambiguous" if status is None else f"HTTP {status}"
                self.health.problem("submit", service_id, cause, message)

    async def _record(self, batch: TrackingBatch, outcome: Outcome) -> None:
        result = outcome.result
        match result:
            case Accepted():
                # Handed over to the follower, which reads its status from
                # now on (the recorder's accept listeners): an answer about it
                # is no longer one to drop as predating this submission.
                self.held_batches.discard(batch.batch_id)
                await self._recorder.accepted(batch)
            case Busy(status=status, message=message):
                await self._recorder.delayed(
                    batch, f"ledger busy ({status}) after {outcome.attempts} attempts: {message}"
                )
            case Unreachable(message=message):
                await self._recorder.delayed(
                    batch, f"ledger unreachable after {outcome.attempts} attempts: {message}"
                )
            case Unjudged(status=status, message=message):
                await self._recorder.delayed(
                    batch,
                    f"refused without judging the batch after {outcome.attempts} attempts: "
                    f"{message}",
                    f"http_{status}",
                )
            case Rejected(status=status, message=message):
                await self._recorder.rejected(batch, status, message)
            case Ambiguous(message=message):
                await self._recorder.ambiguous(batch, message)


class _NextTake:
    """A slot :meth:`Submitter.reserve` set aside for a service's next batch
    (:class:`ledgerq.record.recorder.NextTake`). Ends once: started or cancelled."""

    __slots__ = ("_batch", "_done", "_submitter", "service_id")

    def __init__(self, submitter: Submitter, service_id: str) -> None:
        self._submitter = submitter
        self.service_id = service_id
        self._batch: TrackingBatch | None = None
        self._done = False

    def hold(self, batch: TrackingBatch) -> None:
        assert self._batch is None and not self._done
        # The same step as the poller's take: before anything is recorded.
        failpoint("submitting")
        self._batch = batch
        self._submitter._hold_next(self, batch)

    def start(self) -> None:
        assert self._batch is not None and not self._done
        self._done = True
        self._submitter._start_next(self, self._batch)

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._submitter._cancel_next(self, self._batch)


class _FreedTake:
    """Slots :meth:`Submitter.reserve_freed` set aside for the batches a
    final status frees (:class:`ledgerq.record.recorder.FreedTake`). Ends
    once: started or cancelled."""

    __slots__ = ("_done", "_submitter", "service_id", "slots")

    def __init__(self, submitter: Submitter, service_id: str, slots: int) -> None:
        self._submitter = submitter
        self.service_id = service_id
        self.slots = slots
        self._done = False

    def start(self, batches: list[TrackingBatch]) -> None:
        assert not self._done and len(batches) <= self.slots
        self._done = True
        self._submitter._start_freed(self, batches)

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._submitter._cancel_freed(self)
