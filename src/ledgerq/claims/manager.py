"""Service claims: which gateway instance works on which service (PostgreSQL).

Each instance runs one :class:`ClaimManager`. Every renewal period it runs a
*claim cycle* of these steps, each its own short transaction:

1. **take over** — other instances' expired claims, with the two-phase rule:
   once the first expiry passed if the service has nothing mid-submission (a
   batch marked submitted and not yet acknowledged by the ledger: status
   None, Unknown or Delayed), once the second expiry passed whatever it was
   doing. Each expired claim goes to one live instance, its *rendezvous
   winner* (``claims.sql``), which voids it and claims it again in one
   statement: survivors of a dead instance split its services between them
   without contending for the same rows, each in one cycle, and the pipeline
   hears of them as soon as that transaction commits, the services taken
   over idle named apart (:class:`ClaimChange`: nothing to wake for them);
2. **maintenance** — when the next foreign claim may expire (the next cycle
   comes then), forget long-silent instances; now and then delete the claim
   rows of services with nothing left to do;
3. **renew** — the instance's own row: its heartbeat and its *lease*. A claim
   expires at the later of its own expiry (set when it was taken) and its
   holder's lease, so this one row renews every claim the *database* says
   the instance holds (never what it remembers);
4. **claim** — unclaimed services up to the fair share ``ceil(S/K)`` of S
   services among K live instances (heartbeat within ``liveness_ms``), plus
   every service left unclaimed past ``grace_ms`` whatever the share;
5. **hand over** — claims beyond the floor share ``floor(S/K)`` on services
   with nothing in flight, as many as instances below the floor share lack,
   so a newly started instance gets its share within a few periods; claims
   younger than ``liveness_ms`` stay, so nothing bounces between instances;
   then read back what this instance holds.

Claiming a service gives it a new **epoch** (from one sequence: epochs never
repeat). Writes made for a service carry the :class:`~ledgerq.model.Fence`
(instance id, epoch) returned by :meth:`ClaimManager.fence_for`; the store
applies them only while the claim is still held at that epoch, so an instance
that was paused past its expiry changes nothing once its claim moved on.

Lock order: the claim cycle never waits for a claim row another session
holds (``claims.sql`` says how), so it cannot deadlock with the store's
fenced writes, nor with other instances.

Time is injected: every step takes ``now`` (ms) from the manager's clock and
passes it to the SQL; the database's own clock is never used.

A cycle that fails (no primary answers, say) is followed by the next after a
backoff, not at its schedule: a quarter of the renewal interval doubling to
the whole, each pause drawn from its upper half (:meth:`ClaimManager.pause_ms`),
so instances that lost the database together do not retry it together, and
its expiry schedule, which a failed cycle cannot move forward, does not make
the cycles spin. A step that cannot connect ends its cycle (the others would
only try again). The first failure of a run of them is one warning; the
cycle that succeeds again logs how many failed and for how long.

The tables (``gateway_instances``, ``service_id_claims``) come with the
store's PostgreSQL migrations; open the store (which migrates) first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from ledgerq.claims.session import ClaimSession, Conn, Row
from ledgerq.claims.settings import ClaimSettings
from ledgerq.clock import Clock, now_ms
from ledgerq.errors import ConfigError, StoreError, StoreUnavailableError
from ledgerq.failpoints import failpoint
from ledgerq.model import Fence

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Called after a cycle with the services gained and the services lost.
ChangeListener = Callable[[frozenset[str], frozenset[str]], None]


@dataclass(frozen=True, slots=True)
class ClaimChange:
    """What one change of the claimed set brought (see :meth:`ClaimManager.add_change_listener`)."""

    gained: frozenset[str]
    lost: frozenset[str]
    #: Of ``gained``, the services a take-over moved with nothing to do: no
    #: batch not final when taken, and none since (checked once this
    #: instance claimed them, so a batch accepted meanwhile wakes its service
    #: through the pipeline). Nothing to queue or follow for them.
    idle: frozenset[str] = frozenset()
    #: Of ``gained``, the services taken over with work whose next batches a
    #: take-over listener handed to the pipeline itself
    #: (:meth:`TakeOverListener.hand_to_pipeline`): nobody needs to look them up.
    ready: frozenset[str] = frozenset()


ClaimChangeListener = Callable[[ClaimChange], None]


class TakeOverListener(Protocol):
    """Hears of the batches a take-over finds mid-submission (the slow path).

    ``asking`` is called where the cycle runs (the claim thread under
    :meth:`ClaimManager.run`: it must not block), ``taken`` on the loop that
    called ``run`` (or the caller's, without it), after ``asking`` and before
    the change listeners hear of the services gained; ``won`` where the cycle
    runs again, right after ``taken`` was sent (so the answers can be
    recorded there, under the new claims' fences, without waiting for the
    gateway's loop).
    """

    def asking(self, batches: Mapping[str, tuple[str, ...]]) -> None:
        """Service → batch ids left mid-submission, for claims being taken
        over right now (not yet committed): the ledger may be asked about them
        at once. What is recorded waits for :meth:`taken`."""
        ...

    def taken(self, services: frozenset[str]) -> None:
        """The take-over ended: of the services ``asking`` named, these are
        now claimed (the rest, none when it failed, are not)."""
        ...

    def won(self, fences: Mapping[str, Fence]) -> None:
        """Called where the cycle runs, right after :meth:`taken` was sent
        on its way: the same services, with the fence each is now claimed
        under (the take-over committed). Writes made under these fences
        land only while this instance still holds the claims at them."""
        ...

    async def hand_to_pipeline(self, services: frozenset[str]) -> frozenset[str]:
        """Called where the cycle runs once a take-over committed, with the
        services it moved that have work (none left mid-submission), claimed
        already, before the change listeners hear of them: what the
        listener sends the pipeline now arrives before the change does.
        Returns the services it saw to (their next batches handed to the
        pipeline), named ``ready`` in the change. Awaited at most
        :data:`HAND_TO_PIPELINE_WAIT_S`; a failure or a timeout leaves them all to the
        change listeners."""
        ...

    def started(self) -> None:
        """The claim thread started (called on its loop, which is running):
        open there what the take-overs will need, so they need not wait."""
        ...

    async def ended(self) -> None:
        """The claim thread ends (called on its loop): release what was
        opened there."""
        ...


#: How long a take-over waits for a listener handing the services it took
#: with work to the pipeline (:meth:`TakeOverListener.hand_to_pipeline`, a read of
#: their next batches) before telling the change listeners anyway.
HAND_TO_PIPELINE_WAIT_S = 0.3

#: Claim rows of idle services deleted per clean-up, at most.
CLEANUP_LIMIT = 1_000
#: Expired claims taken over per cycle, those of services with work first;
#: with more, the next cycle comes at once.
TAKE_LIMIT = 500
#: Cycles started by wake() come at most this often (ms). They only claim
#: (:meth:`ClaimManager.claim_new`, one transaction), so the gap stays well
#: below the time between the insert groups of lists posted together: a
#: longer one claims their services one gap apart.
WAKE_GAP_MS = 25
#: The gap after a claim a wake-up asked for that took nothing. With several
#: instances most wake-ups come from batches for services another instance
#: holds; each claim then finds nothing to take, and these claims come no
#: more often than the whole cycles did before (after a full cycle, one
#: more: the first wake-up after it is answered at once).
WAKE_IDLE_GAP_MS = 100


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    instance_id: str
    started_at: int
    heartbeat_at: int
    address: str | None
    claims: int
    #: Heartbeat within the liveness window (counts toward the fair share).
    live: bool


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    service_id: str
    claimant: str | None
    epoch: int
    expiry_1: int | None
    expiry_2: int | None
    claimed_at: int | None
    unclaimed_since: int | None


@dataclass(frozen=True, slots=True)
class CycleReport:
    now: int
    voided: tuple[str, ...]
    claimed: tuple[str, ...]
    released: tuple[str, ...]
    claim_count: int
    #: Claim rows of idle services deleted (clean-up runs now and then).
    forgotten: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Claimed:
    """What this instance has claimed as of its last read: epochs and lease."""

    epochs: Mapping[str, int]
    lease: int | None
    services: frozenset[str]
    epoch_sum: int

    @classmethod
    def of(cls, epochs: Mapping[str, int], lease: int | None) -> _Claimed:
        return cls(epochs, lease, frozenset(epochs), sum(epochs.values()))


_NOTHING = _Claimed.of({}, None)


class ClaimManager:
    """Claims of one gateway instance on a shared PostgreSQL database.

    Use as ``async with ClaimManager(url, settings) as claims:`` and either
    call :meth:`cycle` yourself (tests pass ``now``) or run :meth:`run` in a
    task group. Leaving the context releases every claim.
    """

    def __init__(
        self,
        url: str,
        settings: ClaimSettings | None = None,
        *,
        clock: Clock = now_ms,
        address: str | None = None,
        on_change: ChangeListener | None = None,
    ) -> None:
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                f"claims need a PostgreSQL database, got {url!r}; "
                "a SQLite store serves a single instance and takes no claims"
            )
        self.url = url
        self.settings = settings or ClaimSettings()
        self._clock = clock
        self._address = address
        self._listeners: list[ClaimChangeListener] = []
        if on_change is not None:
            self.add_listener(on_change)
        self._take_over_listeners: list[TakeOverListener] = []
        self._session = ClaimSession(url, self.settings)
        self._claimed = _NOTHING
        self._wake = asyncio.Event()
        #: The loop :meth:`run` was called on (listeners are called there),
        #: and the claim thread's loop, session and thread while it runs.
        self._home: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_session: ClaimSession | None = None
        self._thread: threading.Thread | None = None
        #: When the next foreign claim may expire (ms); run() wakes up for it.
        self.next_expiry: int | None = None
        #: The last cycle ran for a foreign expiry: the next one comes sooner.
        self._follow_up = False
        #: The last take-over left expired claims for the next cycle.
        self._more = False
        #: When the last full cycle (not only a take-over) started (ms).
        self._last_full: int | None = None
        #: When the next clean-up of idle services' claim rows is due (ms).
        self._next_cleanup: int | None = None
        self._stopping = False
        self._ended_retries = 0
        self._ended_deadlocks = 0
        #: How late (s) the current cycle started against its schedule.
        self._late_s = 0.0
        #: Cycles that only claimed (:meth:`claim_new`, after a wake-up).
        self.claim_only_cycles = 0
        #: How long the last full cycle, and the last take-over, took (ms).
        self._full_cycle_ms = 0.0
        self._take_ms = 0.0
        #: Cycles failed in a row, and when the first of them failed (time.monotonic()).
        self.failed_cycles = 0
        self._failing_since = 0.0
        #: Draws the backoff's jitter (tests seed it).
        self.rng = random.Random()

    @property
    def instance_id(self) -> str:
        return self.settings.instance_id

    @property
    def retries(self) -> int:
        """Transactions retried after a serialization failure or deadlock."""
        return self._session.retries + self._thread_retries

    @property
    def deadlocks(self) -> int:
        """Deadlocks PostgreSQL reported to this manager's transactions."""
        return self._session.deadlocks + self._thread_deadlocks

    @property
    def _thread_retries(self) -> int:
        session = self._thread_session
        return self._ended_retries + (session.retries if session is not None else 0)

    @property
    def _thread_deadlocks(self) -> int:
        session = self._thread_session
        return self._ended_deadlocks + (session.deadlocks if session is not None else 0)

    @property
    def _cs(self) -> ClaimSession:
        """The session of the claim cycle: the claim thread's own connection
        while :meth:`run` runs there, the caller's otherwise."""
        session = self._thread_session
        if session is not None and threading.current_thread() is self._thread:
            return session
        return self._session

    # -- lifecycle --------------------------------------------------------

    async def __aenter__(self) -> ClaimManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release every claim (best effort) and close the connection."""
        self.stop()
        thread = self._thread
        if thread is not None:
            # Its last cycle must end before the claims are given back.
            await asyncio.to_thread(thread.join, self.settings.db_timeout_ms * 4 / 1000)
        try:
            await self.release()
        except StoreError as exc:
            log.warning("could not release claims on shutdown: %s", exc)
        await self._session.drop()

    def stop(self) -> None:
        """Make :meth:`run` return after the current cycle."""
        self._stopping = True
        self._set_wake()

    def wake(self) -> None:
        """Run the next cycle now (e.g. when a new service appeared)."""
        self._set_wake()

    def _set_wake(self) -> None:
        loop = self._loop
        if loop is None or threading.current_thread() is self._thread:
            self._wake.set()
            return
        with contextlib.suppress(RuntimeError):  # the claim thread's loop closed
            loop.call_soon_threadsafe(self._wake.set)

    def set_address(self, address: str | None) -> None:
        """Where this instance's API listens; written with the next heartbeat."""
        self._address = address

    def add_listener(self, listener: ChangeListener) -> None:
        """Hear of the services gained and lost after each change."""
        self._listeners.append(lambda change: listener(change.gained, change.lost))

    def add_change_listener(self, listener: ClaimChangeListener) -> None:
        """Hear of each change with the services gained idle apart (a
        dead instance's thousands of idle services need no wake-up)."""
        self._listeners.append(listener)

    def add_take_over_listener(self, listener: TakeOverListener) -> None:
        self._take_over_listeners.append(listener)

    async def run(self) -> None:
        """Run a claim cycle every ``renew_interval_ms`` until :meth:`stop`.

        The cycles run on a thread of their own, with their own event loop and
        connection: on a gateway whose loop is busy with submissions, every
        round trip of a cycle would wait for the loop, a renewal could come
        late enough to lose the claims, and taking over a dead instance's
        services would come that much later. The state the gateway
        reads (:meth:`claimed_services`, :meth:`fence_for`, …) is replaced whole by the
        thread; listeners are called on the loop that called ``run``.
        """
        if self._thread is not None:
            raise RuntimeError("ClaimManager.run() is already running")
        home = self._home = asyncio.get_running_loop()
        ended: asyncio.Future[None] = home.create_future()

        def main() -> None:
            try:
                self._thread_main()
            finally:
                with contextlib.suppress(RuntimeError):  # the home loop closed
                    home.call_soon_threadsafe(_settle, ended)

        thread = threading.Thread(target=main, name=f"claims-{self.instance_id}"[:64], daemon=True)
        self._thread = thread
        thread.start()
        try:
            await ended
        finally:
            # Cancelled (the gateway stopping): end the thread's loop too;
            # close() waits for it before giving the claims back.
            self.stop()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._run_cycles())
        except Exception:  # pragma: no cover - a bug; the claims lapse, others take over
            log.exception("the claim thread of %s failed", self.instance_id)

    async def _run_cycles(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        session = self._thread_session = ClaimSession(self.url, self.settings)
        for listener in self._take_over_listeners:
            listener.started()
        # When the next full cycle is due (time.monotonic()); until then a
        # wake-up runs only the claim (claim_new).
        due = 0.0
        quick = False
        # Whether the last claim a wake-up asked for took a service: wake-ups
        # then come every WAKE_GAP_MS (new services arriving), else every
        # WAKE_IDLE_GAP_MS. A full cycle that took nothing says nothing of
        # the wake-ups (an idle gateway's cycles take nothing): the first
        # wake-up after one is answered at once, not up to
        # WAKE_IDLE_GAP_MS later, as a gateway's first service was.
        claimed_any = True
        try:
            while not self._stopping:
                if not quick:
                    delay = self.cycle_delay_ms()
                    if delay > 0:
                        await asyncio.sleep(delay / 1000)
                cycle_began = time.monotonic()
                # Whatever woke the loop up to now, this cycle answers.
                self._wake.clear()
                try:
                    if quick:
                        claimed_any = bool(await self.claim_new())
                    else:
                        claimed_any = True
                        await self.cycle()
                except StoreError as exc:
                    self._failed(exc)
                else:
                    self._succeeded()
                began = time.monotonic()
                if not quick or self.failed_cycles:
                    due = began + self.pause_ms() / 1000
                pause = max(due - began, 0.0)
                if self.failed_cycles:
                    # Backing off: a wake-up (a new service) waits for the
                    # database as the claims do; only stop() ends the pause.
                    await self._back_off(pause)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=pause)
                woken = self._wake.is_set() and not self.failed_cycles
                # How much later than asked the loop let the next cycle start.
                self._late_s = 0.0 if woken else max(time.monotonic() - began - pause, 0.0)
                if woken and not self._stopping:
                    # Wake-ups come with every batch accepted for a service
                    # this instance does not hold (possibly a new one): with
                    # several instances, half of all POSTs. One cycle per
                    # WAKE_GAP_MS answers them all (WAKE_IDLE_GAP_MS after
                    # a cycle that claimed nothing).
                    wake_gap_ms = WAKE_GAP_MS if claimed_any else WAKE_IDLE_GAP_MS
                    gap = min(self.settings.renew_interval_ms / 10, wake_gap_ms) / 1000 - (
                        time.monotonic() - cycle_began
                    )
                    if gap > 0:
                        await asyncio.sleep(gap)
                # A wake-up asks for a new service to be claimed: the claim
                # alone answers it (docs/ha.md), unless the full cycle is due.
                quick = woken and time.monotonic() < due
        finally:
            for listener in self._take_over_listeners:
                try:
                    await listener.ended()
                except Exception:  # pragma: no cover - a bug; the thread ends anyway
                    log.exception("a take-over listener failed to end on the claim thread")
            self._loop = None
            self._ended_retries += session.retries
            self._ended_deadlocks += session.deadlocks
            self._thread_session = None
            await session.drop()

    def _failed(self, exc: StoreError) -> None:
        """A cycle failed: one warning for the first of a run of failures."""
        self.failed_cycles += 1
        if self.failed_cycles == 1:
            self._failing_since = time.monotonic()
            log.warning(
                "claim cycle of %s failed: %s; the next ones back off (up to %d ms apart) "
                "until one succeeds",
                self.instance_id,
                exc,
                self.settings.renew_interval_ms,
            )
        else:
            log.debug("claim cycle of %s failed again: %s", self.instance_id, exc)

    def _succeeded(self) -> None:
        if self.failed_cycles:
            log.info(
                "claim cycle of %s succeeded after %d failed in %.1f s",
                self.instance_id,
                self.failed_cycles,
                time.monotonic() - self._failing_since,
            )
        self.failed_cycles = 0

    async def _back_off(self, pause_s: float) -> None:
        """Wait ``pause_s`` or until :meth:`stop`, whatever wakes the loop meanwhile."""
        deadline = time.monotonic() + pause_s
        while not self._stopping and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=left)
            self._wake.clear()

    def backoff_ms(self) -> int:
        """The pause after :attr:`failed_cycles` failed cycles in a row: a
        quarter of the renewal interval, doubling with each failure up to the
        whole interval, drawn from the upper half of that (the jitter)."""
        interval = self.settings.renew_interval_ms
        step = interval * min(1.0, 2.0 ** (self.failed_cycles - 1) / 4)
        return max(1, int(step * self.rng.uniform(0.5, 1.0)))

    def pause_ms(self, now: int | None = None) -> int:
        """How long :meth:`run` waits before the next cycle.

        After a failed cycle, :meth:`backoff_ms`: a failed cycle moves no
        expiry forward (the next foreign expiry it would have read stays in
        the past), so without it the cycles would follow one another at once
        for as long as the database is away.

        Otherwise one renewal interval, or less when another instance's claim expires
        sooner: a dead instance's services are then voided as its claims
        expire, not up to an interval later.

        After a cycle that ran for such an expiry, one more comes a tenth of
        an interval later: every live instance wakes for the same expiry, and
        the one whose maintenance voids the claims may be at its fair share
        and take none of them, while an instance below its share ran its
        cycle a moment before the void committed (or skipped the rows the
        other had locked). Without the follow-up, those services would wait
        a whole renewal interval for a claimant.
        """
        if self.failed_cycles:
            return self.backoff_ms()
        now = self._clock() if now is None else now
        pause = self.settings.renew_interval_ms
        if self.next_expiry is not None:
            pause = min(pause, max(self.next_expiry - now, 0) + 1)
        if self._follow_up:
            pause = min(pause, max(self.settings.renew_interval_ms // 10, 1))
        if self._more:
            pause = 0
        return pause

    def cycle_delay_ms(self, now: int | None = None) -> int:
        """How long to wait before a cycle due now, so that a foreign claim
        expiring while it would run is taken at its expiry.

        A cycle takes over first, then maintains, renews, claims and hands
        over, and a claim expiring in the meantime (a dead instance's
        slow-path claims, at its second expiry) would wait for the cycle to
        end, then for the next one's take-over. A full
        cycle due within its own last duration before such an expiry
        therefore starts at the expiry (at most a quarter of a renewal
        interval later: the lease has ``ttl_ms`` to spare).

        The same holds for the take-overs that follow one another while more
        expired claims wait (the idle services of a dead instance, moved 500
        at a time from its first expiry on): one due within its own last
        duration before the second expiry waits for it, so the services left
        mid-submission, which expire then, are not held up behind idle ones.
        """
        now = self._clock() if now is None else now
        nxt = self.next_expiry
        if nxt is None or nxt <= now:
            return 0
        ahead = nxt - now
        took = self._take_ms if self._more else self._full_cycle_ms
        reach = min(took * 1.5 + 20, self.settings.renew_interval_ms / 4)
        return ahead + 1 if ahead <= reach else 0

    # -- what this instance holds ----------------------------------------

    def _valid(self, now: int | None) -> bool:
        now = self._clock() if now is None else now
        return self._claimed.lease is not None and now < self._claimed.lease

    def claimed_services(self, now: int | None = None) -> frozenset[str]:
        return self._claimed.services if self._valid(now) else frozenset()

    def fence_for(self, service_id: str, now: int | None = None) -> Fence | None:
        """The fence to write under for ``service_id``, or None when not (validly) claimed."""
        epoch = self._claimed.epochs.get(service_id)
        if epoch is None or not self._valid(now):
            return None
        return Fence(self.instance_id, epoch)

    def claim_left_ms(self, service_id: str, fence: Fence, now: int | None = None) -> int:
        """How long the claim ``fence`` was taken under stays valid, as last renewed.

        0 once it lapsed, or when this instance no longer holds the service at
        that epoch.
        """
        now = self._clock() if now is None else now
        current = self._claimed
        if current.lease is None or fence != Fence(
            self.instance_id, current.epochs.get(service_id, -1)
        ):
            return 0
        return max(current.lease - now, 0)

    def may_post(self, service_id: str, fence: Fence, now: int | None = None) -> bool:
        """Whether a submission taken under ``fence`` may start another POST attempt.

        Only while the claim is still claimed at that epoch and, as last renewed,
        valid for more than ``post_margin_ms``: no attempt starts after
        ``expiry_1 - post_margin_ms``, so none starts once another instance
        may take the service (``docs/ha.md``, "Safety").
        """
        return self.claim_left_ms(service_id, fence, now) > self.settings.post_margin_ms

    # -- the claim cycle --------------------------------------------------

    async def cycle(self, now: int | None = None) -> CycleReport:
        """Run take-over, maintenance, renew, claim and hand over once, at ``now``.

        Every step is attempted even when an earlier one failed (renewal
        matters most), but for a failure to connect at all, after which none
        is; the first failure is raised at the end.
        """
        failpoint("claim_cycle")
        now = self._clock() if now is None else now
        errors: list[StoreError] = []
        # A cycle that comes at once for more expired claims, soon after a
        # full one, only takes over: the rest waits for the next full cycle
        # (at most half a period away), and a claim reaching its second
        # expiry meanwhile is taken a take-over later, not a cycle later.
        only_take = (
            self._more
            and self._last_full is not None
            and now - self._last_full < self.settings.renew_interval_ms // 2
        )
        if not only_take:
            self._follow_up = self.next_expiry is not None and now >= self.next_expiry

        took: dict[str, float] = {}
        started = time.monotonic()

        async def step(name: str, fn: Callable[[Conn], Awaitable[T]], default: T) -> T:
            if errors and isinstance(errors[0], StoreUnavailableError):
                return default  # no connection to be had: the next cycle tries again
            began = time.monotonic()
            try:
                return await self._cs.transact(name, fn)
            except StoreError as exc:
                errors.append(exc)
                return default
            finally:
                took[name] = time.monotonic() - began

        none: tuple[str, ...] = ()
        # Expired claims first, in a transaction of their own: the pipeline
        # hears of them as soon as it commits.
        nothing: tuple[bool, list[Row]] = (False, [])
        asked: dict[str, tuple[str, ...]] = {}
        idle: set[str] = set()
        more, rows = await step(
            "take over",
            partial(self._take_over, now=now, limit=TAKE_LIMIT, asked=asked, idle=idle),
            nothing,
        )
        self._take_ms = took["take over"] * 1000
        voided = await self._took_over(rows, asked, idle)
        # More expired claims than one take-over moves: the next cycle comes
        # at once (its take-over again those of services with work first, so
        # one reaching its second expiry meanwhile does not wait for the
        # idle ones to move).
        self._more = more and bool(rows)
        if only_take:
            if errors:
                raise errors[0]
            return CycleReport(now, voided, (), (), len(self._claimed.epochs))
        self._last_full = now
        await step("maintenance", lambda c: self._maintain(c, now), None)
        forgotten = none
        if self._next_cleanup is None or now >= self._next_cleanup:
            forgotten = await step("clean-up", lambda c: self._clean_up(c, now), none)
            self._next_cleanup = now + self.settings.cleanup_interval_ms
        await step("renew", lambda c: self._renew(c, now), None)
        claimed = await step("claim", lambda c: self._claim(c, now), none)
        handed = await step("hand over", lambda c: self._hand_over(c, now), None)
        released: tuple[str, ...] = ()
        if handed is not None:
            released, current = handed
            self._log_lost(current, (*released, *forgotten), now)
            self._set_claimed(current)
        self._full_cycle_ms = (time.monotonic() - started) * 1000
        self._log_slow_cycle(time.monotonic() - started, took, len(voided))
        if errors:
            raise errors[0]
        return CycleReport(now, voided, claimed, released, len(self._claimed.epochs), forgotten)

    async def claim_new(self, now: int | None = None) -> tuple[str, ...]:
        """Claim unclaimed services up to the fair share and read what this
        instance holds, in one transaction; the change listeners hear of the
        services gained. What a wake-up (a service seen for the first time)
        asks for, without the take-over, maintenance, renewal and hand-over
        of a whole :meth:`cycle` (five transactions against one), which keep
        their own schedule.
        Returns the services claimed."""
        now = self._clock() if now is None else now

        async def go(conn: Conn) -> tuple[tuple[str, ...], _Claimed]:
            return await self._claim(conn, now), await self._read_claimed(conn)

        claimed, current = await self._cs.transact("claim new", go)
        self.claim_only_cycles += 1
        self._log_lost(current, (), now)
        self._set_claimed(current)
        return claimed

    def _log_lost(self, current: _Claimed, released: Collection[str], now: int) -> None:
        """Claims gone from what the database says this instance holds, which
        it did not hand over, were taken over by others: its lease ran out (a
        paused process, renewals that could not reach the database). Worth a
        warning: the operator otherwise sees only its fenced writes refused."""
        lost = self._claimed.services - current.services - frozenset(released)
        if not lost:
            return
        lease = self._claimed.lease
        shown = ", ".join(sorted(lost)[:5]) + (", …" if len(lost) > 5 else "")
        log.warning(
            "instance %s lost its claims on %d services (%s) to other instances%s; "
            "their new holders carry on, and this instance's writes for them are refused",
            self.instance_id,
            len(lost),
            shown,
            ""
            if lease is None or now < lease
            else f": its lease ran out {now - lease} ms ago (paused, or renewals could not "
            "reach the database)",
        )

    def _log_slow_cycle(self, total_s: float, took: Mapping[str, float], taken: int) -> None:
        """A cycle longer than half a renewal interval is worth a line: it
        delays failover (docs/ha.md, "Settings and failover time") and, past an interval,
        renewals."""
        late = self._late_s
        self._late_s = 0.0
        if (total_s + late) * 1000 < self.settings.renew_interval_ms / 2:
            return
        log.info(
            "claim cycle of %s took %.0f ms (%s; %d taken over), started %.0f ms late",
            self.instance_id,
            total_s * 1000,
            ", ".join(f"{name} {s * 1000:.0f} ms" for name, s in took.items()),
            taken,
            late * 1000,
        )

    async def release(self, now: int | None = None) -> tuple[str, ...]:
        """Give back every claim and leave the live set (clean shutdown)."""
        now = self._clock() if now is None else now

        async def go(conn: Conn) -> tuple[str, ...]:
            await self._session.fetch(conn, "lock_all")
            rows = await self._session.fetch(
                conn, "release_all", now=now, grace_ms=self.settings.grace_ms
            )
            await self._session.execute(conn, "deregister")
            return tuple(sorted(r["service_id"] for r in rows))

        released = await self._session.transact("release", go)
        self._set_claimed(_NOTHING)
        return released

    async def register_services(self, service_ids: Iterable[str], now: int | None = None) -> None:
        """Create unclaimed rows for service ids not seen before."""
        now = self._clock() if now is None else now
        ids = sorted(set(service_ids))

        async def go(conn: Conn) -> None:
            await self._session.execute(conn, "register_services", now=now, service_ids=ids)

        await self._session.transact("register services", go)
        self.wake()

    # -- visibility --------------------------------------------------------

    async def list_instances(self, now: int | None = None) -> list[InstanceInfo]:
        """Every registered instance, oldest first, with its claim count."""
        now = self._clock() if now is None else now
        live_after = now - self.settings.effective_liveness_ms

        async def go(conn: Conn) -> list[Row]:
            return await self._session.fetch(conn, "list_instances")

        rows = await self._session.transact("list instances", go)
        return [
            InstanceInfo(
                r["instance_id"],
                r["started_at"],
                r["heartbeat_at"],
                r["address"],
                r["claims"],
                r["heartbeat_at"] > live_after,
            )
            for r in rows
        ]

    async def claims_for(self, service_ids: Iterable[str]) -> dict[str, ClaimInfo]:
        """The claim rows of ``service_ids`` (services without a row are absent)."""
        ids = sorted(set(service_ids))

        async def go(conn: Conn) -> list[Row]:
            return await self._session.fetch(conn, "claims_for", service_ids=ids)

        rows = await self._session.transact("read claims", go)
        return {r["service_id"]: ClaimInfo(**r) for r in rows}

    # -- the steps ---------------------------------------------------------

    async def _take_over(
        self,
        conn: Conn,
        now: int,
        limit: int,
        asked: dict[str, tuple[str, ...]],
        idle: set[str],
    ) -> tuple[bool, list[Row]]:
        """Up to ``limit`` expired claims taken over: (more left, rows taken).

        ``idle`` collects the candidates with nothing to do (no batch not
        final). When the first take-over after a pause finds services with
        work and idle ones, only those with work are taken, a small
        transaction that commits (and lets the pipeline start them) sooner;
        the idle ones come in the next take-overs, at once.

        ``asked`` collects the batches the slow-path candidates left
        mid-submission; the take-over listeners hear of them before the
        second statement runs, so the ledger is asked while the claims are
        taken (and :meth:`_took_over` tells them which were). When there are
        such batches, only the services with work are taken in this
        take-over (the idle ones locked with them are left to the next,
        which comes at once): the answers are recorded once it commits, not
        after a take-over of hundreds of claims at the second expiry, mostly
        idle ones still being moved from the first.
        """
        fetch = self._cs.fetch
        # The first statement locks what may be taken over; the second decides
        # on a snapshot taken once those rows are locked (see claims.sql).
        found = await fetch(
            conn,
            "take_candidates",
            now=now,
            fallback_ms=self.settings.renew_interval_ms,
            limit=limit,
        )
        if not found:
            return False, []
        more = len(found) >= limit
        # Alone: the services left mid-submission (their answers are recorded
        # once the take-over commits), and those with work found first after
        # a pause (a dead instance's first expiry). Not in the take-overs
        # that follow at once: new batches for its idle services, posted
        # meanwhile, would each make a take-over of a few services, and its
        # idle claims would move only after all of them.
        if any(r["mid"] for r in found) or (not self._more and any(r["work"] for r in found)):
            taking = [r for r in found if r["work"] or r["mid"]]
            more = more or len(taking) < len(found)
            found = taking
        idle.clear()  # a retried transaction finds them again
        idle.update(r["service_id"] for r in found if not (r["work"] or r["mid"]))
        candidates = [r["service_id"] for r in found]
        if self._take_over_listeners and self._claimed.lease is not None:
            # Without a lease (this instance's first cycle) nothing taken is
            # claimed before the cycle ends: the follower's scan asks then.
            mid = {
                r["service_id"]: tuple(r["mid"])
                for r in found
                if r["mid"] and r["service_id"] not in asked
            }
            if mid:
                asked.update(mid)
                for listener in self._take_over_listeners:
                    listener.asking(mid)
        rows = await fetch(conn, "take_expired", now=now, service_ids=candidates, **self._ttls())
        return more, rows

    async def _maintain(self, conn: Conn, now: int) -> None:
        (nxt,) = await self._cs.fetch(conn, "next_foreign_expiry", now=now)
        self.next_expiry = nxt["at"]
        await self._cs.execute(
            conn, "forget_instances", now=now, forget_ms=self.settings.forget_instance_ms
        )

    async def _took_over(
        self, rows: list[Row], asked: Mapping[str, object], idle: Collection[str]
    ) -> tuple[str, ...]:
        """Log the claims maintenance took over and hold them at once.

        The pipeline hears of them now, not after the rest of the cycle
        (renewal, claiming, hand-over): a dead instance's services resume
        sooner. They are claimed under the lease as last read, which the new
        claims outlast (their own expiry was set just now). The take-over
        listeners hear which of the services they were asked about are claimed
        before the change listeners hear of them. The services taken idle
        are looked at again once claimed (:meth:`_still_idle`): the change
        listeners hear which are idle, and wake none of those.
        """
        if not rows:
            if asked:
                self._tell(lambda listener: listener.taken(frozenset()))
                for listener in self._take_over_listeners:
                    listener.won({})
            return ()
        by_holder: dict[tuple[str, bool], int] = {}
        for r in rows:
            key = (r["previous_claimant"], bool(r["slow_path"]))
            by_holder[key] = by_holder.get(key, 0) + 1
        for (holder, slow), n in sorted(by_holder.items()):
            # One line per holder and path, not per service (thousands at
            # once when an instance dies); "voided claim" is what tools grep.
            log.info(
                "voided claim(s) on %d services claimed by %s (%s path), taken over%s",
                n,
                holder,
                "slow" if slow else "fast",
                " (idle)" if idle else "",
            )
        if log.isEnabledFor(logging.DEBUG):
            for r in rows:
                log.debug("took over %s from %s", r["service_id"], r["previous_claimant"])
        current = self._claimed
        won: frozenset[str] = frozenset()
        if current.lease is not None:
            epochs = dict(current.epochs)
            epochs.update({r["service_id"]: r["epoch"] for r in rows})
            taken = frozenset(r["service_id"] for r in rows)
            won = frozenset(asked) & taken
            # Held (their fences readable) before any listener hears of them.
            before = current.services
            self._claimed = _Claimed.of(epochs, current.lease)
            quiet = await self._still_idle(taken & frozenset(idle))
            if asked:
                self._tell(lambda listener: listener.taken(won))
            ready = await self._hand_to_pipeline(taken - quiet - won)
            self._announce(before, self._claimed.services, quiet, ready)
            if asked:
                fences = {s: Fence(self.instance_id, epochs[s]) for s in sorted(won)}
                for listener in self._take_over_listeners:
                    listener.won(fences)
        elif asked:
            self._tell(lambda listener: listener.taken(won))
            for listener in self._take_over_listeners:
                listener.won({})
        return tuple(sorted(r["service_id"] for r in rows))

    async def _clean_up(self, conn: Conn, now: int) -> tuple[str, ...]:
        params = {"now": now, "forget_ms": self.settings.forget_service_ms}
        fetch = self._cs.fetch
        idle = [
            r["service_id"]
            for r in await fetch(conn, "idle_candidates", limit=CLEANUP_LIMIT, **params)
        ]
        if not idle:
            return ()
        rows = await fetch(conn, "forget_idle", service_ids=idle, **params)
        if rows:
            log.info("forgot the claim rows of %d idle services", len(rows))
        return tuple(sorted(r["service_id"] for r in rows))

    async def _renew(self, conn: Conn, now: int) -> None:
        await self._cs.execute(conn, "heartbeat", now=now, address=self._address, **self._ttls())

    async def _claim(self, conn: Conn, now: int) -> tuple[str, ...]:
        rows = await self._cs.fetch(
            conn,
            "claim_share",
            now=now,
            liveness_ms=self.settings.effective_liveness_ms,
            grace_ms=self.settings.grace_ms,
            **self._ttls(),
        )
        return tuple(sorted(r["service_id"] for r in rows))

    async def _hand_over(self, conn: Conn, now: int) -> tuple[tuple[str, ...], _Claimed]:
        fetch = self._cs.fetch
        liveness = self.settings.effective_liveness_ms
        (need,) = await fetch(conn, "hand_over_need", now=now, liveness_ms=liveness)
        released: list[Row] = []
        if need["n"] > 0:
            candidates = await fetch(
                conn,
                "hand_over_candidates",
                now=now,
                limit=need["n"],
                # Keep what was just taken at least as long as a dead instance
                # still counts as live, or it would be handed back and forth.
                min_claimed_ms=liveness,
            )
            if candidates:
                released = await fetch(
                    conn,
                    "hand_over",
                    now=now,
                    service_ids=[r["service_id"] for r in candidates],
                )
        return tuple(sorted(r["service_id"] for r in released)), await self._read_claimed(conn)

    async def _read_claimed(self, conn: Conn) -> _Claimed:
        """What the database says this instance holds; read in full only when it changed."""
        (digest,) = await self._cs.fetch(conn, "claimed_digest")
        lease = digest["lease"]
        known = self._claimed
        if digest["n"] == len(known.epochs) and digest["epochs"] == known.epoch_sum:
            return _Claimed(known.epochs, lease, known.services, known.epoch_sum)
        rows = await self._cs.fetch(conn, "claimed")
        return _Claimed.of({r["service_id"]: r["epoch"] for r in rows}, lease)

    def _ttls(self) -> dict[str, int]:
        return {"ttl_ms": self.settings.ttl_ms, "slow_ttl_ms": self.settings.slow_ttl_ms}

    def _set_claimed(self, current: _Claimed) -> None:
        """Replace what this instance holds, then tell the change listeners."""
        before = self._claimed.services
        self._claimed = current
        self._announce(before, current.services)

    async def _still_idle(self, services: frozenset[str]) -> frozenset[str]:
        """Of ``services`` (taken over idle, now claimed), those still without a
        batch not final. Asked after they are claimed: a batch accepted before
        this read is seen here, one accepted after wakes its service itself
        (the pipeline queues only what is claimed). If the read fails, none."""
        if not services:
            return services

        async def go(conn: Conn) -> list[Row]:
            return await self._cs.fetch(conn, "with_work", service_ids=sorted(services))

        try:
            rows = await self._cs.transact("idle taken", go)
        except StoreError as exc:
            log.info("could not look at the services taken over idle again: %s", exc)
            return frozenset()
        return services - {r["service_id"] for r in rows}

    async def _hand_to_pipeline(self, services: frozenset[str]) -> frozenset[str]:
        """The services taken with work that the take-over listeners saw to
        (:meth:`TakeOverListener.hand_to_pipeline`); none if one fails or is late."""
        if not services:
            return services
        ready: frozenset[str] = frozenset()
        for listener in self._take_over_listeners:
            try:
                async with asyncio.timeout(HAND_TO_PIPELINE_WAIT_S):
                    ready |= await listener.hand_to_pipeline(services)
            except Exception as exc:  # the change listeners look them up instead
                log.info(
                    "handing %d services taken over to the pipeline failed: %r; they are "
                    "looked up as usual",
                    len(services),
                    exc,
                )
        return ready & services

    def _announce(
        self,
        before: frozenset[str],
        after: frozenset[str],
        idle: frozenset[str] = frozenset(),
        ready: frozenset[str] = frozenset(),
    ) -> None:
        """Tell the change listeners what changed from ``before`` to ``after``
        (on the loop :meth:`run` was called on)."""
        gained, lost = after - before, before - after
        if not (gained or lost):
            return
        change = ClaimChange(gained, lost, idle & gained, ready & gained)
        home = self._home
        for listener in self._listeners:
            if home is None or threading.current_thread() is not self._thread:
                listener(change)
            else:
                with contextlib.suppress(RuntimeError):  # the home loop closed
                    home.call_soon_threadsafe(listener, change)

    def _tell(self, call: Callable[[TakeOverListener], None]) -> None:
        """Call every take-over listener, on the loop :meth:`run` was called on."""
        home = self._home
        for listener in self._take_over_listeners:
            if home is None or threading.current_thread() is not self._thread:
                call(listener)
            else:
                with contextlib.suppress(RuntimeError):  # the home loop closed
                    home.call_soon_threadsafe(call, listener)

    async def _connection(self) -> Conn:
        """The claim session's connection (tests drop it to see it replaced)."""
        return await self._session.connection()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
