"""The pipelined benchmark kept from rotting: its verdicts on made-up runs (a
stall, an order violation, a blind resend, a ratio below target with and
without faults), its bounded wait, and one tiny real run with faults; never
its speed."""

from __future__ import annotations

import time
from pathlib import Path

import click
import pytest

from bench.pipelined import (
    Case,
    Options,
    Outcome,
    parse_cases,
    ratio_rows,
    ratio_verdict,
    run_one,
    run_rows,
    section,
    summary,
    verdict,
    wait_until,
)

TEN = Case(10, 100)
ONE = Case(1, 500)


def _run(
    strategy: str, seconds: float | None, *, case: Case = TEN, mode: str = "clean", **kw: object
) -> Outcome:
    total = case.services * case.per_service
    o = Outcome(case, mode, "sqlite", strategy, total, total, committed=total, seconds=seconds)
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_a_clean_run_passes_whatever_its_speed() -> None:
    assert verdict(_run("serial", 100.0)) == (True, [])


def test_a_stall_an_order_violation_or_a_blind_resend_fails() -> None:
    stalled = _run("pipelined", None, ended="stalled", committed=990, elapsed_s=61.2)
    assert verdict(stalled) == (False, ["stalled after 61 s with 990 of 1000 committed"])
    assert verdict(_run("pipelined", 1.0, order_violations=2)) == (False, ["2 order violations"])
    assert verdict(_run("pipelined", 1.0, blind_resends=1)) == (False, ["1 blind resends"])
    wrong = _run("serial", 1.0, problems=["the gateway's status of 3 batches not as expected"])
    assert verdict(wrong)[0] is False


def test_the_ratio_is_judged_against_the_case_s_target_without_faults_only() -> None:
    assert ratio_verdict(_run("serial", 10.0), _run("pipelined", 1.0)) == (10.0, True, [])
    ratio, ok, why = ratio_verdict(_run("serial", 10.0), _run("pipelined", 2.0))
    assert (ratio, ok, why) == (5.0, False, ["5.0 × (target ≥ 10 ×)"])
    # One service: 20 ×.
    one = {"case": ONE}
    assert not ratio_verdict(_run("serial", 10.0, **one), _run("pipelined", 0.6, **one))[1]
    assert ratio_verdict(_run("serial", 10.0, **one), _run("pipelined", 0.5, **one))[1]
    # With faults the ratio is shown, not judged; the runs still are.
    faults = {"mode": "faults"}
    assert ratio_verdict(_run("serial", 10.0, **faults), _run("pipelined", 5.0, **faults))[1]
    bad = _run("pipelined", 1.0, blind_resends=1, **faults)
    assert ratio_verdict(_run("serial", 10.0, **faults), bad)[2] == ["pipelined run failed"]
    # No rate (a stalled run): nothing to compare.
    stalled = _run("pipelined", None, ended="stalled")
    assert ratio_verdict(_run("serial", 10.0), stalled) == (
        None,
        False,
        ["pipelined run failed", "no rate to compare"],
    )


def test_the_report_gives_no_figure_for_a_run_that_did_not_finish() -> None:
    serial = _run("serial", 10.0, gateway_cpu_s=2.0, db_cpu_s=1.0, posts=1000)
    fast = _run("pipelined", 0.5, gateway_cpu_s=1.0, posts=1000)
    stalled = _run("pipelined", None, mode="faults", ended="stalled", gateway_cpu_s=9.0)
    runs = run_rows([serial, fast, stalled])
    assert runs[0][4:8] == ["100.0", "10.00", "1000 of 1000", "1.00"]
    assert runs[0][-3:] == ["2.00", "1.00", "PASS"]
    assert runs[2][4:6] == ["-", "– (stalled)"] and runs[2][-3] == "-"
    assert runs[2][-1].startswith("FAIL: stalled")
    assert ratio_rows([serial, fast])[0][5:] == ["20.0 ×", "≥ 10 ×", "PASS"]
    assert summary([serial, fast]).startswith("**Targets met**")
    text = summary([serial, fast, stalled, _run("serial", 10.0, mode="faults")])
    assert text.startswith("**Targets not met**") and "10 × 100 faults sqlite pipelined" in text
    md = section([TEN], Options(Path("."), ""), text, "RATIOS", "0.1", "0.2")
    assert md.startswith("**Targets not met**") and md.endswith("RATIOS")


def test_cases_are_parsed_and_checked() -> None:
    assert parse_cases("10x100, 1x500") == [TEN, ONE]
    for bad in ("10", "0x100", "1x3", "ax5"):
        with pytest.raises(click.BadParameter):
            parse_cases(bad)


async def test_the_wait_ends_on_a_stall_or_the_timeout_never_hangs() -> None:
    async def frozen() -> int:
        return 0

    moved = iter(range(1, 10**6))

    async def moving() -> int:
        return next(moved)

    opts = Options(Path("."), "", stall_s=0.3, timeout_s=60)
    assert await wait_until(frozen, 10, time.monotonic(), opts) == "stalled"
    opts = Options(Path("."), "", stall_s=60, timeout_s=0.3)
    assert await wait_until(moving, 10**9, time.monotonic(), opts) == "timed out"


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_tiny_real_run_with_faults_is_judged_clean(tmp_path: Path) -> None:
    opts = Options(tmp_path, "", commit_delay_ms=20, stall_s=30, timeout_s=120)
    o = await run_one(Case(2, 8), "faults", "sqlite", "pipelined", opts)
    assert verdict(o) == (True, [])
    # The first chain's fifth batch is INVALID: it and the three after it fail.
    assert o.ended == "done" and o.expected == o.committed == 12 and o.total == 16
    assert all(n >= 1 for n in o.faults.values()), o.faults  # each fault dealt
    assert o.rate is not None and o.gateway_cpu_s is not None and o.db_cpu_s is None
