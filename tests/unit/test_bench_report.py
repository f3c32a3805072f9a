from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from bench import report
from ledgerq.cli import cli


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    report.write_section("a", "first A", command="ledgerq bench a", path=target)
    report.write_section("b", "only B", command="ledgerq bench b", path=target)
    report.write_section("a", "second A", command="ledgerq bench a --x", path=target)
    text = target.read_text()
    assert "second A" in text
    assert "first A" not in text
    assert "only B" in text
    assert text.count("<!-- bench:a -->") == 1
    assert "`ledgerq bench a --x`" in text
    assert "cores" in text
    assert "load average (1, 5, 15 min) when written:" in text


def test_a_new_section_gets_a_heading_to_link_to(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    report.write_section("a", "figures", command="ledgerq bench a", path=target)
    report.write_section("b", "## Its own title\n\nfigures", command="ledgerq bench b", path=target)
    report.write_section("a", "new figures", command="ledgerq bench a", path=target)
    text = target.read_text()
    assert text.count("## `ledgerq bench a`\n\n<!-- bench:a -->") == 1
    assert "ledgerq bench b`\n\n<!-- bench:b" not in text
    assert text.count("## Its own title") == 1


def test_a_new_section_may_name_its_heading(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    report.write_section("x", "figures", command="ledgerq bench x", path=target, heading="Title")
    assert "## Title\n\n<!-- bench:x -->" in target.read_text()


def test_a_partial_compare_run_keeps_the_full_runs_section() -> None:
    from bench import compare

    full = compare.section_for(
        list(compare.SYSTEMS), list(compare.LEDGERS), compare.DEFAULT_SIZES, "100:20"
    )
    assert full == ("compare", None)
    name, heading = compare.section_for(["ideal", "ledgerq-pg"], ["plain"], "50:20", "none")
    assert name == "compare-ideal-ledgerq-pg-plain-50-20"
    assert heading is not None and "ledgerq-pg" in heading and "50 × 20" in heading
    other, _ = compare.section_for(["ideal", "ledgerq-sqlite"], ["plain"], "50:20", "none")
    assert other != name


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert report.percentile(values, 50) == 51.0
    assert report.percentile(values, 99) == 99.0
    assert report.percentile([], 50) == 0.0


def test_bench_group_lists_the_bench_folder() -> None:
    result = CliRunner().invoke(cli, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    assert "all" in result.output
