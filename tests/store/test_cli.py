"""``ledgerq migrate`` and ``ledgerq store summary`` through the real command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledgerq.cli import cli
from ledgerq.store.sqlfiles import latest_version


def test_migrate_prints_versions_before_and_after(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.sqlite3'}"
    runner = CliRunner()
    first = runner.invoke(cli, ["migrate", "--db", url])
    assert first.exit_code == 0, first.output
    latest = latest_version("sqlite")
    assert f"from version 0 to {latest}" in first.output
    second = runner.invoke(cli, ["migrate"], env={"LEDGERQ_DB": url})
    assert second.exit_code == 0, second.output
    assert f"at version {latest}, up to date" in second.output


def test_summary_reads_the_default_file_in_the_working_directory(tmp_path: Path) -> None:
    def summary() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(Path(sys.executable).parent / "ledgerq"), "store", "summary"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    # No store there yet: said so, and nothing created.
    missing = summary()
    assert missing.returncode == 1
    assert "no store at ledgerq.sqlite3" in missing.stderr
    assert list(tmp_path.iterdir()) == []
    assert (
        CliRunner()
        .invoke(cli, ["migrate", "--db", f"sqlite:///{tmp_path / 'ledgerq.sqlite3'}"])
        .exit_code
        == 0
    )
    done = summary()
    assert done.returncode == 0, done.stderr
    assert "Committed" in done.stdout and "total" in done.stdout


def test_store_commands_open_the_store_serve_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A settings file in the working directory names the store, as for serve;
    # LEDGERQ_DB overrides it, --db overrides both.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LEDGERQ_DB", raising=False)
    monkeypatch.delenv("LEDGERQ_CONFIG", raising=False)
    (tmp_path / "ledgerq.toml").write_text('db = "sqlite:///from_file.sqlite3"\n')
    runner = CliRunner()
    assert runner.invoke(cli, ["migrate"]).exit_code == 0
    assert (tmp_path / "from_file.sqlite3").exists()
    assert not (tmp_path / "ledgerq.sqlite3").exists()
    summary = runner.invoke(cli, ["store", "summary"])
    assert summary.exit_code == 0 and "from_file.sqlite3" in summary.output
    env = runner.invoke(cli, ["migrate"], env={"LEDGERQ_DB": "sqlite:///from_env.sqlite3"})
    assert env.exit_code == 0 and (tmp_path / "from_env.sqlite3").exists()
    flag = runner.invoke(
        cli,
        ["migrate", "--db", "sqlite:///from_flag.sqlite3"],
        env={"LEDGERQ_DB": "sqlite:///from_env.sqlite3"},
    )
    assert flag.exit_code == 0 and (tmp_path / "from_flag.sqlite3").exists()
    other = tmp_path / "other.toml"
    other.write_text('db = "sqlite:///from_other.sqlite3"\n')
    assert runner.invoke(cli, ["migrate", "--config", str(other)]).exit_code == 0
    assert (tmp_path / "from_other.sqlite3").exists()
    # A settings file that does not hold is refused as serve refuses it.
    (tmp_path / "ledgerq.toml").write_text('db = "sqlite:///x.sqlite3"\nslotz = 3\n')
    bad = runner.invoke(cli, ["store", "clean", "--older-than", "1d"])
    assert bad.exit_code == 2 and "unknown key 'slotz'" in bad.output


def test_a_store_that_does_not_exist_is_not_created_by_an_inspection(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'typo' / 'x.sqlite3'}"
    for args in (
        ["store", "summary", "--db", url],
        ["store", "clean", "--db", url, "--older-than", "1d"],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, result.output
        assert "no store at" in result.output and "does not exist" in result.output
    assert not (tmp_path / "typo").exists()


def test_bad_url_is_a_clean_error() -> None:
    result = CliRunner().invoke(cli, ["migrate", "--db", "mysql://x"])
    assert result.exit_code == 2
    assert "invalid db (from command line): 'mysql://x'" in result.output


def test_clean_deletes_old_final_batches_only(tmp_path: Path) -> None:
    import asyncio

    from ledgerq.clock import now_ms
    from ledgerq.model import Committed, Pending
    from ledgerq.store import open_store

    from .conftest import make_batch

    url = f"sqlite:///{tmp_path / 'c.sqlite3'}"
    day = 86_400_000

    async def fill() -> None:
        async with await open_store(url) as store:
            old, waiting, recent = await store.add_batches([make_batch() for _ in range(3)])
            await store.update_batch_status(
                old.batch_header, old.service_id, Committed(), now=now_ms() - 3 * day
            )
            await store.update_batch_status(
                waiting.batch_header, waiting.service_id, Pending(), now=now_ms() - 3 * day
            )
            await store.update_batch_status(recent.batch_header, recent.service_id, Committed())

    asyncio.run(fill())
    runner = CliRunner()
    result = runner.invoke(cli, ["store", "clean", "--db", url, "--older-than", "2d"])
    assert result.exit_code == 0, result.output
    assert "deleted 1 final batch" in result.output
    again = runner.invoke(cli, ["store", "clean", "--db", url, "--older-than", "2d"])
    assert "deleted 0 final batch" in again.output
    bad = runner.invoke(cli, ["store", "clean", "--db", url, "--older-than", "soon"])
    assert bad.exit_code != 0 and "not a duration" in bad.output
    # Older than anything the store can hold: nothing to delete, not an OverflowError.
    ages = runner.invoke(cli, ["store", "clean", "--db", url, "--older-than", f"{10**20}d"])
    assert ages.exit_code == 0, ages.output
    assert "deleted 0 final batch" in ages.output
