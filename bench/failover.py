"""High availability: how long a killed gateway's services wait, and
throughput with 1, 2 and 3 gateways on one PostgreSQL.

Failover: ``ledgerq node`` (each batch held ``--commit-delay-ms`` so services
stay busy) and three ``ledgerq serve`` with the **default** claim timings.
Every service gets its first batch; once the three share the services, the
rest of each service's batches is posted while the work flows, and once a
quarter of those are committed the instance holding the most services is
SIGKILLed (mid-run, with posting still going on to the others). Per service
it held with work waiting at that moment, the figure is the time from the
kill until another instance records the submission of that service's next
batch (``submissions.created_at``).
Services the victim had nothing mid-submission on wait for the first expiry,
one it was mid-POST on for the second (TTL + 10 % by default); the target
for both is claim TTL + 1 s.

Throughput: for K = 1, 2, 3 gateways on a fresh database and node, the
batches of every service are posted round-robin across the gateways; the
figure is batches committed per second from the first post to the last
commit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import click
import psycopg

from bench import report
from bench._cluster import Cluster, Workload, check_invariants, install_fence_audit
from bench._harness import cpu_seconds
from ledgerq.claims import ClaimSettings
from ledgerq.codec import decode_batch_list, encode_batch_list
from ledgerq.store import open_store

PG_ADMIN = os.environ.get("LEDGERQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _database() -> tuple[str, str]:
    name = f"ledgerq_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    base = PG_ADMIN.rsplit("/", 1)[0]
    return name, f"{base}/{name}"


def _drop(name: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def _migrate(url: str) -> None:
    async def go() -> None:
        store = await open_store(url)
        await store.close()

    asyncio.run(go())


def _holders(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT claimant, service_id FROM service_id_claims WHERE claimant IS NOT NULL"
        ).fetchall()
    out: dict[str, list[str]] = {}
    for claimant, service_id in rows:
        out.setdefault(claimant, []).append(service_id)
    return out


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise click.ClickException(f"timed out waiting for {what}")


def _lists(workload: Workload, start: int) -> list[tuple[str, bytes]]:
    """Per service, its batches from ``start`` on as one ordered BatchList."""
    return [
        (
            service_id,
            encode_batch_list([b for _, body in made[start:] for b in decode_batch_list(body)]),
        )
        for service_id, made in workload.batches.items()
    ]


def _committed(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM batches WHERE status = 'Committed'").fetchone()
    return int(row[0]) if row else 0


def _mid_submission(url: str, services: list[str]) -> set[str]:
    """Services with a batch submitted but not acknowledged by the ledger."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT DISTINCT service_id FROM batches WHERE service_id = ANY(%s) AND submitted"
            " AND NOT final AND (status IS NULL OR status IN ('Unknown', 'Delayed'))",
            (services,),
        ).fetchall()
    return {r[0] for r in rows}


def _post_parallel(cluster: Cluster, items: list[tuple[str, bytes]], clients: int = 8) -> None:
    """Post ``items`` from ``clients`` threads (one service's items stay in one thread,
    in order): one sequential client cannot feed three gateways."""
    slices = [items[i::clients] for i in range(clients)]
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for done in [pool.submit(cluster.post_round_robin, part) for part in slices]:
            done.result()


