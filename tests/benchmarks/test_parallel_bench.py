"""The parallel benchmark kept from rotting: a tiny real run of each strategy, judged
(verdicts, per-name order and values, no overlap, no blind resend); never its speed."""

from __future__ import annotations

import asyncio

import pytest

from bench.parallel import _ceiling, _chains, _one, _plan
from ledgerq.testing.fault_ledger import FaultPlan
from ledgerq.testing.workload import KeyedWorkload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("strategy", ["serial", "parallel"])
def test_a_tiny_run_is_judged_clean(strategy: str) -> None:
    workload = KeyedWorkload(2, 8, names=4, spread="round-robin")
    run = asyncio.run(
        _one("independent", strategy, workload, _plan(20, faults=True), "sqlite", "", seed=1)
    )
    assert run.problems == []
    assert run.batches == 16 and run.seconds > 0
    if strategy == "parallel":
        assert run.peak_pending > 2  # more than one batch per service at the ledger at once


@pytest.mark.parametrize("strategy", ["serial", "parallel"])
def test_no_run_beats_the_faults_bound(strategy: str) -> None:
    # The bound is the least time the faults dealt allowed any client: a run
    # shorter than it would mean the bound counts time a client need not spend.
    workload = KeyedWorkload(2, 8, names=4, spread="round-robin")
    plan = FaultPlan(commit_delay_ms=40, busy_503=0.2, forget=0.2)
    run = asyncio.run(_one("independent", strategy, workload, plan, "sqlite", "", seed=3))
    assert run.problems == []
    commits = 8 if strategy == "serial" else 2  # a service's batches, or a name's
    assert commits * 0.04 <= run.bound_s <= run.seconds


def test_chains_follow_the_strategy() -> None:
    workload = KeyedWorkload(2, 8, names=4, spread="round-robin")
    serial = _chains(workload, "serial")
    parallel = _chains(workload, "parallel")
    assert sorted(len(c) for c in serial) == [8, 8]
    assert sorted(len(c) for c in parallel) == [2] * 8
    ids = [b.header_signature for b in workload.batches[KeyedWorkload.service_id(0)]]
    assert ids[0::4] in parallel  # a name's batches, in acceptance order


def test_the_ceiling_reads_the_plan() -> None:
    no_faults = _ceiling(FaultPlan(commit_delay_ms=100), 10, 40, 8, trials=50)
    assert no_faults[0] == no_faults[-1] == pytest.approx(8.0)  # 40 commits against 5
    faulty = _ceiling(_plan(100, faults=True), 10, 40, 8, trials=200)
    assert faulty[len(faulty) // 2] < 8.0
