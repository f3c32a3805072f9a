"""The slow path of a take-over: asking the ledger while the claim is taken.

A service taken over from a dead instance past its second expiry may have a
batch that instance left mid-submission (marked ``submitted``, the ledger's
answer never recorded). Nothing of that service moves before the ledger was
asked about it (``docs/ha.md``, "Safety"). :class:`TakeOverAsks` is the
claim manager's take-over listener (:class:`~ledgerq.claims.TakeOverListener`):

* ``asking`` (the take-over's first statement found those batches; its
  second, which moves the claims, is under way): the ledger is asked at
  once, many ids per ``batch_statuses`` read (all services in one read where
  the ledger's status route does not depend on the service: Sawtooth's
  REST API, the in-process node), the reads in parallel with the claim. On
  an HTTP ledger they run on the claim thread's loop with a client of their
  own (the gateway's loop is busy with the services just taken over, and a
  read waiting there for its turn delays the whole failover);
* ``taken`` (the claims moved, on the gateway's loop): the batches of the
  services now claimed are followed by the
  :class:`~ledgerq.follow.follower.Follower` (so its own scan does not ask
  again);
* ``won`` (the claims moved, where the cycle runs): with an ``opener`` (a
  store of its own for the claim thread, PostgreSQL), the answers are
  recorded right there, one store transaction under the new claims'
  fences, and the gateway's loop then only hears what was recorded (the
  follower parks a read for a pending batch; a final or ``Unknown`` one
  wakes its service). Through the gateway's loop, busy then with the many
  services taken over on the fast path just before, that write would wait
  its turn behind them after the answers are in. Without
  an opener (or with the cycle on the gateway's loop) the answers are
  applied there together: one group commit, flushed at once beside the
  groups under way (:func:`ledgerq.store.group.urgent`).

A service not taken (another instance won it, or the take-over failed) has
its answers dropped: nothing is recorded but under the new claim's fence.
A read that fails, or leaves an id out, or a write that is refused, leaves
that batch to the follower's own asks (with their backoff). An answer read
before the claim committed is as good as one read after: the reads start
once the candidates' second expiry passed, when no POST of the old holder
can be under way any more (rule 2 of "Safety"), and the follower drops an
answer for a batch a submission of this process took meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol, cast

from ledgerq.clock import Clock, now_ms
from ledgerq.config import Settings
from ledgerq.errors import LedgerError, StoreError
from ledgerq.follow.follower import Followed, Follower
from ledgerq.ledgers import HttpTimeouts, http_ledger_client
from ledgerq.ledgers.base import LedgerClient
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.model import BatchStatus, BatchStatusName, BatchWrite, Fence, TrackingBatch
from ledgerq.record import writes as record
from ledgerq.record.completer import Completer, urgent
from ledgerq.store import open_store

log = logging.getLogger(__name__)

_Answers = dict[str, BatchStatus]
#: Answers that keep a batch followed (Splinter's Valid is not final either).
_NOT_FINAL = frozenset({BatchStatusName.PENDING, BatchStatusName.VALID})


class OwnStore(Protocol):
    """The store role of the take-over's own reads and writes (a store of the claim thread)."""

    async def apply_writes(self, writes: Sequence[BatchWrite]) -> list[StoreError | None]: ...

    async def queue_round(
        self, *, now: int, delay_window_ms: int, services: Collection[str] | None = None
    ) -> list[TrackingBatch]: ...

    async def close(self) -> None: ...


StoreOpener = Callable[[], Awaitable[OwnStore]]
#: Hands a take-over's picks to the pipeline: the picks, the services read.
Offer = Callable[[Sequence[TrackingBatch], frozenset[str]], None]


def statuses_span_services(ledger: object) -> bool:
    """Whether one ``batch_statuses`` read may carry the ids of several services.

    Sawtooth's REST API and the in-process node have one status route for
    every batch; Splinter's is per scabbard service, and a client not known
    here is asked per service.
    """
    while True:
        if isinstance(ledger, (SawtoothClient, NodeClient)):
            return True
        inner = getattr(ledger, "inner", None)
        if inner is None:
            return False
        ledger = inner


