"""The ``ledgerq`` command."""

from __future__ import annotations

import click

from ledgerq import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ledgerq")
def cli() -> None:
    """Ordered, lossless batch submission to distributed ledgers."""


from ledgerq.commands.bench import bench  # noqa: E402

cli.add_command(bench)

from ledgerq.commands.store import migrate, store  # noqa: E402

cli.add_command(migrate)
cli.add_command(store)

from ledgerq.commands.node import node  # noqa: E402

cli.add_command(node)

from ledgerq.commands.serve import serve  # noqa: E402

cli.add_command(serve)

from ledgerq.commands.cluster import instances, services  # noqa: E402

cli.add_command(instances)
cli.add_command(services)

from ledgerq.commands.client import batches, status, submit  # noqa: E402

cli.add_command(submit)
cli.add_command(status)
cli.add_command(batches)

from ledgerq.commands.service import service  # noqa: E402

cli.add_command(service)

from ledgerq.commands.config import config  # noqa: E402

cli.add_command(config)


def main() -> None:
    cli()
