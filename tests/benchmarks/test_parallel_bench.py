"""The parallel benchmark kept from rotting: a tiny real run of each strategy, judged
(verdicts, per-name order and values, no overlap, no blind resend); never its speed."""

from __future__ import annotations

import asyncio

import pytest

from bench.parallel import _one, _plan
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
