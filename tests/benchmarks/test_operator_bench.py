"""The operator benchmark, kept from rotting: a tiny run that writes nothing."""

from __future__ import annotations

from click.testing import CliRunner

from bench.operator import command


def test_operator_bench_runs_small() -> None:
    result = CliRunner().invoke(
        command, ["--services", "25", "--per-service", "2", "--requests", "2", "--no-write"]
    )
    assert result.exit_code == 0, result.output
    assert "`GET /metrics`" in result.output
    assert "25 services" in result.output
