"""PostgreSQL without a primary, as ``ledgerq serve`` (real processes) meets it.

Each test starts clusters of its own (``tests/pg_server.py``), since it
kills them: a primary alone, or a primary with a synchronous streaming
standby that is promoted once the primary is killed (``kill -9``).

* While no primary answers, ``POST /batches``, the reads and ``/ready``
  answer ``503`` within ``store.outage_timeout_s`` (plus room for a loaded
  machine, still far below the pool's 10 s): no request waits out the pool,
  none waits behind others doing so.
* ``ledgerq serve`` started with only a standby up names every host of
  its multi-host URL and what each answered; with ``--wait-for-store`` it
  waits for the standby's promotion instead, then serves.
* Two gateways, the multi-host URL, clients posting: the primary killed,
  the standby promoted later (``bench/_pg_failover.py``, which ``ledgerq
  bench failover --primary-lost`` measures with): nothing acknowledged is
  lost, answers during the outage come within the bound, both gateways
  accept again after the promotion without a restart.

The bound on answering during an outage is the one timing these tests
assert (the issue's explicit promise); everything else waits for real
processes and never asserts on speed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._cluster import LEDGERQ, Process, Workload
from bench._pg_failover import run_primary_lost
from tests.pg_server import ThrowawayCluster, find_bindir, multi_host_url

pytestmark = [pytest.mark.pg, pytest.mark.slow]

#: The outage bound the gateways run with (``store.outage_timeout_s``), and
#: the room a loaded 2-core machine may add to it; together still well below
#: the pool's timeout (10 s), which is what an answer took without the bound.
BOUND_S = 2.0
ROOM_S = 4.0


@pytest.fixture
def primary() -> Iterator[ThrowawayCluster]:
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries")
    cluster = ThrowawayCluster(bindir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def standby(primary: ThrowawayCluster) -> Iterator[ThrowawayCluster]:
    """A synchronous standby of ``primary``."""
    cluster = primary.start_standby(synchronous=True)
    try:
        yield cluster
    finally:
        cluster.stop()


def _gateway(workdir: Path, name: str, db: str, **env: str) -> Process:
    return Process(
        name,
        ["serve"],
        {
            "LEDGERQ_DB": db,
            "LEDGERQ_LEDGER": "node",
            "LEDGERQ_NODE_DATA_DIR": str(workdir / f"{name}-node"),
            "LEDGERQ_BIND": "127.0.0.1:0",
            "LEDGERQ_WORKERS": "1",
            "LEDGERQ_STORE_OUTAGE_TIMEOUT_S": str(BOUND_S),
            "LEDGERQ_LOG_LEVEL": "info",
            **env,
        },
        workdir,
    )


def _ask(method: str, url: str, body: bytes | None = None) -> tuple[int, float, dict[str, object]]:
    """The status, how long the answer took, and the JSON answer."""
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/octet-stream")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, time.monotonic() - started, json.loads(raw or b"null") or {}


def test_a_post_a_read_and_ready_answer_503_within_the_bound_without_a_primary(
    primary: ThrowawayCluster, tmp_path: Path
) -> None:
    gw = _gateway(tmp_path, "gw", primary.url)
    try:
        workload = Workload(services=24, batches_per_service=3)
        ids = {s: [bid for bid, _ in made] for s, made in workload.batches.items()}
        for service_id, made in workload.batches.items():
            status, _, _ = _ask("POST", f"{gw.url}/batches?service_id={service_id}", made[0][1])
            assert status == 202
        primary.kill()

        def one(n: int, service_id: str) -> tuple[str, int, float]:
            made = workload.batches[service_id]
            if n % 4 == 1:
                what, (status, took, _) = (
                    "status",
                    _ask("GET", f"{gw.url}/batch_statuses?id={ids[service_id][0]}"),
                )
            elif n % 4 == 2:
                what, (status, took, _) = "ready", _ask("GET", f"{gw.url}/ready")
            else:
                body = made[1 + n % 2][1]
                what, (status, took, _) = (
                    "post",
                    _ask("POST", f"{gw.url}/batches?service_id={service_id}", body),
                )
            return what, status, took

        answers: list[tuple[str, int, float]] = []
        # Twice: at once (the pool still holds the lost server's sessions) and
        # once the gateway has found the outage.
        for _ in range(2):
            with concurrent.futures.ThreadPoolExecutor(24) as pool:
                answers += pool.map(lambda a: one(*a), enumerate(sorted(workload.batches)))
        assert {what for what, _, _ in answers} == {"post", "status", "ready"}
        late = [a for a in answers if a[2] > BOUND_S + ROOM_S]
        assert not late, f"answered after the bound: {late}\n{gw.tail(30)}"
        assert {status for _, status, _ in answers} == {503}, answers
        assert gw.alive
        log = gw.log_path.read_text()
        assert log.count("PostgreSQL outage: no primary answers at") == 1, gw.tail(40)
        assert f"127.0.0.1:{primary.port}: Connection refused" in log
    finally:
        gw.kill()


def _serve(workdir: Path, db: str, *args: str) -> list[str]:
    return [
        LEDGERQ,
        "serve",
        "--db",
        db,
        "--bind",
        "127.0.0.1:0",
        "--node-data-dir",
        str(workdir / "node"),
        *args,
    ]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LEDGERQ_")}


def test_start_up_with_only_a_standby_names_every_host_tried(
    primary: ThrowawayCluster, standby: ThrowawayCluster, tmp_path: Path
) -> None:
    url = multi_host_url(primary, standby)
    primary.kill()
    # One process, and a supervisor of two workers (which opens the store
    # first; the ledger, never reached, must be one the workers can share).
    for args in (["--workers", "1"], ["--workers", "2", "--ledger", "sawtooth+http://127.0.0.1:9"]):
        done = subprocess.run(
            _serve(tmp_path, url, *args),
            capture_output=True,
            text=True,
            env=_clean_env(),
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert f"127.0.0.1:{primary.port}: Connection refused" in done.stderr
        assert (
            f"127.0.0.1:{standby.port}: session is read-only (a standby, not the primary)"
            in done.stderr
        )
        assert "--wait-for-store SECONDS" in done.stderr


def test_serve_waits_for_a_primary_with_wait_for_store(
    primary: ThrowawayCluster, standby: ThrowawayCluster, tmp_path: Path
) -> None:
    url = multi_host_url(primary, standby)
    primary.kill()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            _serve(tmp_path, url, "--workers", "1", "--wait-for-store", "300"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_clean_env(),
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 60
        while "waiting up to 300 s for PostgreSQL" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)  # waiting for the real process to say it waits
        assert "listening on" not in log_path.read_text()
        standby.promote()
        deadline = time.monotonic() + 120
        while "listening on" not in (text := log_path.read_text()):
            assert proc.poll() is None, text
            assert time.monotonic() < deadline, text
            time.sleep(0.05)  # waiting for the real process to come up
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
        assert found, text
        gateway_url = found.group(1)
        (service_id, made), *_ = Workload(services=1, batches_per_service=1).batches.items()
        status, _, _ = _ask("POST", f"{gateway_url}/batches?service_id={service_id}", made[0][1])
        assert status == 202
    finally:
        proc.terminate()
        proc.wait(60)


def test_the_primary_killed_and_its_standby_promoted_under_two_gateways(tmp_path: Path) -> None:
    """Two gateways on a primary and its synchronous standby, clients posting
    ordered batches; the primary killed (-9) a third of the way, the standby
    promoted well after the bound. Nothing acknowledged is lost, every
    request during the outage is answered within the bound, and both
    gateways, the same processes, accept again after the promotion."""
    run = run_primary_lost(
        tmp_path,
        services=12,
        batches=10,
        clients=6,
        outage_s=3 * BOUND_S,
        bound_s=BOUND_S,
        finish_timeout_s=240,
    )
    logs = "\n".join(f"--- {name}\n{text[-4000:]}" for name, text in run.logs.items())
    # Every batch acknowledged (202) and committed once, in order per service
    # (the node's values and fingerprints), no fenced write landed.
    assert not run.problems, f"{run.problems}\n{logs}"
    during = run.during_outage()
    assert any(a.status == 503 for a in during), during
    unanswered = [a for a in during if a.status not in (202, 503)]
    assert not unanswered, unanswered
    late = [a for a in during if a.took > BOUND_S + ROOM_S]
    assert not late, f"answered after the bound: {late}\n{logs}"
    # Accepting again, without a restart: each gateway acknowledged a batch
    # posted after the promotion.
    assert run.same_processes, logs
    assert all(t is not None for t in run.accepting_again.values()), run.accepting_again
    for name, text in run.logs.items():
        assert text.count("PostgreSQL outage: no primary answers") == 1, f"{name}\n{text[-4000:]}"
        assert "PostgreSQL outage over" in text, name
        # Logged once per outage, not once per request, batch or retry: the
        # API's refusals and the follower's writes and reads refused for it.
        per_request = [
            line
            for line in text.splitlines()
            if "no PostgreSQL primary answers at" in line
            and ("ledgerq.ingest" in line or "ledgerq.follow" in line)
        ]
        assert not per_request, per_request[:5]
        cycles = [line for line in text.splitlines() if "failed" in line and "claim cycle" in line]
        assert len([line for line in cycles if "WARNING" in line]) == 1, cycles
