"""Real processes for high-availability runs: one ledger — ``ledgerq node``, or
the fault ledger (``ledgerq.testing.fault_ledger``: Sawtooth's REST API
without events, judging every POST, injecting faults) — several ``ledgerq
serve`` on one PostgreSQL database, faults, and the invariants.

Used by the chaos tests (``tests/acceptance/test_ha_chaos.py``) and by
``ledgerq bench failover``. Everything binds 127.0.0.1 with ephemeral ports;
each process logs to a file in the work directory, which is where the harness
reads the address it listens on.

Fenced writes are audited: every gateway connects with its instance id as
``application_name`` (``PGAPPNAME``), and a trigger installed by
:func:`install_fence_audit` records any ``UPDATE`` of ``batches`` made by an
instance that does not hold the batch's service at that moment.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2
import psycopg

from ledgerq.codec import Signer, encode_batch_list, make_batch
from ledgerq.codec.intkey import make_address, make_intkey_transaction

LEDGERQ = str(Path(sys.executable).parent / "ledgerq")
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")

#: Claim timing for runs that must finish in seconds (see docs/ha.md).
FAST_CLAIMS = {
    "LEDGERQ_CLAIMS_RENEW_INTERVAL_MS": "200",
    "LEDGERQ_CLAIMS_TTL_MS": "1000",
    "LEDGERQ_CLAIMS_GRACE_MS": "400",
    "LEDGERQ_MONITOR_POLL_INTERVAL_S": "0.2",
    "LEDGERQ_SUBMITTER_POLL_TIMEOUT_S": "0.2",
    "LEDGERQ_LEDGER_TIMEOUT_SUBMIT_S": "2",
}

_AUDIT = """
CREATE TABLE IF NOT EXISTS fence_audit (
    writer     TEXT NOT NULL,
    service_id TEXT NOT NULL,
    batch_id   TEXT NOT NULL,
    claimant   TEXT
);
CREATE OR REPLACE FUNCTION fence_audit_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    holder TEXT;
BEGIN
    SELECT claimant INTO holder FROM service_id_claims WHERE service_id = NEW.service_id;
    IF holder IS DISTINCT FROM current_setting('application_name') THEN
        INSERT INTO fence_audit VALUES
            (current_setting('application_name'), NEW.service_id, NEW.batch_id, holder);
    END IF;
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS batches_fence_audit ON batches;
CREATE TRIGGER batches_fence_audit BEFORE UPDATE ON batches
    FOR EACH ROW EXECUTE FUNCTION fence_audit_check();
"""


def install_fence_audit(pg_url: str) -> None:
    """Record every batch update made by an instance not holding the service."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(_AUDIT.encode())


_WRITE_LOG = """
CREATE TABLE IF NOT EXISTS write_log (
    at         BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    writer     TEXT NOT NULL DEFAULT current_setting('application_name'),
    service_id TEXT NOT NULL,
    batch_id   TEXT NOT NULL,
    what       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS write_log_since (at BIGINT NOT NULL);
INSERT INTO write_log_since SELECT 9223372036854775807 WHERE NOT EXISTS (
    SELECT FROM write_log_since);
CREATE OR REPLACE FUNCTION write_log_record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    what TEXT;
BEGIN
    IF ledgerq_now_ms() < (SELECT at FROM write_log_since) THEN
        RETURN NULL;
    END IF;
    IF TG_TABLE_NAME = 'batch_statuses' THEN
        what := 'status ' || NEW.dlt_status;
    ELSIF TG_TABLE_NAME = 'submissions' THEN
        what := 'submission';
    ELSIF NEW.submitted AND (TG_OP = 'INSERT' OR NOT OLD.submitted) THEN
        what := 'marked submitted';
    ELSIF TG_OP = 'UPDATE' AND NEW.status IS DISTINCT FROM OLD.status THEN
        what := 'batch ' || coalesce(NEW.status, 'none');
    ELSE
        RETURN NULL;
    END IF;
    INSERT INTO write_log (service_id, batch_id, what)
        VALUES (NEW.service_id, NEW.batch_id, what);
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION write_log_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ledgerq_now_ms() < (SELECT at FROM write_log_since) THEN
        RETURN NULL;
    END IF;
    INSERT INTO write_log (service_id, batch_id, what)
    SELECT n.service_id, '',
           CASE WHEN n.claimant IS NOT NULL THEN 'claimed' ELSE 'unclaimed ' || o.claimant END
    FROM new_rows AS n JOIN old_rows AS o USING (service_id)
    WHERE n.claimant IS DISTINCT FROM o.claimant;
    RETURN NULL;
END
$$;
-- One statement-level trigger per claim statement (thousands of rows at once).
DROP TRIGGER IF EXISTS write_log_claims ON service_id_claims;
CREATE TRIGGER write_log_claims AFTER UPDATE ON service_id_claims
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION write_log_claims();
DROP TRIGGER IF EXISTS write_log_statuses ON batch_statuses;
CREATE TRIGGER write_log_statuses AFTER INSERT OR UPDATE ON batch_statuses
    FOR EACH ROW EXECUTE FUNCTION write_log_record();
DROP TRIGGER IF EXISTS write_log_submissions ON submissions;
CREATE TRIGGER write_log_submissions AFTER INSERT OR UPDATE ON submissions
    FOR EACH ROW EXECUTE FUNCTION write_log_record();
DROP TRIGGER IF EXISTS write_log_batches ON batches;
CREATE TRIGGER write_log_batches AFTER UPDATE ON batches
    FOR EACH ROW EXECUTE FUNCTION write_log_record();
"""


