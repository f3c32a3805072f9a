"""Wake-ups between gateway processes over PostgreSQL ``LISTEN``/``NOTIFY``.

Each process publishes the service ids whose state it changed (a batch
accepted, a batch final, ``Unknown`` or ``Delayed``) on channel
``ledgerq_wake``; every other process listening wakes its queue source for
those services, so a batch accepted by one instance for a service another
instance submits is picked up at once rather than at the next poll.

Publishing never blocks the caller: ids are coalesced and sent by a
background task, several per ``NOTIFY`` (newline-separated, under
PostgreSQL's 8000-byte payload limit). Notifications from this process's
own connection are ignored. Connection failures are logged and retried with
backoff; until then, polling covers the gap. Wake-ups sent while the
listener was away are lost: once it listens again it calls ``on_resync``,
whose owner looks again at everything it waits for (the parked status
requests: :meth:`ledgerq.ingest.longpoll.Changes.notify` with no service).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg

log = logging.getLogger(__name__)

CHANNEL = "ledgerq_wake"
_MAX_PAYLOAD = 7900
#: How often the loops look at the stop flag.
_TICK_S = 0.5


def chunk_payloads(service_ids: list[str]) -> list[str]:
    """Newline-joined ids, each payload under the NOTIFY size limit."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for s in service_ids:
        n = len(s.encode()) + 1
        if current and size + n > _MAX_PAYLOAD:
            out.append("\n".join(current))
            current, size = [], 0
        current.append(s)
        size += n
    if current:
        out.append("\n".join(current))
    return out


class PgWakeups:
    def __init__(
        self,
        url: str,
        on_wake: Callable[[str], None],
        on_resync: Callable[[], None] | None = None,
    ) -> None:
        self._url = url
        self._on_wake = on_wake
        self._on_resync = on_resync
        #: Times the listener listened again after losing its connection.
        self.resyncs = 0
        self._pending: set[str] = set()
        self._has_pending = asyncio.Event()
        self._own_pids: set[int] = set()
        self.received = 0
        self.listening = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """End :meth:`run` within about ``_TICK_S`` (no cancellation needed)."""
        self._stop.set()
        self._has_pending.set()

    def publish(self, service_id: str) -> None:
        self._pending.add(service_id)
        self._has_pending.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._listen_forever())
            tasks.create_task(self._publish_forever())

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, connect_timeout=5)
        self._own_pids.add(conn.info.backend_pid)
        return conn

    async def _listen_forever(self) -> None:
        backoff = 0.1
        lost = False
        while not self._stop.is_set():
            try:
                conn = await self._connect()
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    backoff = 0.1
                    if lost:
                        # What was sent while away is lost: look again at everything.
                        lost = False
                        self.resyncs += 1
                        if self._on_resync is not None:
                            self._on_resync()
                    while not self._stop.is_set():
                        async for note in conn.notifies(timeout=_TICK_S):
                            if note.pid in self._own_pids:
                                continue
                            self.received += 1
                            for service_id in note.payload.split("\n"):
                                if service_id:
                                    self._on_wake(service_id)
            except psycopg.Error as exc:
                self.listening.clear()
                lost = True
                log.warning("wake-up listener lost PostgreSQL: %s; reconnecting", exc)
                await self._pause(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _publish_forever(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                conn = await self._connect()
                async with conn:
                    backoff = 0.1
                    while not self._stop.is_set():
                        await self._has_pending.wait()
                        self._has_pending.clear()
                        ids, self._pending = sorted(self._pending), set()
                        for payload in chunk_payloads(ids):
                            await asyncio.wait_for(
                                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload)), 10
                            )
            except (psycopg.Error, TimeoutError) as exc:
                log.warning("wake-up publisher lost PostgreSQL: %s; reconnecting", exc)
                await self._pause(backoff)
                backoff = min(backoff * 2, 5.0)
