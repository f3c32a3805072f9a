"""Chaos: three ``ledgerq serve`` on one PostgreSQL, a ledger in its own process,
ordered intkey batches in many services; gateways killed (FAIL), paused past
their claim expiry (DELAY) and cut off from PostgreSQL. Every case runs
against ``ledgerq node`` and against the fault ledger (Sawtooth's REST API
only, no events; it drops connections after accepting, answers 503 and 500,
forgets pending batches, and judges every POST). After each run: every batch
committed exactly once, per service in creation order, no service locked, no
write by a fenced-off instance landed — and, on the fault ledger, no POST of
a batch it held, but for the late copy of a gateway frozen (SIGSTOP) in the
middle of a POST it had started under its claim (``docs/ha.md``, "Safety":
no lock covers an HTTP request; ``frozen_mid_post`` names those batches from
the frozen gateway's own log, and any other such POST fails the run).

Claim timings are shortened (``bench._cluster.FAST_CLAIMS``) so a run takes
seconds; these tests wait for real processes, they never assert on speed.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench._cluster import (
    LEDGERQ,
    Cluster,
    Process,
    Workload,
    check_invariants,
    fence_violations,
    frozen_mid_post,
    install_fence_audit,
    wait_all_final,
)
from ledgerq.clock import now_ms
from ledgerq.codec import Signer, encode_batch_list, parse_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.store import open_store

pytestmark = [pytest.mark.slow]

FINISH_TIMEOUT_S = 120


async def _migrate(url: str) -> None:
    store = await open_store(url)
    await store.close()


#: The fault ledger's plan in these runs (``python -m ledgerq.testing.fault_ledger``).
FAULTS = (
    "--commit-delay-ms", "20", "--drop-after-accept", "0.05", "--error-500-after-accept", "0.02",
    "--busy-503", "0.05", "--forget", "0.02", "--status-503", "0.02", "--seed", "3",
)  # fmt: skip


@pytest.fixture(params=["node", "fault-ledger"])
def cluster(pg_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    asyncio.run(_migrate(pg_url))  # before the audit trigger goes in
    install_fence_audit(pg_url)
    c = Cluster(tmp_path, pg_url)
    if request.param == "node":
        c.start_node()
    else:
        c.start_fault_ledger(*FAULTS)
    try:
        yield c
    finally:
        c.close()


def _wave(workload: Workload, start: int, stop: int) -> list[tuple[str, bytes]]:
    """Batches ``start:stop`` of every service, one POST each, services interleaved."""
    return [
        (service_id, made[n][1])
        for n in range(start, stop)
        for service_id, made in workload.batches.items()
        if n < len(made)
    ]


def _finish(cluster: Cluster, workload: Workload) -> None:
    total = len(workload.all_ids())
    counts = wait_all_final(cluster.pg_url, total, FINISH_TIMEOUT_S)
    problems = check_invariants(
        cluster.pg_url,
        cluster.ledger.url,
        workload,
        fault_ledger=cluster.fault_ledger is not None,
        frozen=frozen_mid_post(cluster.gateways.values()),
    )
    logs = "\n".join(f"--- {g.name}\n{g.tail(15)}" for g in cluster.gateways.values())
    assert not problems, f"{problems}\nstatuses {counts}\n{logs}"


@pytest.mark.pg
def test_kill_pause_and_dropped_connections_lose_and_reorder_nothing(cluster: Cluster) -> None:
    workload = Workload(services=12, batches_per_service=10)
    cluster.start_gateways("a", "b", "c")
    cluster.post_round_robin(_wave(workload, 0, 4))
    # FAIL: a dies with whatever it had in flight.
    cluster.gateways["a"].kill()
    cluster.post_round_robin(_wave(workload, 4, 7))
    # DELAY: b freezes past its second expiry, then wakes up and carries on
    # with the claims it believes it has.
    cluster.gateways["b"].stop()
    time.sleep(4.0)  # past FAST_CLAIMS' slow TTL, in real time: b is a real process
    cluster.gateways["b"].cont()
    # Every gateway loses its PostgreSQL connections at once.
    assert cluster.drop_connections() > 0
    cluster.start_gateway("a")
    cluster.post_round_robin(_wave(workload, 7, 10))
    _finish(cluster, workload)


@pytest.mark.pg
@pytest.mark.parametrize("seed", [1, 2])
def test_random_faults_while_batches_arrive(cluster: Cluster, seed: int) -> None:
    rng = random.Random(seed)
    workload = Workload(services=10, batches_per_service=8)
    cluster.start_gateways("a", "b", "c")
    for n in range(8):
        cluster.post_round_robin(_wave(workload, n, n + 1))
        fault = rng.choice(["none", "kill", "pause", "drop"])
        victim = rng.choice(sorted(cluster.gateways))
        gw = cluster.gateways[victim]
        if fault == "kill" and gw.alive and len(cluster.live_gateways()) > 1:
            gw.kill()
            cluster.start_gateway(victim)
        elif fault == "pause" and gw.alive and not gw.stopped:
            gw.stop()
            time.sleep(rng.uniform(0.5, 3.5))  # around both expiries of FAST_CLAIMS
            gw.cont()
        elif fault == "drop":
            cluster.drop_connections()
    _finish(cluster, workload)


#: The plan's PASS/DELAY/FAIL steps, as the gateway's failpoints (ledgerq.failpoints):
#: request claim (again), begin submission, begin POST, HTTP response, update
#: status via the observer (before and after the write).
STEPS = (
    "claim_cycle",
    "submitting",
    "before_post",
    "after_response",
    "before_record",
    "after_record",
)


def _wait_for(predicate: object, timeout_s: float, what: str, gw: Process) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)  # polling real processes and PostgreSQL, not letting time pass
    raise AssertionError(f"timed out waiting for {what}\n{gw.tail(40)}")


def _claims_of(pg_url: str, instance: str) -> int:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM service_id_claims WHERE claimant = %s", (instance,)
        ).fetchone()
    return int(row[0]) if row else 0


async def _preload(url: str, workload: Workload) -> None:
    """Every batch straight into the store, in creation order (as accepted POSTs
    would leave them), so the gateway under test is alone with all the work."""
    store = await open_store(url)
    try:
        start = now_ms()
        for n in range(workload.batches_per_service):
            for service_id, made in workload.batches.items():
                batches = parse_batch_list(made[n][1], service_id)
                await store.add_batches(list(batches), now=start + n)
    finally:
        await store.close()


#: Every step × every fault on the node; on the fault ledger the DELAY cases (a
#: frozen instance is what tests ask-before-resend across instances; the suite's
#: time budget leaves FAIL and dropped connections to the node).
STEP_CASES = [
    *(("node", step, action) for step in STEPS for action in ("kill", "stop", "drop")),
    *(("fault-ledger", step, "stop") for step in STEPS),
]


@pytest.mark.pg
@pytest.mark.parametrize(("cluster", "step", "action"), STEP_CASES, indirect=["cluster"])
def test_a_fault_at_each_step_of_the_cycle_loses_and_reorders_nothing(
    cluster: Cluster, step: str, action: str
) -> None:
    """FAIL (kill), DELAY (stop, resumed once its claims moved on) or a dropped
    connection, in gateway a, at exactly one step of the plan's list."""
    _fault_at_step(cluster, step, action, Workload(services=6, batches_per_service=5))