def ledger_reader(settings: Settings) -> Callable[[], LedgerClient] | None:
    """Makes a client of the gateway's ledger for the calling event loop
    (None for the in-process node, which lives on the gateway's loop)."""
    if settings.ledger == "node":
        return None

    def make() -> LedgerClient:
        timeouts = HttpTimeouts(
            connect=settings.ledger_timeout.connect_s,
            submit=settings.ledger_timeout.submit_s,
            lean=settings.ledger_client == "lean",
        )
        return http_ledger_client(settings.ledger, timeouts, token=settings.ledger_token)

    return make


def store_opener(settings: Settings) -> StoreOpener | None:
    """Opens a store of the gateway's PostgreSQL database on the calling
    event loop (one connection), for the take-over's answers on the claim
    thread; None elsewhere (no claims there)."""
    if not settings.db.startswith(("postgresql://", "postgres://")):
        return None

    async def open_own() -> OwnStore:
        store = await open_store(
            settings.db,
            migrate=False,
            # The answers' write and the next batches' read of one take-over.
            pg_pool_max_size=2,
            # As the gateway's own sessions: a frozen process's locks go.
            pg_idle_in_transaction_ms=settings.claims.ttl_ms,
            pg_outage_timeout_s=settings.store.outage_timeout_s,
            # The database as the gateway's own store left it: asking here
            # would turn the parallel queuer's lock entries on for good, for
            # every batch of a gateway whose services are all serial.
            lock_entries=False,
        )
        return cast(OwnStore, store)

    return open_own


async def _gathered(reads: set[asyncio.Future[_Answers]]) -> _Answers:
    """The answers of ``reads`` together (a read that failed answers nothing:
    its batches are left to the follower's asks)."""
    answers: _Answers = {}
    for read in await asyncio.gather(*reads, return_exceptions=True):
        if isinstance(read, dict):
            answers.update(read)
    return answers


