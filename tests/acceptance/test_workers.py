"""``ledgerq serve --workers 2`` for real: one port, two processes.

SQLite: worker 0 runs the gateway (pipeline and in-process node), worker 1
takes requests; a batch accepted by either is submitted at once (the
pipeline's poll fallback is set to five minutes, so only the workers' bus
can wake it), a second ``serve`` on the file is refused, a killed worker is
restarted, and the workers die with their supervisor. PostgreSQL: every
worker is an instance sharing the services through claims; killing one
moves its services to the other, and every batch is still committed once,
in order. These tests wait on real processes; they assert no speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench._cluster import (
    LEDGERQ,
    Cluster,
    Process,
    Workload,
    check_invariants,
    install_fence_audit,
    wait_all_final,
)
from ledgerq.store import open_store

pytestmark = [pytest.mark.slow]

#: The pipeline's fallbacks are far longer than any wait below: only
#: wake-ups (in-process, the workers' bus, NOTIFY) move batches on time.
SLOW_FALLBACKS = {
    "LEDGERQ_SUBMITTER_POLL_TIMEOUT_S": "300",
    "LEDGERQ_MONITOR_POLL_INTERVAL_S": "300",
}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _post(url: str, service_id: str, body: bytes) -> None:
    """POST, retrying a connection a dying worker reset (as a client would)."""
    for _ in range(20):
        req = urllib.request.Request(
            f"{url}/batches?service_id={service_id}", data=body, method="POST"
        )
        req.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 202
                return
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: stored before the reset, already tracked
                raise
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)  # the kernel moves new connections to a live worker
    raise AssertionError(f"no worker accepted a batch of {service_id}")


def _wait(predicate: Any, what: str, proc: Process, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        assert proc.alive, proc.tail(40)
        time.sleep(0.1)  # polling real processes
    raise AssertionError(f"timed out waiting for {what}\n{proc.tail(40)}")


def _workers(url: str) -> list[dict[str, Any]]:
    try:
        return list(_get(f"{url}/instances").get("workers", []))
    except OSError:
        return []


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too (its parent, the supervisor, is dead).
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def sqlite_gateway(tmp_path: Path) -> Iterator[Process]:
    env = {
        **SLOW_FALLBACKS,
        "LEDGERQ_DB": f"sqlite:///{tmp_path / 'g.sqlite3'}",
        "LEDGERQ_BIND": "127.0.0.1:0",
        "LEDGERQ_NODE_EPHEMERAL": "true",
        "LEDGERQ_WORKERS": "2",
        "LEDGERQ_CONFIG": "",
    }
    gw = Process("gw", ["serve"], env, tmp_path)
    try:
        yield gw
    finally:
        gw.kill()


def test_sqlite_workers_share_the_port_and_the_work(
    sqlite_gateway: Process, tmp_path: Path
) -> None:
    gw = sqlite_gateway
    workers = _wait(lambda: len(_workers(gw.url)) == 2 and _workers(gw.url), "two workers", gw)
    assert [(w["index"], w["role"]) for w in workers] == [(0, "gateway"), (1, "ingest")]
    # A second gateway on the same file is refused, naming the supervisor.
    second = subprocess.run(
        [LEDGERQ, "serve", "--db", f"sqlite:///{tmp_path / 'g.sqlite3'}", "--bind", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LEDGERQ_CONFIG": ""},
    )
    assert second.returncode != 0
    assert f"pid {gw.proc.pid}" in second.stderr
    # Every POST on its own connection: the kernel spreads them over both.
    workload = Workload(services=6, batches_per_service=8)
    for n in range(workload.batches_per_service):
        for service_id, made in workload.batches.items():
            _post(gw.url, service_id, made[n][1])
    ids = workload.all_ids()

    def all_committed() -> bool:
        for service_id, made in workload.batches.items():
            chunk = ",".join(bid for bid, _ in made)
            statuses = _get(f"{gw.url}/batch_statuses?id={chunk}&service_id={service_id}")
            if any(s["status"] != "COMMITTED" for s in statuses["data"]):
                return False
        return True

    _wait(all_committed, "every batch committed", gw)
    # Peers' counts arrive with their next hello (every second).
    accepted = _wait(
        lambda: (
            counts
            if sum((counts := {w["index"]: w["accepted"] for w in _workers(gw.url)}).values())
            == len(ids)
            else None
        ),
        "every acceptance counted",
        gw,
    )
    assert min(accepted.values()) > 0, accepted  # both took requests
    # /metrics, whichever worker answers, counts every worker's events.
    for _ in range(6):
        with urllib.request.urlopen(f"{gw.url}/metrics", timeout=30) as resp:
            lines = resp.read().decode().splitlines()
        assert f"ledgerq_batches_accepted_total {float(len(ids))}" in lines
        posted = next(
            float(line.rpartition(" ")[2])
            for line in lines
            if line.startswith('ledgerq_submission_attempts_total{response="accepted"}')
        )
        assert posted >= len(ids)
    # So does the dashboard's data: throughput and recent batches of both.
    for _ in range(6):
        doc = _get(f"{gw.url}/dashboard/data?recent=200&seconds=600")
        assert sum(doc["throughput"]["accepted"]) == len(ids)
        assert sorted(b["id"] for b in doc["recent"]) == sorted(ids)
        # The header names the gateway's ledger, from the ingest worker too.
        assert doc["ledger"] == "in-process node", doc["ledger"]


def test_a_dead_worker_is_restarted_and_workers_die_with_the_supervisor(
    sqlite_gateway: Process,
) -> None:
    gw = sqlite_gateway
    workers = _wait(lambda: len(_workers(gw.url)) == 2 and _workers(gw.url), "two workers", gw)
    ingest = next(w for w in workers if w["role"] == "ingest")
    os.kill(ingest["pid"], signal.SIGKILL)
    restarted = _wait(
        lambda: [w for w in _workers(gw.url) if w["index"] == 1 and w["restarts"] == 1],
        "worker 1 restarted",
        gw,
    )
    assert restarted[0]["pid"] != ingest["pid"]
    pids = [w["pid"] for w in _workers(gw.url)]
    workload = Workload(services=2, batches_per_service=3)
    for n in range(3):
        for service_id, made in workload.batches.items():
            _post(gw.url, service_id, made[n][1])
    # SIGKILL the supervisor: its workers follow (nothing keeps the port).
    gw.kill()
    deadline = time.monotonic() + 30
    while not all(_pid_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"workers {pids} outlived their supervisor"
        time.sleep(0.05)  # waiting for the kernel to deliver PDEATHSIG


def test_sigterm_stops_every_worker_cleanly(sqlite_gateway: Process) -> None:
    gw = sqlite_gateway
    workers = _wait(lambda: len(_workers(gw.url)) == 2 and _workers(gw.url), "two workers", gw)
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(60) == 0, gw.tail(40)
    assert all(_pid_gone(w["pid"]) for w in workers)


async def _migrate(url: str) -> None:
    store = await open_store(url)
    await store.close()


@pytest.mark.pg
def test_postgres_workers_are_instances_and_fail_over(pg_url: str, tmp_path: Path) -> None:
    asyncio.run(_migrate(pg_url))
    install_fence_audit(pg_url)  # workers name their sessions after their instance
    cluster = Cluster(tmp_path, pg_url)
    try:
        cluster.start_node()
        gw = cluster.start_gateway("a", {"LEDGERQ_WORKERS": "2", **SLOW_FALLBACKS})
        workers = _wait(lambda: len(_workers(gw.url)) == 2 and _workers(gw.url), "two workers", gw)
        assert [w["instance_id"] for w in workers] == ["gw-a-1-0", "gw-a-1-1"]
        assert {w["role"] for w in workers} == {"gateway"}
        workload = Workload(services=8, batches_per_service=6)
        for n in range(3):
            for service_id, made in workload.batches.items():
                _post(gw.url, service_id, made[n][1])
        # Both instances hold services (the share evens out after the TTL).
        _wait(
            lambda: sum(1 for i in _get(f"{gw.url}/instances")["data"] if i["claims"]) == 2,
            "both workers holding services",
            gw,
        )
        victim = workers[0]
        os.kill(victim["pid"], signal.SIGKILL)
        for n in range(3, 6):
            for service_id, made in workload.batches.items():
                _post(gw.url, service_id, made[n][1])
        counts = wait_all_final(pg_url, len(workload.all_ids()), 180)
        assert cluster.node is not None
        problems = check_invariants(pg_url, cluster.node.url, workload)
        assert not problems, f"{problems}\n{counts}\n{gw.tail(40)}"
        # The restarted worker is a new instance.
        _wait(
            lambda: any(
                i["instance_id"] == "gw-a-1-0.1" and i["live"]
                for i in _get(f"{gw.url}/instances")["data"]
            ),
            "the restarted worker registered as a new instance",
            gw,
        )
    finally:
        cluster.close()


def test_sqlite_gateway_worker_killed_mid_run_is_restarted_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    # The node keeps its state on disk here: a restarted gateway worker
    # reopens the same ledger, so batches committed before the kill stay.
    env = {
        **SLOW_FALLBACKS,
        "LEDGERQ_DB": f"sqlite:///{tmp_path / 'g.sqlite3'}",
        "LEDGERQ_BIND": "127.0.0.1:0",
        "LEDGERQ_WORKERS": "2",
        "LEDGERQ_CONFIG": "",
    }
    gw = Process("gw", ["serve"], env, tmp_path)
    try:
        workers = _wait(lambda: len(_workers(gw.url)) == 2 and _workers(gw.url), "workers", gw)
        pipeline = next(w for w in workers if w["role"] == "gateway")
        workload = Workload(services=4, batches_per_service=6)
        for n in range(3):
            for service_id, made in workload.batches.items():
                _post(gw.url, service_id, made[n][1])
        os.kill(pipeline["pid"], signal.SIGKILL)
        # Meanwhile the ingest worker still accepts (the file is shared).
        for n in range(3, 6):
            for service_id, made in workload.batches.items():
                _post(gw.url, service_id, made[n][1])
        _wait(
            lambda: [w for w in _workers(gw.url) if w["index"] == 0 and w["restarts"] == 1],
            "the gateway worker restarted",
            gw,
        )

        def statuses() -> list[str]:
            out = []
            for service_id, made in workload.batches.items():
                chunk = ",".join(bid for bid, _ in made)
                try:
                    got = _get(f"{gw.url}/batch_statuses?id={chunk}&service_id={service_id}")
                except OSError:  # a connection the killed worker's socket had queued
                    return []
                out += [s["status"] for s in got["data"]]
            return out

        # Every batch committed is also every batch in order: the workload's
        # `inc`s fail (INVALID) before their `set` or a `set` after them.
        _wait(lambda: set(statuses()) == {"COMMITTED"}, "every batch committed", gw)
    finally:
        gw.kill()