def install_write_log(pg_url: str) -> None:
    """Log, from :func:`start_write_log` on, every write of a batch's state (marked
    submitted, its status, the ledger's answers, submissions) and every claim taken or
    voided, with its time (``clock_timestamp()``, when the row was written) and writer
    (the instance's ``application_name``): what each instance did, in order."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(_WRITE_LOG.encode())


def start_write_log(pg_url: str, since_ms: int) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE write_log_since SET at = %s", (since_ms,))


def write_log(pg_url: str) -> list[tuple[int, str, str, str, str]]:
    """(at, writer, service, batch, what) in the order written."""
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT at, writer, service_id, batch_id, what FROM write_log ORDER BY at, ctid"
        ).fetchall()
    return [(int(a), w, s, b, x) for a, w, s, b, x in rows]


def fence_violations(pg_url: str) -> list[tuple[str, str, str, str | None]]:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT writer, service_id, batch_id, claimant FROM fence_audit")
        return [(w, s, b, c) for w, s, b, c in rows.fetchall()]


class Process:
    """A ``ledgerq`` subprocess logging to a file."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        env: Mapping[str, str],
        workdir: Path,
        *,
        program: Sequence[str] = (LEDGERQ,),
        wait: bool = True,
    ):
        """``wait=False`` returns once the process is started; :meth:`wait_listening`
        then waits for it (several processes start at once that way)."""
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [*program, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=workdir,
        )
        self.url = self.wait_listening() if wait else ""
        self.stopped = False
        #: (frozen at, thawed at) of every SIGSTOP sent from outside (time.time()).
        self.pauses: list[tuple[float, float | None]] = []

    def wait_listening(self, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log_path.read_text(errors="replace"))
            if match:
                self.url = match.group(1)
                return self.url
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.tail()}")
            time.sleep(0.05)  # waiting for the process to come up, not for time to pass
        raise RuntimeError(f"{self.name} did not listen within {timeout_s} s: {self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()  # SIGKILL ends a stopped process too
            self.proc.wait(30)
        self._log.close()

    def terminate(self, timeout_s: float = 30.0) -> None:
        if self.alive:
            if self.stopped:
                self.cont()
            self.proc.terminate()
            self.proc.wait(timeout_s)
        self._log.close()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True
        self.pauses.append((time.time(), None))

    @property
    def stopped_itself(self) -> bool:
        """Whether the process is in the stopped state (e.g. it SIGSTOPped itself)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[0] in ("T", "t")

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False
        if self.pauses and self.pauses[-1][1] is None:
            self.pauses[-1] = (self.pauses[-1][0], time.time())


def _request(
    url: str, method: str = "GET", body: bytes | None = None, timeout_s: float = 10.0
) -> Any:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/octet-stream")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read() or b"null")


@dataclass
class Workload:
    """Per service, an intkey ``set k 0`` then ``inc k 1`` batches, in order.

    Exactly-once execution leaves each key at ``batches - 1``; order shows in
    the node's fingerprints (strictly increasing in creation order).
    """

    services: int
    batches_per_service: int
    signer: Signer = field(default_factory=Signer.generate)
    #: Each batch declares a dependency on the one before (a chain, for the
    #: pipelined strategy).
    chained: bool = False
    #: service id → (batch id, serialized batch) in creation order.
    batches: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for s in range(self.services):
            service_id, key = f"svc-{s:03d}", f"k{s:03d}"
            made = []
            previous: list[str] = []
            for n in range(self.batches_per_service):
                verb, value = ("set", 0) if n == 0 else ("inc", 1)
                tx = make_intkey_transaction(
                    self.signer, verb, key, value, dependencies=previous if self.chained else ()
                )
                b = make_batch(self.signer, [tx])
                previous = [tx.header_signature]
                made.append((b.header_signature, encode_batch_list([b])))
            self.batches[service_id] = made

    def key(self, service_id: str) -> str:
        return "k" + service_id.removeprefix("svc-")

    def all_ids(self) -> list[str]:
        return [bid for made in self.batches.values() for bid, _ in made]


@dataclass
class Cluster:
    workdir: Path
    pg_url: str
    env: Mapping[str, str] = field(default_factory=lambda: dict(FAST_CLAIMS))
    node: Process | None = None
    #: The fault ledger, when the cluster runs against it instead of the node.
    fault_ledger: Process | None = None
    gateways: dict[str, Process] = field(default_factory=dict)
    generation: int = 0

    def start_node(self, *extra: str) -> Process:
        self.node = Process(
            "node", ["node", "--bind", "127.0.0.1:0", "--shards", "2", *extra], {}, self.workdir
        )
        return self.node

    def start_fault_ledger(self, *flags: str) -> Process:
        """The fault ledger as the cluster's ledger; ``flags`` set its fault plan."""
        self.fault_ledger = Process(
            "fault-ledger",
            ["--bind", "127.0.0.1:0", *flags],
            {},
            self.workdir,
            program=(sys.executable, "-m", "ledgerq.testing.fault_ledger"),
        )
        return self.fault_ledger

    @property
    def ledger(self) -> Process:
        ledger = self.fault_ledger or self.node
        assert ledger is not None, "start a node or a fault ledger first"
        return ledger

    def start_gateway(
        self,
        name: str,
        extra_env: Mapping[str, str] | None = None,
        *,
        ledger_url: str | None = None,
        wait: bool = True,
    ) -> Process:
        """Start ``ledgerq serve`` as ``gw-<name>-<n>``; ``extra_env`` e.g. its failpoints;
        ``ledger_url`` the ledger as this gateway reaches it (e.g. a :class:`LedgerCut`);
        ``wait=False`` as for :class:`Process`."""
        self.generation += 1
        instance = f"gw-{name}-{self.generation}"
        env = {
            **self.env,
            "LEDGERQ_DB": self.pg_url,
            "LEDGERQ_LEDGER": "sawtooth+" + (ledger_url or self.ledger.url),
            "LEDGERQ_BIND": "127.0.0.1:0",
            "LEDGERQ_CLAIMS_INSTANCE_ID": instance,
            "PGAPPNAME": instance,
            # One process per instance: faults hit the instance itself.
            "LEDGERQ_WORKERS": "1",
            "LEDGERQ_LOG_LEVEL": "info",
            **(extra_env or {}),
        }
        gw = Process(instance, ["serve"], env, self.workdir, wait=wait)
        self.gateways[name] = gw
        return gw

    def start_gateways(self, *names: str) -> list[Process]:
        """Start several gateways at once and wait until each listens."""
        started = [self.start_gateway(name, wait=False) for name in names]
        for gw in started:
            gw.wait_listening()
        return started

    def live_gateways(self) -> list[Process]:
        return [g for g in self.gateways.values() if g.alive and not g.stopped]

    def post(self, gateway: Process, service_id: str, serialized: bytes) -> None:
        _request(f"{gateway.url}/batches?service_id={service_id}", "POST", serialized)

    def post_round_robin(
        self, items: Iterable[tuple[str, bytes]], to: Sequence[Process] | None = None
    ) -> None:
        """Post each ``(service, batch list)`` to the next live gateway (of ``to``, if
        given), retrying elsewhere."""
        n = 0
        for service_id, body in items:
            for _ in range(20):
                live = [g for g in self.live_gateways() if to is None or g in to]
                gw = live[n % len(live)]
                n += 1
                try:
                    self.post(gw, service_id, body)
                    break
                except (urllib.error.URLError, OSError, TimeoutError):
                    continue
            else:
                raise RuntimeError(f"no gateway accepted a batch of {service_id}")

    def drop_connections(self) -> int:
        """``pg_terminate_backend`` every gateway connection; returns how many."""
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name LIKE %s",
                ("gw-%",),
            ).fetchall()
        return len(rows)

    def close(self) -> None:
        for gw in self.gateways.values():
            gw.kill()
        for ledger in (self.node, self.fault_ledger):
            if ledger is not None:
                ledger.kill()


