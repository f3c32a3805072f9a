"""High availability: how long a killed gateway's services wait, and
throughput with 1, 2 and 3 gateways on one PostgreSQL.

Failover: ``ledgerq node`` (each batch held ``--commit-delay-ms`` so services
stay busy) and three ``ledgerq serve`` with the **default** claim timings.
Every service gets its first batch; once each gateway holds at least half its
share, the rest of each service's batches is posted while the work flows, and
once ``--kill-at`` batches are committed the instance holding the most
services is frozen (SIGSTOP) and SIGKILLed, posting going on to the others.

Both failover paths are sampled on purpose (``--cut``, the default): every
gateway reaches the node through a :class:`~bench._cluster.LedgerCut`, and
just before the kill the victim is cut off — it goes on running, marking
batches submitted and POSTing them, but gets no answer, and half its POSTs
never reach the node — until its submission slots (half a share of
services, at most the default 256) are full. Its services with such a batch
are *mid-submission* (the slow path: their claims last until the second
expiry, and the new holder asks the ledger before resending); the rest of
its services with work waiting take the fast path. Which path each sample
took is read from the store at the freeze, and confirmed by what the new
holders wrote (a trigger logs every write of a batch's state after the kill,
with the writing instance).

Per service the victim held with a batch not final, the figures are the time
from the kill until another instance's first write for it (a batch marked
submitted, or a status recorded) and until its new claim (the claim row written);
the target for both paths is claim TTL + 1 s.

Throughput: for K = 1, 2, 3 gateways on a fresh database and node, the
batches of every service are posted round-robin across the gateways; the
figure is batches committed per second from the first post to the last
commit.

``--primary-lost`` measures the other failover instead: PostgreSQL's
primary killed (-9) under two gateways and its synchronous standby promoted
``--outage-s`` later (:mod:`bench._pg_failover`, throwaway clusters, the
default claim timings), once per outage length given. Per run: every
request under way during the outage and how long its answer took (the
target: all within ``store.outage_timeout_s``), how long after the promotion
each gateway acknowledged a batch again (the target: 3 s), and the
invariants (every acknowledged batch committed once, in order). Its figures
go to a section of their own (``failover-primary-lost``).
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
from dataclasses import dataclass, field
from pathlib import Path

import click
import psycopg

from bench import report
from bench._cluster import (
    Cluster,
    LedgerCut,
    Workload,
    check_invariants,
    install_fence_audit,
    install_write_log,
    start_write_log,
    write_log,
)
from bench._harness import cpu_seconds
from bench._pg_failover import PrimaryLostRun, run_primary_lost
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


def _post_parallel(
    cluster: Cluster, items: list[tuple[str, bytes]], clients: int | None = None
) -> None:
    """Post ``items`` from ``clients`` threads (one service's items stay in one thread,
    in order): one sequential client cannot feed three gateways, and eight (each POST
    a new connection) posted about 40 a second at 10,000 services, slower than the
    gateways commit, so that at the kill few services had work waiting; runs of more
    than 1,000 items post from 32."""
    if clients is None:
        clients = 8 if len(items) <= 1_000 else 32
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


def _balanced(holders: dict[str, list[str]], services: int, instances: int = 3) -> bool:
    """Every instance holds at least half its fair share of the services.

    (Waiting for an exact share, every service held and the busiest within a
    tenth of its share, timed out at 10,000 services on a loaded machine: the
    last hand-overs lag, and services whose batches are all final may already
    be released. Half a share each is enough for the kill to hit a third of the
    work.)"""
    if len(holders) < instances:
        return False
    return min(len(v) for v in holders.values()) >= services / instances / 2


@dataclass
class Sample:
    """One service the victim held with work waiting at the kill."""

    service_id: str
    #: A batch of it was marked submitted without the ledger's answer at the kill.
    mid_submission: bool
    #: The batch left mid-submission, if any.
    left: str | None = None
    #: Seconds from the kill to the first write another instance made for it.
    resumed_s: float | None = None
    #: Seconds from the kill to the new claim (its ``claimed_at``).
    claimed_s: float | None = None
    #: The new holders' writes for it after the kill, in order: (batch is the one
    #: left mid-submission, what).
    writes: list[tuple[bool, str]] = field(default_factory=list)
    #: The gateway whose claim of it was written first after the kill.
    taker: str | None = None


@dataclass
class FailoverRun:
    samples: list[Sample]
    problems: list[str]
    #: Batches committed per second, first post to last commit.
    rate: float
    #: Services held per instance when the victim was frozen.
    shares: dict[str, int]
    victim: str
    balanced: bool
    #: Seconds the victim ran cut off from the ledger before the freeze (0: no cut).
    cut_s: float
    posts_dropped: int
    #: Each gateway's submission slots (0: the default).
    slots: int
    committed_at_kill: int
    elapsed_s: float
    #: Services the victim held at the kill, with work or not.
    held: int = 0
    #: Seconds from the kill until each of those was claimed by another instance.
    moved: list[float] = field(default_factory=list)


_FIRST_WRITES = """
SELECT service_id, min(at) FILTER (WHERE what NOT IN ('claimed') AND what NOT LIKE 'unclaimed %%'),
       min(at) FILTER (WHERE what = 'claimed')