def _open(url: str, services: list[str]) -> set[str]:
    """Services with a batch not final yet: a new holder has something to do
    for each (submit it, or follow the one the ledger has until it is final)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT DISTINCT service_id FROM batches WHERE service_id = ANY(%s) AND NOT final",
            (services,),
        ).fetchall()
    return {r[0] for r in rows}


def measure_failover(
    workdir: Path, services: int, batches: int, commit_delay_ms: int
) -> tuple[dict[str, tuple[float, bool]], int, list[str], float]:
    """Per resumed service: (seconds, was mid-submission); victim services; problems;
    batches committed per second over the whole run (first post to last commit)."""
    name, url = _database()
    _migrate(url)
    install_fence_audit(url)
    cluster = Cluster(workdir, url, env={})
    try:
        cluster.start_node("--commit-delay-ms", str(commit_delay_ms))
        for gw in ("a", "b", "c"):
            cluster.start_gateway(gw)
        workload = Workload(services, batches)
        started = time.monotonic()
        items = []
        for service_id, made in workload.batches.items():
            items.append((service_id, made[0][1]))
        _post_parallel(cluster, items)
        # Let the claims balance (the defaults hand over after claim TTL); under
        # a loaded machine the last few hand-overs may lag: a tenth off is enough.
        settings = ClaimSettings()
        _wait(
            lambda: (
                len(_holders(url)) == 3
                and sum(map(len, _holders(url).values())) == services
                and max(map(len, _holders(url).values())) <= -(-services // 3) * 1.1 + 1
            ),
            180,
            "three instances sharing the services",
        )
        # The rest of each service's batches in one ordered BatchList per
        # service, posted while the work flows; the kill comes mid-run, once a
        # quarter of those batches are committed (posting goes on to the others).
        poster = threading.Thread(
            target=_post_parallel, args=(cluster, _lists(workload, 1)), daemon=True
        )
        poster.start()
        kill_at = services + (services * batches - services) // 4
        _wait(lambda: _committed(url) >= kill_at, 600, f"{kill_at} batches committed")
        holders = _holders(url)
        victim_id = max(holders, key=lambda k: len(holders[k]))
        victim = next(g for g in cluster.gateways.values() if g.name == victim_id)
        victim.stop()  # freeze it first, so what it has in flight is what it dies with
        killed_ms = time.time_ns() // 1_000_000
        # Its services with work waiting at the kill: each is a sample (one whose
        # next batch is only posted after the kill would time the posting).
        victim_services = sorted(_open(url, _holders(url).get(victim_id, [])))
        in_flight = _mid_submission(url, victim_services)
        victim.kill()
        wait_s = (settings.slow_ttl_ms + 15_000) / 1000
        deadline = time.monotonic() + wait_s
        resumed: dict[str, float] = {}
        while time.monotonic() < deadline and len(resumed) < len(victim_services):
            with psycopg.connect(url) as conn:
                # The first thing another instance did for the service after the
                # kill: submit its next batch, or record the ledger's answer about
                # the batch the victim had submitted (the victim is dead: any write
                # after the kill is another instance's).
                rows = conn.execute(
                    "SELECT service_id, min(at) FROM ("
                    " SELECT service_id, created_at AS at FROM submissions"
                    " WHERE service_id = ANY(%(s)s) AND created_at > %(k)s"
                    " UNION ALL SELECT service_id, updated_at FROM batch_statuses"
                    " WHERE service_id = ANY(%(s)s) AND updated_at > %(k)s) AS a"
                    " GROUP BY service_id",
                    {"s": victim_services, "k": killed_ms},
                ).fetchall()
            for service_id, at in rows:
                resumed[service_id] = (at - killed_ms) / 1000
            time.sleep(0.05)
        poster.join(600)
        total = services * batches
        _wait(lambda: _committed(url) >= total, 600, "every batch committed")
        rate = total / (time.monotonic() - started)
        assert cluster.node is not None
        problems = check_invariants(url, cluster.node.url, workload)
        return (
            {s: (t, s in in_flight) for s, t in resumed.items()},
            len(victim_services),
            problems,
            rate,
        )
    finally:
        cluster.close()
        _drop(name)


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            total += cpu_seconds(pid)
    return total


def _pg_backends(url: str) -> list[int]:
    """The server processes serving this database now (the gateways' pools)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(r[0]) for r in rows]


@dataclass
class Throughput:
    batches_s: float
    #: CPU seconds per 1,000 committed batches, by part.
    gateways_cpu: float
    postgres_cpu: float
    node_cpu: float


def measure_throughput(workdir: Path, instances: int, services: int, batches: int) -> Throughput:
    name, url = _database()
    _migrate(url)
    cluster = Cluster(workdir, url, env={"LEDGERQ_LOG_LEVEL": "warning"})
    try:
        node = cluster.start_node()
        gateways = [cluster.start_gateway(f"t{instances}{chr(97 + i)}") for i in range(instances)]
        workload = Workload(services, batches)
        gw_pids = [g.proc.pid for g in gateways]
        backends = _pg_backends(url)
        cpu0 = (_cpu(gw_pids), _cpu(backends), _cpu([node.proc.pid]))
        started = time.monotonic()
        _post_parallel(cluster, _lists(workload, 0))
        total = services * batches
        _wait(lambda: _committed(url) >= total, 600, "every batch committed")
        elapsed = time.monotonic() - started
        # Backends opened during the run count from zero; those closed are missed.
        late = [p for p in _pg_backends(url) if p not in backends]
        cpu1 = (_cpu(gw_pids), _cpu(backends) + _cpu(late), _cpu([node.proc.pid]))
        per_k = [(b - a) * 1000 / total for a, b in zip(cpu0, cpu1, strict=True)]
        return Throughput(total / elapsed, *per_k)
    finally:
        cluster.close()
        _drop(name)


def _samples(kind: str, times: list[float]) -> str:
    """The samples of one path: all of them if few, else every tenth percentile."""
    if not times:
        return f"* {kind} path samples: none."
    if len(times) <= 30:
        return f"* {kind} path samples (s): " + ", ".join(f"{t:.2f}" for t in times) + "."
    marks = [report.percentile(times, p) for p in range(0, 101, 10)]
    return (
        f"* {kind} path, {len(times)} samples; p0, p10 … p100 (s): "
        + ", ".join(f"{t:.2f}" for t in marks)
        + "."
    )


@click.command()
@click.option("--services", default=60, show_default=True, help="Services in the failover run.")
@click.option("--batches", default=60, show_default=True, help="Batches per service (failover).")
@click.option("--commit-delay-ms", default=50, show_default=True, help="Node commit delay.")
@click.option("--tp-services", default=100, show_default=True, help="Services (throughput).")
@click.option("--tp-batches", default=20, show_default=True, help="Batches per service.")
@click.option("--write/--no-write", default=True, show_default=True, help="Update BENCHMARKS.md.")
def command(
    services: int,
    batches: int,
    commit_delay_ms: int,
    tp_services: int,
    tp_batches: int,
    write: bool,
) -> None:
    """Failover time after SIGKILL, and throughput with 1-3 gateways on PostgreSQL."""
    settings = ClaimSettings()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ledgerq-failover-") as tmp:
        work = Path(tmp)
        report.console.print("failover: 3 gateways, default claim timings, SIGKILL the busiest")
        resumed, held, problems, run_rate = measure_failover(
            work, services, batches, commit_delay_ms
        )
        rates = {}
        for k in (1, 2, 3):
            report.console.print(f"throughput: {k} gateway(s)")
            rates[k] = measure_throughput(work, k, tp_services, tp_batches)
    load_after = os.getloadavg()
    target = (settings.claim_ttl_ms + 1_000) / 1000
    fast = sorted(t for t, busy in resumed.values() if not busy)
    slow = sorted(t for t, busy in resumed.values() if busy)

    def row(kind: str, times: list[float]) -> list[object]:
        if not times:
            return [kind, 0, "-", "-", "-", "-", "-"]
        return [
            kind,
            len(times),
            f"{min(times):.2f} s",
            f"{statistics.median(times):.2f} s",
            f"{report.percentile(times, 95):.2f} s",
            f"{max(times):.2f} s",
            f"{sum(t <= target for t in times)} / {len(times)}",
        ]

    lines = [
        f"Claim timings: renew {settings.renew_interval_ms} ms, TTL (first expiry) "
        f"{settings.claim_ttl_ms} ms, second expiry {settings.slow_ttl_ms} ms, grace "
        f"{settings.grace_ms} ms (the defaults). Machine load average (1, 5, 15 min) before: "
        f"{', '.join(f'{x:.1f}' for x in load_before)}; after: "
        f"{', '.join(f'{x:.1f}' for x in load_after)} (a machine shared with other work).",
        "",
        f"**Failover** — {services} services × {batches} ordered intkey batches, node commit "
        f"delay {commit_delay_ms} ms, 3 gateways; the rest of each service's batches posted "
        "while the first ones run, and "
        "the busiest gateway SIGKILLed once a quarter of those are committed, holding "
        f"{held} services with work waiting ({len(resumed)} resumed). Time from the kill "
        "until another gateway records the submission of each of those services' next "
        "batch or the ledger's answer about the batch the victim had submitted "
        "(whichever comes first):",
        "",
        report.table(
            ["path", "services", "min", "median", "p95", "max", f"≤ TTL + 1 s ({target:.0f} s)"],
            [
                row("fast (nothing mid-submission)", fast),
                row("slow (a batch mid-submission)", slow),
            ],
        ),
        "",
        _samples("fast", fast),
        _samples("slow", slow),
        "",
        "Fast path: the claim lapses at its first expiry (the TTL, counted from the victim's "
        "last renewal, so up to 5 s after the kill), the survivors wake up for that moment, "
        "claim, and queue the service's next batch. Slow path: the victim died between marking "
        "a batch submitted and the ledger's answer; the claim lapses at the second expiry "
        "(TTL + 10 %), then the new holder asks the ledger about that batch before anything "
        'else (docs/ha.md, "Safety", says why this needs no longer second expiry).',
        "Invariants after the run (all committed, exactly once, in order, no fenced write "
        f"landed): {'held' if not problems else 'VIOLATED: ' + '; '.join(problems)}. "
        f"The whole run, first post to last commit (balancing wait and kill included): "
        f"{run_rate:.0f} batches/s.",
        "",
        f"**Throughput** — {tp_services} services × {tp_batches} batches posted round-robin "
        "across the gateways, one PostgreSQL, one node process (no commit delay):",
        "",
        report.table(
            [
                "gateways",
                "batches/s (first post → last commit)",
                "CPU s per 1,000 batches: gateways",
                "PostgreSQL",
                "node",
            ],
            [
                [
                    k,
                    f"{t.batches_s:.0f}",
                    f"{t.gateways_cpu:.2f}",
                    f"{t.postgres_cpu:.2f}",
                    f"{t.node_cpu:.2f}",
                ]
                for k, t in rates.items()
            ],
        ),
        "",
        "CPU: user + system time of the gateway processes, of the PostgreSQL server processes "
        "serving the run's database (read from /proc), and of the node, per 1,000 batches.",
        "",
        "On this 2-core machine every gateway process competes for the same cores with "
        "PostgreSQL and the node, so more gateways add contention, not capacity: instances "
        "are for availability here. The gateway's own throughput is measured by "
        "`ledgerq bench e2e`.",
    ]
    markdown = "\n".join(lines)
    click.echo(markdown)
    if write:
        report.write_section("failover", markdown, command="ledgerq bench failover")