#: The pipelined strategy (several batches of a service in flight, the
#: ledger keeping their order): the steps around a POST and its record.
PIPELINED_STEP_CASES = [
    *(
        ("node", step, action)
        for step in ("submitting", "after_response", "before_record")
        for action in ("kill", "stop")
    ),
    *(("fault-ledger", step, "stop") for step in ("after_response", "before_record")),
]


@pytest.mark.pg
@pytest.mark.parametrize(("cluster", "step", "action"), PIPELINED_STEP_CASES, indirect=["cluster"])
def test_a_fault_at_each_step_of_a_pipelined_service_loses_and_reorders_nothing(
    cluster: Cluster, step: str, action: str
) -> None:
    """As above, with chained batches under the pipelined strategy: a
    take-over finds several batches of a service in flight, follows them
    all, and asks the ledger before anything is resent."""
    cluster.env = {**cluster.env, "LEDGERQ_QUEUER_STRATEGY": "pipelined"}
    workload = Workload(services=4, batches_per_service=8, chained=True)
    _fault_at_step(cluster, step, action, workload)


@pytest.mark.pg
def test_pipelined_services_under_random_faults(cluster: Cluster) -> None:
    cluster.env = {**cluster.env, "LEDGERQ_QUEUER_STRATEGY": "pipelined"}
    rng = random.Random(5)
    workload = Workload(services=6, batches_per_service=8, chained=True)
    cluster.start_gateways("a", "b", "c")
    for n in range(8):
        cluster.post_round_robin(_wave(workload, n, n + 1))
        fault = rng.choice(["none", "kill", "pause", "drop"])
        gw = cluster.gateways[rng.choice(sorted(cluster.gateways))]
        if fault == "kill" and gw.alive and len(cluster.live_gateways()) > 1:
            gw.kill()
            cluster.start_gateway(gw.name.split("-")[1])
        elif fault == "pause" and gw.alive and not gw.stopped:
            gw.stop()
            time.sleep(rng.uniform(0.5, 3.5))
            gw.cont()
        elif fault == "drop":
            cluster.drop_connections()
    _finish(cluster, workload)