FROM write_log
WHERE service_id = ANY(%(s)s) AND writer <> %(v)s GROUP BY service_id
"""


def _left_mid_submission(url: str, services: list[str]) -> dict[str, str]:
    """Per service, the batch marked submitted without the ledger's answer (see
    docs/ha.md, "Two-phase expiry": status None, Unknown or Delayed)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT service_id, batch_id FROM batches WHERE service_id = ANY(%s) AND submitted"
            " AND NOT final AND (status IS NULL OR status IN ('Unknown', 'Delayed'))",
            (services,),
        ).fetchall()
    return {s: b for s, b in rows}


def _cut_off(url: str, victim_id: str, cut: LedgerCut, slots: int, timeout_s: float) -> float:
    """Cut the victim off its ledger and let it run until its submission ``slots``
    are full of batches without an answer (or their count stopped growing, or
    ``timeout_s``); returns the seconds it ran cut off."""
    cut.cut()
    started = time.monotonic()
    last, steady_since = -1, started
    while time.monotonic() - started < timeout_s:
        held = _holders(url).get(victim_id, [])
        work = _open(url, held)
        mid = len(_mid_submission(url, sorted(work)))
        now = time.monotonic()
        if mid != last:
            last, steady_since = mid, now
        if mid and (mid >= min(slots, len(work)) or now - steady_since >= 0.5):
            break
        time.sleep(0.05)
    return time.monotonic() - started


