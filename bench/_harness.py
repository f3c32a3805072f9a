"""Shared parts of the system benchmarks (compare, load, soak).

Real processes on loopback: ``ledgerq node`` (or the plain-REST fault
ledger), ``ledgerq serve`` and job-queue workers run as subprocesses whose
stderr goes to a log file; the benchmark process only generates the workload
and watches the ledger: the node's ``/events`` stream, which timestamps every
batch reaching a final status, or the fault ledger's own report, which
records when each batch was first POSTed and when it became final. Both use
one clock: ``time.monotonic`` (system-wide ``CLOCK_MONOTONIC``, the same in
every process of the machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psycopg

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_address, make_intkey_batch

ROOT = Path(__file__).resolve().parent.parent
LEDGERQ = str(Path(sys.executable).with_name("ledgerq"))
_LISTENING = re.compile(rb"listening on (http://[\w.\[\]:-]+)")
_READY = re.compile(rb"ready")

DEFAULT_PG = os.environ.get("LEDGERQ_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass
class Proc:
    """A subprocess whose stderr is copied to ``log_path``; ``start`` waits for its banner."""

    args: list[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    banner: re.Pattern[bytes] = _LISTENING
    url: str = ""
    process: asyncio.subprocess.Process | None = None
    _drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self, timeout_s: float = 60.0) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            *self.args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **self.env},
            cwd=ROOT,
        )
        found: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._drain = asyncio.create_task(self._drain_stderr(found))
        try:
            self.url = await asyncio.wait_for(asyncio.shield(found), timeout_s)
        except (TimeoutError, RuntimeError) as exc:
            await self.kill()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{' '.join(self.args[:3])} did not start ({exc}):\n{tail}") from exc
        return self.url

    async def _drain_stderr(self, found: asyncio.Future[str]) -> None:
        assert self.process is not None and self.process.stderr is not None
        with self.log_path.open("ab") as log:
            async for line in self.process.stderr:
                log.write(line)
                if not found.done():
                    m = self.banner.search(line)
                    if m:
                        found.set_result(m.group(1).decode() if m.groups() else "")
        if not found.done():
            found.set_exception(RuntimeError("process exited before it was ready"))

    async def kill(self) -> None:
        """SIGKILL: no clean shutdown."""
        await self._end(signal.SIGKILL)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s."""
        try:
            await self._end(signal.SIGTERM)
        except TimeoutError:
            await self._end(signal.SIGKILL)

    async def _end(self, sig: int) -> None:
        if self.process is None:
            return
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
        await asyncio.wait_for(self.process.wait(), 20)
        if self._drain is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain, 10)
        self.process = None


def node_proc(workdir: Path, *, shards: int = 2, extra: tuple[str, ...] = ()) -> Proc:
    """``ledgerq node`` on an ephemeral loopback port, its data in ``workdir/node``."""
    args = [LEDGERQ, "node", "--bind", "127.0.0.1:0", "--data-dir", str(workdir / "node")]
    return Proc([*args, "--shards", str(shards), *extra], workdir / "node.log")


def fault_ledger_proc(workdir: Path, *, commit_delay_ms: int = 20, verify: bool = False) -> Proc:
    """The plain-REST ledger (no ``/events``, no ``/subscriptions``) on a loopback port.

    Signatures are not verified by default, so the ledger's CPU (it shares the
    machine with the system under test) stays small and equal for every system.
    """
    args = [
        sys.executable,
        "-m",
        "ledgerq.testing.fault_ledger",
        "--bind",
        "127.0.0.1:0",
        "--commit-delay-ms",
        str(commit_delay_ms),
        *([] if verify else ["--no-verify"]),
    ]
    return Proc(args, workdir / "ledger.log")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (a ``ledgerq serve`` with
    workers, a decoding pool), read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def tree_cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds used so far by each process of the trees rooted at ``pids``."""
    used = {}
    for root in pids:
        for p in process_tree(root):
            with contextlib.suppress(OSError):
                used[p] = cpu_seconds(p)
    return used


def cpu_delta(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU used between two readings (a process that appeared meanwhile counts from 0)."""
    return sum(used - before.get(pid, 0.0) for pid, used in after.items())


def gateway_proc(
    workdir: Path, db: str, ledger: str, *, name: str = "gateway", env: Mapping[str, str] = {}
) -> Proc:
    """``ledgerq serve`` on PostgreSQL ``db``, submitting to ``ledger``; one
    process unless ``env`` sets ``LEDGERQ_WORKERS``."""
    args = [LEDGERQ, "serve", "--db", db, "--ledger", ledger, "--bind", "127.0.0.1:0"]
    return Proc(
        args, workdir / f"{name}.log", env={"LEDGERQ_CONFIG": "", "LEDGERQ_WORKERS": "1", **env}
    )


# -- workload -------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    service: str
    index: int
    batch_id: str
    batch: bytes  # the serialized Batch
    batch_list: bytes  # a BatchList of that batch alone


@dataclass
class Workload:
    """``services`` × ``per_service`` intkey batches: ``set k 0`` then ``inc k 1``s.

    Run in order, every key ends at ``per_service - 1``; a reorder makes a batch
    INVALID (an ``inc`` before the ``set``, or a ``set`` after ``inc``s).
    """

    services: int
    per_service: int
    signer: Signer = field(default_factory=Signer.generate)

    def __post_init__(self) -> None:
        self.run_tag = uuid.uuid4().hex[:6]
        self.batches: dict[str, list[Batch]] = {}
        for s in range(self.services):
            service = self.service_id(s)
            name = self.key(s)
            out = []
            for n in range(self.per_service):
                op = ("set", name, 0) if n == 0 else ("inc", name, 1)
                b = make_intkey_batch(self.signer, [op])
                out.append(
                    Batch(service, n, b.header_signature, b.serialized, encode_batch_list([b]))
                )
            self.batches[service] = out
        self.by_id = {b.batch_id: b for bs in self.batches.values() for b in bs}

    def service_id(self, s: int) -> str:
        return f"svc{s:05d}"

    def key(self, s: int) -> str:
        # Unique per workload so runs on one node never share a key (max 20 chars).
        return f"k{self.run_tag}{s:05d}"

    @property
    def total(self) -> int:
        return self.services * self.per_service


