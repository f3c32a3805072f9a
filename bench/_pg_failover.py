"""PostgreSQL fails over under gateways at work: a primary and a synchronous
standby (throwaway clusters, ``tests/pg_server.py``), ``ledgerq node``, two
``ledgerq serve`` given both hosts in one URL
(``target_session_attrs=read-write``), clients posting ordered intkey
batches; the primary SIGKILLed mid-run and the standby promoted
``outage_s`` later.

Each client thread owns some services and posts their batches one POST at a
time, each to the next gateway in turn, a service's next batch only once its
last one was acknowledged (202); any other answer (503, a refused
connection, no answer within the client's timeout) is retried a moment
later, as a client of a queue would. Every request is recorded: when it
started and ended, at which gateway, what it got.

Used by ``tests/acceptance/test_pg_failover.py`` (does what the docs promise
hold?) and ``ledgerq bench failover --primary-lost`` (how long until the
gateways accept again, how long answers took during the outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench._cluster import (
    Cluster,
    Workload,
    check_invariants,
    install_fence_audit,
    wait_all_final,
)
from ledgerq.store import open_store
from tests.pg_server import ThrowawayCluster, find_bindir, multi_host_url

#: A client's own limit on one request: an answer later than this is none.
CLIENT_TIMEOUT_S = 30.0
#: How long a client waits before retrying a request that was not accepted.
RETRY_PAUSE_S = 0.1


@dataclass(frozen=True, slots=True)
class Attempt:
    """One POST: when it started and ended (``time.time()``), where, what it got."""

    gateway: str
    service_id: str
    started: float
    ended: float
    #: The HTTP status, or 0 when no answer came (refused, reset, timed out).
    status: int
    #: For status 0, why.
    error: str = ""

    @property
    def took(self) -> float:
        return self.ended - self.started


@dataclass
class PrimaryLostRun:
    attempts: list[Attempt]
    #: time.time() of the kill and of the promotion (the standby accepting writes).
    killed_at: float
    promoted_at: float
    #: Per gateway, its first 202 to a request started after the promotion (None: none).
    accepting_again: dict[str, float | None]
    problems: list[str]
    #: Gateways alive at the end, and whether each is the process started at first.
    same_processes: bool
    bound_s: float
    batches: int
    elapsed_s: float
    #: Each gateway's whole log, by instance name.
    logs: dict[str, str] = field(default_factory=dict)

    def during_outage(self) -> list[Attempt]:
        """The requests under way at some moment between the kill and the promotion."""
        return [
            a for a in self.attempts if a.ended > self.killed_at and a.started < self.promoted_at
        ]


def _post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT_S) as resp:
            resp.read()
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code, ""
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return 0, repr(exc)


class Clients:
    """Client threads posting a workload, in order per service, to the gateways."""

    def __init__(self, cluster: Cluster, workload: Workload, threads: int) -> None:
        self._cluster = cluster
        self._workload = workload
        self._lock = threading.Lock()
        self.attempts: list[Attempt] = []
        self.acked = 0
        self._stop = threading.Event()
        services = sorted(workload.batches)
        self._threads = [
            threading.Thread(target=self._run, args=(n, services[n::threads]), daemon=True)
            for n in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for every batch to be acknowledged; False if some were not in time."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))
        self._stop.set()
        return not any(t.is_alive() for t in self._threads)

    def _run(self, n: int, services: list[str]) -> None:
        gateways = sorted(self._cluster.gateways.values(), key=lambda g: g.name)
        turn = n
        next_batch = dict.fromkeys(services, 0)
        while next_batch and not self._stop.is_set():
            failed = False
            for service_id in list(next_batch):
                made = self._workload.batches[service_id]
                gw = gateways[turn % len(gateways)]
                turn += 1
                started = time.time()
                status, error = _post(
                    f"{gw.url}/batches?service_id={service_id}", made[next_batch[service_id]][1]
                )
                attempt = Attempt(gw.name, service_id, started, time.time(), status, error)
                with self._lock:
                    self.attempts.append(attempt)
                    if status == 202:
                        self.acked += 1
                if status == 202:
                    next_batch[service_id] += 1
                    if next_batch[service_id] == len(made):
                        del next_batch[service_id]
                else:
                    failed = True
            if failed:
                self._stop.wait(RETRY_PAUSE_S)


def _migrate(url: str) -> None:
    async def go() -> None:
        store = await open_store(url)
        await store.close()

    asyncio.run(go())


def run_primary_lost(
    workdir: Path,
    *,
    services: int,
    batches: int,
    clients: int,
    outage_s: float,
    bound_s: float,
    kill_at: float = 0.3,
    fast_claims: bool = True,
    env: Mapping[str, str] | None = None,
    finish_timeout_s: float = 180.0,
) -> PrimaryLostRun:
    """The whole run: clusters, node, two gateways, clients; the primary
    killed once ``kill_at`` of the batches were acknowledged, the standby
    promoted ``outage_s`` later; then every batch acknowledged and final,
    and the invariants checked (``check_invariants``).

    ``bound_s``: the gateways' ``store.outage_timeout_s``. ``fast_claims``:
    the claim timings of the chaos tests (``FAST_CLAIMS``), else the defaults."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries found")
    primary = ThrowawayCluster(bindir)
    standby: ThrowawayCluster | None = None
    cluster: Cluster | None = None
    try:
        primary.start()
        standby = primary.start_standby(synchronous=True)
        url = multi_host_url(primary, standby)
        _migrate(url)
        install_fence_audit(url)
        cluster = Cluster(workdir, url)
        cluster.env = {
            **(cluster.env if fast_claims else {}),
            "LEDGERQ_STORE_OUTAGE_TIMEOUT_S": str(bound_s),
            **(env or {}),
        }
        cluster.start_node()
        for name in ("a", "b"):
            cluster.start_gateway(name)
        pids = {name: gw.proc.pid for name, gw in cluster.gateways.items()}
        workload = Workload(services, batches)
        total = services * batches
        load = Clients(cluster, workload, clients)
        began = time.monotonic()
        load.start()
        while load.acked < total * kill_at:
            time.sleep(0.01)  # polling the clients' progress
        primary.kill()
        killed_at = time.time()
        time.sleep(outage_s)  # the outage: how long no primary answers
        standby.promote()
        promoted_at = time.time()
        done = load.join(finish_timeout_s)
        problems = [] if done else ["not every batch was acknowledged within the wait"]
        wait_all_final(url, total, finish_timeout_s)
        problems += check_invariants(url, cluster.ledger.url, workload)
        elapsed = time.monotonic() - began
        accepting: dict[str, float | None] = {}
        for name, gw in cluster.gateways.items():
            after = [
                a.ended - promoted_at
                for a in load.attempts
                if a.gateway == gw.name and a.status == 202 and a.started >= promoted_at
            ]
            accepting[name] = min(after) if after else None
        same = all(gw.alive and gw.proc.pid == pids[name] for name, gw in cluster.gateways.items())
        return PrimaryLostRun(
            attempts=load.attempts,
            killed_at=killed_at,
            promoted_at=promoted_at,
            accepting_again=accepting,
            problems=problems,
            same_processes=same,
            bound_s=bound_s,
            batches=total,
            elapsed_s=elapsed,
            logs={
                gw.name: gw.log_path.read_text(errors="replace") for gw in cluster.gateways.values()
            },
        )
    finally:
        if cluster is not None:
            cluster.close()
        for c in (standby, primary):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.stop()
