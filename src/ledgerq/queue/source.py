"""The queue the producer pulls from, one batch at a time.

:class:`QueueSource` serves the one-round serial queuer's rounds
(:class:`ledgerq.queue.serial.RoundStore.queue_round`) to the producer:

* **One round at a time.** When the current round is used up, the next pull
  asks the store for a new one — if one is due: at start, after
  ``wake(None)``, and once per ``poll_interval``; in between, the woken
  services below are all there is to look at. Every service with work has one batch in a
  round, so a service with 10,000 waiting batches delays a service with one
  batch by at most the rest of the current round.
* **Woken, not polled.** :meth:`QueueSource.wake` says a service's state
  changed in the store (a batch accepted, committed, found ``Unknown``...).
  The next pull then asks the store for that service's pick and appends it to
  the *end* of the current round, unless the service already has a batch
  waiting in it — so a busy service still gets at most one batch per round
  position and nobody is overtaken. Waiters in :meth:`QueueSource.get` return
  at once; without a wake-up they look again every ``poll_interval`` (for
  ``Delayed`` batches whose window passes, which no event announces).
* **Never twice.** A batch stays *handed out* until the producer says the
  store shows it taken (:meth:`QueueSource.taken`) or that it will not take
  it (:meth:`QueueSource.released`), the store shows it changed (a new
  status, attempt count or attempt time), a round that covers its service no
  longer contains it, or ``handout_ms`` passes (its submission died before
  recording anything). Until then it is not handed out again, even if the
  store — not yet told ``submitted = true`` — still queues it.
* **Narrow rounds** (``narrow=True``): rounds come without the picks' blobs
  (``serialized_batch``, transactions), so a round over many services ships
  a few narrow columns per pick; the batches handed out are then loaded in
  full with one set-based read per pull (at most ``limit`` of them). A pick
  whose state changed in the store since its round (gone, final, or another
  ``submitted``, status, attempt count or attempt time) is not handed out:
  its service is looked at again on the next pull.
* **Claimed services.** Under high availability ``services`` says which
  services this instance holds; with ``claimant`` (its instance id) a full
  round is asked for the services the store's claims give it, a join in the
  database rather than a list of thousands of ids, and its picks are kept
  only for services ``services`` also names.
* **Offered picks.** :meth:`QueueSource.offer` queues picks read
  elsewhere (a take-over's, on the claim thread: the services a dead
  instance left with work, whose round on the gateway's busy loop would
  wait for the loop) to the *front* of the round, without asking the
  store. A service this source handed a batch of (or heard
  ``taken_elsewhere`` of) less than ``handout_ms`` before gets no
  offered pick but is woken instead: the pick may have been read before
  that hand-out was recorded.
* A round is a snapshot: the producer records ``submitted = true`` (fenced,
  under HA) before posting, and must treat a refused write as "not mine".
* **Resting services** (``resting``): a service that takes nothing now
  (paused, halted, waiting for a dependency) gets no pick; it is woken when
  it leaves.
* **Strategies** (:class:`~ledgerq.queue.strategy.StrategyMap`): a service
  under ``serial`` gets its picks from ``queue_round``, one under
  ``parallel`` from ``parallel_round``. A woken parallel service gets up to
  ``parallel_picks`` picks in one query (its eligible batches, which never
  conflict with each other), queued one after the other at the end of the
  round; once the last is handed out it is woken again, and its batches
  handed out (not yet shown as taken) are passed as ``exclude``: the
  next pull appends its next eligible batches, so several of its batches are
  in flight together.
  :meth:`QueueSource.taken` says the store now shows a batch as taken, which
  ends its hand-out; :meth:`QueueSource.released`, that a batch handed out will
  not be taken. ``exclude`` services in :meth:`QueueSource.next_batches`
  apply to serial services only; ``exclude_batches`` to every service, and a
  pick in it is dropped, never handed out later: the caller is still working
  on that very batch, so the pick is stale.

``wake`` must be called after the store write it announces has committed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ledgerq.clock import Clock, now_ms
from ledgerq.errors import StoreError
from ledgerq.model import BatchStatusName, TrackingBatch
from ledgerq.queue.parallel import ParallelRoundStore, check_per_service
from ledgerq.queue.serial import DEFAULT_DELAY_WINDOW_MS, RoundStore, round_order_key
from ledgerq.queue.strategy import SERIAL_ONLY, Strategy, StrategyMap

#: How soon to hand back to a caller whose ``exclude`` holds back work.
_DEFERRED_RETRY_S = 0.002
#: A woken parallel service's picks per round: the batches a final status
#: (or several, group-committed) freed come in one query, not one per pull.
DEFAULT_PARALLEL_PICKS = 16
#: At most this many picks past every woken service's first (a round of
#: woken services comes with the batches' blobs): the submission slots.
_MAX_LATER_PICKS = 256
#: Services' last hand-outs kept before the older ones are looked through.
_MAX_TOUCHED = 65_536

_T = TypeVar("_T")

ServiceFilter = Callable[[], Collection[str] | None]

_Key = tuple[str, str]
_Version = tuple[BatchStatusName | None, int, int | None]


@dataclass(frozen=True, slots=True)
class _HandOut:
    version: _Version
    taken_at: int
    seq: int | None
    #: A parallel service's: excluded from its rounds, so a round's silence
    #: about it says nothing.
    excluded: bool


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _key(batch: TrackingBatch) -> _Key:
    return (batch.service_id, batch.batch_header)


def _version(batch: TrackingBatch) -> _Version:
    return (batch.status_name, batch.attempts, batch.last_attempt_at)


class QueueSource:
    """Serves rounds from a :class:`RoundStore` one batch at a time."""

    def __init__(
        self,
        store: RoundStore,
        *,
        clock: Clock = now_ms,
        delay_window_ms: int = DEFAULT_DELAY_WINDOW_MS,
        services: ServiceFilter | None = None,
        round_limit: int | None = None,
        handout_ms: int | None = None,
        poll_interval: float = 1.0,
        query_timeout: float = 30.0,
        narrow: bool = False,
        strategies: StrategyMap = SERIAL_ONLY,
        claimant: str | None = None,
        parallel_picks: int = DEFAULT_PARALLEL_PICKS,
        resting: Collection[str] = (),
    ) -> None:
        """``resting``: services that take nothing now (paused, halted,
        waiting for a dependency), a live view: none of their batches is
        handed out, and a service that leaves it must be woken."""
        if delay_window_ms < 0:
            raise ValueError(f"delay_window_ms must be >= 0, got {delay_window_ms}")
        check_per_service(parallel_picks)
        rounds = {kind.rounds for kind in strategies.kinds()}
        #: The rounds every service takes picks from, if one kind for all.
        self._uniform_rounds = rounds.pop() if len(rounds) == 1 else None
        if self._uniform_rounds is not Strategy.SERIAL and not hasattr(store, "parallel_round"):
            raise TypeError("the parallel strategy needs a store with parallel_round")
        self._store = store
        self._strategies = strategies
        # Every service serial (the default): no per-service strategy lookups.
        self._all_serial = self._uniform_rounds is Strategy.SERIAL
        self._clock = clock
        self._delay_window_ms = delay_window_ms
        self._services = services
        self._round_limit = round_limit
        self._handout_ms = delay_window_ms if handout_ms is None else handout_ms
        self._poll_interval = poll_interval
        self._query_timeout = query_timeout
        self._narrow = narrow
        self._claimant = claimant
        self._parallel_picks = parallel_picks
        self._resting = resting
        self._round: deque[TrackingBatch] = deque()
        # Per service, how many of its picks wait in the round (one at most
        # for a serial service; up to parallel_picks for a parallel one).
        self._in_round: dict[str, int] = {}
        self._handed_out: dict[_Key, _HandOut] = {}
        # No hand-out is older than this (None: none): the hand-outs are looked
        # through for expired ones only once one may have expired.
        self._oldest_handout: int | None = None
        self._woken: set[str] = set()
        # Seqs of round picks that came without their blobs.
        self._narrow_picks: set[int] = set()
        # A full round is asked for only when one is due: at start, after
        # wake(None), and every poll interval (Delayed batches whose window
        # passed, wake-ups missed); otherwise woken services are enough.
        self._full_due = True
        self._last_full: int | None = None
        # Wake-ups: a flag cleared before each look (so one that comes during
        # a query is not lost) and the futures of callers waiting for one.
        self._woke = False
        self._waiters: set[asyncio.Future[None]] = set()
        self._lock = asyncio.Lock()
        self.rounds = 0
        #: Per service, when this source last handed out a batch of it (or
        #: heard one was taken elsewhere): an offered pick may predate it.
        self._touched: dict[str, int] = {}
        self._touch_limit = _MAX_TOUCHED
        #: Batches taken without this source handing them out while a round
        #: was being read (``None``: no round is): that round may offer them.
        self._taken_while_reading: set[tuple[str, str]] | None = None

    @property
    def queued(self) -> int:
        """Batches left in the current round."""
        return len(self._round)

    @property
    def handed_out(self) -> int:
        """Batches handed out that the store has not yet shown as taken."""
        return len(self._handed_out)

    def taken(self, batch: TrackingBatch) -> None:
        """The store now shows ``batch`` as taken (``submitted``): its hand-out
        ends. One this source did not hand out (taken ahead of its service's
        order for a batch that depends on it, or by a pipelined walk) leaves
        the round, and a round read meanwhile does not offer it."""
        if self._handed_out.pop(_key(batch), None) is None:
            self._taken_without(batch)

    def idle(self, service_id: str) -> bool:
        """Whether nothing of ``service_id`` is handed out or queued in
        the current round, and the service is serial: its next batch may then
        be taken outside the source (the commit → next POST merge), which
        skips nothing the source would have done first."""
        if service_id in self._in_round:
            return False
        if not self._all_serial and self._parallel(service_id):
            return False
        return not any(key[0] == service_id for key in self._handed_out)

    def taken_elsewhere(self, batch: TrackingBatch) -> None:
        """``batch`` was recorded taken outside the source (with its
        predecessor's final status): a pick of its service still in the
        round predates that and is dropped, never handed out later."""
        service_id = batch.service_id
        self._touched[service_id] = self._clock()
        self._taken_without(batch)
        if service_id in self._in_round:
            kept = [b for b in self._round if b.service_id != service_id]
            self._round.clear()
            self._round.extend(kept)
            del self._in_round[service_id]

    def _taken_without(self, batch: TrackingBatch) -> None:
        key = _key(batch)
        if self._taken_while_reading is not None:
            self._taken_while_reading.add(key)
        if batch.service_id not in self._in_round:
            return
        for pick in self._round:
            if _key(pick) == key:
                self._round.remove(pick)
                self._left_round(batch.service_id)
                break

    def released(self, batch: TrackingBatch) -> None:
        """``batch`` was handed out but will not be taken (the caller dropped
        it, or could not record it): its hand-out ends and its service is looked
        at again."""
        self._handed_out.pop(_key(batch), None)
        self.wake(batch.service_id)

    def wake(self, service_id: str | None = None) -> None:
        """A service's state changed in the store (``None``: some service)."""
        if service_id is not None:
            self._woken.add(service_id)
        else:
            self._full_due = True
        self._woke = True
        for waiter in self._waiters:
            _settle(waiter)

    def offer(self, picks: Collection[TrackingBatch], services: Collection[str]) -> None:
        """The picks of ``services`` (at most one per service, whole, as a
        round of those services returns them, read once they were claimed): a
        take-over's. Queued at the *front* of the current round, in the
        order they are given: their services' work has waited since the
        previous holder stopped (a claim's TTL at least), while the round
        holds what this instance's own services were given since; each
        service still gets one batch per round, and the round's others wait
        for these picks only. Behind a survivor's own round of hundreds of
        batches they would wait for a submission slot past the failover
        target.

        A service handed out (or taken elsewhere) within ``handout_ms``, one
        not claimed, and a parallel one are woken instead (the pick may predate
        that hand-out, or come from the other strategy's round); one
        already in the round keeps its place there."""
        self._forget_touches(self._clock())
        by_service = {b.service_id: b for b in picks}
        allowed = self._allowed(set(services))
        queued: set[str] = set()
        for service_id in services:
            if (
                service_id in self._touched
                or service_id not in allowed
                or (not self._all_serial and self._parallel(service_id))
            ):
                self.wake(service_id)
                continue
            batch = by_service.get(service_id)
            if batch is None or service_id in self._in_round:
                continue  # nothing queueable when read (in flight), or queued already
            if _key(batch) in self._handed_out:
                self.wake(service_id)  # handed out long ago: let a round decide
                continue
            queued.add(service_id)
            self._in_round[service_id] = 1
        if queued:
            self._round.extendleft(reversed([b for b in picks if b.service_id in queued]))
            self._woke = True
            for waiter in self._waiters:
                _settle(waiter)

    async def get(self, max_wait: float | None = None) -> TrackingBatch | None:
        """The next batch, waiting up to ``max_wait`` seconds (``None``: for ever)."""
        batches = await self._wait_for(1, frozenset(), max_wait)
        return batches[0] if batches else None

    async def next(self) -> TrackingBatch | None:
        """The next batch without waiting; ``None`` if the store has none."""
        batches, _ = await self._take(1, frozenset())
        return batches[0] if batches else None

    async def next_batches(
        self,
        limit: int,
        *,
        exclude: frozenset[str],
        timeout_s: float,
        exclude_batches: frozenset[str] = frozenset(),
    ) -> list[TrackingBatch]:
        """Up to ``limit`` batches in round order, at most one per serial
        service; none of a serial service in ``exclude`` and none whose id is in
        ``exclude_batches`` (kept for a later call); waits up to ``timeout_s``
        for work, else ``[]``.

        What the producer's poll loop pulls.
        """
        return await self._wait_for(limit, exclude, timeout_s, exclude_batches)

    async def _wait_for(
        self,
        limit: int,
        exclude: frozenset[str],
        max_wait: float | None,
        exclude_batches: frozenset[str] = frozenset(),
    ) -> list[TrackingBatch]:
        loop = asyncio.get_running_loop()
        deadline = None if max_wait is None else loop.time() + max_wait
        while True:
            # Cleared before looking, so a wake-up during the query is not lost.
            self._woke = False
            batches, deferred = await self._take(limit, exclude, exclude_batches)
            if batches:
                return batches
            wait = _DEFERRED_RETRY_S if deferred else self._poll_interval
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                wait = min(wait, remaining)
            await self._pause(wait)
            if deferred:
                # Let the caller ask again with its up-to-date ``exclude``.
                return []

    async def _pause(self, wait: float) -> None:
        """Until a wake-up, or ``wait`` seconds. A future and a timer: run once
        per batch handed out, ``asyncio.wait_for`` would add a task, a second
        future and their callbacks."""
        if self._woke:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(wait, _settle, waiter)
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)

    async def _take(
        self,
        limit: int,
        exclude: frozenset[str],
        exclude_batches: frozenset[str] = frozenset(),
    ) -> tuple[list[TrackingBatch], bool]:
        """Pop up to ``limit`` batches, asking the store at most three times.

        Also says whether work was *deferred*: picks or wake-ups of services
        in ``exclude``, or picks in ``exclude_batches``, kept for when the
        caller no longer excludes them.
        """
        async with self._lock:
            now = self._clock()
            self._expire_handouts(now)
            # Only a serial service waits for its previous batch's task to end.
            blocked = (
                exclude
                if self._all_serial
                else frozenset(s for s in exclude if not self._parallel(s))
            )
            if self._woken:
                woken = self._woken
                self._woken = woken & blocked
                targets = self._allowed(woken.difference(self._in_round, blocked))
                if targets:
                    await self._refill(now, targets)
            if not self._round and self._full_round_due(now):
                await self._refill(now, None)
            taken: list[TrackingBatch] = []
            skipped: list[TrackingBatch] = []
            while self._round and len(taken) < limit:
                batch = self._round.popleft()
                if batch.batch_id in exclude_batches:
                    # The caller is still working on this very batch: the
                    # pick is stale. Drop it; the store decides again once
                    # the caller is done.
                    self._left_round(batch.service_id)
                    self._woken.add(batch.service_id)
                    continue
                if batch.service_id in blocked:
                    # The caller is still finishing this service's previous
                    # batch (already final or Unknown in the store): keep the
                    # pick in place for its next call.
                    skipped.append(batch)
                    continue
                self._left_round(batch.service_id)
                taken.append(batch)
            self._round.extendleft(reversed(skipped))
            if any(b.seq in self._narrow_picks for b in taken):
                taken = await self._load(taken)
            if taken and (self._oldest_handout is None or now < self._oldest_handout):
                self._oldest_handout = now
            for batch in taken:
                self._touched[batch.service_id] = now
                parallel = not self._all_serial and self._parallel(batch.service_id)
                self._handed_out[_key(batch)] = _HandOut(_version(batch), now, batch.seq, parallel)
                if parallel and batch.service_id not in self._in_round:
                    # Its next eligible batches, those handed out excluded.
                    self._woken.add(batch.service_id)
            if len(self._touched) > self._touch_limit:
                self._forget_touches(now)
            return taken, bool(skipped or self._woken)

    def _forget_touches(self, now: int) -> None:
        """Hand-outs older than ``handout_ms`` are forgotten."""
        self._touched = {s: t for s, t in self._touched.items() if now - t < self._handout_ms}
        self._touch_limit = max(_MAX_TOUCHED, 2 * len(self._touched))

    def _left_round(self, service_id: str) -> None:
        left = self._in_round[service_id] - 1
        if left:
            self._in_round[service_id] = left
        else:
            del self._in_round[service_id]

    def _parallel(self, service_id: str) -> bool:
        return self._strategies.of(service_id) is Strategy.PARALLEL

    async def _round_of(
        self,
        strategy: Strategy,
        now: int,
        services: set[str] | None,
        limit: int | None,
        extra: dict[str, Any],
        *,
        full: bool,
    ) -> list[TrackingBatch]:
        """One strategy's round for ``services`` (``None``: all); the caller
        keeps the picks of ``services`` only."""
        if services is not None and not services:
            return []
        if strategy is Strategy.SERIAL:
            ask: set[str] | None = services
            kwargs = dict(extra)
            if full and services is not None and self._claimant is not None:
                # The store's claims for this instance, a join in the database.
                kwargs["claimant"] = self._claimant
                ask = None
            return await self._ask(
                self._store.queue_round(
                    now=now,
                    delay_window_ms=self._delay_window_ms,
                    services=ask,
                    limit=limit,
                    **kwargs,
                ),
                "a round",
            )
        store = cast(ParallelRoundStore, self._store)
        per_service = 1
        if not full and services is not None:
            # Woken services: every batch their final statuses freed, in one
            # query; past every service's first pick, no more than a
            # producer takes at once (the picks come whole).
            per_service = self._parallel_picks
            cap = len(services) + _MAX_LATER_PICKS
            limit = cap if limit is None else min(limit, cap)
        return await self._ask(
            store.parallel_round(
                now=now,
                delay_window_ms=self._delay_window_ms,
                services=services,
                limit=limit,
                exclude=[
                    h.seq for h in self._handed_out.values() if h.excluded and h.seq is not None
                ],
                per_service=per_service,
                **extra,
            ),
            "a round",
        )

    async def _load(self, picks: list[TrackingBatch]) -> list[TrackingBatch]:
        """The full batches of narrow picks, minus those the store changed since."""
        seqs = [b.seq for b in picks if b.seq is not None and b.seq in self._narrow_picks]
        loaded = await self._ask(self._store.get_batches_by_seq(seqs), "the batches to submit")
        by_seq = {b.seq: b for b in loaded}
        full: list[TrackingBatch] = []
        for pick in picks:
            if pick.seq is None or pick.seq not in self._narrow_picks:
                full.append(pick)  # from a round of woken services: loaded already
                continue
            self._narrow_picks.discard(pick.seq)
            batch = by_seq.get(pick.seq)
            if (
                batch is None
                or batch.is_final
                or batch.submitted != pick.submitted
                or _version(batch) != _version(pick)
            ):
                self._woken.add(pick.service_id)  # decide again from the store
                continue
            full.append(batch)
        return full

    async def _ask(self, query: Awaitable[_T], what: str) -> _T:
        try:
            return await asyncio.wait_for(query, self._query_timeout)
        except TimeoutError as exc:
            raise StoreError(
                f"the store did not return {what} within {self._query_timeout} s; "
                "check the database's load and connectivity"
            ) from exc

    def _allowed(self, services: set[str]) -> set[str]:
        if self._resting:
            services = services.difference(self._resting)
        if self._services is None:
            return services
        allowed = self._services()
        return services if allowed is None else services & set(allowed)

    def _expire_handouts(self, now: int) -> None:
        # Run on every pull: with hundreds of batches handed out, a look through
        # them all each time cost more than the rest of the pull.
        oldest = self._oldest_handout
        if oldest is None or now - oldest < self._handout_ms:
            return
        expired = [k for k, h in self._handed_out.items() if now - h.taken_at >= self._handout_ms]
        for key in expired:
            del self._handed_out[key]
            self._woken.add(key[0])  # look at its service again
        self._oldest_handout = min((h.taken_at for h in self._handed_out.values()), default=None)

    def _full_round_due(self, now: int) -> bool:
        return (
            self._full_due
            or self._last_full is None
            or now - self._last_full >= self._poll_interval * 1000
        )

    async def _refill(self, now: int, targets: set[str] | None) -> None:
        services = targets
        limit = None if targets is not None else self._round_limit
        if services is None and self._services is not None:
            allowed = self._services()
            services = None if allowed is None else set(allowed)
        # Stores without narrow rounds (test doubles) never see the argument.
        # Rounds of a few woken services come whole: one query, no reload.
        extra: dict[str, Any] = {"narrow": targets is None} if self._narrow else {}
        uniform = self._uniform_rounds
        groups: list[tuple[Strategy, set[str] | None]]
        if uniform is not None:
            groups = [(uniform, services)]
        elif services is not None:
            parallel = {s for s in services if self._parallel(s)}
            groups = [(Strategy.SERIAL, services - parallel), (Strategy.PARALLEL, parallel)]
        else:
            groups = [(Strategy.SERIAL, None), (Strategy.PARALLEL, None)]
        picks: list[TrackingBatch] = []
        complete = True
        # Rounds are read one at a time (under the source's lock).
        taken_meanwhile: set[tuple[str, str]] = set()
        self._taken_while_reading = taken_meanwhile
        try:
            for strategy, group in groups:
                got = await self._round_of(strategy, now, group, limit, extra, full=targets is None)
                # A round cut short by the limit covers nothing for sure.
                complete = complete and (limit is None or len(got) < limit)
                if group is not None:
                    got = [b for b in got if b.service_id in group]
                if uniform is None:
                    got = [b for b in got if self._strategies.of(b.service_id).rounds is strategy]
                picks += got
        finally:
            self._taken_while_reading = None
        if len(groups) > 1:
            picks.sort(key=round_order_key)
            picks = picks if limit is None else picks[:limit]
        if targets is None:
            self.rounds += 1
            self._full_due = False
            self._last_full = now
        returned = {_key(b) for b in picks}
        # Services with picks in the round already get none from this one.
        present = set(self._in_round)
        # A batch handed out but missing from a round that covers its service
        # is no longer queueable in the store: the store has caught up. (Not a
        # parallel service's: its rounds exclude what it has handed out.)
        if complete:
            for key, given in list(self._handed_out.items()):
                covered = services is None or key[0] in services
                if covered and not given.excluded and key not in returned:
                    del self._handed_out[key]
        for batch in picks:
            out = self._handed_out.get(_key(batch))
            if out is not None:
                if out.version == _version(batch):
                    continue  # the store has not recorded the hand-out yet
                del self._handed_out[_key(batch)]
            if batch.service_id in present or batch.service_id in self._resting:
                continue
            if _key(batch) in taken_meanwhile:
                # Taken elsewhere while this round was read: a round read
                # from now on decides.
                self._woken.add(batch.service_id)
                continue
            if extra.get("narrow") and batch.seq is not None:
                self._narrow_picks.add(batch.seq)
            self._round.append(batch)
            self._in_round[batch.service_id] = self._in_round.get(batch.service_id, 0) + 1
