"""Open everything the gateway needs from its settings, run it, close it all.

:func:`run_gateway` runs one gateway in this process; given a
:class:`~ledgerq.gateway.workers.WorkerSpec` it runs it as one worker of
``ledgerq serve --workers N`` (its own socket on the shared port, the worker
bus, and on SQLite either the whole gateway or the API alone).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

from ledgerq.clock import now_ms
from ledgerq.config import Settings
from ledgerq.errors import ConfigError, InvalidBatchError, LedgerError
from ledgerq.gateway.bus import MetricsSockets, WorkerBus, WorkerChainReads, WorkerInfo
from ledgerq.gateway.ha import advertised_address, open_high_availability
from ledgerq.gateway.service import Gateway
from ledgerq.gateway.wakeups import PgWakeups
from ledgerq.gateway.workers import WorkerSpec, listening_socket
from ledgerq.ledgers import HttpTimeouts, LedgerClient, http_ledger_client
from ledgerq.ledgers.base import CommitEvent, LedgerBatchStatus, SubmitResult
from ledgerq.ledgers.chain import ChainHandler, ChainReads, chain_reads
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.ledgers.splinter import scabbard_path
from ledgerq.queue.strategy import Strategy
from ledgerq.store import open_store

log = logging.getLogger(__name__)


class IngestOnlyLedger:
    """The ledger client of an ingest worker, which never submits nor follows;
    Sawtooth's read routes it answers through ``reads`` (the ledger's own
    client, or worker 0 for the in-process node).

    ``description`` names the ledger the gateway submits to (through worker
    0), as worker 0's own client does: the dashboard shows it whichever
    worker answers."""

    def __init__(self, description: str, reads: ChainReads | None = None) -> None:
        self.description = description
        self.reads = reads

    def chain_handler(self, method: str, route: str) -> ChainHandler | None:
        return None if self.reads is None else self.reads.chain_handler(method, route)

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        raise LedgerError("an ingest worker submits nothing; worker 0 runs the pipeline")

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        raise LedgerError("an ingest worker follows nothing; worker 0 runs the pipeline")

    async def transaction_committed(self, transaction_id: str) -> bool:
        raise LedgerError("an ingest worker checks no dependency; worker 0 runs the pipeline")

    def events(self) -> AsyncIterator[CommitEvent] | None:
        return None

    def triggers(self) -> AsyncIterator[None] | None:
        return None

    async def close(self) -> None:
        pass


def _splinter_service_id(service_id: str) -> None:
    try:
        scabbard_path(service_id)
    except LedgerError as exc:
        raise InvalidBatchError(str(exc), rule="invalid_service_id") from exc


def _any_service_id(service_id: str) -> None:
    pass


async def open_ledger(settings: Settings, stack: AsyncExitStack) -> LedgerClient:
    if settings.ledger.startswith("splinter+") and settings.default_service:
        try:
            scabbard_path(settings.default_service)
        except LedgerError as exc:
            raise ConfigError(f"default_service: {exc}") from exc
    if settings.ledger == "node":
        # The in-process node lives as long as the gateway: the stack closes it.
        from ledgerq.node import Node

        node = await Node.open(
            settings.node_data_dir,
            shards=settings.node.shards,
            ephemeral=settings.node.ephemeral,
        )
        stack.push_async_callback(node.close)
        return NodeClient(node)
    client = _http_client(settings)
    stack.push_async_callback(client.close)
    return client


def _http_client(settings: Settings) -> LedgerClient:
    return http_ledger_client(
        settings.ledger,
        HttpTimeouts(
            connect=settings.ledger_timeout.connect_s,
            submit=settings.ledger_timeout.submit_s,
            lean=settings.ledger_client == "lean",
        ),
        token=settings.ledger_token,
    )


async def ingest_ledger(
    settings: Settings, stack: AsyncExitStack, worker: WorkerSpec
) -> IngestOnlyLedger:
    """An ingest worker's ledger: Sawtooth's reads from the ledger's own
    client, or from worker 0 when the ledger is its in-process node."""
    if settings.ledger == "node":
        reads = WorkerChainReads(
            MetricsSockets(worker.sockets_dir, worker.index, worker.count).path(0)
        )
        stack.push_async_callback(reads.close)
        return IngestOnlyLedger(NodeClient.DESCRIPTION, reads)
    client = _http_client(settings)
    stack.push_async_callback(client.close)
    return IngestOnlyLedger(client.description, chain_reads(client))


async def run_gateway(
    settings: Settings,
    *,
    install_signals: bool = False,
    on_started: Callable[[Gateway], Any] | None = None,
    worker: WorkerSpec | None = None,
) -> None:
    async with AsyncExitStack() as stack:
        # A frozen instance's open transaction (a fenced write share-locks its
        # claim row) must end before others need that row: within the TTL.
        store = await open_store(
            settings.db,
            migrate=True,
            pg_idle_in_transaction_ms=settings.claims.ttl_ms,
            pg_outage_timeout_s=settings.store.outage_timeout_s,
            pg_wait_s=settings.store.wait_s,
            # Lock entries only if some service may be parallel (docs/store.md).
            lock_entries=Strategy.PARALLEL in settings.queuer.strategies.kinds(),
            # PostgreSQL: the hot statements prepared before the first request.
            warm=True,
        )
        stack.push_async_callback(store.close)
        pipeline = worker is None or worker.role == "gateway"
        claims = None
        ledger: LedgerClient
        if worker is not None and not pipeline:
            ledger = await ingest_ledger(settings, stack, worker)
        else:
            # SQLite: refuse a second gateway on the file (unless this worker's
            # supervisor holds the lock for it); PostgreSQL: take claims.
            claims = await open_high_availability(
                settings,
                stack,
                sqlite_locked_by_supervisor=worker is not None
                and worker.sqlite_locked_by_supervisor,
            )
            ledger = await open_ledger(settings, stack)
        splinter = settings.ledger.startswith("splinter+")
        gateway = Gateway(
            settings,
            store,
            ledger,
            check_service_id=_splinter_service_id if splinter else _any_service_id,
            claims=claims,
        )
        extra = []
        sock = None
        if worker is not None:
            host, _ = settings.bind_address
            sock = listening_socket(host, worker.port, listen=True)
            bus = WorkerBus.from_fds(
                WorkerInfo(
                    index=worker.index,
                    count=worker.count,
                    pid=os.getpid(),
                    role=worker.role,
                    instance_id=None if claims is None else claims.instance_id,
                    started_at=now_ms(),
                    restarts=worker.restarts,
                ),
                worker.inbox_fd,
                worker.outbox_fds,
                # On PostgreSQL every worker is an instance: NOTIFY relays.
                relay_wakeups=not settings.db.startswith(("postgresql://", "postgres://")),
            )
            bus.on_wake(lambda s: gateway.wake(s, relay=False))
            bus.count_accepted(lambda: gateway.metrics.accepted_total)
            gateway.add_wakeups(bus)
            gateway.api.workers = bus.workers
            extra.append(bus.run())
            # /metrics of any worker adds up every worker's counters.
            sockets = MetricsSockets(worker.sockets_dir, worker.index, worker.count)
            stack.push_async_callback(
                await sockets.serve(
                    gateway.metrics.exposition,
                    gateway.metrics.dashboard_part,
                    # Worker 0 answers the others' Sawtooth reads of its in-process node.
                    chain=chain_reads(ledger) if pipeline and settings.ledger == "node" else None,
                )
            )
            gateway.metrics.peers = sockets.peers
            # /dashboard/data of any worker adds up every worker's throughput and recent batches.
            gateway.metrics.peer_dashboards = sockets.peer_dashboards
        if claims is not None:
            extra.append(claims.run())

            async def advertise() -> None:
                await gateway.started.wait()
                host, port = settings.bind_address
                claims.set_address(advertised_address(host, gateway.port or port))

            extra.append(advertise())
        if settings.db.startswith(("postgresql://", "postgres://")):
            wakeups = PgWakeups(
                settings.db,
                lambda s: gateway.wake(s, relay=False),
                # Wake-ups lost while the listener was away: parked status
                # requests look at all their batches again.
                on_resync=gateway.changes.notify,
            )
            gateway.add_wakeups(wakeups)
            extra.append(wakeups.run())
        if install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, gateway.stop)
        if on_started is not None:

            async def announce() -> None:
                await gateway.started.wait()
                on_started(gateway)

            extra.append(announce())
        await gateway.run(extra=extra, sock=sock, pipeline=pipeline)
