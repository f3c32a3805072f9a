"""``ledgerq service``: operator control of one service on a running gateway.

``pause``, ``resume``, ``skip`` (resume a halted service past its
``INVALID`` batch) and ``cancel`` (queued batches) post to the gateway's
``/services/{id}/...`` routes; ``history`` reads ``GET /services/{id}``: the
service's state and its recorded actions. ``skip`` and ``cancel`` ask for
confirmation first (``--yes`` answers it). They reach the gateway as the
other client commands do (``--url``, ``--token``) and exit with their codes
(``ledgerq.commands.client``): 4 when the gateway refuses (the message says
why in one line), 3 when it cannot be reached, 1 when the question was
answered no.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any
from urllib.parse import quote

import click
from rich.table import Table

from ledgerq.commands.client import (
    EXIT_REFUSED,
    ExitError,
    console,
    json_option,
    run,
    url_option,
)
from ledgerq.commands.gateway_client import GatewayClient


def _path(service_id: str, action: str = "") -> str:
    # Service ids hold letters, digits and . _ - : ~ @ +; #none is %23none.
    return f"/services/{quote(service_id, safe=':~@+')}" + (f"/{action}" if action else "")


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ids(raw: tuple[str, ...]) -> list[str]:
    return [i for part in raw for i in part.split(",") if i]


def _confirm(question: str, yes: bool, nothing: str) -> None:
    """Ask ``question`` unless ``yes``; a no (or no answer) ends the command."""
    if yes:
        return
    try:
        agreed = click.confirm(question, default=False, err=True)
    except click.Abort:
        agreed = False
    if not agreed:
        raise ExitError(f"not confirmed: {nothing} (--yes answers the question)", 1)


def _act(url: str, token: str | None, service_id: str, action: str, body: Any = None) -> Any:
    async def go(client: GatewayClient) -> Any:
        return await client.post_json(_path(service_id, action), body)

    return run(go, url, token)["data"]


def _said(record: dict[str, Any]) -> str:
    """One line saying what an action did."""
    what = {
        "pause": "paused",
        "resume": "resumed",
        "skip": "resumed past its invalid batch",
        "cancel": f"{len(record['batch_ids'])} batch(es) cancelled",
        "halt": "halted",
    }.get(record["action"], record["action"])
    line = f"service {record['service_id']}: {what} by {record['actor']} at {_time(record['at'])}"
    return line + (f" ({record['detail']})" if record["detail"] == "already paused" else "")


def _batches(ids: list[str]) -> str:
    shown = ", ".join(i[:16] + "…" for i in ids[:3])
    return (shown + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")) or "-"


def _service(url: str, token: str | None, service_id: str, **params: Any) -> dict[str, Any]:
    async def go(client: GatewayClient) -> Any:
        return await client.get(_path(service_id), **params)

    doc: dict[str, Any] = run(go, url, token)
    return doc


@click.group()
def service() -> None:
    """Operator control of a service: pause, resume, skip, cancel; its history."""


@service.command()
@click.argument("service_id", metavar="SERVICE")
@json_option
@url_option
def pause(service_id: str, as_json: bool, url: str, token: str | None) -> None:
    """Pause SERVICE: nothing new is submitted; what is in flight is followed to its end."""
    record = _act(url, token, service_id, "pause")
    click.echo(json.dumps(record, indent=2) if as_json else _said(record))


@service.command()
@click.argument("service_id", metavar="SERVICE")
@json_option
@url_option
def resume(service_id: str, as_json: bool, url: str, token: str | None) -> None:
    """Resume a paused SERVICE (a halted one is resumed with `skip`)."""
    record = _act(url, token, service_id, "resume")
    click.echo(json.dumps(record, indent=2) if as_json else _said(record))


@service.command()
@click.argument("service_id", metavar="SERVICE")
@click.argument("batch_id", required=False)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@url_option
def skip(
    service_id: str, batch_id: str | None, yes: bool, as_json: bool, url: str, token: str | None
) -> None:
    """Resume SERVICE, halted at an INVALID batch, past that batch.

    BATCH_ID: the batch it is halted at (default: read from the gateway).
    The batches after it are then submitted in order.
    """
    if batch_id is None or not yes:
        halted = _service(url, token, service_id, limit=1)["data"].get("halted")
        if halted is None:
            raise ExitError(
                f"service {service_id} is not halted: there is nothing to skip", EXIT_REFUSED
            )
        batch_id = batch_id or halted["batch_id"]
        reason = f": {halted['reason']}" if halted["batch_id"] == batch_id else ""
        _confirm(
            f"Resume service {service_id} past batch {batch_id}{reason}? Its next batches "
            "will be submitted",
            yes,
            "the service stays halted",
        )
    record = _act(url, token, service_id, "skip", {"batch_id": batch_id})
    click.echo(json.dumps(record, indent=2) if as_json else _said(record))


@service.command()
@click.argument("service_id", metavar="SERVICE")
@click.argument("batch_ids", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@url_option
def cancel(
    service_id: str,
    batch_ids: tuple[str, ...],
    yes: bool,
    as_json: bool,
    url: str,
    token: str | None,
) -> None:
    """Cancel queued batches of SERVICE: all or none, never submitted.

    BATCH_IDS: batch ids, separated by spaces or commas (at most 1000). Only
    batches that cannot be on the ledger are cancelled (not taken for
    submission, not pending): pause the service first to keep it so.
    """
    ids = list(dict.fromkeys(_ids(batch_ids)))
    _confirm(
        f"Cancel {len(ids)} batch(es) of service {service_id}? They become final (INVALID) "
        "and are never submitted",
        yes,
        "nothing was cancelled",
    )
    record = _act(url, token, service_id, "cancel", {"batch_ids": ids})
    click.echo(json.dumps(record, indent=2) if as_json else _said(record))


@service.command()
@click.argument("service_id", metavar="SERVICE")
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=20, show_default=True, help="Actions shown."
)
@click.option("--before", type=click.IntRange(1), default=None, help="Older than this action id.")
@json_option
@url_option
def history(
    service_id: str, limit: int, before: int | None, as_json: bool, url: str, token: str | None
) -> None:
    """Show SERVICE's state and its recorded actions, newest first."""
    doc = _service(url, token, service_id, limit=limit, before=before)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    s = doc["data"]
    out = console()
    out.print(
        f"service {s['service_id']}: {s['queue_depth']} queued of {s['total']}; "
        f"{s.get('lock_reason') or 'nothing holds it'}",
        highlight=False,
    )
    table = Table(box=None)
    for col in ("id", "at", "action", "by", "batches", "detail"):
        table.add_column(col)
    for a in s["history"]:
        table.add_row(
            str(a["id"]),
            _time(a["at"]),
            a["action"],
            a["actor"],
            _batches(a["batch_ids"]),
            a.get("detail") or "-",
        )
    out.print(table)
    if doc["paging"].get("next") and s["history"]:
        out.print(f"more: --before {s['history'][-1]['id']}", style="dim")
