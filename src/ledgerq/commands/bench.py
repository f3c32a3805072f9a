"""``ledgerq bench``: runs the benchmarks of the repository's ``bench/`` folder.

Benchmarks are not shipped in the package; they run from a source checkout
(``make bench``). Each ``bench/<name>.py`` exposes a click command ``command``
and becomes ``ledgerq bench <name>``; ``ledgerq bench all`` runs them in turn.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

_REPO = Path(__file__).resolve().parents[3]
_BENCH = _REPO / "bench"
_NOT_COMMANDS = {"__init__", "report"}


def _bench_names() -> list[str]:
    if not _BENCH.is_dir():
        return []
    return sorted(
        p.stem
        for p in _BENCH.glob("*.py")
        if p.stem not in _NOT_COMMANDS and not p.stem.startswith("_")
    )


def _load(name: str) -> click.Command:
    if str(_REPO) not in sys.path:
        sys.path.insert(0, str(_REPO))
    module = importlib.import_module(f"bench.{name}")
    command = getattr(module, "command", None)
    if not isinstance(command, click.Command):
        raise click.ClickException(f"bench/{name}.py defines no click command named 'command'")
    return command


class _BenchGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return ["all", *_bench_names()]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "all":
            return _all
        if cmd_name not in _bench_names():
            return None
        return _load(cmd_name)


@click.command("all")
@click.pass_context
def _all(ctx: click.Context) -> None:
    """Run every benchmark with its defaults."""
    for name in _bench_names():
        click.secho(f"== bench {name}", bold=True, err=True)
        ctx.invoke(_load(name))


@click.group("bench", cls=_BenchGroup)
def bench() -> None:
    """Measure ledgerq; figures go to docs/BENCHMARKS.md (needs a source checkout)."""
    if not _BENCH.is_dir():
        raise click.ClickException(
            "the benchmarks live in the bench/ folder of a source checkout; "
            "clone the repository and run `make bench`"
        )
