"""The producer: every service's lane, from the queue to the ledger and back.

One component owns what this process knows of each service between the
store and the ledger — its *lane*: the batches of it being posted, and the
claim each was taken under. The stages around it own nothing of that:

* the :class:`~ledgerq.queue.source.QueueSource` reads rounds from the store
  and hands out what the queuer rules pick (``docs/queuer.md``);
* the :class:`~ledgerq.submit.submitter.Submitter` POSTs one batch and
  returns its :class:`~ledgerq.submit.submitter.Outcome`;
* the :class:`~ledgerq.follow.follower.Follower` reads the ledger and hands
  each status back to :meth:`Producer.ledger_status`;
* the :class:`~ledgerq.record.completer.Completer` applies every write, each a
  :class:`~ledgerq.model.BatchWrite` of :mod:`ledgerq.record.writes`.

A batch is taken in one of three ways, each under the same lane rules (at
most ``submitter.slots`` submissions; never one batch twice; never two of a
serial service; under the parallel strategy only what its queue hands out):

1. **From the queue.** The poll loop pulls what the source hands out; each
   batch is recorded taken (``submitted``, fenced under HA) before its POST.
2. **With its predecessor's final status** (the commit → next POST merge,
   ``docs/gateway.md``). When the ledger accepts a serial service's batch,
   the service's next batch is read ahead (:class:`~ledgerq.queue.ahead.
   NextReader`); its final status and that batch's take are then one
   transaction, and the POST follows at once. A parallel service's final
   status takes the batches it frees the same way, where the store can
   (``takes_freed``). Whatever does not fit (no slot, nothing read ahead,
   the store finding another pick) falls back to the queue.
3. **Offered by a take-over** (:meth:`QueueSource.offer`): picks read on the
   claim thread, queued at the front of the round.

After each take: the POST (:meth:`Submitter.post`, with the claim's lease
under HA), then its outcome recorded (``ledgerq.record.writes`` says what
each means). An accepted batch is followed from then on; an ambiguous one
asked about at once; a write that frees the service (a final status,
``Unknown``, ``Delayed``) wakes the queue for the service's next batch and
tells ``notify`` (status readers, other processes).

Under high availability every write carries the fence of the claim the batch
was taken under: nothing a submission records lands once the claim moved on.
A status the follower read for a service no longer held is dropped.

:meth:`Producer.stop` takes no new batch; :meth:`Producer.run` returns once
every submission in progress was recorded and the follower stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledgerq.backoff import Jitter, equal_jitter
from ledgerq.clock import Clock, now_ms
from ledgerq.errors import FencedOffError, LedgerqError, StatusTransitionError
from ledgerq.failpoints import failpoint
from ledgerq.follow.follower import Follower, FollowSettings
from ledgerq.follow.in_flight import InFlightStore, StoreMonitorSource
from ledgerq.ledgers.base import Accepted, Ambiguous, LedgerBatchStatus, LedgerClient
from ledgerq.ledgers.health import LedgerHealth
from ledgerq.model import BatchStatus, BatchStatusName, BatchWrite, Fence, Invalid, TrackingBatch
from ledgerq.pipeline.dependencies import (
    DependencyCheck,
    Fail,
    Resolution,
    TakeFirst,
    Wait,
    dependencies_of,
)
from ledgerq.pipeline.pipelined import Later, Pipelines, PipelineStore, Take
from ledgerq.pipeline.resting import ControlsStore, Resting
from ledgerq.queue.ahead import NextOpenStore, NextReader, Successors
from ledgerq.queue.parallel import ParallelRoundStore
from ledgerq.queue.serial import RoundStore
from ledgerq.queue.source import QueueSource, ServiceFilter
from ledgerq.queue.strategy import (
    CONTINUE_ALWAYS,
    SERIAL_ONLY,
    OnInvalid,
    OnInvalidMap,
    Strategy,
    StrategyMap,
)
from ledgerq.record import writes
from ledgerq.record.completer import Completer
from ledgerq.submit.submitter import Outcome, Sleep, Submitter, SubmitterSettings

log = logging.getLogger(__name__)

#: Batches a parallel service's final status takes along at most (the rest
#: of what it frees, if any, come from the queue).
FREED_TAKE = 4
#: Next batches read ahead kept at most.
_MAX_READ_AHEAD = 100_000


class ProducerStore(
    RoundStore,
    ParallelRoundStore,
    InFlightStore,
    NextOpenStore,
    PipelineStore,
    ControlsStore,
    Protocol,
):
    """The store roles the producer's stages read."""

    @property
    def takes_freed(self) -> bool:
        """Whether a final status can take the batches it frees (``BatchWrite.take_freed``)."""
        ...


class ClaimLeases(Protocol):
    """What the producer needs of the claims (``ledgerq.claims``) under HA."""

    def fence_for(self, service_id: str) -> Fence | None: ...

    def may_post(self, service_id: str, fence: Fence) -> bool: ...

    def claim_left_ms(self, service_id: str, fence: Fence) -> int: ...


