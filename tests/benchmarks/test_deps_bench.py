"""The dependencies benchmark kept from rotting: its verdict on made-up runs (a stall,
a slow run, a drop, a resend, an early commit), its bounded wait, and a tiny real
run straight to the fault ledger; never its speed."""

from __future__ import annotations

import time
from pathlib import Path

import click
import pytest

from bench.deps import (
    Options,
    Outcome,
    parse_loads,
    rows,
    run_one,
    section,
    summary,
    verdict,
    wait_until_final,
)
from ledgerq.testing.intkey_load import IntkeyLoad


def _done(system: str, ledger: str, seconds: float, **kw: object) -> Outcome:
    o = Outcome("star 1 × 4", system, ledger, 4, final=4, committed=4, seconds=seconds)
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_a_gateway_run_passes_within_twice_the_time_straight_to_the_node() -> None:
    assert verdict(_done("ledgerq-sqlite", "node", 1.9), 1.0) == (True, [])
    ok, why = verdict(_done("ledgerq-pg", "fault", 2.5), 1.0)
    assert not ok and why == ["2.5 × the time straight to the node (target ≤ 2 ×)"]
    # No baseline (the direct run did not finish): not judged a pass.
    assert verdict(_done("ledgerq-pg", "node", 1.0), None)[0] is False
    # A direct run has no ratio to meet.
    assert verdict(_done("direct", "fault", 50.0), 1.0) == (True, [])


def test_a_stall_a_drop_a_resend_or_an_early_commit_fails() -> None:
    stalled = Outcome("l", "ledgerq-sqlite", "node", 4, committed=1, ended="stalled")
    stalled.elapsed_s = 45.2
    stalled.problems = ["3 of 4 not COMMITTED (3 no status)"]
    ok, why = verdict(stalled, 1.0)
    assert not ok and why[0] == "stalled after 45 s with 1 of 4 committed"
    assert not verdict(_done("ledgerq-pg", "fault", 1.0, dropped=2), 1.0)[0]
    assert not verdict(_done("ledgerq-pg", "fault", 1.0, resent=1), 1.0)[0]
    early = _done("direct", "node", 1.0, problems=["1 committed before a batch they depend on"])
    assert not verdict(early, None)[0]


def test_the_table_gives_no_figure_for_a_run_that_did_not_finish() -> None:
    base = _done("direct", "node", 0.5)
    stalled = Outcome("star 1 × 4", "ledgerq-sqlite", "node", 4, committed=2, ended="stalled")
    stalled.gateway_cpu_s = 3.0  # spent, but no figure per batch from a stall
    good = _done("ledgerq-pg", "node", 0.8, gateway_cpu_s=0.004, db_cpu_s=0.002)
    table = rows([base, stalled, good])
    assert table[0][2:4] == ["0.50 s", "1"]
    assert table[1][2:5] == ["– (stalled)", "-", "2 of 4"]
    assert table[1][-3:-1] == ["-", "-"] and table[1][-1].startswith("FAIL: stalled")
    assert table[2][3] == "1.60" and table[2][-3:] == ["1.00", "0.50", "PASS"]
    text = summary([base, stalled, good])
    assert text.startswith("**Target not met**: 1 of 2") and "ledgerq-sqlite → node 2/4" in text
    assert summary([base, good]).startswith("**Target met**")
    opts = Options(Path("."), "")
    md = section(parse_loads("star:1x4"), opts, "TABLE", text, "0.1", "0.2")
    assert md.startswith("**Target not met**") and "TABLE" in md


def test_loads_are_parsed_and_checked() -> None:
    assert [s.label for s in parse_loads("star:1x400,chain:20x20")] == [
        "star 1 × 400",
        "chain 20 × 20",
    ]
    for bad in ("star", "tree:1x4", "star:0x4", "chain:2x1"):
        with pytest.raises(click.BadParameter):
            parse_loads(bad)


class _Frozen:
    """A ledger on which nothing ever becomes final (or, ``moving``, always more)."""

    url = ""

    def __init__(self, moving: bool = False) -> None:
        self.moving, self.calls = moving, 0

    def final_count(self, load: IntkeyLoad) -> int:
        self.calls += 1
        return self.calls % load.total if self.moving else 0

    def judge(self, load: IntkeyLoad, started: float, outcome: Outcome) -> None:
        raise AssertionError("not called")


async def test_the_wait_ends_on_a_stall_or_the_timeout_never_hangs() -> None:
    load = IntkeyLoad(1, 10, shape="chain")
    opts = Options(Path("."), "", stall_s=0.3, timeout_s=60)
    assert await wait_until_final(_Frozen(), load, time.monotonic(), opts) == "stalled"
    opts = Options(Path("."), "", stall_s=60, timeout_s=0.3)
    moving = _Frozen(moving=True)
    assert await wait_until_final(moving, load, time.monotonic(), opts) == "timed out"


@pytest.mark.slow
async def test_a_tiny_real_run_straight_to_the_fault_ledger_is_judged_clean(
    tmp_path: Path,
) -> None:
    opts = Options(tmp_path, "", posters=3, keys=2, commit_delay_ms=0, stall_s=20, timeout_s=60)
    outcome = await run_one(parse_loads("star:2x6")[0], "direct", "fault", opts)
    assert outcome.ended == "done" and outcome.committed == outcome.total == 12
    assert outcome.problems == [] and outcome.dropped == 0 and outcome.resent == 0
    assert outcome.held is not None and outcome.held > 0  # the shuffle put dependents first
    assert verdict(outcome, None) == (True, [])
