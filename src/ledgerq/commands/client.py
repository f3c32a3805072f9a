"""Client commands: ``submit``, ``status`` and ``batches`` (``services``, ``instances``: cluster).

They talk to a gateway over HTTP: ``--url`` (default ``http://127.0.0.1:8080``,
or ``$LEDGERQ_URL``), ``--token`` (or ``$LEDGERQ_TOKEN``) when the gateway
requires one. Read commands print a table, or the gateway's JSON with ``--json``.

Exit codes (also in ``docs/api.md``):

== ==========================================================================
0  done; every batch asked about is committed (``status``, ``submit``)
1  any other error
2  wrong usage (click's own)
3  the gateway cannot be reached or did not answer in time
4  the gateway refused the request (bad input, missing token: HTTP 4xx)
5  at least one batch is INVALID
6  still not final when ``--wait``/``--timeout`` ran out
7  at least one batch is unknown to the gateway
== ==========================================================================
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.commands.gateway_client import (
    DEFAULT_URL,
    GatewayClient,
    GatewayRefusedError,
    GatewayUnreachableError,
)

EXIT_UNREACHABLE = 3
EXIT_REFUSED = 4
EXIT_INVALID = 5
EXIT_NOT_FINAL = 6
EXIT_UNKNOWN = 7
FINAL = ("COMMITTED", "INVALID")
#: Batches per POST when generating: one BatchList holds them in order.
POST_CHUNK = 100
#: Between two looks at the queue depths while following generated batches.
FOLLOW_INTERVAL_S = 0.25

T = TypeVar("T")


class ExitError(click.ClickException):
    """A failure with its documented exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        # click exits with this instance attribute's value.
        vars(self)["exit_code"] = code


def _gateway_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    # Without a scheme the request fails later as "the gateway did not answer" (exit 3).
    url = value.strip().rstrip("/")
    host = url.partition("://")[2]
    if not url.startswith(("http://", "https://")) or not host or host.startswith("/"):
        raise click.BadParameter(f"{value!r} is not the gateway's URL; write http://HOST:PORT")
    return url


def url_option(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--token",
        envvar="LEDGERQ_TOKEN",
        default=None,
        help="Bearer token, when the gateway sets auth.token [env LEDGERQ_TOKEN].",
    )(f)
    return click.option(
        "--url",
        envvar="LEDGERQ_URL",
        default=DEFAULT_URL,
        show_default=True,
        callback=_gateway_url,
        help="The gateway [env LEDGERQ_URL].",
    )(f)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def run(make: Callable[[GatewayClient], Awaitable[T]], url: str, token: str | None) -> T:
    async def go() -> T:
        async with GatewayClient(url, token=token) as client:
            return await make(client)

    try:
        return asyncio.run(go())
    except GatewayUnreachableError as exc:
        raise ExitError(str(exc), EXIT_UNREACHABLE) from exc
    except GatewayRefusedError as exc:
        hint = ""
        if exc.status == 401:
            hint = "; pass the gateway's token with --token or LEDGERQ_TOKEN"
        raise ExitError(f"{exc}{hint}", EXIT_REFUSED) from exc


def console(*, stderr: bool = False, min_width: int = 0) -> Console:
    """A console that does not cut columns at 80 characters when piped, nor
    below ``min_width`` (a terminal narrower than that wraps the lines instead)."""
    stream = sys.stderr if stderr else sys.stdout
    width = Console(stderr=stderr).width if stream.isatty() else 160
    return Console(stderr=stderr, width=max(width, min_width))


def _print_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2))


def _short(value: str | None, n: int = 16) -> str:
    if not value:
        return "-"
    return value if len(value) <= n else value[:n] + "…"


def _status_exit(entries: list[dict[str, Any]], *, waited: bool) -> int:
    statuses = {e["status"] for e in entries}
    if "INVALID" in statuses:
        return EXIT_INVALID
    if "UNKNOWN" in statuses:
        return EXIT_UNKNOWN
    if statuses - {"COMMITTED"}:
        return EXIT_NOT_FINAL if waited else 0
    return 0


