"""``scripts/prerequisites.sh``, which ``make`` runs before the venv and the tests:
what is missing is installed with apt-get as root, or named in one line.

The script runs with a ``PATH`` of fakes (``id``, ``apt-get``, ``python3``,
``chromium``), so each case is the same on any machine.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prerequisites.sh"


@pytest.fixture
def fakes(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "pg").mkdir()  # an empty /usr/lib/postgresql
    return bin_dir


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _run(bin_dir: Path, *needs: str, uid: int, **env: str) -> subprocess.CompletedProcess[str]:
    _fake(bin_dir, "id", f"echo {uid}")
    for tool in ("sh", "cat"):  # what the script and the fakes themselves use
        target = Path("/bin") / tool
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(target)
    return subprocess.run(
        ["/bin/sh", str(SCRIPT), *needs],
        env={"PATH": str(bin_dir), "PG_ROOT": str(bin_dir.parent / "pg"), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_nothing_missing_does_nothing(fakes: Path) -> None:
    _fake(fakes, "python3", "exit 0")
    _fake(fakes, "chromium", "exit 0")
    _fake(fakes, "apt-get", f"echo called >> {fakes}/apt.log")
    result = _run(fakes, "venv", "chromium", uid=1000)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert not (fakes / "apt.log").exists()


def test_missing_parts_are_named_in_one_line_when_not_root(fakes: Path) -> None:
    _fake(fakes, "python3", "exit 1")  # no venv/ensurepip
    result = _run(fakes, "venv", "postgresql", "chromium", uid=1000)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("missing: python3-venv postgresql chromium — install with:")
    assert "apt-get install -y python3-venv postgresql chromium" in result.stderr
    assert "LEDGERQ_TEST_PG" in result.stderr


def test_a_server_named_by_ledgerq_test_pg_needs_no_binaries(fakes: Path) -> None:
    _fake(fakes, "chromium", "exit 0")
    result = _run(fakes, "postgresql", "chromium", uid=1000, LEDGERQ_TEST_PG="postgresql://x")
    assert result.returncode == 0, result.stderr


def test_root_installs_what_is_missing_with_apt_get(fakes: Path) -> None:
    _fake(fakes, "python3", "exit 0")
    _fake(fakes, "apt-get", f'echo "$*" >> {fakes}/apt.log')
    result = _run(fakes, "venv", "postgresql", "chromium", uid=0)
    assert result.returncode == 0, result.stderr
    assert (fakes / "apt.log").read_text().splitlines() == [
        "update -qq",
        "install -y -qq postgresql chromium",
    ]
    assert "installing: postgresql chromium" in result.stdout


def test_an_unknown_need_is_a_usage_error(fakes: Path) -> None:
    result = _run(fakes, "gpu", uid=1000)
    assert result.returncode == 2
    assert "unknown need 'gpu'" in result.stderr


def test_the_makefile_runs_it_before_the_venv_and_the_tests() -> None:
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    assert "sh scripts/prerequisites.sh venv" in makefile
    assert "sh scripts/prerequisites.sh postgresql chromium" in makefile
    assert os.access(SCRIPT, os.X_OK)