class TakeOverAsks:
    def __init__(
        self,
        ledger: LedgerClient,
        follower: Follower,
        *,
        max_ids: int = 100,
        reader: Callable[[], LedgerClient] | None = None,
        opener: StoreOpener | None = None,
        wake: Callable[[str], None] | None = None,
        offer: Offer | None = None,
        delay_window_ms: int = 0,
        clock: Clock = now_ms,
    ) -> None:
        """``reader``: makes a client of the same ledger for another event
        loop (an HTTP ledger): the claim thread then reads on its own loop,
        not on the gateway's, busy with the services just taken over.
        ``opener``: opens a store on another event loop: with a ``reader``,
        the claim thread then records the answers too. ``wake``: called on
        the gateway's loop with a service whose batch those answers made
        final or ``Unknown`` (as the producer wakes what its writes free).
        ``offer``: hands the next batches of the services a take-over moved
        with work to the pipeline (:meth:`hand_to_pipeline`; ``delay_window_ms`` and
        ``clock`` as the queue's)."""
        self._ledger = ledger
        self._offer = offer
        self._delay_window_ms = delay_window_ms
        self._clock = clock
        self._follower = follower
        self._reader = reader
        self._opener = opener
        self._wake = wake
        self._span = statuses_span_services(ledger)
        self._max_ids = max(max_ids, 1)
        try:
            self._home: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._home = None
        #: Per service asked about and not yet decided (the gateway's loop
        #: only): its batch ids, the read that answers them (None: read and
        #: recorded where the cycle runs), when it started.
        self._asked: dict[str, tuple[tuple[str, ...], asyncio.Future[_Answers] | None, float]] = {}
        #: Entries adopted for answers recorded where the cycle runs, by batch id.
        self._adopted: dict[str, Followed] = {}
        self._tasks: set[asyncio.Future[object]] = set()
        #: The claim thread's side: per service asked about there and not yet
        #: won or lost, its batch ids and read; its tasks and its own store.
        self._apart: dict[str, tuple[tuple[str, ...], asyncio.Future[_Answers]]] = {}
        self._apart_began = 0.0
        self._apart_tasks: set[asyncio.Future[object]] = set()
        self._own: asyncio.Future[OwnStore] | None = None
        self._client: LedgerClient | None = None
        #: When the last read ended (time.monotonic(), whatever the thread).
        self._read_at = 0.0
        #: Batches asked about, and answers applied, so far.
        self.asked = 0
        self.applied = 0
        #: Batches handed to the pipeline by :meth:`hand_to_pipeline` so far.
        self.handed = 0

    def asking(self, batches: Mapping[str, tuple[str, ...]]) -> None:
        """Called where the claim cycle runs (the claim thread): starts the reads."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        groups = self._groups(batches)
        home = self._home
        if home is None or loop is home:
            self._note(batches, self._read_here(groups), started)
        elif self._reader is not None and self._opener is not None:
            # Read, and then recorded (won), here.
            read = asyncio.ensure_future(self._read_apart(groups))
            self._keep_apart(read)  # type: ignore[arg-type]
            self._apart_began = started
            for s, ids in batches.items():
                self._apart[s] = (ids, read)
            self.started()  # opened at the thread's start; anew if that failed
            home.call_soon_threadsafe(lambda: self._note(batches, None, started))
        elif self._reader is not None:
            done = asyncio.run_coroutine_threadsafe(self._read_apart(groups), loop)
            home.call_soon_threadsafe(
                lambda: self._note(batches, asyncio.wrap_future(done), started)
            )
        else:
            home.call_soon_threadsafe(lambda: self._note(batches, self._read_here(groups), started))

    def taken(self, services: frozenset[str]) -> None:
        """Called on the gateway's loop once the take-over ended."""
        asked, self._asked = self._asked, {}
        reads: set[asyncio.Future[_Answers]] = set()
        pairs: list[tuple[str, str]] = []
        apart = False
        started = time.monotonic()
        for s, (ids, read, began) in asked.items():
            if s in services:
                if read is None:
                    apart = True
                else:
                    reads.add(read)
                pairs += [(b, s) for b in ids]
                started = min(started, began)
        entries = self._follower.adopt(pairs)
        if apart:
            # Recorded where the cycle runs: settled when it says what landed.
            self._adopted.update((e.batch_id, e) for e in entries)
            return
        if entries:
            wanted = frozenset(b for b, _ in pairs)
            times = (started, time.monotonic())
            self._keep(asyncio.ensure_future(self._apply(entries, wanted, reads, times)))

    def won(self, fences: Mapping[str, Fence]) -> None:
        """Called where the cycle runs once the take-over committed: the
        answers read there are recorded there, under ``fences``."""
        apart, self._apart = self._apart, {}
        if not apart:
            return
        pairs = [
            (s, b, fence)
            for s, (ids, _) in apart.items()
            if (fence := fences.get(s)) is not None
            for b in ids
        ]
        if not pairs:
            return
        reads = {read for s, (_, read) in apart.items() if s in fences}
        times = (self._apart_began, time.monotonic())
        self._keep_apart(asyncio.ensure_future(self._record_apart(pairs, reads, times)))

    async def hand_to_pipeline(self, services: frozenset[str]) -> frozenset[str]:
        """Where the cycle runs, once a take-over committed: the next batches
        of ``services`` (taken with work, claimed now) read with the claim
        thread's own store and handed to the pipeline on the gateway's loop,
        before the change that names them gets there. A listed round of a
        take-over's services on the gateway's loop, busy with what it took
        over, would wait for the loop at every round trip of a short
        statement; here it is one read on a quiet loop. Only apart from the
        gateway's loop, with a store of its own; else the services are left
        to the change (their wake-ups)."""
        home = self._home
        if self._offer is None or self._opener is None or home is None:
            return frozenset()
        if asyncio.get_running_loop() is home:
            return frozenset()
        began = time.monotonic()
        self.started()  # the store, anew if opening it failed
        assert self._own is not None
        store = await self._own
        picks = await store.queue_round(
            now=self._clock(), delay_window_ms=self._delay_window_ms, services=services
        )
        home.call_soon_threadsafe(self._offer, picks, services)
        self.handed += len(picks)
        # Where the time goes between a take-over and the first write
        # (docs/ha.md, "Settings and failover time").
        log.info(
            "handed the next batches of %d services taken over with work to the pipeline "
            "(%d to submit), read in %.0f ms",
            len(services),
            len(picks),
            (time.monotonic() - began) * 1000,
        )
        return services

    def started(self) -> None:
        """Where the claim cycle runs (the claim thread): its ledger client and
        store are made now, not while a take-over waits for them (a client
        made per take-over would add its connection set-up to every
        failover)."""
        if self._reader is not None and self._client is None:
            self._client = self._reader()
        own = self._own
        failed = own is not None and own.done() and (own.cancelled() or own.exception())
        if self._opener is not None and (own is None or failed):
            own = self._own = asyncio.ensure_future(self._opener())
            own.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def ended(self) -> None:
        """The claim thread ends: its reads and writes stop, its store closes."""
        for task in list(self._apart_tasks):
            task.cancel()
        if self._apart_tasks:
            await asyncio.gather(*self._apart_tasks, return_exceptions=True)
        own, self._own = self._own, None
        if own is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await (await own).close()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _groups(self, batches: Mapping[str, tuple[str, ...]]) -> list[list[tuple[str, str]]]:
        """(service, batch id) pairs per read: many services in one where the ledger allows."""
        step = self._max_ids
        if self._span:
            pairs = [(s, b) for s, ids in batches.items() for b in ids]
            return [pairs[i : i + step] for i in range(0, len(pairs), step)]
        return [
            [(s, b) for b in ids[i : i + step]]
            for s, ids in batches.items()
            for i in range(0, len(ids), step)
        ]

    def _note(
        self,
        batches: Mapping[str, tuple[str, ...]],
        read: asyncio.Future[_Answers] | None,
        began: float,
    ) -> None:
        if read is not None:
            self._keep(read)  # type: ignore[arg-type]
        self.asked += sum(len(ids) for ids in batches.values())
        for s, ids in batches.items():
            self._asked[s] = (ids, read, began)

    def _keep(self, task: asyncio.Future[object]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _keep_apart(self, task: asyncio.Future[object]) -> None:
        self._apart_tasks.add(task)
        task.add_done_callback(self._apart_tasks.discard)

    def _read_here(self, groups: list[list[tuple[str, str]]]) -> asyncio.Future[_Answers]:
        return asyncio.ensure_future(self._read_all(self._ledger, groups))

    async def _read_apart(self, groups: list[list[tuple[str, str]]]) -> _Answers:
        """The reads on this (the claim thread's) loop, with a client of its own."""
        if self._client is not None:
            return await self._read_all(self._client, groups)
        assert self._reader is not None
        client = self._reader()
        try:
            return await self._read_all(client, groups)
        finally:
            await client.close()

    async def _read_all(
        self, ledger: LedgerClient, groups: list[list[tuple[str, str]]]
    ) -> _Answers:
        answers: _Answers = {}
        for read in await asyncio.gather(*(self._read(ledger, g) for g in groups)):
            answers.update(read)
        self._read_at = time.monotonic()
        return answers

    async def _read(self, ledger: LedgerClient, group: Sequence[tuple[str, str]]) -> _Answers:
        ids = [b for _, b in group]
        try:
            statuses = await ledger.batch_statuses(group[0][0], ids)
        except LedgerError as exc:
            log.warning(
                "asking the ledger about %d batches left mid-submission failed: %s; "
                "the follower asks again",
                len(ids),
                exc,
            )
            return {}
        return {s.batch_id: s.status for s in statuses}

    async def _record_apart(
        self,
        pairs: Sequence[tuple[str, str, Fence]],
        reads: set[asyncio.Future[_Answers]],
        times: tuple[float, float],
    ) -> None:
        """On the claim thread: the answers recorded with its own store, one
        transaction, each under its service's new fence; then the gateway's
        loop hears what landed (whatever happens: what did not land is left
        to the follower's asks)."""
        began, claimed = times
        written: _Answers = {}
        answered = recorded = claimed
        try:
            answers = await _gathered(reads)
            answered = time.monotonic()
            writes = [
                record.ledger_status(s, b, answer, now=None, fence=fence)
                for s, b, fence in pairs
                if (answer := answers.get(b)) is not None
            ]
            if writes:
                assert self._own is not None
                # Through the one write verb, on this thread's own store.
                results = await Completer(await self._own).apply_together(writes)
                for w, error in zip(writes, results, strict=True):
                    if error is None:
                        written[w.id] = cast(BatchStatus, w.status)
                    else:
                        log.info("status of batch %s not recorded: %s", w.id[:16], error)
            recorded = time.monotonic()
        except Exception as exc:  # whatever it is, the follower asks instead
            log.warning(
                "recording the ledger's answers about %d batches left mid-submission failed: "
                "%s; the follower asks again",
                len(pairs),
                exc,
            )
        finally:
            home = self._home
            ids = tuple(b for _, b, _ in pairs)
            services = {b: s for s, b, _ in pairs}
            if home is not None:
                with contextlib.suppress(RuntimeError):  # the gateway's loop closed
                    home.call_soon_threadsafe(self._settle, ids, services, written)
        # Where the time goes between a take-over and the first write
        # (docs/ha.md, "Settings and failover time").
        log.info(
            "took over %d batches left mid-submission: after the take-over began, the ledger's "
            "answers were read in %.0f ms, the claims committed at %.0f ms, the answers were "
            "in at %.0f ms and recorded on the claim thread at %.0f ms (%d of them)",
            len(pairs),
            (self._read_at - began) * 1000,
            (claimed - began) * 1000,
            (answered - began) * 1000,
            (recorded - began) * 1000,
            len(written),
        )

    def _settle(
        self, ids: Sequence[str], services: Mapping[str, str], written: Mapping[str, BatchStatus]
    ) -> None:
        """On the gateway's loop: what the claim thread recorded is settled
        for the follower, and the services it freed are woken."""
        entries = [e for b in ids if (e := self._adopted.pop(b, None)) is not None]
        self._follower.settled(entries, written)
        self.applied += len(written)
        if self._wake is not None:
            freed = {services[b] for b, status in written.items() if status.name not in _NOT_FINAL}
            for service_id in sorted(freed):
                self._wake(service_id)

    async def _apply(
        self,
        entries: Sequence[Followed],
        ids: frozenset[str],
        reads: set[asyncio.Future[_Answers]],
        times: tuple[float, float],
    ) -> None:
        """``times``: when the take-over began, when this loop heard it ended."""
        began, heard = times
        answers = {b: s for b, s in (await _gathered(reads)).items() if b in ids}
        answered = time.monotonic()
        # Recorded in a group of their own, not behind the writes under way.
        with urgent():
            await self._follower.answered(entries, answers)
        self.applied += len(answers)
        # Where the time goes between a take-over and the first write
        # (docs/ha.md, "Settings and failover time").
        log.info(
            "took over %d batches left mid-submission: after the take-over began, the ledger's "
            "answers were read in %.0f ms, the gateway's loop heard of the claims at %.0f ms "
            "and had the answers at %.0f ms; recorded %.0f ms after that",
            len(entries),
            (self._read_at - began) * 1000,
            (heard - began) * 1000,
            (answered - began) * 1000,
            (time.monotonic() - answered) * 1000,
        )
