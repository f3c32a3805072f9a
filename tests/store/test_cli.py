"""``ledgerq migrate`` and ``ledgerq store summary`` through the real command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_summary_migrates_the_default_file_in_the_working_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ledgerq"), "store", "summary"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Committed" in done.stdout and "total" in done.stdout
    assert (tmp_path / "ledgerq.sqlite3").exists()


def test_bad_url_is_a_clean_error() -> None:
    result = CliRunner().invoke(cli, ["migrate", "--db", "mysql://x"])
    assert result.exit_code != 0
    assert "unsupported store URL" in result.output


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
