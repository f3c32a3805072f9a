"""Figures from a run: throughput, latency, per-service cycle, failure damage.

Definitions (all times on the benchmark process's monotonic clock):

* *commit time* of a batch: when the node's event stream reported its final
  status;
* *latency*: commit time minus the moment the batch reached the head of its
  service's queue (the later of its acceptance and its predecessor's commit),
  so a deep queue does not inflate it;
* *cycle*: time between consecutive commits of one service; the *cycle
  overhead* of a system is its median cycle minus the bare client's;
* *throughput*: batches committed / (last commit - first acceptance);
* *gap* (plain-REST ledger only, whose report has POST arrival times): for
  consecutive batches of one service, the arrival of batch n+1's first POST
  at the ledger minus batch n's commit, both on the ledger's clock — what the
  system adds between a commit and the next batch of the service;
* *CPU per batch*: CPU seconds of the system's own process(es) (the
  gateways, the procrastinate workers, the benchmark process for the ideal
  client) during the run, per committed batch;
* *blocked* (failure case): for each service with work left when a worker was
  killed, the time from the kill to that service's next commit.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise

from bench._harness import Workload
from bench._systems import Run
from bench.report import percentile


@dataclass
class Figures:
    system: str
    services: int
    per_service: int
    committed: int
    invalid: int
    missing: int
    executed_twice: int
    wrong_keys: int
    throughput: float
    latency_p50_ms: float
    latency_p99_ms: float
    cycle_p50_ms: float
    blocked_p50_s: float = 0.0
    blocked_max_s: float = 0.0
    blocked_keys: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    commit_times: list[float] = field(default_factory=list)  # seconds since start
    latencies_ms: list[float] = field(default_factory=list)
    killed_at: float | None = None  # seconds since start
    gap_p50_ms: float | None = None
    gap_p99_ms: float | None = None
    cpu_ms_per_batch: float | None = None
    #: PostgreSQL's sessions' CPU per committed batch (None: SQLite, or unread).
    db_cpu_ms_per_batch: float | None = None
    #: POSTs of a batch the (fault) ledger held; None where not judged.
    violations: int | None = None


def figures(
    run: Run,
    events: dict[str, list[tuple[float, str]]],
    keys: dict[str, int | None],
    first_post: dict[str, float] | None = None,
    violations: int | None = None,
) -> Figures:
    wl: Workload = run.workload
    gaps = _gaps(wl, events, first_post) if first_post is not None else []
    latencies: list[float] = []
    cycles: list[float] = []
    blocked: list[float] = []
    commits: list[float] = []
    statuses: Counter[str] = Counter()
    twice = 0
    for batches in wl.batches.values():
        prev: float | None = None
        after_kill: float | None = None
        for b in batches:
            seen = events.get(b.batch_id)
            if not seen:
                statuses["missing"] += 1
                prev = None
                continue
            twice += len(seen) > 1
            at, status = seen[0]
            statuses[status] += 1
            commits.append(at - run.started)
            head = max(run.accepted.get(b.batch_id, run.started), prev or 0.0)
            latencies.append((at - head) * 1000)
            if prev is not None:
                cycles.append((at - prev) * 1000)
            if run.killed_at is not None and after_kill is None and at >= run.killed_at:
                after_kill = at
            prev = at
        if run.killed_at is not None:
            last = events.get(batches[-1].batch_id)
            if last is None or last[0][0] >= run.killed_at:
                # the service had work left at the kill
                blocked.append((after_kill - run.killed_at) if after_kill else float("inf"))
    end = max(commits) if commits else 0.0
    expected = wl.per_service - 1
    wrong = sum(1 for v in keys.values() if v != expected)
    finite = [b for b in blocked if b != float("inf")]
    return Figures(
        system=run.system,
        services=wl.services,
        per_service=wl.per_service,
        committed=statuses["COMMITTED"],
        invalid=statuses["INVALID"],
        missing=statuses["missing"],
        executed_twice=twice,
        wrong_keys=wrong,
        throughput=(len(commits) / end) if end > 0 else 0.0,
        latency_p50_ms=percentile(latencies, 50),
        latency_p99_ms=percentile(latencies, 99),
        cycle_p50_ms=statistics.median(cycles) if cycles else 0.0,
        blocked_p50_s=percentile(finite, 50),
        blocked_max_s=max(blocked) if blocked else 0.0,
        blocked_keys=len(blocked),
        extra=dict(run.extra),
        commit_times=sorted(commits),
        latencies_ms=latencies,
        killed_at=None if run.killed_at is None else run.killed_at - run.started,
        gap_p50_ms=percentile(gaps, 50) if gaps else None,
        gap_p99_ms=percentile(gaps, 99) if gaps else None,
        cpu_ms_per_batch=(
            run.cpu_s * 1000 / len(commits) if run.cpu_s is not None and commits else None
        ),
        db_cpu_ms_per_batch=(
            run.db_cpu_s * 1000 / len(commits) if run.db_cpu_s is not None and commits else None
        ),
        violations=violations,
    )


def _gaps(
    wl: Workload, events: dict[str, list[tuple[float, str]]], first_post: dict[str, float]
) -> list[float]:
    out = []
    for batches in wl.batches.values():
        for prev, nxt in pairwise(batches):
            done = events.get(prev.batch_id)
            posted = first_post.get(nxt.batch_id)
            if done and posted is not None:
                out.append((posted - done[0][0]) * 1000)
    return out