class TakeObserver(Protocol):
    """Told of every batch this process takes (the metrics)."""

    def batch_taken(self, batch: TrackingBatch) -> None: ...


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    submitter: SubmitterSettings = field(default_factory=SubmitterSettings)
    follower: FollowSettings = field(default_factory=FollowSettings)
    #: How long a Delayed batch's service rests (ms).
    delay_window_ms: int = 15_000
    #: How long a batch stays handed out by the queue at most (ms): a
    #: backstop, long enough for a slow store to record a take.
    handout_ms: int = 60_000
    #: Batches of a pipelined service in flight at once, at most.
    pipeline_depth: int = 64


@dataclass(frozen=True, slots=True)
class _RunLink:
    """A batch's place in a pipelined run being posted: whether the ledger
    accepted it (the run's next POST waits for that), and whether it is the
    run's last (whose acceptance walks on)."""

    answered: asyncio.Future[bool]
    last: bool


class _Lease:
    """A submission's claim: :class:`~ledgerq.submit.submitter.Lease`."""

    __slots__ = ("_claims", "_fence", "_service_id")

    def __init__(self, claims: ClaimLeases, service_id: str, fence: Fence) -> None:
        self._claims = claims
        self._service_id = service_id
        self._fence = fence

    def may_post(self) -> bool:
        return self._claims.may_post(self._service_id, self._fence)

    def left_ms(self) -> int:
        return self._claims.claim_left_ms(self._service_id, self._fence)