def _fault_at_step(cluster: Cluster, step: str, action: str, workload: Workload) -> None:
    asyncio.run(_preload(cluster.pg_url, workload))
    # a starts alone and claims every service, so it passes each point of the
    # submission cycle once per batch: the 8th pass of 30 is mid-run. The
    # claim cycle runs every 200 ms (the first at start-up): ~0.6 s in.
    hit = 4 if step == "claim_cycle" else 8
    a = cluster.start_gateway("a", {"LEDGERQ_FAILPOINTS": f"{step}={action}@{hit}"})
    fired = f"failpoint {step}: {action} at hit {hit}"
    _wait_for(lambda: fired in a.log_path.read_text(errors="replace"), 60, fired, a)
    cluster.start_gateways("b", "c")
    if action == "kill":
        _wait_for(lambda: not a.alive, 30, "a to die", a)
    elif action == "stop":
        _wait_for(lambda: a.stopped_itself, 30, "a to stop itself", a)
        a.stopped = True
        # DELAY: a wakes only once every claim it had was taken by another.
        _wait_for(lambda: _claims_of(cluster.pg_url, a.name) == 0, 60, "a's claims to move", a)
        a.cont()
    _finish(cluster, workload)
    if action != "kill":
        assert a.alive, a.tail(40)


def test_a_second_gateway_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'one.sqlite3'}"
    args = [LEDGERQ, "serve", "--db", db, "--bind", "127.0.0.1:0"]
    env_log = tmp_path / "first.log"
    with (
        env_log.open("wb") as log,
        subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path) as first,
    ):
        try:
            deadline = time.monotonic() + 60
            while "listening on" not in env_log.read_text(errors="replace"):
                assert first.poll() is None, env_log.read_text()
                assert time.monotonic() < deadline, env_log.read_text()
                time.sleep(0.05)  # waiting for the first gateway to come up
            second = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
            assert second.returncode != 0
            assert "already serving the SQLite database" in second.stderr
            assert f"pid {first.pid}" in second.stderr
        finally:
            first.terminate()
            first.wait(30)


@pytest.mark.pg
def test_the_fence_audit_catches_a_write_by_a_non_holder(pg_url: str) -> None:
    asyncio.run(_migrate(pg_url))
    install_fence_audit(pg_url)
    with psycopg.connect(pg_url, autocommit=True, application_name="gw-x") as conn:
        conn.execute(
            "INSERT INTO batches (service_id, batch_id, signer_public_key, trace,"
            " serialized_batch) VALUES ('s', 'b', '02', FALSE, '')"
        )
        conn.execute(
            "INSERT INTO service_id_claims (service_id, claimant, epoch, expiry_1, expiry_2,"
            " claimed_at) VALUES ('s', 'gw-y', 1, 1, 1, 1)"
        )
        conn.execute("UPDATE batches SET submitted = TRUE WHERE service_id = 's'")
    assert fence_violations(pg_url) == [("gw-x", "s", "b", "gw-y")]


@pytest.mark.pg
def test_a_halt_holds_across_a_take_over_until_an_operator_resumes_the_service(
    pg_url: str, tmp_path: Path
) -> None:
    """on_invalid = halt: a's service stops at its INVALID batch; a dies; b
    takes the service over and sends nothing after that batch until an
    operator resumes it past it, then commits the rest in order."""
    asyncio.run(_migrate(pg_url))
    install_fence_audit(pg_url)
    cluster = Cluster(tmp_path, pg_url)
    cluster.env = {**cluster.env, "LEDGERQ_QUEUER_ON_INVALID": "halt"}
    try:
        cluster.start_node()
        signer = Signer.generate()
        ops = [("set", "h1", 0), ("inc", "h1", 1), ("inc", "nobody", 1), ("inc", "h1", 1)]
        made = [make_intkey_batch(signer, [op]) for op in ops]
        bad = made[2].header_signature  # an inc of a name never set: INVALID
        a = cluster.start_gateway("a")
        for b in made:
            cluster.post_round_robin([("halting", encode_batch_list([b]))], to=[a])
        _wait_for(lambda: _status(pg_url, bad) == "Invalid", 60, "the invalid batch", a)
        a.kill()
        b = cluster.start_gateway("b")
        _wait_for(lambda: _claims_of(pg_url, b.name) >= 1, 60, "b to take the service", b)
        time.sleep(1.5)  # b's queue, claims and controls have all had their turn
        last = made[3].header_signature
        assert _status(pg_url, last) is None
        assert not _submitted(pg_url, last)

        async def skip() -> None:
            store = await open_store(pg_url)
            try:
                await store.control_service("halting", "skip", actor="ops", batch_ids=[bad])
            finally:
                await store.close()

        asyncio.run(skip())
        _wait_for(lambda: _status(pg_url, last) == "Committed", 60, "the rest to commit", b)
        assert fence_violations(pg_url) == []
    finally:
        cluster.close()


