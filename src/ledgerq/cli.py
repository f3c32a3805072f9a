"""The ``ledgerq`` command."""

from __future__ import annotations

import importlib

import click

from ledgerq import __version__

#: Each command and the module that defines it. A command's module is
#: imported only when that command runs (or help lists it): a client command
#: such as ``ledgerq status`` need not load the gateway, the node and the
#: benchmarks to start.
COMMANDS = {
    "batches": "ledgerq.commands.client",
    "bench": "ledgerq.commands.bench",
    "config": "ledgerq.commands.config",
    "instances": "ledgerq.commands.cluster",
    "migrate": "ledgerq.commands.store",
    "node": "ledgerq.commands.node",
    "serve": "ledgerq.commands.serve",
    "service": "ledgerq.commands.service",
    "services": "ledgerq.commands.cluster",
    "status": "ledgerq.commands.client",
    "store": "ledgerq.commands.store",
    "submit": "ledgerq.commands.client",
}


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        command = getattr(importlib.import_module(module), cmd_name)
        assert isinstance(command, click.Command), cmd_name
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ledgerq")
def cli() -> None:
    """Ordered, lossless batch submission to distributed ledgers."""


def main() -> None:
    cli()