def measure_failover(
    workdir: Path,
    services: int,
    batches: int,
    commit_delay_ms: int,
    *,
    cut: bool = True,
    kill_at: int | None = None,
    balance_timeout_s: float = 180.0,
    resume_timeout_s: float = 60.0,
) -> FailoverRun:
    """Three gateways, the busiest SIGKILLed mid-run; per service it held with work
    waiting, how long until another instance claimed it and acted for it.

    ``cut``: every gateway reaches the node through a :class:`LedgerCut`; the
    victim is cut off just before the kill, so some of its services are left
    mid-submission (the slow path) and the rest not (the fast path)."""
    name, url = _database()
    _migrate(url)
    install_fence_audit(url)
    install_write_log(url)
    # With the cut, a gateway's submission slots fill with batches left without an
    # answer: half a share of slots leaves about half the victim's services with
    # work mid-submission (the slow path) and the rest not (the fast path). The
    # default (256) where a share is larger.
    slots = min(256, max(2, services // 6))
    cluster = Cluster(workdir, url, env={"LEDGERQ_SUBMITTER_SLOTS": str(slots)} if cut else {})
    cuts: dict[str, LedgerCut] = {}
    try:
        node = cluster.start_node("--commit-delay-ms", str(commit_delay_ms))
        for gw in ("a", "b", "c"):
            relay = LedgerCut(node.url) if cut else None
            proc = cluster.start_gateway(gw, ledger_url=relay.url if relay else None)
            if relay:
                cuts[proc.name] = relay
        workload = Workload(services, batches)
        started = time.monotonic()
        _post_parallel(cluster, [(s, made[0][1]) for s, made in workload.batches.items()])
        settings = ClaimSettings()
        deadline = time.monotonic() + balance_timeout_s
        balanced = False
        while time.monotonic() < deadline and not balanced:
            balanced = _balanced(_holders(url), services)
            time.sleep(0.2)
        # The rest of each service's batches in one ordered BatchList per
        # service, posted while the work flows; the kill comes mid-run, once
        # ``kill_at`` batches are committed (posting goes on to the others).
        poster = threading.Thread(
            target=_post_parallel, args=(cluster, _lists(workload, 1)), daemon=True
        )
        poster.start()
        if kill_at is None:
            kill_at = services + (services * batches - services) // 4
        _wait(lambda: _committed(url) >= kill_at, 900, f"{kill_at} batches committed")
        holders = _holders(url)
        victim_id = max(holders, key=lambda k: len(holders[k]))
        victim = next(g for g in cluster.gateways.values() if g.name == victim_id)
        cut_s = _cut_off(url, victim_id, cuts[victim_id], slots, 3.0) if cut else 0.0
        victim.stop()  # freeze it first, so what it has in flight is what it dies with
        killed_ms = time.time_ns() // 1_000_000
        start_write_log(url, killed_ms)
        holders = _holders(url)
        committed_at_kill = _committed(url)
        # Its services with work waiting at the kill: each is a sample (one whose
        # next batch is only posted after the kill would time the posting).
        victim_services = sorted(_open(url, holders.get(victim_id, [])))
        left = _left_mid_submission(url, victim_services)
        victim.kill()
        samples = {s: Sample(s, s in left, left.get(s)) for s in victim_services}
        deadline = time.monotonic() + settings.slow_ttl_ms / 1000 + resume_timeout_s
        while time.monotonic() < deadline and any(
            x.resumed_s is None or x.claimed_s is None for x in samples.values()
        ):
            with psycopg.connect(url) as conn:
                # The first thing another instance did for the service after the
                # kill: mark a batch submitted, or record the ledger's answer about
                # one; and when it claimed it (the victim is dead: any write after
                # the kill is another's).
                writes = conn.execute(
                    _FIRST_WRITES, {"s": victim_services, "v": victim_id}
                ).fetchall()
            for service_id, acted, claimed in writes:
                x = samples[service_id]
                if acted is not None:
                    x.resumed_s = (acted - killed_ms) / 1000
                if claimed is not None:
                    x.claimed_s = (claimed - killed_ms) / 1000
            time.sleep(0.05)
        poster.join(900)
        total = services * batches
        _wait(lambda: _committed(url) >= total, 900, "every batch committed")
        elapsed = time.monotonic() - started
        problems = check_invariants(url, node.url, workload)
        held_at_kill = set(holders.get(victim_id, []))
        moved: dict[str, float] = {}
        for at, writer, service_id, batch_id, what in write_log(url):
            if writer == victim_id:
                continue
            if what == "claimed" and service_id in held_at_kill:
                moved.setdefault(service_id, (at - killed_ms) / 1000)
            x = samples.get(service_id)
            if x is not None and what == "claimed" and x.taker is None:
                x.taker = writer
            if x is not None and batch_id:
                x.writes.append((batch_id == x.left, what))
        return FailoverRun(
            samples=list(samples.values()),
            problems=problems,
            rate=total / elapsed,
            shares={k: len(v) for k, v in sorted(holders.items())},
            victim=victim_id,
            balanced=balanced,
            cut_s=cut_s,
            posts_dropped=cuts[victim_id].posts_dropped if cut else 0,
            slots=slots if cut else 0,
            committed_at_kill=committed_at_kill,
            elapsed_s=elapsed,
            held=len(held_at_kill),
            moved=sorted(moved.values()),
        )
    finally:
        cluster.close()
        for relay in cuts.values():
            relay.close()
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


def _path_rows(samples: list[Sample], target: float) -> list[list[object]]:
    def row(kind: str, group: list[Sample]) -> list[object]:
        times = sorted(x.resumed_s for x in group if x.resumed_s is not None)
        claimed = sorted(x.claimed_s for x in group if x.claimed_s is not None)
        if not group:
            return [kind, 0, "-", "-", "-", "-", "-", "-"]
        if not times:
            return [kind, len(group), "-", "-", "-", "-", f"0 / {len(group)}", "-"]
        return [
            kind,
            len(group),
            f"{min(times):.2f} s",
            f"{statistics.median(times):.2f} s",
            f"{report.percentile(times, 95):.2f} s",
            f"{max(times):.2f} s",
            f"{sum(t <= target for t in times)} / {len(group)}",
            (f"{statistics.median(claimed):.2f} / {max(claimed):.2f} s" if claimed else "not seen"),
        ]

    return [
        row("fast (nothing mid-submission)", [x for x in samples if not x.mid_submission]),
        row("slow (a batch mid-submission)", [x for x in samples if x.mid_submission]),
    ]


def _late(samples: list[Sample], target: float, most: int = 10) -> list[str]:
    """The samples resumed after ``target`` (or never), each with its claim, its first
    write and who took it: what a miss needs looked at (the gateways' logs)."""
    late = sorted(
        (x for x in samples if x.resumed_s is None or x.resumed_s > target),
        key=lambda x: x.resumed_s if x.resumed_s is not None else float("inf"),
    )
    if not late:
        return []

    def one(x: Sample) -> str:
        path = "slow" if x.mid_submission else "fast"
        claimed = f"{x.claimed_s:.2f} s" if x.claimed_s is not None else "not seen"
        first = f"{x.resumed_s:.2f} s" if x.resumed_s is not None else "none seen"
        what = f" ({x.writes[0][1]})" if x.writes else ""
        return (
            f"{x.service_id} ({path}, by {x.taker or '?'}: claimed {claimed}, "
            f"first write {first}{what})"
        )

    more = f"; {len(late) - most} more" if len(late) > most else ""
    return [f"* Over {target:.0f} s: " + ", ".join(one(x) for x in late[:most]) + more + "."]


def _counts(items: list[str]) -> str:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return "; ".join(f"{what} ({n})" for what, n in sorted(counts.items(), key=lambda c: -c[1]))


def _evidence(samples: list[Sample]) -> str:
    """What the new holders wrote after the kill (the write log), per path: how the
    path shows beyond the store's state at the freeze."""
    fast = [x for x in samples if not x.mid_submission]
    slow = [x for x in samples if x.mid_submission]
    parts = []
    if fast:
        parts.append(
            "fast path, the new holder's first write for the service: "
            + _counts([x.writes[0][1] if x.writes else "none seen" for x in fast])
        )
    if slow:

        def status_first(x: Sample) -> bool:
            about_left = [what for same, what in x.writes if same]
            return bool(about_left) and not about_left[0].startswith("marked submitted")

        asked = [x for x in slow if x.writes and x.writes[0][0] and status_first(x)]
        blind = [
            x
            for x in slow
            if any(same for same, _ in x.writes)
            and next(w for same, w in x.writes if same).startswith("marked submitted")
        ]
        answers = [next(w for same, w in x.writes if same) for x in asked]
        resent = sum(any(same and w == "marked submitted" for same, w in x.writes) for x in slow)
        parts.append(
            f"slow path: for {len(asked)} of {len(slow)} services the new holder's first "
            "write was a status of the batch left mid-submission, i.e. the ledger was asked "
            f"before anything was sent ({_counts(answers)}); {resent} of those batches were "
            "then marked submitted again (resent under the same id: the ledger had answered "
            f"UNKNOWN), and {len(blind)} were marked submitted before any status was written"
        )
    return ". ".join(parts) + "." if parts else ""


def failover_markdown(
    run: FailoverRun,
    services: int,
    batches: int,
    commit_delay_ms: int,
    settings: ClaimSettings,
    cut: bool,
) -> list[str]:
    target = (settings.ttl_ms + 1_000) / 1000
    never = sum(x.resumed_s is None for x in run.samples)
    how = (
        f"Just before the kill the victim was cut off from the node for {run.cut_s:.1f} s "
        "while it went on running (`bench/_cluster.py`, `LedgerCut`): no answer, status or "
        "event reached it, and the POSTs it sent on every other connection did not reach the "
        f"node ({run.posts_dropped} dropped), so the batches it marked submitted meanwhile were "
        "left without the ledger's answer — the slow path, forced. "
        if cut
        else "No cut: the slow path is only sampled if the kill happens to find a batch mid-POST. "
    )
    shares = ", ".join(f"{k} {v:,}" for k, v in run.shares.items())
    return [
        f"**Failover** — {services:,} services × {batches} ordered intkey batches, node commit "
        f"delay {commit_delay_ms} ms, 3 gateways on one PostgreSQL; each service's first batch "
        "posted, then (once each gateway held at least half its share"
        f"{'' if run.balanced else ' — not reached within the wait, the run went on'}) the "
        "rest, and the busiest gateway "
        f"({run.victim}) SIGKILLed (frozen first) once {run.committed_at_kill:,} batches were "
        f"committed, posting going on to the others. Services held at the kill: {shares}. "
        + how
        + f"The victim held {len(run.samples):,} services with a batch not final "
        f"({sum(x.mid_submission for x in run.samples):,} of them mid-submission). "
        "Per such service: the time from the kill until another gateway's first write "
        "for it — a batch marked submitted, or a status recorded — and until its new claim "
        "(the claim row written; all times from the write log, `clock_timestamp()`):",
        "",
        report.table(
            [
                "path",
                "services",
                "min",
                "median",
                "p95",
                "max",
                f"≤ TTL + 1 s ({target:.0f} s)",
                "claim moved: median / max",
            ],
            _path_rows(run.samples, target),
        ),
        "",
        *([*late, ""] if (late := _late(run.samples, target)) else []),
        f"All {run.held:,} services the victim held at the kill, with work or not: "
        f"{len(run.moved):,} claimed by another gateway, "
        + (
            f"the first {min(run.moved):.2f} s, median {statistics.median(run.moved):.2f} s,"
            f" the last {max(run.moved):.2f} s after the kill; "
            f"{sum(t <= target for t in run.moved):,} within {target:.0f} s. "
            if run.moved
            else "none within the wait. "
        )
        + (f"{never} services saw no write by another gateway within the wait. " if never else "")
        + "Invariants after the run (all committed, exactly once, in order, no fenced write "
        f"landed): {'held' if not run.problems else 'VIOLATED: ' + '; '.join(run.problems[:5])}."
        f" The whole run took {run.elapsed_s:.0f} s, first post to last commit (balancing wait "
        f"and kill included): {run.rate:.0f} batches/s.",
    ]


def failover_detail(run: FailoverRun) -> list[str]:
    """What the console shows beyond the page's section: every sample, and how each
    path shows in what the survivors wrote first."""
    fast = sorted(
        x.resumed_s for x in run.samples if not x.mid_submission and x.resumed_s is not None
    )
    slow = sorted(x.resumed_s for x in run.samples if x.mid_submission and x.resumed_s is not None)
    return [
        _samples("fast", fast),
        _samples("slow", slow),
        "",
        "Which path a sample took is read from the store at the freeze, before the kill: "
        "a service is *mid-submission* if one of its batches is marked submitted without the "
        "ledger's answer (status none, Unknown or Delayed, not final; docs/ha.md, "
        '"Two-phase expiry"). It shows again in what the survivors wrote first: '
        + _evidence(run.samples)
        + " Fast path: the claim lapses at its first expiry (the TTL, counted from the "
        "victim's last renewal, so up to 5 s after the kill), the survivors claim it and go "
        "on with the service's batches. Slow path: the claim lapses at the second expiry "
        "(TTL + 10 %), and the new holder first asks the ledger about the batch left "
        "mid-submission (a status is written: the ledger's, or Unknown, after which the same "
        'batch is resent) — docs/ha.md, "Safety", says why this needs no longer second expiry.',
    ]


#: Targets of the primary-lost case (issue 38): accepting again this soon
#: after the promotion.
ACCEPTING_AGAIN_TARGET_S = 3.0


def _primary_lost_target(runs: list[tuple[float, PrimaryLostRun]]) -> report.Target:
    """The at-a-glance figure: accepting again, and answers within the bound."""
    again = [t for _, run in runs for t in run.accepting_again.values()]
    seen = [t for t in again if t is not None]
    during = [a for _, run in runs for a in run.during_outage()]
    within = all(a.status and a.took <= run.bound_s for _, run in runs for a in run.during_outage())
    held = all(not run.problems for _, run in runs)
    worst = f"{max(seen):.2f} s" if seen else "never"
    met = len(seen) == len(again) and max(seen, default=0) <= ACCEPTING_AGAIN_TARGET_S
    return report.Target(
        "pg-failover",
        f"accepting again after at most {worst}; {len(during)} requests during "
        f"{len(runs)} outages, {'all' if within else 'not all'} answered within the bound",
        "yes" if met and within and held else "no",
    )


def _primary_lost_row(outage_s: float, run: PrimaryLostRun) -> list[object]:
    during = run.during_outage()
    took = sorted(a.took for a in during if a.status)
    unanswered = sum(1 for a in during if not a.status)
    within = sum(1 for a in during if a.status and a.took <= run.bound_s)
    again = [t for t in run.accepting_again.values()]
    seen = [t for t in again if t is not None]
    return [
        f"{outage_s:g} s",
        len(during),
        f"{sum(a.status == 503 for a in during)} / {sum(a.status == 202 for a in during)}",
        unanswered,
        (
            f"{statistics.median(took):.2f} / {report.percentile(took, 99):.2f} / {took[-1]:.2f} s"
            if took
            else "-"
        ),
        f"{within} / {len(during)}",
        " / ".join("none" if t is None else f"{t:.2f} s" for t in again),
        "yes"
        if len(seen) == len(again) and max(seen, default=0) <= ACCEPTING_AGAIN_TARGET_S
        else "no",
        "held" if not run.problems else "VIOLATED: " + "; ".join(run.problems[:3]),
    ]


def primary_lost_markdown(
    runs: list[tuple[float, PrimaryLostRun]], services: int, batches: int, clients: int
) -> list[str]:
    bound = runs[0][1].bound_s if runs else 0.0
    restarted = [o for o, r in runs if not r.same_processes]
    return [
        f"**PostgreSQL primary lost** — a primary and a synchronous streaming standby "
        "(throwaway clusters, `pg_basebackup -R`, `synchronous_standby_names = '*'`), "
        "`ledgerq node`, two `ledgerq serve` given both hosts in one URL "
        f"(`target_session_attrs=read-write`, `store.outage_timeout_s` {bound:g} s, default "
        f"claim timings); {clients} client threads posting {services} services × {batches} "
        "ordered intkey batches, one batch per POST, each POST to the next gateway, a "
        "service's next batch only after a 202 for its last, anything else retried 0.1 s "
        "later (a client's own timeout: 30 s). Once 30 % were acknowledged the primary was "
        "SIGKILLed; the standby was promoted (`pg_ctl promote`) after the outage given.",
        "",
        report.table(
            [
                "outage (kill → promotion)",
                "requests under way during it",
                "answered 503 / 202",
                "not answered",
                "answer time: median / p99 / max",
                f"answered within the bound ({bound:g} s)",
                "a batch acknowledged again after the promotion: gateway a / b",
                f"≤ {ACCEPTING_AGAIN_TARGET_S:g} s",
                "invariants",
            ],
            [_primary_lost_row(outage, run) for outage, run in runs],
        ),
        "",
        "*Requests under way during it*: every POST started before the promotion and "
        "answered (or given up) after the kill. *Acknowledged again*: from the promotion "
        "(the standby accepting writes) to the end of the first POST started after it that "
        "got a 202, per gateway; it includes the clients' pause between retries. "
        "*Invariants*: every batch acknowledged, then committed once and in order per "
        "service (the node's values and fingerprints), no write by a fenced-off instance. "
        + (
            "Both gateways ran as the same processes throughout, never restarted."
            if not restarted
            else f"A gateway was restarted in the run(s) of {restarted} s."
        ),
    ]


def run_primary_lost_bench(
    outages: tuple[float, ...],
    services: int,
    batches: int,
    clients: int,
    bound_s: float,
    workdir: Path | None,
    write: bool,
) -> None:
    runs: list[tuple[float, PrimaryLostRun]] = []
    load_before = os.getloadavg()
    for outage in outages:
        report.console.print(f"primary lost: outage {outage:g} s")
        with contextlib.ExitStack() as stack:
            if workdir is None:
                work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ledgerq-pl-")))
            else:
                work = workdir / f"outage-{outage:g}"
                work.mkdir(parents=True, exist_ok=True)
            runs.append(
                (
                    outage,
                    run_primary_lost(
                        work,
                        services=services,
                        batches=batches,
                        clients=clients,
                        outage_s=outage,
                        bound_s=bound_s,
                        fast_claims=False,
                    ),
                )
            )
    load_after = os.getloadavg()
    first, *rest = primary_lost_markdown(runs, services, batches, clients)
    lines = [
        f"Machine load average (1, 5, 15 min) before: "
        f"{', '.join(f'{x:.1f}' for x in load_before)}; after: "
        f"{', '.join(f'{x:.1f}' for x in load_after)} (the runs' own clusters, node, gateways "
        f"and clients on the 2 cores). {first}",
        *rest,
    ]
    markdown = "\n".join(lines)
    click.echo(markdown)
    if write:
        report.write_section(
            "failover-primary-lost", markdown, targets=[_primary_lost_target(runs)]
        )


@click.command()
@click.option("--services", default=60, show_default=True, help="Services in the failover run.")
@click.option("--batches", default=60, show_default=True, help="Batches per service (failover).")
@click.option("--commit-delay-ms", default=50, show_default=True, help="Node commit delay.")
@click.option(
    "--cut/--no-cut",
    default=True,
    show_default=True,
    help="Cut the victim off its ledger just before the kill (forces slow-path samples).",
)
@click.option(
    "--kill-at",
    type=int,
    default=None,
    help="Kill once this many batches are committed [default: the first batches and a "
    "quarter of the rest].",
)
@click.option(
    "--balance-timeout", default=180.0, show_default=True, help="Seconds to wait for the share."
)
@click.option("--throughput/--no-throughput", default=True, show_default=True)
@click.option("--tp-services", default=100, show_default=True, help="Services (throughput).")
@click.option("--tp-batches", default=20, show_default=True, help="Batches per service.")
@click.option(
    "--section",
    type=click.Choice(["failover", "failover-scale"]),
    default="failover",
    show_default=True,
    help="BENCHMARKS.md section to write: failover-scale for a run at thousands of services.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the processes' logs here (default: a temporary directory, removed).",
)
@click.option("--write/--no-write", default=True, show_default=True, help="Update BENCHMARKS.md.")
@click.option(
    "--primary-lost",
    is_flag=True,
    help="Measure PostgreSQL's primary lost under two gateways instead (throwaway clusters).",
)
@click.option(
    "--outage-s",
    "outages",
    type=float,
    multiple=True,
    default=(1.5, 30.0),
    show_default=True,
    help="--primary-lost: seconds from the kill to the promotion; repeatable, one run each.",
)
@click.option("--pl-services", default=40, show_default=True, help="--primary-lost: services.")
@click.option(
    "--pl-batches", default=25, show_default=True, help="--primary-lost: batches per service."
)
@click.option("--pl-clients", default=40, show_default=True, help="--primary-lost: client threads.")
@click.option(
    "--bound-s",
    default=2.0,
    show_default=True,
    help="--primary-lost: the gateways' store.outage_timeout_s.",
)
def command(
    services: int,
    batches: int,
    commit_delay_ms: int,
    cut: bool,
    kill_at: int | None,
    balance_timeout: float,
    throughput: bool,
    tp_services: int,
    tp_batches: int,
    section: str,
    workdir: Path | None,
    write: bool,
    primary_lost: bool,
    outages: tuple[float, ...],
    pl_services: int,
    pl_batches: int,
    pl_clients: int,
    bound_s: float,
) -> None:
    """Failover time after SIGKILL, and throughput with 1-3 gateways on PostgreSQL;
    with --primary-lost, PostgreSQL's primary killed and its standby promoted."""
    if primary_lost:
        run_primary_lost_bench(
            outages, pl_services, pl_batches, pl_clients, bound_s, workdir, write
        )
        return
    settings = ClaimSettings()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ledgerq-fo-")))
        else:
            work = workdir
            work.mkdir(parents=True, exist_ok=True)
        report.console.print("failover: 3 gateways, default claim timings, SIGKILL the busiest")
        run = measure_failover(
            work,
            services,
            batches,
            commit_delay_ms,
            cut=cut,
            kill_at=kill_at,
            balance_timeout_s=balance_timeout,
        )
        load_mid = os.getloadavg()
        rates = {}
        if throughput:
            for k in (1, 2, 3):
                report.console.print(f"throughput: {k} gateway(s)")
                rates[k] = measure_throughput(work, k, tp_services, tp_batches)
    load_after = os.getloadavg()

    first, *rest = failover_markdown(run, services, batches, commit_delay_ms, settings, cut)
    lines = [
        f"Claim timings: renew {settings.renew_interval_ms} ms, TTL (first expiry) "
        f"{settings.ttl_ms} ms, second expiry {settings.slow_ttl_ms} ms, grace "
        f"{settings.grace_ms} ms (the defaults). Machine load average (1, 5, 15 min) before: "
        f"{', '.join(f'{x:.1f}' for x in load_before)}; after the failover run: "
        f"{', '.join(f'{x:.1f}' for x in load_mid)} (its own gateways, PostgreSQL and node on "
        f"the 2 cores; a machine shared with other work). {first}",
        *rest,
    ]
    detail = failover_detail(run)
    if throughput:
        detail += [
            "",
            f"**Throughput** — {tp_services} services × {tp_batches} batches posted round-robin "
            "across the gateways, one PostgreSQL, one node process (no commit delay); load "
            f"average after: {', '.join(f'{x:.1f}' for x in load_after)}:",
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
            "CPU: user + system time of the gateway processes, of the PostgreSQL server "
            "processes serving the run's database (read from /proc), and of the node, per "
            "1,000 batches.",
            "",
            "On this 2-core machine every gateway process competes for the same cores with "
            "PostgreSQL and the node, so more gateways add contention, not capacity: instances "
            "are for availability here. The gateway's own throughput is measured by "
            "`ledgerq bench e2e`.",
        ]
    markdown = "\n".join(lines)
    click.echo(markdown)
    click.echo("\n".join(detail))
    if write:
        targets = [failover_target(run, settings)] if section == "failover" else []
        report.write_section(section, markdown, targets=targets)


def failover_target(run: FailoverRun, settings: ClaimSettings) -> report.Target:
    """The page's failover target: every service of the victim resumed within TTL + 1 s."""
    limit = (settings.ttl_ms + 1_000) / 1000
    parts, met = [], bool(run.samples)
    for name, mid in (("fast", False), ("slow", True)):
        times = [x.resumed_s for x in run.samples if x.mid_submission is mid]
        if not times:
            continue
        seen = [t for t in times if t is not None]
        worst = f"{max(seen):.2f} s" if seen else "none seen"
        parts.append(f"{name} path max {worst} ({len(times):,} services)")
        met = met and len(seen) == len(times) and max(seen) <= limit
    figure = ", ".join(parts) or "no service held work at the kill"
    return report.Target("failover", f"{figure}; limit {limit:.0f} s", "yes" if met else "no")
