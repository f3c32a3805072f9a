"""Nothing skips silently: a run lists every skipped test with its reason, and
under CI (``CI`` set) a skip fails the run. The rule lives in
``tests/conftest.py``; here it runs on a tiny suite of its own in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "CI"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        cwd=folder,
        # No third-party plugins: they take seconds to import and play no part here.
        env={**base, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_some.py").write_text(
        "import pytest\n\n"
        "def test_runs():\n    pass\n\n"
        "def test_needs_a_thing():\n    pytest.skip('the thing is missing (install it)')\n\n"
        "@pytest.mark.xfail(reason='known', strict=True)\n"
        "def test_known_failure():\n    raise AssertionError\n"
    )
    return tmp_path


def test_skips_are_listed_with_their_reason_and_pass_outside_ci(tmp_path: Path) -> None:
    result = _run(_suite(tmp_path))
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    assert "test_some.py::test_needs_a_thing: the thing is missing (install it)" in result.stdout
    assert "test_known_failure" not in result.stdout.split("1 skipped ---")[-1].split("\n")[1]


def test_under_ci_a_skip_fails_the_run(tmp_path: Path) -> None:
    result = _run(_suite(tmp_path), CI="1")
    assert result.returncode == 1, result.stdout
    assert "test_some.py::test_needs_a_thing: the thing is missing (install it)" in result.stdout
    assert "nothing may skip" in result.stdout


def test_under_ci_a_run_without_skips_passes(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    (suite / "test_some.py").write_text("def test_runs():\n    pass\n")
    result = _run(suite, CI="1")
    assert result.returncode == 0, result.stdout
    assert "skipped" not in result.stdout