class LedgerCut:
    """A TCP relay between one gateway and its ledger that can cut the gateway off
    mid-run, while it goes on running: after :meth:`cut`, nothing the ledger sends
    reaches the gateway (answers to its POSTs, status reads, the event stream),
    and the POSTs it sends on every other connection (odd-numbered ones) do not
    reach the ledger either.

    That is how ``ledgerq bench failover`` puts batches *mid-submission*
    deterministically: the gateway marks each batch submitted and POSTs it, and
    no answer ever comes, so at the kill those services have a batch
    ``{submitted, no answer}`` — some the ledger has (the POST went through, its
    answer was swallowed), some it never saw. Before :meth:`cut` it relays
    bytes unchanged, both ways.
    """

    def __init__(self, upstream_url: str):
        host, port = upstream_url.removeprefix("http://").rsplit(":", 1)
        self._upstream = (host, int(port))
        self._cut = False
        self._connections = 0
        #: POST requests the ledger never saw / answers withheld, after the cut.
        self.posts_dropped = 0
        self.chunks_withheld = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the ledger relay did not start")
        assert self._server is not None
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)

        self._loop.run_until_complete(start())
        ready.set()
        self._loop.run_forever()

    def cut(self) -> None:
        """From now on: no byte from the ledger to the gateway, half the POSTs dropped."""
        self._loop.call_soon_threadsafe(setattr, self, "_cut", True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self._connections
        self._connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        posting = False

        async def to_ledger() -> None:
            nonlocal posting
            while chunk := await _read(reader):
                # A keep-alive connection carries one request after another; a
                # new one starts a chunk (the client waits for each answer).
                if chunk.startswith(b"POST "):
                    posting = True
                elif chunk[:4] in (b"GET ", b"HEAD", b"PUT ", b"DELE"):
                    posting = False
                if self._cut and posting and number % 2:
                    if chunk.startswith(b"POST "):
                        self.posts_dropped += 1
                    continue
                up_writer.write(chunk)
                with contextlib.suppress(OSError):
                    await up_writer.drain()

        async def to_gateway() -> None:
            while chunk := await _read(up_reader):
                if self._cut:
                    self.chunks_withheld += 1
                    continue
                writer.write(chunk)
                with contextlib.suppress(OSError):
                    await writer.drain()

        tasks = [asyncio.ensure_future(to_ledger()), asyncio.ensure_future(to_gateway())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for w in (writer, up_writer):
                w.close()

    def close(self) -> None:
        """Stop listening and end every relay (both sides closed)."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
            await asyncio.sleep(0.05)  # let the closed transports drop their sockets

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _read(reader: asyncio.StreamReader) -> bytes:
    """The next chunk, or b"" once the peer closed or reset the connection."""
    try:
        return await reader.read(65536)
    except OSError:
        return b""


def store_statuses(pg_url: str) -> dict[str, int]:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT coalesce(status, 'none'), count(*) FROM batches GROUP BY 1"
        ).fetchall()
    return {s: n for s, n in rows}


def wait_all_final(pg_url: str, total: int, timeout_s: float) -> dict[str, int]:
    """Wait until the store holds ``total`` batches, all final; returns the status counts."""
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = store_statuses(pg_url)
        final = sum(counts.get(s, 0) for s in ("Committed", "Valid", "Invalid"))
        if final >= total:
            return counts
        time.sleep(0.2)  # polling an outside system for completion
    return counts


def node_value(node_url: str, key: str) -> int | None:
    try:
        doc = _request(f"{node_url}/state/{make_address(key)}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return int(cbor2.loads(base64.b64decode(doc["data"]))[key])


def node_fingerprint(node_url: str, batch_id: str) -> tuple[int, int] | None:
    try:
        doc = _request(f"{node_url}/fingerprints/{batch_id}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    b, _, t = doc["fingerprint"].partition(".")
    return int(b), int(t)


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (\S+): (.*)$")
_SUBMISSION = re.compile(r"submission (started|finished) batch=([0-9a-f]+) ")


def _log_time(stamp: str) -> float:
    import datetime

    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def frozen_mid_post(gateways: Iterable[Process]) -> set[str]:
    """Batch id prefixes a gateway was submitting when it was frozen (SIGSTOP, from
    outside or by a ``stop`` failpoint), whose submission ended only after it thawed.

    Such a gateway may write a POST it had already decided on after its claim
    moved on and the new holder resent the batch — the late copy ``docs/ha.md``
    ("Safety") bounds but no gateway can prevent: no lock covers an HTTP
    request. Every other POST of a batch the ledger holds is a defect.
    """
    prefixes: set[str] = set()
    for gw in gateways:
        freezes = [(a, b if b is not None else float("inf")) for a, b in gw.pauses]
        started: dict[str, float] = {}
        spans: list[tuple[str, float, float]] = []
        frozen_at: float | None = None
        for line in gw.log_path.read_text(errors="replace").splitlines():
            m = _LOG_LINE.match(line)
            if not m:
                continue
            at, message = _log_time(m.group(1)), m.group(3)
            if message.startswith("failpoint ") and ": stop at hit" in message:
                frozen_at = at
            elif message.startswith("failpoint ") and message.endswith(": resumed"):
                if frozen_at is not None:
                    freezes.append((frozen_at, at))
                frozen_at = None
            sub = _SUBMISSION.search(message)
            if sub and sub.group(1) == "started":
                started[sub.group(2)] = at
            elif sub:
                spans.append((sub.group(2), started.pop(sub.group(2), at), at))
        if frozen_at is not None:
            freezes.append((frozen_at, float("inf")))
        spans += [(p, t, float("inf")) for p, t in started.items()]
        for prefix, begin, end in spans:
            if any(begin <= a and end >= b for a, b in freezes):
                prefixes.add(prefix)
    return prefixes


def check_invariants(
    pg_url: str,
    node_url: str,
    workload: Workload,
    *,
    fault_ledger: bool = False,
    frozen: set[str] | None = None,
) -> list[str]:
    """Everything the HA design promises, checked after a run; returns the violations.

    ``fault_ledger``: ``node_url`` is the fault ledger's, whose report judges
    order per key, exactly-once values and every POST: no batch it held may be
    POSTed again, but for the late copies of gateways frozen mid-POST
    (``frozen``, from :func:`frozen_mid_post`)."""
    problems: list[str] = []
    counts = store_statuses(pg_url)
    total = sum(len(v) for v in workload.batches.values())
    if counts.get("Committed", 0) != total:
        problems.append(f"not every batch committed: {counts} (expected {total} Committed)")
    if fault_ledger:
        problems += _judged_by_fault_ledger(node_url, workload, frozen or set())
    else:
        problems += _judged_by_node(node_url, workload)
    with psycopg.connect(pg_url) as conn:
        locked = conn.execute(
            "SELECT service_id, batch_id FROM batches WHERE NOT final LIMIT 5"
        ).fetchall()
    if locked:
        problems.append(f"services left with open batches: {locked}")
    violations = fence_violations(pg_url)
    if violations:
        problems.append(f"writes by fenced-off instances landed: {violations[:5]}")
    return problems


def _judged_by_fault_ledger(url: str, workload: Workload, frozen: set[str]) -> list[str]:
    report = _request(f"{url}/_fault/report", timeout_s=60)
    problems = []
    # Submission logs name batches by their first 16 characters.
    unexplained = [v for v in report["violations"] if v["batch_id"][:16] not in frozen]
    if unexplained:
        problems.append(f"POSTs of batches the ledger held: {unexplained[:5]}")
    for service_id, made in workload.batches.items():
        key = workload.key(service_id)
        order = report["order"].get(key, [])
        if order != [bid for bid, _ in made]:
            problems.append(f"{service_id}: committed {len(order)} of {len(made)}, or out of order")
        value = report["values"].get(key)
        if value != len(made) - 1:
            problems.append(f"{service_id}: key holds {value}, expected {len(made) - 1}")
    return problems


def _judged_by_node(node_url: str, workload: Workload) -> list[str]:
    problems = []
    for service_id, made in workload.batches.items():
        value = node_value(node_url, workload.key(service_id))
        if value != len(made) - 1:
            problems.append(
                f"{service_id}: key holds {value}, expected {len(made) - 1} "
                "(a batch lost or executed twice)"
            )
        prints = [node_fingerprint(node_url, bid) for bid, _ in made]
        if any(p is None for p in prints):
            problems.append(f"{service_id}: some batches never reached the node")
        elif prints != sorted(prints):  # type: ignore[type-var]
            problems.append(f"{service_id}: committed out of creation order: {prints}")
    return problems