# -- status -------------------------------------------------------------------


@click.command()
@click.argument("batch_ids", nargs=-1, required=True)
@click.option(
    "--service-id",
    "-s",
    default=None,
    help="The batches' service (default: found by each batch id, across services).",
)
@click.option("--wait", is_flag=True, help="Wait for every batch to be final (see --timeout).")
@click.option(
    "--timeout",
    type=click.FloatRange(0, 300),
    default=60.0,
    show_default=True,
    help="With --wait: give up after this many seconds.",
)
@json_option
@url_option
def status(
    batch_ids: tuple[str, ...],
    service_id: str | None,
    wait: bool,
    timeout: float,
    as_json: bool,
    url: str,
    token: str | None,
) -> None:
    """Show the status of batches by id (exit 0 when all are committed).

    BATCH_IDS: one or more batch ids (header signatures), separated by spaces
    or commas. Without --service-id each is found in whichever service tracks it.
    """
    ids = [i for raw in batch_ids for i in raw.split(",") if i]

    async def fetch(client: GatewayClient) -> list[dict[str, Any]]:
        return await client.statuses(ids, service_id, wait_s=timeout if wait else 0)

    entries = run(fetch, url, token)
    if as_json:
        _print_json({"data": entries})
    else:
        table = Table(box=None)
        for col in ("batch", "service", "status", "tracking", "invalid transactions"):
            table.add_column(col)
        for e in entries:
            problems = "; ".join(
                f"{_short(t.get('id'))}: {t.get('message', '')}" for t in e["invalid_transactions"]
            )
            table.add_row(
                _short(e["id"]),
                e.get("service_id") or "-",
                e["status"],
                e.get("ledgerq_status") or "-",
                problems or "-",
            )
        console().print(table)
    code = _status_exit(entries, waited=wait)
    if code:
        sys.exit(code)


# -- listings -----------------------------------------------------------------


