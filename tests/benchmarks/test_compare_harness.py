"""The comparison benchmark's harness, kept from rotting: its figures on made-up
events, and a tiny real run of every system against `ledgerq node` and against
the plain-REST fault ledger on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._harness import Workload
from bench._metrics import figures
from bench._systems import Run, Setup
from bench.compare import _one, _parse_sizes


def _run_with(workload: Workload, order: dict[str, list[str]]) -> tuple[Run, dict]:
    """A run whose batches were accepted at t=0 and committed in ``order`` per service."""
    run = Run("x", workload, started=0.0)
    events: dict[str, list[tuple[float, str]]] = {}
    for service, batches in workload.batches.items():
        for b in batches:
            run.accepted[b.batch_id] = 0.0
        for t, bid in enumerate(order.get(service, [b.batch_id for b in batches]), start=1):
            events.setdefault(bid, []).append((float(t), "COMMITTED"))
    return run, events


def test_figures_of_an_orderly_run() -> None:
    wl = Workload(2, 3)
    run, events = _run_with(wl, {})
    f = figures(run, events, {wl.service_id(0): 2, wl.service_id(1): 2})
    assert (f.committed, f.invalid, f.missing, f.executed_twice, f.wrong_keys) == (6, 0, 0, 0, 0)
    assert f.cycle_p50_ms == 1000.0
    assert f.latency_p50_ms == 1000.0  # each batch waits one second at the head of its queue
    assert f.throughput == 2.0  # 6 batches by t=3 s


def test_figures_count_double_executions_missing_batches_and_wrong_keys() -> None:
    wl = Workload(1, 3)
    ids = [b.batch_id for b in wl.batches[wl.service_id(0)]]
    run, events = _run_with(wl, {wl.service_id(0): [ids[0], ids[1]]})
    events[ids[1]].append((9.0, "COMMITTED"))
    f = figures(run, events, {wl.service_id(0): 1})
    assert (f.missing, f.executed_twice, f.wrong_keys) == (1, 1, 1)


def test_figures_of_a_kill_measure_the_wait_to_the_next_commit() -> None:
    wl = Workload(1, 4)
    run, events = _run_with(wl, {})
    run.killed_at = 2.5
    events[wl.batches[wl.service_id(0)][2].batch_id] = [(7.5, "COMMITTED")]
    events[wl.batches[wl.service_id(0)][3].batch_id] = [(8.0, "COMMITTED")]
    f = figures(run, events, {wl.service_id(0): 3})
    assert f.blocked_keys == 1
    assert f.blocked_max_s == 5.0


def test_sizes_are_parsed_and_checked() -> None:
    assert _parse_sizes("10:200,1000:6") == [(10, 200), (1000, 6)]
    with pytest.raises(Exception, match="SERVICES:BATCHES"):
        _parse_sizes("10")


def test_the_gap_is_the_next_post_minus_the_previous_commit() -> None:
    wl = Workload(1, 3)
    ids = [b.batch_id for b in wl.batches[wl.service_id(0)]]
    run, events = _run_with(wl, {})
    posted = {ids[0]: 0.5, ids[1]: 1.004, ids[2]: 2.010}
    f = figures(run, events, {wl.service_id(0): 2}, posted, 0)
    assert f.gap_p50_ms is not None and f.gap_p99_ms is not None
    assert round(f.gap_p50_ms) in (4, 10) and round(f.gap_p99_ms) == 10
    assert f.violations == 0


@pytest.mark.pg
@pytest.mark.slow
@pytest.mark.parametrize("ledger", ["node", "plain"])
@pytest.mark.parametrize("system", ["ideal", "ledgerq-sqlite", "ledgerq-pg", "procrastinate"])
async def test_a_tiny_real_run_commits_everything_in_order(
    system: str, ledger: str, tmp_path: Path, pg_admin_url: str
) -> None:
    setup = Setup(tmp_path, pg_admin_url, slots=4, workers=1, timeout_s=60, ledger=ledger)
    f = await _one(setup, system, 3, 4, None)
    assert (f.committed, f.invalid, f.missing, f.executed_twice, f.wrong_keys) == (12, 0, 0, 0, 0)
    assert f.throughput > 0
    assert f.cpu_ms_per_batch is not None and f.cpu_ms_per_batch > 0
    if ledger == "plain":
        assert f.violations == 0 and f.gap_p50_ms is not None
