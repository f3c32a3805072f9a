"""``ledgerq serve --workers N``: N gateway processes behind one listening port.

A gateway is one process on one event loop; on a machine with several cores
the supervisor here runs N of them:

* **One port.** The supervisor binds the address with ``SO_REUSEPORT`` and
  keeps that socket (not listening) for its lifetime, so the port stays
  reserved; every worker binds and listens on the same port with
  ``SO_REUSEPORT``, and the kernel spreads new connections across the
  workers' sockets. ``SO_REUSEPORT`` would as well let the workers join
  those of another ``ledgerq serve`` already listening there (any process
  of the same user may), and the kernel would split the connections
  between two unrelated gateways: the supervisor first checks that nothing
  listens on the address and refuses to start otherwise.
* **PostgreSQL**: every worker is a full gateway instance — its own claim
  manager and instance id, sharing services with the other workers and with
  any other ``ledgerq serve`` through claims (``docs/ha.md``). A configured
  ``claims.instance_id`` becomes ``<id>-<worker>`` (``.<restart>`` after a
  restart) so that no two processes share one.
* **SQLite**: worker 0 runs the gateway (API, pipeline, in-process node);
  the others take requests only (decode, verify, insert: the CPU-heavy part
  of ingest). The supervisor holds the single-instance lock on the file, so
  a second ``ledgerq serve`` on it is still refused; its workers share it.
* **Supervised.** A worker that exits unexpectedly is started again (after
  0.5 s, doubling up to 10 s while it keeps dying); on PostgreSQL its
  services fail over to the other instances meanwhile, as for any instance.
  A worker that fails while starting the first time (a bad setting, an
  unreachable database) stops the whole command with its error.
* **Stopped together.** SIGTERM or SIGINT to the supervisor is passed on;
  every worker drains and exits, then the supervisor. Workers die with the
  supervisor (``PR_SET_PDEATHSIG`` on Linux, and a lifeline pipe they watch).
* **Settings** are resolved once, by the supervisor, and handed to every
  worker (on its standard input: secrets never appear in its environment).

Workers talk over :mod:`ledgerq.gateway.bus` (wake-ups, who is alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from ledgerq.claims.settings import MAX_INSTANCE_ID_LENGTH
from ledgerq.config import Settings
from ledgerq.errors import ConfigError, LedgerqError
from ledgerq.gateway.bus import socket_pairs

log = logging.getLogger(__name__)

#: Exit code of a worker that could not start (settings, database, port).
EXIT_START_FAILED = 3
_RESTART_FIRST_S = 0.5
_RESTART_MAX_S = 10.0
#: A worker that ran this long before dying restarts without backoff.
_HEALTHY_RUN_S = 30.0


def resolve_workers(settings: Settings) -> int:
    """How many worker processes ``settings`` ask for, validated.

    ``workers = 0`` (the default) means one per core, or one where more
    cannot work: a ``memory://`` store (one process by nature) or an
    in-process node on PostgreSQL (each worker would be its own ledger).
    Asking for more than one there explicitly is refused.
    """
    asked = settings.workers
    single = None
    if settings.db.startswith("memory://"):
        single = "a memory:// store lives in one process"
    elif settings.ledger == "node" and not settings.db.startswith("sqlite:///"):
        single = (
            "with PostgreSQL every worker is a gateway instance, and an in-process node in "
            "each would be a separate ledger; run `ledgerq node` and point --ledger at it"
        )
    if asked == 0:
        return 1 if single else max(os.cpu_count() or 1, 1)
    if asked > 1 and single:
        raise ConfigError(f"workers = {asked} is not possible here: {single}; use --workers 1")
    return asked


def listening_socket(host: str, port: int, *, listen: bool, backlog: int = 1024) -> socket.socket:
    """A TCP socket on (host, port) with ``SO_REUSEPORT``; listening if asked."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {bind_failure(exc)}") from exc
    return sock


def bind_failure(exc: OSError) -> str:
    """Why a listening socket could not be had, and what to do (asyncio words it its own way)."""
    reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return f"{reason}: another process listens there; stop it or choose another --bind"
    return f"{reason}; choose another --bind"