@click.command()
@click.option("--service-id", "-s", default=None, help="Only this service.")
@click.option(
    "--status",
    "status_filter",
    type=click.Choice(
        ["none", "Pending", "Delayed", "Unknown", "Invalid", "Valid", "Committed"],
        case_sensitive=False,
    ),
    default=None,
    help="Only batches with this tracking status (none: not yet submitted or answered).",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--after", type=click.IntRange(0), default=None, help="Continue after this seq.")
@click.option(
    "--full-ids", is_flag=True, help="Print whole batch ids (128 characters) instead of 16."
)
@json_option
@url_option
def batches(
    service_id: str | None,
    status_filter: str | None,
    limit: int,
    after: int | None,
    full_ids: bool,
    as_json: bool,
    url: str,
    token: str | None,
) -> None:
    """List tracked batches in acceptance order."""

    async def fetch(client: GatewayClient) -> Any:
        return await client.get(
            "/tracking/batches",
            service_id=service_id,
            status=status_filter,
            limit=limit,
            after=after,
        )

    doc = run(fetch, url, token)
    if as_json:
        _print_json(doc)
        return
    table = Table(box=None)
    for col in ("seq", "batch", "service", "status", "submitted", "attempts", "error"):
        table.add_column(col)
    for b in doc["data"]:
        err = b.get("error")
        table.add_row(
            str(b.get("seq")),
            b["id"] if full_ids else _short(b["id"]),
            b["service_id"],
            b.get("status") or "-",
            "yes" if b.get("submitted") else "no",
            str(b.get("attempts", 0)),
            f"{err['type']}: {err['message']}" if err else "-",
        )
    out = console(min_width=240 if full_ids else 0)
    out.print(table)
    if doc.get("paging", {}).get("next") and doc["data"]:
        out.print(f"more: --after {doc['data'][-1]['seq']}", style="dim")


# -- submit -------------------------------------------------------------------


def generate(n: int, services: int, run_id: str) -> dict[str, list[bytes]]:
    """``n`` signed intkey batches over ``services`` services, order-dependent.

    Each service gets its own key ``<run_id>-<k>``: its first batch ``set``s it
    to 0 and every later one ``inc``s it by 1, so a batch executed out of order
    (an ``inc`` before the ``set``) is INVALID.
    """
    signer = Signer.generate()
    out: dict[str, list[bytes]] = {}
    for i in range(n):
        k = i % services
        service_id = f"gen-{run_id}-{k}"
        name = f"{run_id}-{k}"
        first = service_id not in out
        batch = make_intkey_batch(signer, [("set" if first else "inc", name, 0 if first else 1)])
        out.setdefault(service_id, []).append(batch.serialized)
    return out


def _ids_of(serialized: list[bytes]) -> list[str]:
    from ledgerq.codec import decode_batch

    return [decode_batch(b, verify=False).header_signature for b in serialized]


Finals = dict[str | None, list[dict[str, Any]]]


async def _follow_ids(
    client: GatewayClient,
    ids_by_service: dict[str | None, list[str]],
    deadline: float,
    progress: Progress,
    task: TaskID,
) -> Finals:
    """Long-poll the statuses of the batches until all are final or the deadline."""
    final: Finals = {}
    remaining = dict(ids_by_service)
    while remaining and time.monotonic() < deadline:
        wait_s = max(0.0, min(5.0, deadline - time.monotonic()))

        async def check(
            s: str | None, ids: list[str], wait_s: float = wait_s
        ) -> tuple[str | None, list[dict[str, Any]]]:
            return s, await client.statuses(ids, s, wait_s=wait_s)

        for s, entries in await asyncio.gather(*(check(s, i) for s, i in remaining.items())):
            finished = [e for e in entries if e["status"] in FINAL]
            final.setdefault(s, []).extend(finished)
            left = [e["id"] for e in entries if e["status"] not in FINAL]
            progress.update(task, advance=len(finished))
            if left:
                remaining[s] = left
            else:
                remaining.pop(s)
    for s, ids in remaining.items():
        final.setdefault(s, []).extend({"id": i, "status": "PENDING"} for i in ids)
    return final


async def _follow_services(
    client: GatewayClient,
    ids_by_service: dict[str | None, list[str]],
    deadline: float,
    progress: Progress,
    task: TaskID,
) -> Finals:
    """Follow services of their own (generated) by their queue depth.

    One ``GET /services`` per round costs the gateway one query, where
    long-polling thousands of ids would re-read them at every change. A
    service whose depth reaches 0 has only final batches: its statuses are
    read once.
    """
    final: Finals = {}
    pending = set(ids_by_service)
    total = sum(len(ids) for ids in ids_by_service.values())
    reported = 0
    while pending and time.monotonic() < deadline:
        depths: dict[str, int] = {}
        after: str | None = None
        while True:
            page = (await client.get("/services", limit=10_000, after=after))["data"]
            depths.update({e["service_id"]: e["queue_depth"] for e in page})
            if len(page) < 10_000:
                break
            after = page[-1]["service_id"]
        for s in [s for s in pending if s is not None and depths.get(s) == 0]:
            final[s] = await client.statuses(ids_by_service[s], s)
            pending.discard(s)
        left = sum(depths.get(s, len(ids_by_service[s])) for s in pending if s is not None)
        progress.update(task, advance=total - left - reported)
        reported = total - left
        if pending:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
    for service in pending:
        final[service] = await client.statuses(ids_by_service[service], service)
    return final


@click.command()
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
@click.option("--service-id", "-s", default=None, help="Service of the FILE's batches.")
@click.option(
    "--generate", "count", type=click.IntRange(1), default=None, help="Generate N batches."
)
@click.option(
    "--services",
    "n_services",
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="Spread generated batches over this many services.",
)
@click.option("--no-wait", is_flag=True, help="Return once the gateway accepted the batches.")
@click.option(
    "--timeout",
    type=click.FloatRange(1),
    default=600.0,
    show_default=True,
    help="Seconds to wait for every batch to be final.",
)
@json_option
@url_option
def submit(
    file: Path | None,
    service_id: str | None,
    count: int | None,
    n_services: int,
    no_wait: bool,
    timeout: float,
    as_json: bool,
    url: str,
    token: str | None,
) -> None:
    """Submit a BatchList FILE, or --generate N signed intkey batches; wait until final.

    Generated batches are ordered per service (a `set`, then `inc`s), so any
    reordering would make one INVALID. Exit 0 when all are committed.
    """
    if (file is None) == (count is None):
        raise click.UsageError("give a BatchList FILE or --generate N (one of them)")
    if file is not None:
        body = file.read_bytes()
        from ledgerq.codec import decode_batch_list

        try:
            ids = [b.header_signature for b in decode_batch_list(body)]
        except Exception as exc:
            raise ExitError(f"{file} is not a valid BatchList: {exc}", EXIT_REFUSED) from exc
        ids_by_service: dict[str | None, list[str]] = {service_id: ids}
        posts = [(service_id, body)]
    else:
        assert count is not None
        generated = generate(count, min(n_services, count), secrets.token_hex(3))
        ids_by_service = {s: _ids_of(bs) for s, bs in generated.items()}
        posts = [
            (s, encode_batch_list(bs[i : i + POST_CHUNK]))
            for s, bs in generated.items()
            for i in range(0, len(bs), POST_CHUNK)
        ]
    total = sum(len(v) for v in ids_by_service.values())
    err = console(stderr=True)
    started = time.monotonic()

    async def go(client: GatewayClient) -> dict[str | None, list[dict[str, Any]]]:
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            disable=as_json,
            transient=False,
        )
        with progress:
            sent = progress.add_task("accepted", total=total)
            limit = asyncio.Semaphore(8)

            # Services in parallel; one service's lists in turn, since
            # acceptance order is submission order.
            async def post_service(s: str | None) -> None:
                for svc, body in posts:
                    if svc == s:
                        async with limit:
                            await client.post_batches(body, s)
                progress.update(sent, advance=len(ids_by_service[s]))

            await asyncio.gather(*(post_service(s) for s in ids_by_service))
            if no_wait:
                return {
                    s: [{"id": i, "status": "PENDING"} for i in ids]
                    for s, ids in ids_by_service.items()
                }
            done = progress.add_task("final   ", total=total)
            deadline = time.monotonic() + timeout
            follow = _follow_services if count is not None else _follow_ids
            return await follow(client, ids_by_service, deadline, progress, done)

    results = run(go, url, token)
    elapsed = time.monotonic() - started
    entries = [e for es in results.values() for e in es]
    counts = Counter(e["status"] for e in entries)
    summary = {
        "batches": total,
        "services": len(ids_by_service),
        "committed": counts.get("COMMITTED", 0),
        "invalid": counts.get("INVALID", 0),
        "not_final": total - counts.get("COMMITTED", 0) - counts.get("INVALID", 0),
        "seconds": round(elapsed, 3),
    }
    if as_json:
        _print_json(
            {
                **summary,
                "batch_ids": {str(s): ids for s, ids in ids_by_service.items()},
                "invalid_batches": [e for e in entries if e["status"] == "INVALID"],
            }
        )
    else:
        rate = total / elapsed if elapsed > 0 else 0.0
        err.print(
            f"{summary['committed']} committed, {summary['invalid']} invalid, "
            f"{summary['not_final']} not final — {total} batches over {summary['services']} "
            f"services in {elapsed:.1f} s ({rate:.0f} batches/s)"
        )
        for e in entries:
            if e["status"] == "INVALID":
                msgs = "; ".join(t.get("message", "") for t in e.get("invalid_transactions", []))
                err.print(f"INVALID {e['id'][:16]}…: {msgs}", style="red")
    if no_wait:
        return
    code = _status_exit(entries, waited=True)
    if code:
        sys.exit(code)
