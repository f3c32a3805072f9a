from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bench import report
from ledgerq.cli import cli


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    report.write_section("codec", "first A", command="ledgerq bench codec", path=target)
    report.write_section("store", "only B", command="ledgerq bench store", path=target)
    report.write_section("codec", "second A", command="ledgerq bench codec --x", path=target)
    text = target.read_text()
    assert "second A" in text
    assert "first A" not in text
    assert "only B" in text
    assert text.count("<!-- bench:codec -->") == 1
    assert "`ledgerq bench codec --x`" in text
    assert "cores" in text
    assert "load average (1, 5, 15 min) when written:" in text


def test_a_section_gets_its_fixed_heading_once(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    report.write_section("e2e", "figures", command="ledgerq bench e2e", path=target)
    report.write_section("e2e", "new figures", command="ledgerq bench e2e", path=target)
    text = target.read_text()
    assert text.count(f"## {report.SECTIONS['e2e']}\n\n<!-- bench:e2e -->") == 1


def test_a_section_not_listed_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    with pytest.raises(ValueError, match="compare-ideal-plain"):
        report.write_section("compare-ideal-plain", "x", command="c", path=target)
    with pytest.raises(ValueError, match="not measured by section"):
        report.write_section(
            "codec", "x", command="c", path=target, targets=[report.Target("e2e", "1", "yes")]
        )
    assert not target.exists()


def test_the_table_at_the_top_follows_the_sections_targets(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    report.write_section(
        "e2e",
        "figures",
        command="ledgerq bench e2e",
        path=target,
        targets=[report.Target("e2e", "sqlite 2,100 batches/s | x", "yes")],
    )
    text = target.read_text()
    top = text.index("## At a glance")
    assert top < text.index("## Gateway end to end")
    row = next(line for line in text.splitlines() if "**sqlite 2,100" in line)
    assert "**sqlite 2,100 batches/s / x** | yes |" in row
    assert "`ledgerq bench e2e`" in row
    assert "[Gateway end to end](#gateway-end-to-end)" in row
    assert "| not measured |" in text  # every other target still has its row
    report.write_section(
        "e2e",
        "figures",
        command="ledgerq bench e2e",
        path=target,
        targets=[report.Target("e2e", "sqlite 1,500 batches/s", "no")],
    )
    text = target.read_text()
    assert "2,100" not in text
    assert "**sqlite 1,500 batches/s** | no |" in text
    assert text.count("## At a glance") == 1
    assert report.with_summary(text) == text


def test_a_compare_run_writes_one_section_per_ledger() -> None:
    from bench import compare
    from bench._metrics import Figures

    assert set(compare.SECTION_OF) == set(compare.LEDGERS)
    assert {*compare.SECTION_OF.values(), compare.FAILURE_SECTION} <= set(report.SECTIONS)

    def run(system: str, s: int, m: int, rate: float, gap: float, cpu: float) -> Figures:
        return Figures(
            system,
            s,
            m,
            s * m,
            0,
            0,
            0,
            0,
            rate,
            1.0,
            2.0,
            3.0,
            gap_p50_ms=gap,
            cpu_ms_per_batch=cpu,
        )

    targets = {
        t.key: t
        for t in compare.plain_targets(
            [
                run("ideal", 50, 20, 1000, 1, 0.2),
                run("ledgerq-sqlite", 50, 20, 800, 4, 0.4),
                run("ledgerq-pg", 50, 20, 600, 9, 0.9),
                run("ideal", 1000, 5, 1000, 1, 0.2),
                run("ledgerq-sqlite", 1000, 5, 600, 4, 0.45),
                run("ledgerq-pg", 1000, 5, 300, 9, 1.1),
            ]
        )
    }
    assert targets["plain-sqlite"] == report.Target(
        "plain-sqlite", "0.80 × at 50 × 20, 0.60 × at 1,000 × 5", "yes"
    )
    assert targets["plain-pg"].met == "no"
    assert targets["gap"] == report.Target("gap", "sqlite 4.0 ms, pg 9.0 ms", "no")
    assert targets["gateway-cpu"].figure == "sqlite 0.45 ms, pg 1.10 ms at 1,000 × 5"


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert report.percentile(values, 50) == 51.0
    assert report.percentile(values, 99) == 99.0
    assert report.percentile([], 50) == 0.0


def test_bench_group_lists_the_bench_folder() -> None:
    result = CliRunner().invoke(cli, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    assert "all" in result.output


def test_the_machine_column_keeps_a_cpu_name_with_parentheses() -> None:
    from bench.report import _short_machine

    intel = (
        "2 cores (Intel(R) Xeon(R) Processor @ 2.60GHz), 24 GiB RAM, Linux 6, "
        "a secp256k1 verify 70 µs"
    )
    assert _short_machine(intel) == "2 cores, Intel Xeon, 24 GiB, verify 70 µs"
    assert (
        _short_machine("2 cores (AMD EPYC 7B13), 24 GiB RAM, Linux 6")
        == "2 cores, AMD EPYC 7B13, 24 GiB"
    )
