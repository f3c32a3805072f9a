"""Open everything the gateway needs from its settings, run it, close it all."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from ledgerq.config import Settings
from ledgerq.dlt import HttpTimeouts, LedgerClient, http_ledger_client
from ledgerq.dlt.splinter import scabbard_path
from ledgerq.errors import InvalidBatchError, LedgerError
from ledgerq.gateway.ha import open_high_availability
from ledgerq.gateway.notify import PgWakeups
from ledgerq.gateway.service import Gateway
from ledgerq.store import open_store

log = logging.getLogger(__name__)


def _splinter_service_id(service_id: str) -> None:
    try:
        scabbard_path(service_id)
    except LedgerError as exc:
        raise InvalidBatchError(str(exc), rule="invalid_service_id") from exc


def _any_service_id(service_id: str) -> None:
    pass


async def open_ledger(settings: Settings, stack: AsyncExitStack) -> LedgerClient:
    if settings.ledger == "node":
        from ledgerq.dlt.node import open_node_client

        return await open_node_client(settings, stack)
    client = http_ledger_client(
        settings.ledger,
        HttpTimeouts(
            connect=settings["ledger_timeout.connect_s"],
            submit=settings["ledger_timeout.submit_s"],
        ),
    )
    stack.push_async_callback(client.close)
    return client


async def run_gateway(
    settings: Settings,
    *,
    install_signals: bool = False,
    on_started: Callable[[Gateway], Any] | None = None,
) -> None:
    async with AsyncExitStack() as stack:
        # A frozen instance's open transaction (a fenced write share-locks its
        # claim row) must end before others need that row: within the TTL.
        store = await open_store(
            settings.db, migrate=True, pg_idle_in_transaction_ms=settings.claims.claim_ttl_ms
        )
        stack.push_async_callback(store.close)
        # SQLite: refuse a second gateway on the file; PostgreSQL: take claims.
        claims = await open_high_availability(settings, stack)
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
        if claims is not None:
            extra.append(claims.run())

            async def advertise() -> None:
                await gateway.started.wait()
                claims.set_address(f"{settings.bind[0]}:{gateway.port}")

            extra.append(advertise())
        if settings.db.startswith(("postgresql://", "postgres://")):
            wakeups = PgWakeups(settings.db, lambda s: gateway.wake(s, relay=False))
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
        await gateway.run(extra=extra)
