"""The gateway: API, queue source, submitter and monitor wired around one store.

:class:`Gateway` owns nothing it did not build: the caller opens the store
and the ledger client (and closes them after :meth:`Gateway.run` returns).

Wake-ups are event driven inside the process: an accepted ``POST /batches``
wakes the queue source for its services, and every recorder write that
frees a service (a final status, ``Unknown``, ``Delayed``) wakes the queue
source for that service and the long-polling ``/batch_statuses`` readers.
Between processes (several gateways on one PostgreSQL) a
:class:`~ledgerq.gateway.notify.PgWakeups` relays the same wake-ups over
``LISTEN``/``NOTIFY``. Polling (``submitter.poll_timeout_s``,
``monitor.poll_interval_s``) is the fallback only.

:meth:`Gateway.stop` stops accepting work: the submitter drains its
in-flight submissions (each is recorded), the monitor stops, the HTTP server
closes; then :meth:`Gateway.run` returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp import web

from ledgerq.clock import Clock, now_ms
from ledgerq.config import Settings
from ledgerq.dlt.base import LedgerClient
from ledgerq.gateway.api import ApiStore, Changes, ClaimsView, GatewayApi
from ledgerq.gateway.sources import InFlightStore, StoreMonitorSource
from ledgerq.model import Fence, TrackingBatch
from ledgerq.monitor import Monitor
from ledgerq.queue_source import QueueSource
from ledgerq.queuer import RoundStore
from ledgerq.recorder import Recorder
from ledgerq.store.base import GroupWriter
from ledgerq.store.group import GroupCommitWriter, GroupInserter
from ledgerq.submitter import Submitter
from ledgerq.web import GatewayMetrics, gateway_app

log = logging.getLogger(__name__)


class GatewayStore(ApiStore, InFlightStore, RoundStore, GroupWriter, Protocol):
    """Every store role the gateway uses."""

    dialect: str


class Claims(ClaimsView, Protocol):
    """What the gateway needs of the claim manager (``ledgerq.claims``)."""

    def claimed_services(self, now: int | None = None) -> frozenset[str]: ...

    def fence_for(self, service_id: str, now: int | None = None) -> Fence | None: ...

    def may_post(self, service_id: str, fence: Fence, now: int | None = None) -> bool: ...

    def wake(self) -> None: ...

    def add_listener(self, listener: Callable[[frozenset[str], frozenset[str]], None]) -> None: ...


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
        self.metrics = GatewayMetrics(top_services=settings["metrics.top_services"], clock=clock)
        ledger = self.ledger = self.metrics.instrument(ledger)
        self.claims = claims
        # Under HA only claimed services are queued and monitored.
        services = None if claims is None else claims.claimed_services
        self.changes = Changes()
        # The pipeline's writes are group-committed: one transaction for all
        # the outcomes that arrive while the previous one commits.
        self.writer = GroupCommitWriter(store, flushers=1 if store.dialect == "sqlite" else 4)
        self.recorder = Recorder(
            self.writer, clock=clock, fences=None if claims is None else claims.fence_for
        )
        self.queue = QueueSource(
            store,
            clock=clock,
            delay_window_ms=settings["delay_window_ms"],
            poll_interval=settings.submitter.poll_timeout_s,
            services=services,
            # Rounds without blobs; the batches handed out are loaded in full.
            lean=True,
        )
        self.submitter = Submitter(
            self.queue,
            ledger,
            self.recorder,
            settings.submitter,
            may_post=None if claims is None else self._may_post,
        )
        self.monitor_source = StoreMonitorSource(store, services=services)
        self.monitor = Monitor(
            self.monitor_source,
            ledger,
            self.recorder,
            settings.monitor,
            clock=clock,
            held=self.submitter.held_batches,
        )
        self.api = GatewayApi(
            store,
            on_accepted=self._accepted,
            check_service_id=check_service_id,
            is_ready=lambda: self._running,
            max_body_bytes=settings["max_body_bytes"],
            changes=self.changes,
            clock=clock,
            claims=claims,
            # Requests arriving while one insert commits go in together.
            acceptor=GroupInserter(store),
        )
        self.recorder.add_unlock_listener(self.wake)
        if claims is not None:
            claims.add_listener(self._claims_changed)
        self._wakeups: list[Wakeups] = []
        self._running = False
        self._stop = asyncio.Event()
        self.port: int | None = None
        self.started = asyncio.Event()

    def add_wakeups(self, relay: Wakeups) -> None:
        self._wakeups.append(relay)

    def wake(self, service_id: str, *, relay: bool = True) -> None:
        """A service's state changed: look for its next batch now."""
        self.queue.wake(service_id)
        self.changes.notify(service_id)
        if relay:
            for w in self._wakeups:
                w.publish(service_id)

    def _claims_changed(self, gained: frozenset[str], lost: frozenset[str]) -> None:
        # A service taken over may carry a batch its previous holder left in
        # flight: the monitor asks the ledger about it before anything moves.
        self.monitor_source.adopt(gained)
        if gained:
            self.monitor.trigger()
        for service_id in gained:
            self.wake(service_id, relay=False)

    def _may_post(self, batch: TrackingBatch) -> bool:
        # Checked before every POST attempt: the claim the submission was
        # taken under must still be held, with post_margin_ms to spare.
        fence = self.recorder.submission_fence(batch)
        return (
            fence is not None
            and self.claims is not None
            and self.claims.may_post(batch.service_id, fence)
        )

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

    async def run(self, *, extra: Sequence[Any] = ()) -> None:
        """Serve until :meth:`stop`; ``extra``: more coroutines to run alongside."""
        host, port = self.settings.bind
        runner = web.AppRunner(gateway_app(self), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            self.port = runner.addresses[0][1]
            log.info(
                "gateway listening on http://%s:%s, ledger %s",
                host,
                self.port,
                self.ledger.description,
            )
            async with asyncio.TaskGroup() as tasks:
                submitter = tasks.create_task(self.submitter.run())
                monitor = tasks.create_task(self.monitor.run())
                others = [tasks.create_task(c) for c in extra]
                self._running = True
                self.started.set()
                await self._stop.wait()
                self._running = False
                log.info("gateway stopping: draining in-flight submissions")
                self.submitter.stop()
                await submitter
                self.monitor.stop()
                await monitor
                for w in self._wakeups:
                    w.stop()
                # Extras get a moment to end by themselves, then are cancelled.
                await asyncio.wait(others, timeout=5) if others else None
                for t in others:
                    t.cancel()
        finally:
            await runner.cleanup()
        log.info("gateway stopped")
