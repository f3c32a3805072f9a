"""The gateway: the ingest API and the pipeline's producer around one store.

:class:`Gateway` owns nothing it did not build: the caller opens the store
and the ledger client (and closes them after :meth:`Gateway.run` returns).
It builds the :class:`~ledgerq.record.completer.Completer` (every pipeline
write), the :class:`~ledgerq.pipeline.producer.Producer` (the lanes: queue,
submitter, follower), the API, and under high availability the take-over's
asks, and runs them under one lifecycle.

Wake-ups are event driven inside the process: an accepted ``POST /batches``
wakes the queue for its services, and every write of the producer that
frees a service (a final status, ``Unknown``, ``Delayed``) wakes the queue
for that service and the long-polling ``/batch_statuses`` readers. Between
processes (several gateways on one PostgreSQL) a
:class:`~ledgerq.gateway.wakeups.PgWakeups` relays the wake-ups over
``LISTEN``/``NOTIFY``. Polling (``submitter.poll_timeout_s``,
``monitor.poll_interval_s``) is the safety net only.

:meth:`Gateway.stop` stops accepting work: the producer drains its
in-flight submissions (each is recorded) and stops its follower, the claims
are given back, the HTTP server closes; then :meth:`Gateway.run` returns.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp import web

from ledgerq.claims import ClaimChange, TakeOverListener
from ledgerq.clock import Clock, now_ms
from ledgerq.config import Settings
from ledgerq.errors import ConfigError
from ledgerq.follow.in_flight import InFlightStore
from ledgerq.gateway.takeover import TakeOverAsks, ledger_reader, store_opener
from ledgerq.gateway.workers import bind_failure, resolve_workers
from ledgerq.ingest.api import ApiStore, Changes, ClaimsView, GatewayApi
from ledgerq.ingest.decoding import Yielding, verify_thread_wanted
from ledgerq.ingest.guard import GuardedSite, request_line_limit
from ledgerq.ledgers.base import LedgerClient
from ledgerq.ledgers.chain import chain_reads
from ledgerq.ledgers.health import LedgerHealth
from ledgerq.model import Fence, TrackingBatch
from ledgerq.operator import GatewayMetrics, gateway_app
from ledgerq.pipeline.producer import PipelineSettings, Producer
from ledgerq.procpool import Priority
from ledgerq.queue.ahead import Successors
from ledgerq.queue.parallel import ParallelRoundStore
from ledgerq.queue.serial import RoundStore
from ledgerq.record.completer import Completer
from ledgerq.store.base import ControlStore, GroupWriter
from ledgerq.store.group import GroupInserter

log = logging.getLogger(__name__)

#: The shortest time a batch stays handed out by the queue (ms).
HANDOUT_BACKSTOP_MS = 60_000


class GatewayStore(
    ApiStore, InFlightStore, RoundStore, ParallelRoundStore, GroupWriter, ControlStore, Protocol
):
    """Every store role the gateway uses."""

    dialect: str


class Claims(ClaimsView, Protocol):
    """What the gateway needs of the claim manager (``ledgerq.claims``)."""

    @property
    def instance_id(self) -> str: ...

    def claimed_services(self, now: int | None = None) -> frozenset[str]: ...

    def fence_for(self, service_id: str, now: int | None = None) -> Fence | None: ...

    def may_post(self, service_id: str, fence: Fence, now: int | None = None) -> bool: ...

    def claim_left_ms(self, service_id: str, fence: Fence, now: int | None = None) -> int: ...

    def wake(self) -> None: ...

    def stop(self) -> None: ...

    def add_change_listener(self, listener: Callable[[ClaimChange], None]) -> None: ...

    def add_take_over_listener(self, listener: TakeOverListener) -> None: ...


class Wakeups(Protocol):
    """Relays wake-ups to other processes."""

    def publish(self, service_id: str) -> None: ...

    def stop(self) -> None: ...


class Gateway:
    def __init__(
        self,
        settings: Settings,
        store: GatewayStore,
        ledger: LedgerClient,
        *,
        clock: Clock = now_ms,
        check_service_id: Callable[[str], None] = lambda _s: None,
        claims: Claims | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        # Counted and timed for /metrics; the pipeline sees the same client.
        self.metrics = GatewayMetrics(top_services=settings.metrics.top_services, clock=clock)
        ledger = self.ledger = self.metrics.instrument(ledger)
        #: What the ledger has been answering, per service (logged once per burst).
        self.health = LedgerHealth(ledger.description, clock=clock)
        self.claims = claims
        self.changes = Changes(max_waiters=settings.max_waiters)
        # The pipeline's writes are group-committed: one transaction for all
        # the outcomes that arrive while the previous one commits. PostgreSQL:
        # two groups at once (a group is two round trips there; more made
        # smaller groups for the same throughput and more CPU, docs/design-notes.md).
        self.completer = Completer(store, flushers=1 if store.dialect == "sqlite" else 2)
        #: The API's inserts, in order per service: the read-ahead's guesses.
        successors = Successors()
        strategies = settings.queuer.strategies
        self.producer = Producer(
            store,
            self.completer,
            ledger,
            PipelineSettings(
                submitter=settings.submitter,
                follower=settings.follower,
                delay_window_ms=settings.delay_window_ms,
                # The producer ends each hand-out (taken or released); the time
                # limit is a backstop, long enough for a slow store to record
                # a hand-out.
                handout_ms=max(settings.delay_window_ms, HANDOUT_BACKSTOP_MS),
                pipeline_depth=settings.queuer.pipeline_depth,
            ),
            strategies=strategies,
            on_invalid=settings.queuer.on_invalid_map,
            claims=claims,
            # Under HA only claimed services are queued and followed; full
            # rounds join the claims table rather than list thousands of ids.
            services=None if claims is None else claims.claimed_services,
            claimant=claims.instance_id
            if claims is not None and store.dialect == "postgresql"
            else None,
            notify=self._notify,
            observer=self.metrics,
            health=self.health,
            successors=successors,
            clock=clock,
        )
        self.metrics.watch_pipeline(self.producer, self.producer.follower, claims)
        self.api = GatewayApi(
            store,
            on_accepted=self._accepted,
            check_service_id=check_service_id,
            is_ready=lambda: self._running,
            is_stopping=lambda: self._stop.is_set(),
            max_body_bytes=settings.max_body_bytes,
            max_status_ids=settings.max_status_ids,
            decode_slots=settings.decode_slots,
            decode_priority=Priority.parse(settings.decode_priority),
            decode_yielding=Yielding(
                bytes=settings.decode_yield_bytes,
                share=settings.decode_yield_share,
                max_wait_s=settings.decode_yield_max_wait_s,
            ),
            pipeline_busy=self._pipeline_busy,
            verify_thread=verify_thread_wanted(
                settings.decode_verify_thread, resolve_workers(settings)
            ),
            changes=self.changes,
            clock=clock,
            claims=claims,
            # Requests arriving while one insert commits go in together, and
            # each batch's successor is remembered for the read-ahead.
            acceptor=GroupInserter(store, successors=successors),
            strategy_of=lambda service_id: strategies.of(service_id).value,
            ledger_problem=self._ledger_problem,
            chain=chain_reads(ledger),
            ledger_name=ledger.description,
            default_service=settings.default_service,
            on_control=self._controlled,
        )
        #: Asks the ledger about the batches a take-over finds mid-submission.
        self.take_over = TakeOverAsks(
            ledger,
            self.producer.follower,
            max_ids=settings.follower.max_ids,
            reader=ledger_reader(settings),
            # Under HA the claim thread records the answers with a store of its own.
            opener=None if claims is None else store_opener(settings),
            wake=self.wake,
            # ... and hands the next batches of the services it took with
            # work to the queue itself (no round on this loop for them).
            offer=self.producer.source.offer,
            delay_window_ms=settings.delay_window_ms,
            clock=clock,
        )
        if claims is not None:
            claims.add_take_over_listener(self.take_over)
            claims.add_change_listener(self._claims_changed)
        self._wakeups: list[Wakeups] = []
        self._running = False
        self._stop = asyncio.Event()
        self.port: int | None = None
        self.started = asyncio.Event()

    def add_wakeups(self, relay: Wakeups) -> None:
        self._wakeups.append(relay)

    def wake(self, service_id: str, *, relay: bool = True) -> None:
        """A service's state changed: look for its next batch now, and tell
        the status readers (and, with ``relay``, the other processes)."""
        self.producer.wake(service_id)
        self.changes.notify(service_id)
        if relay:
            for w in self._wakeups:
                w.publish(service_id)

    def _notify(self, service_id: str) -> None:
        """The producer changed a service's state: its status readers and the
        other processes hear of it (the producer woke its own queue)."""
        self.changes.notify(service_id)
        for w in self._wakeups:
            w.publish(service_id)

    def _claims_changed(self, change: ClaimChange) -> None:
        # A service taken over may carry a batch its previous holder left in
        # flight: the follower asks the ledger about it before anything moves.
        # One taken over idle has nothing to queue or follow: a dead
        # instance's thousands of idle services, each woken, cost the loop a
        # round over hundreds of listed services per take-over while the
        # services with work waited (docs/ha.md, "Two-phase expiry").
        # One whose next batch the take-over handed to the queue already
        # (``ready``) needs no round: only the status readers hear of it.
        busy = change.gained - change.idle
        follower = self.producer.follower
        if busy:
            follower.scan_now(busy)
        if change.lost:
            follower.drop_services(change.lost)
        for service_id in busy:
            if service_id in change.ready:
                self.changes.notify(service_id)
            else:
                self.wake(service_id, relay=False)

    async def _controlled(self, service_id: str) -> None:
        """An operator acted on the service here: the producer reads its
        controls now (other instances within a poll interval; the store
        refuses their takes meanwhile), and its queue and status readers
        look again (a cancelled batch is final)."""
        await self.producer.refresh_controls([service_id])
        self.wake(service_id)

    def _pipeline_busy(self) -> bool:
        # Work in flight: submissions, batches followed to their final status
        # (the API adds the posts it is taking in). Large posts yield to it.
        return self.producer.submitting > 0 or bool(self.producer.follower.followed)

    def _ledger_problem(self, service_id: str) -> dict[str, object] | None:
        problem = self.health.for_service(service_id)
        return None if problem is None else problem.to_json()

    def _accepted(self, batches: Sequence[TrackingBatch]) -> None:
        self.metrics.batches_accepted(batches)
        services = {b.service_id for b in batches}
        for service_id in services:
            self.wake(service_id)
        if self.claims is not None and not services <= self.claims.claimed_services():
            # Possibly a new service: claim it now rather than at the next period.
            self.claims.wake()

    def stop(self) -> None:
        self._stop.set()

    async def run(
        self,
        *,
        extra: Sequence[Any] = (),
        sock: socket.socket | None = None,
        pipeline: bool = True,
    ) -> None:
        """Serve until :meth:`stop`; ``extra``: more coroutines to run alongside.

        ``sock``: a listening socket to serve on instead of binding
        ``settings.bind_address`` (a worker of ``serve --workers``); ``pipeline=False``:
        the API only, no submitter nor monitor (an ingest worker on SQLite).
        """
        host, port = self.settings.bind_address
        limits = self.settings.http
        runner = web.AppRunner(
            gateway_app(self),
            access_log=None,
            keepalive_timeout=limits.keepalive_s,
            # The status link of a posted list, and a GET of max_status_ids
            # ids, fit in a request line (aiohttp's default is 8 KiB: 63 ids).
            max_line_size=request_line_limit(self.settings.max_status_ids),
        )
        await runner.setup()
        try:
            site = GuardedSite(runner, limits, host, port, sock=sock)
            try:
                await site.start()
            except OSError as exc:
                for coro in extra:
                    if asyncio.iscoroutine(coro):
                        coro.close()  # never started: no "never awaited" warning
                raise ConfigError(f"cannot listen on {host}:{port}: {bind_failure(exc)}") from exc
            self.port = runner.addresses[0][1]
            log.info(
                "gateway listening on http://%s:%s, ledger %s",
                host,
                self.port,
                self.ledger.description,
            )
            async with asyncio.TaskGroup() as tasks:
                producer = tasks.create_task(self.producer.run()) if pipeline else None
                others = [tasks.create_task(c) for c in extra]
                self._running = True
                self.started.set()
                await self._stop.wait()
                self._running = False
                log.info("gateway stopping: draining in-flight submissions")
                if producer is not None:
                    self.producer.stop()
                    await producer
                self.take_over.stop()
                if self.claims is not None:
                    # Nothing is submitted any more: the claim cycles end
                    # now, and the claims are given back (docs/ha.md), not
                    # renewed (or new ones taken) until the extras time out.
                    self.claims.stop()
                for w in self._wakeups:
                    w.stop()
                # Extras get a moment to end by themselves, then are cancelled.
                await asyncio.wait(others, timeout=5) if others else None
                for t in others:
                    t.cancel()
        finally:
            await runner.cleanup()
        log.info("gateway stopped")
