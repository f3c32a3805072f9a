"""``ledgerq instances`` and ``ledgerq services``: what a running gateway sees.

Both ask a gateway's REST API (``--url``): ``GET /instances`` lists the
gateway instances sharing its database (id, start, last renewal, claims
held, live or not) and, behind a ``serve --workers N`` port, its workers;
``GET /services`` the services with queue depth, in-flight batch, lock
reason and, under high availability, the claimant and its claim expiries.
``--json`` prints the API's answer as is.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ledgerq.commands.client import json_option, run, url_option


def _get(url: str, path: str, token: str | None, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = run(lambda client: client.get(path, **params), url, token)
    return body


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@click.command()
@url_option
@json_option
def instances(url: str, token: str | None, as_json: bool) -> None:
    """List the gateway instances sharing the gateway's database."""
    body = _get(url, "/instances", token)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    if body.get("ledger"):
        click.echo(f"submitting to: {body['ledger']}")
    if not body.get("high_availability"):
        click.echo("single instance (SQLite store): no claims, this gateway serves every service")
        _print_workers(body.get("workers") or [])
        return
    table = Table(title="gateway instances")
    for col in ("instance", "live", "claims", "last renewal (UTC)", "started (UTC)", "address"):
        table.add_column(col)
    for i in body["data"]:
        table.add_row(
            i["instance_id"],
            "yes" if i["live"] else "no",
            str(i["claims"]),
            _time(i["last_renewal"]),
            _time(i["started_at"]),
            i.get("address") or "-",
        )
    # Wide, as ``services``: on 80 columns the ids and addresses were cut
    # ("vm-9576-e839…", "127.0.0.1:2…"), the instances impossible to tell apart.
    Console(width=200).print(table)
    _print_workers(body.get("workers") or [])


def _print_workers(workers: list[dict[str, Any]]) -> None:
    """The processes of ``serve --workers N`` behind the gateway's port."""
    if not workers:
        return
    table = Table(title="workers behind this port (serve --workers)")
    for col in ("worker", "pid", "role", "instance", "restarts", "accepted", "started (UTC)"):
        table.add_column(col)
    for w in workers:
        table.add_row(
            str(w["index"]),
            str(w["pid"]),
            w["role"],
            w.get("instance_id") or "-",
            str(w["restarts"]),
            str(w["accepted"]),
            _time(w.get("started_at")),
        )
    Console(width=200).print(table)


def _in_flight(s: dict[str, Any]) -> str:
    """How many batches are in flight, and the first one's id."""
    first = (s.get("in_flight_batch_id") or "")[:16]
    count = s.get("in_flight")
    if count is None:
        return first or "-"
    return f"{count} ({first})" if first else str(count)


@click.command()
@url_option
@json_option
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=1000,
    show_default=True,
    help="Show at most this many services (1-10000, as the gateway takes).",
)
def services(url: str, token: str | None, as_json: bool, limit: int) -> None:
    """List services: queue depth, in-flight batch, lock reason and claimant."""
    body = _get(url, "/services", token, limit=limit)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    ha = any("claimant" in s for s in body["data"])
    table = Table(title="services")
    columns = ["service", "strategy", "queued", "total", "in flight", "lock reason"]
    if ha:
        columns += ["claimant", "epoch", "claim expires (UTC)"]
    for col in columns:
        table.add_column(col)
    for s in body["data"]:
        row = [
            s["service_id"],
            s.get("strategy") or "serial",
            str(s["queue_depth"]),
            str(s["total"]),
            _in_flight(s),
            s.get("lock_reason") or "-",
        ]
        if ha:
            row += [
                s.get("claimant") or "-",
                "-" if s.get("claim_epoch") is None else str(s["claim_epoch"]),
                _time(s.get("claim_expiry_1")),
            ]
        table.add_row(*row)
    Console(width=200).print(table)
