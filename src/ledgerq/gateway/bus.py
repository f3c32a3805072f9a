"""The workers of one ``ledgerq serve --workers N`` talking to each other.

Every worker has an inbox: one end of a Unix datagram socket pair its
supervisor made (and keeps, so a restarted worker gets the same inbox); it
holds the other ends, the outboxes, of every other worker. Two messages:

* **wake** — service ids whose state this worker changed (a batch accepted,
  a batch final, ``Unknown`` or ``Delayed``): the others wake their queue
  source and their long-polling status readers for them, exactly as
  PostgreSQL ``LISTEN``/``NOTIFY`` does between instances. On SQLite, where
  one worker runs the pipeline and the others take requests, this is how a
  batch accepted by one is submitted at once by the other, and how a status
  it records answers a long poll held by another. (On PostgreSQL every
  worker is an instance and the database relays wake-ups.)
* **hello** — who a worker is (index, pid, role, instance id, start, how
  many times its slot was restarted), sent every second: every worker knows
  its live peers, for ``/instances`` and the dashboard.

Sending never blocks: the sockets are non-blocking and a datagram that finds
a full inbox (a worker stopped or dead) is dropped — wake-ups are hints,
polling is the fallback.

Metrics do not fit in a datagram: each worker also serves its own Prometheus
exposition on a Unix socket in a directory its supervisor made
(:class:`MetricsSockets`); the worker that answers ``/metrics`` reads the
others' there and adds them up. On SQLite, worker 0 serves there too the
in-process node's answers to Sawtooth's read routes, which the others
forward to it (:class:`WorkerChainReads`): whichever worker a Sawtooth
client reaches reads the same chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiohttp
from aiohttp import web

from ledgerq.ledgers.chain import SAWTOOTH_READS, ChainHandler, ChainReads, forward_read

log = logging.getLogger(__name__)

#: How often a worker says hello; a peer silent for three of these is gone.
HELLO_INTERVAL_S = 1.0
#: Datagram payloads stay well under the Unix socket's limit.
_MAX_DATAGRAM = 32_000


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker of a ``ledgerq serve --workers N``."""

    index: int
    count: int
    pid: int
    #: ``gateway`` (API and pipeline) or ``ingest`` (API only, SQLite).
    role: str
    #: Its claim manager's instance id (PostgreSQL), else None.
    instance_id: str | None
    started_at: int
    #: How many times the supervisor restarted this slot.
    restarts: int
    #: Batches this worker accepted (POST /batches) since it started.
    accepted: int = 0


def _chunks(service_ids: Sequence[str]) -> Iterable[list[str]]:
    chunk: list[str] = []
    size = 0
    for s in service_ids:
        n = len(s) + 4
        if chunk and size + n > _MAX_DATAGRAM:
            yield chunk
            chunk, size = [], 0
        chunk.append(s)
        size += n
    if chunk:
        yield chunk


class WorkerBus:
    """This worker's inbox and its peers' outboxes."""

    def __init__(
        self,
        me: WorkerInfo,
        inbox: socket.socket,
        outboxes: Sequence[socket.socket],
        *,
        relay_wakeups: bool,
    ) -> None:
        self.me = me
        self._inbox = inbox
        self._outboxes = list(outboxes)
        for s in (inbox, *outboxes):
            s.setblocking(False)
        self._relay = relay_wakeups
        self._accepted: Callable[[], int] = lambda: 0
        self._on_wake: Callable[[str], None] | None = None
        self._peers: dict[int, tuple[WorkerInfo, float]] = {}
        #: Set whenever a peer's hello arrives.
        self.heard = asyncio.Event()
        self._stop = asyncio.Event()
        self.sent = 0
        self.dropped = 0
        self.received = 0

    @classmethod
    def from_fds(
        cls, me: WorkerInfo, inbox_fd: int, outbox_fds: Sequence[int], *, relay_wakeups: bool
    ) -> WorkerBus:
        def sock(fd: int) -> socket.socket:
            return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM, fileno=fd)

        return cls(me, sock(inbox_fd), [sock(fd) for fd in outbox_fds], relay_wakeups=relay_wakeups)

    def on_wake(self, callback: Callable[[str], None]) -> None:
        self._on_wake = callback

    def count_accepted(self, accepted: Callable[[], int]) -> None:
        """Where this worker's count of accepted batches comes from (for hello)."""
        self._accepted = accepted

    @property
    def info(self) -> WorkerInfo:
        return replace(self.me, accepted=self._accepted())

    # -- the Wakeups role (gateway.service) --------------------------------

    def publish(self, service_id: str) -> None:
        if self._relay:
            self._send({"t": "wake", "s": [service_id]})

    def publish_many(self, service_ids: Sequence[str]) -> None:
        if self._relay:
            for chunk in _chunks(service_ids):
                self._send({"t": "wake", "s": chunk})

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        for s in (self._inbox, *self._outboxes):
            s.close()

    # -- peers ---------------------------------------------------------------

    def workers(self) -> list[WorkerInfo]:
        """This worker and every peer heard from within three hello intervals."""
        horizon = time.monotonic() - 3 * HELLO_INTERVAL_S
        live = [info for info, heard in self._peers.values() if heard >= horizon]
        return sorted([self.info, *live], key=lambda w: w.index)

    # -- plumbing ------------------------------------------------------------

    def _send(self, message: dict[str, object]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        for out in self._outboxes:
            try:
                out.send(data)
                self.sent += 1
            except (BlockingIOError, ConnectionRefusedError, OSError):
                self.dropped += 1

    def _receive(self) -> None:
        while True:
            try:
                data = self._inbox.recv(65_536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("worker bus: cannot read the inbox: %s", exc)
                return
            self.received += 1
            try:
                message = json.loads(data)
                kind = message["t"]
            except (ValueError, KeyError, TypeError):
                log.warning("worker bus: dropped an unreadable message")
                continue
            if kind == "wake":
                if self._on_wake is not None:
                    for service_id in message["s"]:
                        self._on_wake(str(service_id))
            elif kind == "hello":
                info = WorkerInfo(**message["w"])
                if info.index != self.me.index:
                    self._peers[info.index] = (info, time.monotonic())
                    self.heard.set()
            else:
                log.warning("worker bus: unknown message kind %r", kind)

    async def run(self) -> None:
        """Read the inbox and say hello every second until :meth:`stop`."""
        loop = asyncio.get_running_loop()
        loop.add_reader(self._inbox.fileno(), self._receive)
        try:
            while not self._stop.is_set():
                self._send({"t": "hello", "w": asdict(self.info)})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), HELLO_INTERVAL_S)
        finally:
            loop.remove_reader(self._inbox.fileno())
            self.close()