# -- watching the node ----------------------------------------------------------


class EventWatcher:
    """Follows the node's ``/events`` (final statuses) and timestamps each one."""

    def __init__(self, node_url: str) -> None:
        self.node_url = node_url
        self.events: dict[str, list[tuple[float, str]]] = defaultdict(list)
        self.seq: dict[str, int] = {}  # batch id -> the node's event sequence number (first)
        self.count = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    async def __aenter__(self) -> EventWatcher:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._connected.wait(), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        last: str | None = None
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                headers = {"Last-Event-ID": last} if last else {}
                try:
                    async with session.get(f"{self.node_url}/events", headers=headers) as resp:
                        self._connected.set()
                        async for raw in resp.content:
                            line = raw.decode().rstrip("\n")
                            if line.startswith("id: "):
                                last = line[4:]
                            elif line.startswith("data: "):
                                data = json.loads(line[6:])
                                self.events[data["id"]].append((time.monotonic(), data["status"]))
                                if last is not None:
                                    self.seq.setdefault(data["id"], int(last))
                                self.count += 1
                                self._changed.set()
                except (aiohttp.ClientError, TimeoutError):
                    await asyncio.sleep(0.05)

    def final_at(self, batch_id: str) -> float | None:
        seen = self.events.get(batch_id)
        return seen[0][0] if seen else None

    async def wait_for(self, ids: Sequence[str], timeout_s: float) -> bool:
        """Until every id has a final status; False on timeout."""
        deadline = time.monotonic() + timeout_s
        pending = [i for i in ids if i not in self.events]
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            pending = [i for i in pending if i not in self.events]
            if pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
        return True


class LedgerReport:
    """Watches the fault ledger: waits on its progress, then reads its report.

    The same interface as :class:`EventWatcher` (``events``, ``wait_for``),
    filled from the ledger's report (:meth:`collect`); it also knows when each
    batch was first POSTed (``first_post``), which gives the gap between a
    commit and the next batch of the service, and the violations.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: dict[str, list[tuple[float, str]]] = {}
        self.first_post: dict[str, float] = {}
        self.values: dict[str, int] = {}
        self.violations: list[dict[str, object]] = []
        self.counts: dict[str, int] = {}

    async def __aenter__(self) -> LedgerReport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def final_count(self) -> int:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.get(f"{self.url}/_fault/progress") as resp,
        ):
            return int((await resp.json())["final"])

    async def wait_for(self, ids: Sequence[str], timeout_s: float) -> bool:
        """Until as many batches as ``ids`` are final (a fresh ledger per run)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self.final_count() >= len(ids):
                await self.collect()
                return all(i in self.events for i in ids)
            await asyncio.sleep(0.05)  # polling another process for completion
        await self.collect()
        return False

    async def collect(self) -> None:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
            session.get(f"{self.url}/_fault/report") as resp,
        ):
            report = await resp.json()
        t0 = float(report["t0_monotonic"])
        for batch_id, b in report["batches"].items():
            if b["first_post_ms"] is not None:
                self.first_post[batch_id] = t0 + b["first_post_ms"] / 1000
            if b["final_ms"] is not None and b["status"] in ("COMMITTED", "INVALID"):
                self.events[batch_id] = [(t0 + b["final_ms"] / 1000, b["status"])]
        self.values = dict(report["values"])
        self.violations = list(report["violations"])
        self.counts = dict(report["counts"])


def workload_keys(workload: Workload) -> list[tuple[str, str]]:
    return [(workload.service_id(s), workload.key(s)) for s in range(workload.services)]


async def read_keys(node_url: str, keys: Iterable[tuple[str, str]]) -> dict[str, int | None]:
    """The intkey value of each ``(service, key)``'s key, read from the node's state."""
    import base64

    import cbor2

    out: dict[str, int | None] = {}
    async with aiohttp.ClientSession() as session:
        for service, key in keys:
            async with session.get(f"{node_url}/state/{make_address(key)}") as resp:
                if resp.status == 404:
                    out[service] = None
                    continue
                body = await resp.json()
            entries = cbor2.loads(base64.b64decode(body["data"]))
            out[service] = entries.get(key)
    return out


# -- PostgreSQL -----------------------------------------------------------------


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


def create_database(admin_url: str, prefix: str) -> str:
    """A fresh database; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return _with_db(admin_url, name)


async def backend_cpu_seconds(admin_url: str, db_url: str) -> dict[int, float] | None:
    """CPU seconds used so far by each PostgreSQL server process serving
    ``db_url``'s database; ``None`` for SQLite, or when they cannot be read
    (a server on another machine)."""
    if not db_url or db_url.startswith("sqlite"):
        return None
    name = db_url.rpartition("/")[2]
    try:
        async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))
            pids = [int(row[0]) for row in await cur.fetchall()]
    except psycopg.Error:
        return None
    used = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # a server on another machine, or gone
            used[pid] = cpu_seconds(pid)
    return used or None


def drop_database(admin_url: str, url: str) -> None:
    name = url.rpartition("/")[2]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