class Producer:
    def __init__(
        self,
        store: ProducerStore,
        completer: Completer,
        ledger: LedgerClient,
        settings: PipelineSettings | None = None,
        *,
        strategies: StrategyMap = SERIAL_ONLY,
        on_invalid: OnInvalidMap = CONTINUE_ALWAYS,
        claims: ClaimLeases | None = None,
        services: ServiceFilter | None = None,
        claimant: str | None = None,
        notify: Callable[[str], None] = lambda _service_id: None,
        observer: TakeObserver | None = None,
        health: LedgerHealth | None = None,
        successors: Successors | None = None,
        clock: Clock = now_ms,
        sleep: Sleep = asyncio.sleep,
        jitter: Jitter = equal_jitter,
        narrow: bool = True,
    ) -> None:
        """``services``: the services this instance holds (HA; None: all);
        ``claimant``: its instance id, for rounds that join the claims in
        the database. ``notify(service_id)``: a service's state changed
        (status readers, other processes). ``successors``: the API's
        inserts, the read-ahead's guesses."""
        self.settings = s = settings or PipelineSettings()
        self._store = store
        self._completer = completer
        self._strategies = strategies
        self._all_serial = strategies.uniform is Strategy.SERIAL
        self._on_invalid = on_invalid
        self._never_halts = on_invalid.uniform is OnInvalid.CONTINUE
        self._claims = claims
        self._notify = notify
        self._observer = observer
        self._clock = clock
        health = health or LedgerHealth(ledger.description, clock=clock)
        #: Services that take nothing now (stopped, or waiting for a dependency).
        self._rests = Resting(store, wake=self._wake_source, clock=clock)
        self.source = QueueSource(
            store,
            clock=clock,
            delay_window_ms=s.delay_window_ms,
            poll_interval=s.submitter.poll_timeout_s,
            services=services,
            claimant=claimant,
            narrow=narrow,
            strategies=strategies,
            handout_ms=s.handout_ms,
            resting=self._rests.services,
        )
        self.submitter = Submitter(ledger, s.submitter, sleep=sleep, health=health, jitter=jitter)
        #: Batch ids being posted right now: the follower leaves them alone.
        self._posting: set[str] = set()
        self.follower = Follower(
            StoreMonitorSource(store, services=services),
            ledger,
            self,
            s.follower,
            posting=self._posting,
            health=health,
            jitter=jitter,
        )
        self.ahead = NextReader(store, successors)
        self.dependencies = DependencyCheck(store, ledger)
        #: Batches with a ledger status being recorded (by how many answers).
        self._answering: dict[str, int] = {}
        self._pipelines = Pipelines(
            store,
            ledger,
            strategies,
            self.dependencies,
            depth=s.pipeline_depth,
            delay_window_ms=s.delay_window_ms,
            clock=clock,
            answering=self._answering,
        )
        # The lanes: submissions in progress (batch id -> service id), per
        # service how many, and slots set aside for takes under way.
        self._in_flight: dict[str, str] = {}
        self._busy: dict[str, int] = {}
        self._reserved = 0
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self._stopped_future: asyncio.Future[None] | None = None
        #: Submissions ended so far (the exclusions of a pull are then stale).
        self._ended = 0
        self._tasks: asyncio.TaskGroup | None = None
        #: Per batch at the ledger: its service's next batch, read ahead.
        self._next_of: dict[str, TrackingBatch] = {}
        #: Read-aheads under way, by the id of the batch at the ledger.
        self._reading: dict[str, asyncio.Task[TrackingBatch | None]] = {}
        #: Batches being recorded accepted: done once their submission ended.
        self._accepting: dict[str, asyncio.Future[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        #: Batches in flight here that wait for, or undergo, the check of their
        #: declared dependencies (not taken yet: they may still step aside).
        self._checking: set[str] = set()
        #: Per batch whose dependency check reads the store: the services a
        #: submission of which ended meanwhile.
        self._ended_during: dict[str, set[str]] = {}
        self.submitted_total = 0
        #: Batches taken with their predecessor's final status; of those,
        #: the ones a parallel final status freed.
        self.taken_with_final = 0
        self.taken_freed = 0

    # -- what the lanes hold ---------------------------------------------------

    @property
    def in_flight(self) -> dict[str, str]:
        """Batches with a submission in progress: batch id → service id (a copy)."""
        return dict(self._in_flight)

    @property
    def submitting(self) -> int:
        """Submissions in progress now."""
        return len(self._in_flight)

    @property
    def posting(self) -> Collection[str]:
        """Batch ids being posted right now (a live view)."""
        return self._posting

    def _wake_source(self, service_id: str) -> None:
        self.source.wake(service_id)

    def _parallel(self, service_id: str) -> bool:
        return not self._all_serial and self._strategies.of(service_id) is Strategy.PARALLEL

    def _free_slots(self) -> int:
        return self.settings.submitter.slots - len(self._in_flight) - self._reserved

    def _take(self, batch: TrackingBatch, *, check: bool = False) -> None:
        """Count ``batch`` in its lane: its slot, its service busy, posting.
        Reads of it already under way answer for the batch as it was before:
        the follower drops them. ``check``: its declared dependencies are
        checked before its take is recorded."""
        self._in_flight[batch.batch_id] = batch.service_id
        if check and dependencies_of(batch):
            self._checking.add(batch.batch_id)
        self._busy[batch.service_id] = self._busy.get(batch.service_id, 0) + 1
        self._posting.add(batch.batch_id)
        self._pipelines.taken(batch)
        self.follower.resending(batch.batch_id)
        if self._observer is not None:
            self._observer.batch_taken(batch)

    def _untake(self, batch: TrackingBatch) -> None:
        """Undo :meth:`_take` (the submission ended, or never started)."""
        self._in_flight.pop(batch.batch_id, None)
        self._checking.discard(batch.batch_id)
        left = self._busy.get(batch.service_id, 1) - 1
        if left > 0:
            self._busy[batch.service_id] = left
        else:
            self._busy.pop(batch.service_id, None)
            self._rests.idle(batch.service_id)
        self._posting.discard(batch.batch_id)
        self._ended += 1
        for ended in self._ended_during.values():
            ended.add(batch.service_id)
        self._slot_free.set()

    def _fence(self, service_id: str) -> Fence | None:
        """The fence to write under now (None without HA)."""
        if self._claims is None:
            return None
        fence = self._claims.fence_for(service_id)
        if fence is None:
            raise FencedOffError(
                f"this instance holds no valid claim on service {service_id!r}; nothing was "
                "written: the service's current holder takes care of it"
            )
        return fence

    def _lease(self, service_id: str, fence: Fence | None) -> _Lease | None:
        if self._claims is None or fence is None:
            return None
        return _Lease(self._claims, service_id, fence)

    # -- lifecycle -------------------------------------------------------------

    def wake(self, service_id: str | None = None) -> None:
        """A service's state changed in the store (``None``: some service):
        look for its next batch now. A pipelined service with batches in
        flight here, which the queue does not pick, is walked on from its
        last (batches accepted after it go without waiting for a commit)."""
        self.source.wake(service_id)
        if (
            service_id is not None
            and self._tasks is not None
            and self._pipelines.pipelined(service_id)
        ):
            last = self._pipelines.last(service_id)
            if last is not None:
                self._walk_on(service_id, last)

    def stop(self) -> None:
        """Take no new batches; :meth:`run` returns once in-flight ones are recorded."""
        self._stopping.set()
        self.submitter.stop()
        if self._stopped_future is not None and not self._stopped_future.done():
            self._stopped_future.set_result(None)
        self._slot_free.set()

    async def run(self) -> None:
        self._stopped_future = None  # made on this run's loop by the first _next
        await self._rests.refresh()
        async with asyncio.TaskGroup() as outer:
            outer.create_task(self.follower.run())
            resting = outer.create_task(self._rest_loop())
            try:
                async with asyncio.TaskGroup() as tasks:
                    self._tasks = tasks
                    await self._poll()
            finally:
                # Every submission was recorded (the group waited for them):
                # what was accepted is followed until the follower stops.
                self._tasks = None
                self.follower.stop()
                resting.cancel()

    # -- from the queue ----------------------------------------------------------

    async def _poll(self) -> None:
        assert self._tasks is not None
        while not self._stopping.is_set():
            free = self._free_slots()
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            for batch in await self._next(free):
                if self._stopping.is_set():
                    break
                busy = batch.service_id in self._busy
                if batch.batch_id in self._in_flight or (
                    busy and not self._parallel(batch.service_id)
                ):
                    # Never one batch twice, never two of a serial service.
                    self.source.released(batch)
                    continue
                self._take(batch, check=True)
                self._tasks.create_task(self._submit(batch))

    async def _next(self, limit: int) -> Sequence[TrackingBatch]:
        exclude = frozenset(self._busy)
        exclude_batches = frozenset(self._in_flight)
        ended = self._ended
        try:
            # Work at hand (most calls, under load) is taken without a task
            # and a race: the source looks once and does not wait.
            ready = await self.source.next_batches(
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
            self.source.next_batches(
                limit,
                exclude=exclude,
                timeout_s=self.settings.submitter.poll_timeout_s,
                exclude_batches=exclude_batches,
            )
        )
        if self._stopped_future is None:
            # One future for the whole run, not a task per call.
            self._stopped_future = asyncio.get_running_loop().create_future()
            if self._stopping.is_set():
                self._stopped_future.set_result(None)
        racing: set[asyncio.Future[Any]] = {fetch, self._stopped_future}
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
        await asyncio.sleep(self.settings.submitter.poll_timeout_s)
        return ()

    # -- one submission ------------------------------------------------------------

    async def _submit(
        self,
        batch: TrackingBatch,
        *,
        recorded: bool = False,
        fence: Fence | None = None,
        link: _RunLink | None = None,
    ) -> None:
        """Take, post and record ``batch``; ``recorded``: the store shows it
        taken already (with its predecessor's final status, or in a pipelined
        run: ``link``, under ``fence``), so the POST comes first."""
        started = time.monotonic()
        # One line here and one when it ends, per batch, at INFO: the HA chaos
        # tests read them to know which POSTs a frozen gateway had under way.
        # An operator who does not want them sets log_level = "warning".
        log.info("submission started batch=%s service=%s", batch.batch_id[:16], batch.service_id)
        outcome: Outcome | None = None
        taken_here = not recorded
        try:
            if not recorded:
                failpoint("submitting")
                if dependencies_of(batch) and not await self._dependencies_met(batch):
                    return
                fence = self._fence(batch.service_id)
                await self._completer.apply(writes.taken(batch, now=self._clock(), fence=fence))
                recorded = True
                self.source.taken(batch)
            elif link is None:
                failpoint("taken_with_final")
            outcome = await self.submitter.post(batch, self._lease(batch.service_id, fence))
            if link is not None:
                link.answered.set_result(isinstance(outcome.result, Accepted))
            failpoint("before_record")
            await self._record(batch, outcome, fence, walk=link is None or link.last)
            failpoint("after_record")
            self.submitted_total += 1
        except LedgerqError as exc:
            # The store failed: the batch stays {submitted, ...} and the
            # follower's next scan asks the ledger about it. Fenced off, the
            # service moved to another instance (this one was paused, or
            # could not renew): expected under HA, the new holder asks the
            # ledger about the batch; not an error of this instance's. A
            # take refused because the service was paused or halted
            # meanwhile (by an operator elsewhere): expected too.
            refused = isinstance(exc, StatusTransitionError) and not recorded
            if refused:
                self._spawn(self._rests.refresh([batch.service_id]))
            log.log(
                logging.WARNING
                if isinstance(exc, FencedOffError | StatusTransitionError)
                else logging.ERROR,
                "submission of batch=%s service=%s not recorded: %s",
                batch.batch_id[:16],
                batch.service_id,
                exc,
            )
        finally:
            if link is not None and not link.answered.done():
                link.answered.set_result(False)
            if taken_here and not recorded:
                self.source.released(batch)
                self._pipelines.leave(batch.service_id, batch.batch_id)
            self._untake(batch)
            log.info(
                "submission finished batch=%s service=%s result=%s attempts=%s in %.1f ms",
                batch.batch_id[:16],
                batch.service_id,
                type(outcome.result).__name__ if outcome else "error",
                outcome.attempts if outcome else "?",
                (time.monotonic() - started) * 1000,
            )

    async def _record(
        self, batch: TrackingBatch, outcome: Outcome, fence: Fence | None, *, walk: bool = True
    ) -> None:
        """``walk``: an accepted pipelined batch walks on (in a run, only its
        last does: the run's next POST follows the others)."""
        result = outcome.result
        if isinstance(result, Accepted):
            # Handed over to the follower, which reads its status from now
            # on: an answer about it is no longer one to drop as predating
            # this submission.
            self._posting.discard(batch.batch_id)
            await self._accepted(batch, fence, walk=walk)
            return
        write = writes.outcome(batch, result, outcome.attempts, now=self._clock(), fence=fence)
        await self._apply_freeing(write)
        if isinstance(result, Ambiguous):
            # The ledger may or may not have it: asked before anything moves.
            self.follower.ask(batch.batch_id, batch.service_id)

    async def _accepted(self, batch: TrackingBatch, fence: Fence | None, *, walk: bool) -> None:
        """The ledger accepted ``batch``: it is followed from now on (its
        status read parked at once), and recorded ``Pending``.

        The read is not held up by the write: it is at the ledger before the
        batch can be committed there, even when the write waits for a group
        or two. Its answer waits for the write instead (:meth:`ledger_status`),
        so the batch's writes land in order and its submission has ended when
        the answer is applied.
        """
        recorded = asyncio.get_running_loop().create_future()
        self._accepting[batch.batch_id] = recorded
        try:
            self.follower.accepted(batch.batch_id, batch.service_id)
            if walk and self._pipelines.pipelined(batch.service_id):
                # The next batches may go now that the ledger has this one;
                # they do not wait for this write (the ledger keeps the order).
                self._spawn(self._pipeline_next(batch.service_id, batch.batch_id))
            if not self._parallel(batch.service_id):
                # While the batch waits at the ledger, not once it is final
                # (the store's check at the take decides whether this is
                # still the pick), and in a task of its own: the submission
                # must end now.
                task = asyncio.get_running_loop().create_task(
                    self._read_next(batch.service_id, batch.batch_id)
                )
                self._reading[batch.batch_id] = task
                task.add_done_callback(lambda _t: self._reading.pop(batch.batch_id, None))
            await self._completer.apply(
                writes.outcome(batch, Accepted(), 1, now=self._clock(), fence=fence)
            )
        finally:
            # Set as the submission ends (nothing is done after this returns
            # but free its slot and the service), so an answer waiting for it
            # finds the service free for its next batch.
            del self._accepting[batch.batch_id]
            recorded.set_result(None)

    async def _read_next(self, service_id: str, batch_id: str) -> TrackingBatch | None:
        try:
            nxt = await self.ahead.next_open_batch(service_id, batch_id)
        except LedgerqError as exc:
            log.warning("cannot read the next batch of service %s: %s", service_id, exc)
            return None
        if nxt is not None and dependencies_of(nxt):
            # Checked before its take, on the queue's path.
            return None
        if nxt is not None:
            if len(self._next_of) >= _MAX_READ_AHEAD:
                self._next_of.clear()  # batches no longer followed here, say
            self._next_of[batch_id] = nxt
        return nxt

    def _unlocked(self, service_id: str) -> None:
        """The service may move on: its next batch, and whoever listens."""
        self.source.wake(service_id)
        self._notify(service_id)

    # -- what the ledger says --------------------------------------------------------

    async def ledger_status(self, service_id: str, status: LedgerBatchStatus) -> None:
        self._answering[status.batch_id] = self._answering.get(status.batch_id, 0) + 1
        try:
            await self._ledger_status(service_id, status)
        finally:
            left = self._answering[status.batch_id] - 1
            if left:
                self._answering[status.batch_id] = left
            else:
                del self._answering[status.batch_id]

    async def _ledger_status(self, service_id: str, status: LedgerBatchStatus) -> None:
        """Record what the ledger said about one batch of ``service_id`` (the
        follower's :class:`~ledgerq.follow.follower.StatusSink`).

        A final status takes the service's next batch along when it can
        (module docstring, 2.); a status for a service no longer held is
        dropped.
        """
        batch_id = status.batch_id
        written = writes.recorded_status(status.status)
        recording = self._accepting.get(batch_id)
        if recording is not None:
            # Answered while its submission still records it accepted (the
            # read went out first): that write lands first, and the service
            # is free for its next batch once the submission has ended.
            await asyncio.shield(recording)
        final = written.is_final
        pending = written.name is BatchStatusName.PENDING
        ahead = None if pending else self._next_of.pop(batch_id, None)
        try:
            fence = self._fence(service_id)
            if final and ahead is None and batch_id in self._reading:
                # Read ahead, not back yet: sooner than the queue's two commits.
                ahead = await asyncio.shield(self._reading[batch_id])
                self._next_of.pop(batch_id, None)
            if not final or self._halt_reason(service_id, written) is not None:
                await self._write_status(service_id, batch_id, written, fence)
                if pending and self._pipelines.pipelined(service_id):
                    # Asked about (it was ambiguous): at the ledger after all.
                    self._spawn(self._pipeline_next(service_id, batch_id))
            elif ahead is not None:
                await self._final_then_next(service_id, batch_id, written, fence, ahead)
            else:
                await self._final_then_freed(service_id, batch_id, written, fence)
        except FencedOffError as exc:
            log.info("status of batch %s not recorded: %s", batch_id[:16], exc)

    async def _write_status(
        self, service_id: str, batch_id: str, status: BatchStatus, fence: Fence | None
    ) -> None:
        write = writes.ledger_status(service_id, batch_id, status, now=self._clock(), fence=fence)
        await self._apply_freeing(write)

    def _halt_reason(self, service_id: str, status: BatchStatus | None) -> str | None:
        """Why ``status`` halts the service, if it does (``on_invalid = halt``)."""
        if self._never_halts or not isinstance(status, Invalid):
            return None
        if self._on_invalid.of(service_id) is not OnInvalid.HALT:
            return None
        return writes.invalid_reason(status)

    async def _apply_freeing(self, write: BatchWrite) -> None:
        """Apply a write that may end a batch (and halt its service), then let
        the service and whoever waits for the batch move on."""
        status = write.status
        halt = self._halt_reason(write.service_id, status if isinstance(status, Invalid) else None)
        if halt is not None:
            write = dataclasses.replace(write, halt=halt)
        # The take the write is about: a walk may take the batch again between
        # the write's commit and this task's next step (it reads the store).
        take = self._pipelines.take_of(write.service_id, write.id)
        await self._completer.apply(write)
        service_id = write.service_id
        if halt is not None:
            self._rests.stop(service_id)
            self._notify(service_id)
        elif write.frees_service:
            self._unlocked(service_id)
        if write.status is not None and write.status.is_final:
            self._rests.finished(write.id)
        if write.frees_service and self._pipelines.pipelined(service_id):
            before, after = self._pipelines.leave_take(service_id, write.id, take)
            if isinstance(status, Invalid):
                # Out of the lane now, before anything is awaited: a walk
                # under way must not take a batch after one of them (it
                # would depend on the INVALID batch, and be in flight where
                # nothing fails it).
                for batch_id in after:
                    self._pipelines.leave(service_id, batch_id)
                await self._fail_pipeline(service_id, write.id, after)
            elif write.status is not None and write.status.is_final:
                self._walk_on(service_id, write.id)
            elif before is not None or after:
                # Lost (Unknown) or refused for now (Delayed) while others of
                # the service are in flight (which lock it in the queue's
                # rounds): the first batch of the service not at the ledger
                # is sent again from here, then each after it, in order.
                self._spawn(self._pipeline_next(service_id, None))

    def _reserve_next(self, service_id: str) -> bool:
        """A slot for a serial service's next batch, taken with its
        predecessor's final status: only where the queue would take it now
        (running, a free slot, nothing of the service in flight, handed out
        or queued). Until it ends the service counts as busy."""
        if (
            self._tasks is None
            or self._stopping.is_set()
            or service_id in self._busy
            or service_id in self._rests.services
            or self._free_slots() <= 0
            or self._parallel(service_id)
            or not self.source.idle(service_id)
        ):
            return False
        self._reserved += 1
        self._busy[service_id] = 0
        return True

    async def _final_then_next(
        self,
        service_id: str,
        batch_id: str,
        status: BatchStatus,
        fence: Fence | None,
        nxt: TrackingBatch,
    ) -> None:
        """Write ``status`` (final) and, in the same transaction, ``nxt`` (the
        service's next batch, read ahead while this one waited at the ledger)
        taken; then post ``nxt``.

        The rules of the two writes this replaces still hold, since they land
        together: the final status is durable before the next batch is
        posted, and the next batch's ``submitted`` before its POST. If the
        slot or the store says no, the final status is written alone and the
        queue picks the next batch.
        """
        if not self._reserve_next(service_id):
            await self._write_status(service_id, batch_id, status, fence)
            return
        landed = False
        try:
            failpoint("submitting")
            self._take(nxt)
            now = self._clock()
            done, take = await self._completer.apply_together(
                [
                    writes.ledger_status(service_id, batch_id, status, now=now, fence=fence),
                    writes.taken_after(nxt, batch_id, now=now, fence=fence),
                ]
            )
            if done is not None:
                raise done
            landed = take is None
        finally:
            self._reserved -= 1
            if not landed:
                self._untake(nxt)
        if not landed:
            self._unlocked(service_id)
            return
        self._rests.finished(batch_id)
        self.taken_with_final += 1
        self.source.taken_elsewhere(nxt)
        self._post_taken(nxt, fence)
        # The service moved on but stays locked: nothing to queue.
        self._notify(service_id)

    async def _final_then_freed(
        self, service_id: str, batch_id: str, status: BatchStatus, fence: Fence | None
    ) -> None:
        """Write ``status`` (final) and, where the store can, in the same
        transaction up to :data:`FREED_TAKE` of the batches it frees (a
        parallel service's, blocked by it until now) taken; then post them.

        The final status is durable before a batch it freed is posted, and
        each such batch's ``submitted`` before its POST. A batch blocked
        until this transaction was never offered by a round, so nothing else
        takes it. When it took as many as it could, more may be free: the
        queue is woken as usual; when it took none, too.
        """
        slots = min(FREED_TAKE, self._free_slots())
        if (
            slots <= 0
            or not self._parallel(service_id)
            or not self._store.takes_freed
            or service_id in self._rests.services
            or self._tasks is None
            or self._stopping.is_set()
        ):
            await self._write_status(service_id, batch_id, status, fence)
            return
        freed: list[TrackingBatch] = []
        self._reserved += slots
        try:
            await self._completer.apply(
                writes.ledger_status(
                    service_id,
                    batch_id,
                    status,
                    now=self._clock(),
                    fence=fence,
                    take_freed=slots,
                    freed=freed,
                )
            )
        finally:
            self._reserved -= slots
            self._slot_free.set()
        self._rests.finished(batch_id)
        for batch in freed:
            if batch.batch_id in self._in_flight:
                continue  # a submission of this process has it already
            self._take(batch)
            self.taken_with_final += 1
            self.taken_freed += 1
            self._post_taken(batch, fence)
        if not freed or len(freed) >= slots:
            self._unlocked(service_id)
        else:
            self._notify(service_id)

    # -- the pipelined strategy ------------------------------------------------

    async def _pipeline_next(self, service_id: str, after: str | None) -> None:
        """Take the next batches of a pipelined service that may go while
        those before them are in flight, if there are (:class:`Pipelines`)."""
        lock = self._pipelines.lock(service_id)
        try:
            async with lock:
                if self._stopping.is_set() or service_id in self._rests.services:
                    return
                found = await self._pipelines.next(service_id, after, self._in_flight)
                if isinstance(found, Later):
                    asyncio.get_running_loop().call_later(
                        found.delay_ms / 1000, self._look_again, service_id, found.after
                    )
                elif (
                    isinstance(found, Take)
                    and self._tasks is not None
                    and not self._stopping.is_set()
                    and not self._sent_again(after)
                ):
                    run: list[TrackingBatch] = []
                    for batch in found.batches:
                        if batch.batch_id in self._in_flight:
                            break  # taken another way meanwhile: the run ends before it
                        self._take(batch)
                        run.append(batch)
                    if run:
                        self._tasks.create_task(self._take_run(service_id, run))
        except LedgerqError as exc:
            log.warning("cannot read the next batch of service %s: %s", service_id, exc)
        finally:
            self._pipelines.unlocked(service_id, lock)

    async def _take_run(self, service_id: str, run: Sequence[TrackingBatch]) -> None:
        """Record a pipelined walk's run taken, in one transaction, then post
        it (:meth:`_post_run`).

        Only the batches before the first take the store refuses are posted;
        those after it that were recorded taken stay ``submitted``, and the
        follower's next scan asks the ledger about them before anything
        resends them.
        """
        landed = 0
        fence: Fence | None = None
        try:
            for _ in run:
                failpoint("submitting")
            fence = self._fence(service_id)
            now = self._clock()
            refusals = await self._completer.apply_together(
                [writes.taken(batch, now=now, fence=fence) for batch in run]
            )
            landed = next((i for i, e in enumerate(refusals) if e is not None), len(run))
            if landed < len(run):
                refused = refusals[landed]
                if isinstance(refused, StatusTransitionError):
                    self._spawn(self._rests.refresh([service_id]))
                log.warning(
                    "batch=%s service=%s not taken: %s; the %d after it in its run are not posted",
                    run[landed].batch_id[:16],
                    service_id,
                    refused,
                    len(run) - landed - 1,
                )
        except LedgerqError as exc:
            log.log(
                logging.WARNING
                if isinstance(exc, FencedOffError | StatusTransitionError)
                else logging.ERROR,
                "run of %d batches of service %s not taken: %s",
                len(run),
                service_id,
                exc,
            )
        finally:
            for batch in run[landed:]:
                self._pipelines.leave(service_id, batch.batch_id)
                self._untake(batch)
                self.source.released(batch)
        for batch in run[:landed]:
            self.source.taken(batch)
        await self._post_run(run[:landed], fence)

    async def _post_run(self, run: Sequence[TrackingBatch], fence: Fence | None) -> None:
        """Post a run's batches, recorded taken, in their order: each POST
        once the ledger accepted the one before (so the ledger never holds
        one for a batch it has not seen yet), not once that was recorded.
        After one the ledger did not accept (refused, ambiguous, not posted),
        the rest are not posted: they stay ``submitted``, in the lane, and
        the ledger is asked about them (it has never seen them: ``Unknown``,
        and they go again after it, in order)."""
        loop = asyncio.get_running_loop()
        for at, batch in enumerate(run):
            link = _RunLink(loop.create_future(), last=at == len(run) - 1)
            if not self._post_in_run(batch, fence, link):
                unposted = run[at:]
            elif not await link.answered:
                unposted = run[at + 1 :]
            else:
                continue
            for rest in unposted:
                self._untake(rest)
                if self._pipelines.holds(rest.service_id, rest.batch_id):
                    self._pipelines.unsent(rest.service_id, rest.batch_id)
                    self.follower.ask(rest.batch_id, rest.service_id)
            return

    def _post_in_run(self, batch: TrackingBatch, fence: Fence | None, link: _RunLink) -> bool:
        """Start the submission of a run's batch; not if it left its lane
        meanwhile (failed: a batch before it was INVALID) or the producer's
        run is ending."""
        if self._tasks is None or not self._pipelines.holds(batch.service_id, batch.batch_id):
            return False
        try:
            self._tasks.create_task(self._submit(batch, recorded=True, fence=fence, link=link))
        except RuntimeError:  # its task group is shutting down
            return False
        return True

    def _sent_again(self, batch_id: str | None) -> bool:
        """Whether a walk from ``batch_id`` must not take the batch after it:
        ``batch_id`` is being posted or checked again (the ledger lost it)
        and the ledger has not accepted it yet. Its submission's end walks on."""
        return (
            batch_id is not None and batch_id in self._in_flight and batch_id not in self._accepting
        )

    def _walk_on(self, service_id: str, final: str) -> None:
        """``final`` (of a pipelined service) is final, or new batches of
        the service were accepted: perhaps more may go. Walked from the last
        batch of the service in flight here (those before it are in flight
        too, and a batch lost among them is sent again from the service's
        first), or not at all while that one is being posted (its acceptance
        walks on) or was not posted (the ledger's answer about it walks
        on); from the service's first when a walk left a lost batch
        behind."""
        if self._pipelines.lost_behind(service_id):
            self._spawn(self._pipeline_next(service_id, None))
            return
        start = self._pipelines.last(service_id)
        if start is not None and self._pipelines.blocks(service_id, start, self._in_flight):
            return
        self._spawn(self._pipeline_next(service_id, start or final))

    def _look_again(self, service_id: str, after: str | None) -> None:
        if self._tasks is not None and not self._stopping.is_set():
            self._spawn(self._pipeline_next(service_id, after))

    async def _fail_pipeline(self, service_id: str, invalid: str, after: Sequence[str]) -> None:
        """A pipelined batch is ``Invalid``: the batches taken after it, in
        flight at the ledger, depend on it (each declared the one before):
        they fail at once, and are followed no more. They have left the lane
        already (:meth:`_apply_freeing`)."""
        if not after:
            return
        try:
            fence = self._fence(service_id)
            batches = await self._store.get_batches_by_id(after)
        except LedgerqError as exc:
            log.warning("cannot fail the batches after %s: %s", invalid[:16], exc)
            return
        reason = f"depends on batch {invalid}, which the ledger judged INVALID"
        for batch in batches:
            self.follower.resending(batch.batch_id)
            self._posting.discard(batch.batch_id)
            try:
                await self._apply_freeing(
                    writes.dependency_failed(batch, reason, now=self._clock(), fence=fence)
                )
            except LedgerqError as exc:
                # Left in flight: the follower's scan asks about it.
                log.warning("batch %s not failed: %s", batch.batch_id[:16], exc)

    # -- declared dependencies, halts and operator control --------------------

    async def _dependencies_met(self, batch: TrackingBatch) -> bool:
        """Whether ``batch`` may be taken now as far as its declared
        dependencies go (``ledgerq.pipeline.dependencies``). If not, what
        it must do instead was done: a dependency of its service taken
        first, the batch failed, or its service set waiting."""
        # Checks run together. Each acts on its verdict with no await between
        # what it reads of the lanes and what it does to them: checks made
        # together see each other's batches as checked, not in flight
        # (``_checking``), so none waits for another. The store is read
        # before: a batch it shows not sent may have been taken meanwhile,
        # and is in flight here still (seen), or its submission ended: then
        # the check reads again (each time after a submission of that
        # service ended, so it ends).
        ended = self._ended_during[batch.batch_id] = set()
        try:
            while True:
                ended.clear()
                verdict = await self.dependencies.resolve(batch)
                if not isinstance(verdict, TakeFirst) or verdict.batch.service_id not in ended:
                    break
            return await self._check_dependencies(batch, verdict)
        finally:
            self._ended_during.pop(batch.batch_id, None)
            self._checking.discard(batch.batch_id)

    async def _check_dependencies(self, batch: TrackingBatch, verdict: Resolution) -> bool:
        service_id = batch.service_id
        match verdict:
            case TakeFirst(batch=first, reason=reason):
                if not self._may_take_first(batch, first):
                    # Another submission has it, others of its service are in
                    # flight, or another instance holds its service: wait,
                    # and look again once that service has nothing in flight.
                    self._rests.wait_for_idle(first.service_id, service_id)
                    await self._wait_for(batch, Wait(reason, first.batch_id))
                    return False
                assert self._tasks is not None
                self._take(first, check=True)
                self._tasks.create_task(self._submit(first))
                return False
            case Fail(reason=reason):
                fence = self._fence(service_id)
                await self._apply_freeing(
                    writes.dependency_failed(batch, reason, now=self._clock(), fence=fence)
                )
                log.info("batch=%s service=%s failed: %s", batch.batch_id[:16], service_id, reason)
                return False
            case Wait():
                await self._wait_for(batch, verdict)
                return False
        if not self._parallel(service_id) and self._taken_of(service_id, batch.batch_id):
            # A batch of the service went first (a dependency of another):
            # still one at a time.
            self._rests.wait_for_idle(service_id, service_id)
            await self._wait_for(batch, Wait("waits for its service's batch in flight"))
            return False
        self._rests.end_wait(service_id, wake=False)
        return True

    def _taken_of(self, service_id: str, but: str) -> int:
        """The batches of ``service_id`` in flight here, ``but`` aside; one
        still waiting for its dependency check does not count (it may step
        aside, and checks it waits for would wait for it in turn)."""
        return sum(
            1
            for batch_id, of in self._in_flight.items()
            if of == service_id and batch_id not in self._checking and batch_id != but
        )

    def _may_take_first(self, batch: TrackingBatch, first: TrackingBatch) -> bool:
        """Whether ``first`` (a batch ``batch`` depends on) may be taken now,
        ahead of its service's order: nothing else of its service in flight
        here (``batch`` aside), that service held and taking batches."""
        service_id = first.service_id
        others = self._taken_of(service_id, batch.batch_id)
        if (
            self._tasks is None
            or first.batch_id in self._in_flight
            or others > 0
            or self._rests.stopped(service_id)
        ):
            return False
        return self._claims is None or self._claims.fence_for(service_id) is not None

    async def _wait_for(self, batch: TrackingBatch, wait: Wait) -> None:
        """Set the batch's service waiting (it takes nothing until it looks
        again), and record what it waits for once per change (its lock
        reason)."""
        service_id = batch.service_id
        if self._rests.wait(service_id, batch.batch_id, wait.reason, wait.on):
            fence = self._fence(service_id)
            await self._completer.apply(
                writes.waiting(batch, wait.reason, now=self._clock(), fence=fence)
            )
            self._notify(service_id)

    async def refresh_controls(self, service_ids: Collection[str] | None = None) -> None:
        """Read the services' controls again (an operator paused, resumed or
        resumed one past its halt); ``None``: every service's."""
        await self._rests.refresh(service_ids)

    async def _rest_loop(self) -> None:
        """Every poll interval: which services are paused or halted (an
        operator acted on another instance), and the waits that are due."""
        while True:
            await asyncio.sleep(self.settings.submitter.poll_timeout_s)
            await self._rests.refresh()
            self._rests.due()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _post_taken(self, batch: TrackingBatch, fence: Fence | None) -> None:
        """Post a batch the store already shows taken. If the run ended
        meanwhile, the batch stays {submitted}: the follower asks the ledger
        about it before anything resends it."""
        try:
            if self._tasks is None:
                raise RuntimeError("the producer's run ended")
            self._tasks.create_task(self._submit(batch, recorded=True, fence=fence))
        except RuntimeError:  # no run, or its task group is shutting down
            self._untake(batch)
            log.warning(
                "batch=%s service=%s taken as the producer stopped; not posted (the "
                "ledger is asked about it)",
                batch.batch_id[:16],
                batch.service_id,
            )
