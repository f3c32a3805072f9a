"""``ledgerq instances`` and ``ledgerq services``: what a running gateway sees.

Both ask a gateway's REST API (``--url``): ``GET /instances`` lists the
gateway instances sharing its database (id, start, last renewal, claims
held, live or not); ``GET /services`` the services with queue depth,
in-flight batch, lock reason and, under high availability, the claimant and
its claim expiries. ``--json`` prints the API's answer as is.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ledgerq.commands.client import EXIT_REFUSED, EXIT_UNREACHABLE, ExitError

url_option = click.option(
    "--url",
    envvar="LEDGERQ_URL",
    default="http://127.0.0.1:8080",
    show_default=True,
    show_envvar=True,
    help="Base URL of a running gateway.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the raw JSON answer.")
token_option = click.option(
    "--token",
    envvar="LEDGERQ_TOKEN",
    default=None,
    help="Bearer token, when the gateway sets auth.token [env LEDGERQ_TOKEN].",
)


def _get(url: str, path: str, token: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    target = url.rstrip("/") + path
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(target, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            body: dict[str, Any] = json.load(resp)
            return body
    except urllib.error.HTTPError as exc:
        hint = "; pass the gateway's token with --token or LEDGERQ_TOKEN" if exc.code == 401 else ""
        raise ExitError(
            f"{target} answered {exc.code}: {exc.read()[:300]!r}{hint}", EXIT_REFUSED
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ExitError(
            f"cannot reach the gateway at {url}: {exc}; is `ledgerq serve` running there? "
            "(start one with `ledgerq serve`, or point --url / LEDGERQ_URL at it)",
            EXIT_UNREACHABLE,
        ) from exc


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@click.command()
@url_option
@token_option
@json_option
def instances(url: str, token: str | None, as_json: bool) -> None:
    """List the gateway instances sharing the gateway's database."""
    body = _get(url, "/instances", token)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    if not body.get("high_availability"):
        click.echo("single instance (SQLite store): no claims, this gateway serves every service")
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
    Console().print(table)


@click.command()
@url_option
@token_option
@json_option
@click.option("--limit", default=1000, show_default=True, help="Show at most this many services.")
def services(url: str, token: str | None, as_json: bool, limit: int) -> None:
    """List services: queue depth, in-flight batch, lock reason and claimant."""
    body = _get(url, f"/services?limit={int(limit)}", token)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    ha = any("claimant" in s for s in body["data"])
    table = Table(title="services")
    columns = ["service", "queued", "total", "in flight", "lock reason"]
    if ha:
        columns += ["claimant", "epoch", "claim expires (UTC)"]
    for col in columns:
        table.add_column(col)
    for s in body["data"]:
        row = [
            s["service_id"],
            str(s["queue_depth"]),
            str(s["total"]),
            (s.get("in_flight_batch_id") or "-")[:16],
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
