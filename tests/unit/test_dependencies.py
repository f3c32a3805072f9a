"""The installed dependencies satisfy pyproject.toml's floors and bounds
(which sit past the published advisories: docs/operations.md)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
REQUIREMENTS = [
    Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
]


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=lambda r: r.name)
def test_installed_version_satisfies_pyproject(requirement: Requirement) -> None:
    installed = version(requirement.name)
    assert requirement.specifier.contains(installed, prereleases=True), (
        f"{requirement.name} {installed} is installed but pyproject.toml asks for "
        f"{requirement.specifier}; reinstall with `make .venv/.dev`"
    )


def test_floors_sit_past_the_advisories() -> None:
    by_name = {r.name: r.specifier for r in REQUIREMENTS}
    assert not by_name["aiohttp"].contains("3.13.2")
    assert not by_name["cbor2"].contains("5.6.1")
    assert not by_name["coincurve"].contains("22.0.0")