def check_port_free(host: str, port: int) -> None:
    """Refuse (``ConfigError``) when another process listens on ``port`` at any
    address ``host`` names: checked before a one-process gateway makes its
    store and node data, which a refused start would otherwise leave behind.
    Port 0 (any free port) is not checked; the listening socket itself is
    bound later, and a port taken in between is still refused then."""
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}; choose another --bind") from exc
    for family, kind, proto, _name, address in addresses:
        probe = socket.socket(family, kind, proto)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {bind_failure(exc)}") from exc
        finally:
            probe.close()


def reserve_port(host: str, port: int) -> socket.socket:
    """The supervisor's placeholder on (host, port), once no other process listens there.

    The placeholder (not listening) does not count in :func:`check_port_free`:
    a probe without ``SO_REUSEPORT`` binds beside a socket that does not
    listen, never beside one that does, whoever owns it.
    """
    placeholder = listening_socket(host, port, listen=False)
    try:
        check_port_free(host, int(placeholder.getsockname()[1]))
    except ConfigError:
        placeholder.close()
        raise
    return placeholder


@dataclass
class WorkerSpec:
    """What a worker needs to know, handed over on its standard input."""

    values: dict[str, Any]
    sources: dict[str, str]
    config_file: str | None
    index: int
    count: int
    #: ``gateway`` (API and pipeline) or ``ingest`` (API only; SQLite).
    role: str
    restarts: int
    port: int
    inbox_fd: int
    outbox_fds: list[int]
    lifeline_fd: int
    supervisor_pid: int
    #: The supervisor holds the SQLite single-instance lock for its workers.
    sqlite_locked_by_supervisor: bool = False
    #: Where the workers serve their own metrics to one another.
    sockets_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))

    def settings(self) -> Settings:
        return Settings.build(self.values, self.sources, self.config_file)


def worker_instance_id(configured: str, index: int, restarts: int) -> str:
    """The claim instance id of a worker when one was configured (else generated)."""
    if not configured:
        return ""
    suffix = f"-{index}" if restarts == 0 else f"-{index}.{restarts}"
    return configured[: MAX_INSTANCE_ID_LENGTH - len(suffix)] + suffix


@dataclass
class _Slot:
    index: int
    role: str
    restarts: int = 0
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    ready: bool = False
    backoff: float = _RESTART_FIRST_S


