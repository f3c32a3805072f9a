"""The package layout is the data flow; the import contracts in ``pyproject.toml``
(``[tool.importlinter]``) keep it so. These tests run ``lint-imports`` on the
package, and once on a copy with a forbidden import added, to show the check
can fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path, src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_import_contract_is_kept() -> None:
    result = _lint(REPO, REPO / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_forbidden_import_breaks_a_contract(tmp_path: Path) -> None:
    # A copy of the package in which the node reaches into the gateway's store.
    shutil.copytree(REPO / "src" / "ledgerq", tmp_path / "src" / "ledgerq")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    commit = tmp_path / "src" / "ledgerq" / "node" / "commit.py"
    commit.write_text(commit.read_text() + "\nimport ledgerq.store.sqlite  # noqa\n")
    result = _lint(tmp_path, tmp_path / "src")
    assert result.returncode != 0
    assert "The node stands alone" in result.stdout
    assert "BROKEN" in result.stdout