def _status(pg_url: str, batch_id: str) -> str | None:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT status FROM batches WHERE batch_id = %s", (batch_id,)).fetchone()
    return None if row is None else row[0]


def _submitted(pg_url: str, batch_id: str) -> bool:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT submitted FROM batches WHERE batch_id = %s", (batch_id,)
        ).fetchone()
    return bool(row and row[0])


def _act(gw: Process, service_id: str, action: str, body: object = None) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{gw.url}/services/{service_id}/{action}",
        data=None if body is None else json.dumps(body).encode(),
        method="POST",
        headers={} if body is None else {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        data: dict[str, Any] = json.loads(resp.read())["data"]
    return data


def _report(ledger: Process) -> dict[str, Any]:
    with urllib.request.urlopen(f"{ledger.url}/_fault/report", timeout=60) as resp:
        report: dict[str, Any] = json.loads(resp.read())
    return report


def _claimant(pg_url: str, service_id: str) -> str | None:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT claimant FROM service_id_claims WHERE service_id = %s", (service_id,)
        ).fetchone()
    return None if row is None else row[0]


@pytest.mark.pg
def test_an_operator_acts_through_the_gateway_that_does_not_hold_the_service(
    pg_url: str, tmp_path: Path
) -> None:
    """Pause, cancel and resume sent to the instance without the service's
    claim bind the one holding it: nothing posted while paused, the cancelled
    batch never reaches the ledger, the rest commits in order after the
    resume (judged by the fault ledger)."""
    asyncio.run(_migrate(pg_url))
    install_fence_audit(pg_url)
    cluster = Cluster(tmp_path, pg_url)
    try:
        cluster.start_fault_ledger("--commit-delay-ms", "20", "--busy-503", "0.05", "--seed", "5")
        signer = Signer.generate()
        ops = [("set", "op1", 0), ("inc", "op1", 1), ("inc", "op1", 1), ("inc", "op1", 1)]
        made = [make_intkey_batch(signer, [op]) for op in ops]
        ids = [b.header_signature for b in made]
        a, b = cluster.start_gateways("a", "b")
        cluster.post(a, "ops", encode_batch_list([made[0]]))
        _wait_for(lambda: _status(pg_url, ids[0]) == "Committed", 60, "the first batch", a)
        _wait_for(lambda: _claimant(pg_url, "ops") is not None, 60, "a claim on ops", a)
        holder = {g.name: g for g in (a, b)}[_claimant(pg_url, "ops")]
        other = b if holder is a else a

        assert _act(other, "ops", "pause")["action"] == "pause"
        for batch in made[1:]:
            cluster.post(other, "ops", encode_batch_list([batch]))
        time.sleep(2.0)  # the holder's queue and controls have had many turns
        posted = _report(cluster.ledger)["batches"]
        assert not any(i in posted for i in ids[1:]), "a batch was posted while paused"
        assert all(not _submitted(pg_url, i) for i in ids[1:])

        _act(other, "ops", "cancel", {"batch_ids": [ids[2]]})
        _act(other, "ops", "resume")
        _wait_for(lambda: _status(pg_url, ids[3]) == "Committed", 60, "the rest", holder)
        report = _report(cluster.ledger)
        assert ids[2] not in report["batches"], "the cancelled batch reached the ledger"
        assert report["order"]["op1"] == [ids[0], ids[1], ids[3]]
        assert report["values"]["op1"] == 2
        assert report["violations"] == []
        assert _status(pg_url, ids[2]) == "Invalid"
        assert _claimant(pg_url, "ops") == holder.name
        # The one write of a batch by the instance without the claim: the
        # operator's cancel, serialized with the holder's takes by the row lock.
        assert {(w, s, i) for w, s, i, _ in fence_violations(pg_url)} == {
            (other.name, "ops", ids[2])
        }
    finally:
        cluster.close()