class Supervisor:
    """Runs and supervises the workers of one ``ledgerq serve``."""

    def __init__(self, settings: Settings, count: int, *, worker_module: str) -> None:
        host, port = settings.bind_address
        # First: nothing below is left behind when the port is taken.
        self._placeholder = reserve_port(host, port)
        self.host = host
        self.port = int(self._placeholder.getsockname()[1])
        self.settings = settings
        self.count = count
        self._module = worker_module
        self._sqlite = settings.db.startswith("sqlite:///")
        self._slots = [
            _Slot(i, "ingest" if self._sqlite and i > 0 else "gateway") for i in range(count)
        ]
        self._pairs = socket_pairs(count)
        self._sockets_dir = tempfile.mkdtemp(prefix="ledgerq-workers-")
        self._lifeline_r, self._lifeline_w = os.pipe()
        os.set_inheritable(self._lifeline_r, True)
        self._stopping = asyncio.Event()
        self._ready = asyncio.Event()
        self._watchers: set[asyncio.Task[None]] = set()
        self.failure: str | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._stopping.set()

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self._slots if s.proc is not None]

    async def run(self, on_ready: Any = None) -> None:
        """Start every worker, announce once all serve, supervise until stopped."""
        try:
            async with asyncio.TaskGroup() as tasks:
                for slot in self._slots:
                    tasks.create_task(self._supervise(slot))
                tasks.create_task(self._announce(on_ready))
                await self._stopping.wait()
                await self._stop_all()
        finally:
            self.close()
        if self.failure is not None:
            raise LedgerqError(self.failure)

    async def _announce(self, on_ready: Any) -> None:
        await self._ready.wait()
        log.info(
            "%d workers listening on %s (%s)",
            self.count,
            self.url,
            ", ".join(f"{s.index}: pid {s.proc.pid} {s.role}" for s in self._slots if s.proc),
        )
        if on_ready is not None:
            on_ready(self)

    async def _supervise(self, slot: _Slot) -> None:
        while not self._stopping.is_set():
            await self._start(slot)
            code = await self._wait_exit(slot)
            if self._stopping.is_set():
                return
            if not slot.ready and slot.restarts == 0:
                self.failure = (
                    f"worker {slot.index} could not start (exit code {code}); see its error above"
                )
                self.stop()
                return
            ran = asyncio.get_running_loop().time() - slot.started
            slot.backoff = _RESTART_FIRST_S if ran >= _HEALTHY_RUN_S else slot.backoff
            log.warning(
                "worker %d (pid %s, %s) exited with %s after %.1f s; restarting in %.1f s",
                slot.index,
                slot.proc.pid if slot.proc else "?",
                slot.role,
                code,
                ran,
                slot.backoff,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), slot.backoff)
            slot.backoff = min(slot.backoff * 2, _RESTART_MAX_S)
            slot.restarts += 1

    def _spec(self, slot: _Slot) -> WorkerSpec:
        values = dict(self.settings.values)
        values["claims.instance_id"] = worker_instance_id(
            str(values.get("claims.instance_id") or ""), slot.index, slot.restarts
        )
        return WorkerSpec(
            values=values,
            sources=dict(self.settings.sources),
            config_file=self.settings.config_file,
            index=slot.index,
            count=self.count,
            role=slot.role,
            restarts=slot.restarts,
            port=self.port,
            inbox_fd=self._pairs[slot.index][0].fileno(),
            outbox_fds=[p[1].fileno() for i, p in enumerate(self._pairs) if i != slot.index],
            lifeline_fd=self._lifeline_r,
            supervisor_pid=os.getpid(),
            sqlite_locked_by_supervisor=self._sqlite,
            sockets_dir=self._sockets_dir,
        )

    async def _start(self, slot: _Slot) -> None:
        spec = self._spec(slot)
        ready_r, ready_w = os.pipe()
        os.set_inheritable(ready_w, True)
        spec.extra["ready_fd"] = ready_w
        fds = [spec.inbox_fd, *spec.outbox_fds, spec.lifeline_fd, ready_w]
        slot.ready = False
        slot.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self._module,
            stdin=asyncio.subprocess.PIPE,
            pass_fds=fds,
        )
        os.close(ready_w)
        slot.started = asyncio.get_running_loop().time()
        assert slot.proc.stdin is not None
        slot.proc.stdin.write(spec.to_json().encode())
        await slot.proc.stdin.drain()
        slot.proc.stdin.close()
        watcher = asyncio.get_running_loop().create_task(self._watch_ready(slot, ready_r))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch_ready(self, slot: _Slot, fd: int) -> None:
        # The worker writes one byte once it serves; EOF without it: it died.
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
        )
        try:
            if await reader.read(1):
                slot.ready = True
                if all(s.ready for s in self._slots):
                    self._ready.set()
        finally:
            transport.close()

    async def _wait_exit(self, slot: _Slot) -> int:
        assert slot.proc is not None
        return await slot.proc.wait()

    async def _stop_all(self) -> None:
        procs = [s.proc for s in self._slots if s.proc is not None and s.proc.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if procs:
            # Workers drain their submissions first; give them time, then insist.
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in procs], timeout=60
            )
            for proc in procs:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            if pending:
                await asyncio.wait(pending, timeout=10)

    def close(self) -> None:
        """Give back the port, pipes and sockets directory (once: ``run`` ends
        with it; a start refused before ``run`` calls it itself)."""
        if self._closed:
            return
        self._closed = True
        shutil.rmtree(self._sockets_dir, ignore_errors=True)
        self._placeholder.close()
        for inbox, outbox in self._pairs:
            inbox.close()
            outbox.close()
        for fd in (self._lifeline_r, self._lifeline_w):
            with contextlib.suppress(OSError):
                os.close(fd)