class MetricsSockets:
    """Each worker's own exposition on ``<directory>/w<index>.sock``."""

    def __init__(self, directory: str, index: int, count: int) -> None:
        self._dir = directory
        self.index = index
        self.count = count

    def path(self, index: int) -> str:
        return os.path.join(self._dir, f"w{index}.sock")

    async def serve(
        self,
        exposition: Callable[[], bytes],
        dashboard_part: Callable[[int, int], dict[str, Any]] | None = None,
        chain: ChainReads | None = None,
    ) -> Callable[[], Awaitable[None]]:
        """Serve this worker's exposition (``/``), its share of the
        dashboard (``/dashboard?seconds=N&until=S``) and, given ``chain``,
        Sawtooth's read routes (for :class:`WorkerChainReads`); returns the
        coroutine function that stops it."""

        async def own(_request: web.Request) -> web.Response:
            return web.Response(body=exposition())

        async def dashboard(request: web.Request) -> web.Response:
            if dashboard_part is None:
                raise web.HTTPNotFound()
            try:
                seconds, until = int(request.query["seconds"]), int(request.query["until"])
            except (KeyError, ValueError):
                raise web.HTTPBadRequest() from None
            return web.json_response(dashboard_part(seconds, until))

        app = web.Application()
        app.router.add_get("/", own)
        app.router.add_get("/dashboard", dashboard)
        for method, route in SAWTOOTH_READS if chain is not None else ():
            assert chain is not None
            handler = chain.chain_handler(method, route)
            if handler is not None:
                app.router.add_route(method, route, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        path = self.path(self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by this slot's previous process
        await web.UnixSite(runner, path).start()
        return runner.cleanup

    async def _from_peers(self, path: str) -> list[bytes]:
        """``path`` read from every other worker; one that does not answer
        it in 2 s is left out."""

        async def one(index: int) -> bytes | None:
            try:
                connector = aiohttp.UnixConnector(path=self.path(index))
                async with (
                    aiohttp.ClientSession(
                        connector=connector, timeout=aiohttp.ClientTimeout(total=2)
                    ) as session,
                    session.get(f"http://worker{path}") as resp,
                ):
                    resp.raise_for_status()
                    return await resp.read()
            except (aiohttp.ClientError, OSError, TimeoutError):
                return None

        got = await asyncio.gather(*(one(i) for i in range(self.count) if i != self.index))
        return [g for g in got if g is not None]

    async def peers(self) -> list[bytes]:
        """The other workers' expositions."""
        return await self._from_peers("/")

    async def peer_dashboards(self, seconds: int, until_s: int) -> list[dict[str, Any]]:
        """The other workers' shares of the dashboard (``dashboard_part``)."""
        bodies = await self._from_peers(f"/dashboard?seconds={int(seconds)}&until={int(until_s)}")
        return [json.loads(b) for b in bodies]


class WorkerChainReads:
    """Sawtooth's read routes of the in-process node, which lives in worker 0:
    forwarded to it on its socket (:meth:`MetricsSockets.serve`)."""

    def __init__(self, path: str, *, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def chain_handler(self, method: str, route: str) -> ChainHandler | None:
        return self._forward if (method, route) in SAWTOOTH_READS else None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.path))
        return await forward_read(
            self._session,
            "http://worker0",
            request,
            ledger="the in-process node, in worker 0",
            timeout_s=self.timeout_s,
            connect_s=2.0,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def socket_pairs(count: int) -> list[tuple[socket.socket, socket.socket]]:
    """One (inbox, outbox) datagram pair per worker; inherited by the workers."""
    pairs = []
    for _ in range(count):
        inbox, outbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for s in (inbox, outbox):
            os.set_inheritable(s.fileno(), True)
        pairs.append((inbox, outbox))
    return pairs
