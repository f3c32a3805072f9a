"""``ledgerq config show``: the effective settings and where each value came from.

The same layers as ``ledgerq serve`` (flags over ``LEDGERQ_*`` environment
over the TOML file over defaults), validated the same way: an invalid value
exits with status 1 and a message naming the key. Secret values
(:data:`~ledgerq.config.SECRET_KEYS`) print as ``***``, and so does a
password in the database or ledger URL.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from ledgerq.commands.client import console
from ledgerq.config import KEYS, SECRET_KEYS, env_name, load_settings, masked_url
from ledgerq.errors import ConfigError
from ledgerq.store.migrate import redact


def shown(key: str, value: Any) -> Any:
    if key == "auth.tokens":
        # Who may do what is worth seeing; the tokens themselves never.
        return [{**entry, "token": "***"} for entry in value]
    if key in SECRET_KEYS:
        return "***" if value else ""
    if key == "db":
        return redact(str(value))
    if key == "ledger":
        return masked_url(str(value))
    return value


@click.group()
def config() -> None:
    """Inspect the configuration."""


@config.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML settings file (default $LEDGERQ_CONFIG, else ./ledgerq.toml if present).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(config_file: str | None, as_json: bool) -> None:
    """Print every setting, its effective value and its source."""
    try:
        settings = load_settings(config_file=config_file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    for warning in settings.warnings:
        click.echo(f"WARNING: {warning}", err=True)
    rows = [
        {
            "key": k.name,
            "value": shown(k.name, settings.values[k.name]),
            "source": settings.sources[k.name],
            "env": env_name(k.name),
            "help": k.help,
        }
        for k in KEYS
    ]
    if as_json:
        click.echo(json.dumps({"config_file": settings.config_file, "settings": rows}, indent=2))
        return
    out = console()
    out.print(f"configuration file: {settings.config_file or '(none)'}")
    table = Table(box=None)
    for col in ("key", "value", "source", "environment variable"):
        table.add_column(col)
    for r in rows:
        style = None if r["source"] == "default" else "bold"
        table.add_row(r["key"], str(r["value"]), r["source"], r["env"], style=style)
    out.print(table)
