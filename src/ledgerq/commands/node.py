"""``ledgerq node``: run the ledger node with its Sawtooth REST API.

Security settings (``node.*`` keys: flags over ``LEDGERQ_NODE_*`` over the
settings file, see docs/configuration.md): a bearer token on every route,
the Host names and web origins let in, and a refusal to listen beyond
loopback without a token unless ``--insecure-allow-remote`` is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import signal
from pathlib import Path
from typing import Any

import click
from aiohttp import web

from ledgerq.config import Settings, load_settings, parse_bind
from ledgerq.errors import ConfigError, LedgerqError
from ledgerq.gateway.workers import bind_failure
from ledgerq.ingest.guard import GuardedSite, guard_middleware
from ledgerq.logs import add_secret, configure_logging
from ledgerq.node import Node, memdebug
from ledgerq.node.access import AccessPolicy, is_loopback
from ledgerq.node.rest import RestLimits, make_app
from ledgerq.node.scabbard import ScabbardServices
from ledgerq.operator import extend_node_app


def tune_gc() -> None:
    """Collect young objects less often: this process's heap is mostly messages that
    live microseconds, and the default threshold (700) spends a third of the time in
    the collector at full load (see docs/node.md)."""
    gc.set_threshold(50_000, 20, 100)


def _parse_bind(value: str) -> tuple[str, int]:
    try:
        return parse_bind(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; expected HOST:PORT, e.g. 127.0.0.1:8008") from exc


@click.command("node")
@click.option("--bind", default="127.0.0.1:8008", show_default=True, help="HOST:PORT to serve.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Journal and store (LMDB); without it the node keeps nothing across restarts.",
)
@click.option("--shards", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option(
    "--ephemeral",
    is_flag=True,
    help="Forget pending batches on restart (they report UNKNOWN), as a Sawtooth validator.",
)
@click.option(
    "--max-pending",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="Pending batches beyond which POST /batches answers 429.",
)
@click.option(
    "--commit-delay-ms",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Keep each executed batch PENDING this long before committing it.",
)
@click.option(
    "--snapshot-every",
    type=click.IntRange(1),
    default=50_000,
    show_default=True,
    help="Start a new journal segment after this many records (old ones are deleted "
    "once the store holds them).",
)
@click.option(
    "--dedupe-window",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="Batch orderings kept in memory for de-duplication; older ids are answered "
    "from the store.",
)
@click.option(
    "--keep-logs",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="Execution summaries kept in memory for GET /logs (the most recent).",
)
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings file."
)
@click.option("--token", help="Bearer token required on every route [node.token].")
@click.option(
    "--allowed-hosts",
    help="Comma-separated Host names answered besides loopback [node.allowed_hosts].",
)
@click.option(
    "--allowed-origins",
    help="Comma-separated web origins let in; none by default [node.allowed_origins].",
)
@click.option(
    "--insecure-allow-remote",
    is_flag=True,
    default=None,
    help="Listen beyond loopback without a token: anyone reaching the port may submit.",
)
@click.option("--max-held", type=int, help="Batches held on dependencies, at most [node.max_held].")
@click.option(
    "--held-expiry-s",
    type=float,
    help="A held batch turns INVALID after this long [node.held_expiry_s].",
)
@click.option(
    "--max-scabbard-services",
    type=int,
    help="Scabbard ledgers open at once [node.max_scabbard_services].",
)
@click.option(
    "--scabbard-idle-s",
    type=float,
    help="Close a scabbard ledger idle this long [node.scabbard_idle_s].",
)
def node(
    bind: str,
    data_dir: Path | None,
    shards: int,
    ephemeral: bool,
    max_pending: int,
    commit_delay_ms: int,
    snapshot_every: int,
    dedupe_window: int,
    keep_logs: int,
    config_file: str | None,
    token: str | None,
    allowed_hosts: str | None,
    allowed_origins: str | None,
    insecure_allow_remote: bool | None,
    max_held: int | None,
    held_expiry_s: float | None,
    max_scabbard_services: int | None,
    scabbard_idle_s: float | None,
) -> None:
    """Run a Sawtooth-compatible ledger node (intkey 1.0, sawtooth_settings 1.0) with a REST API.

    Also serves Splinter scabbard routes (/scabbard/CIRCUIT/SERVICE/...), a
    separate ledger per service.
    """
    from ledgerq import failpoints

    host, port = _parse_bind(bind)
    flags = {
        "node.token": token,
        "node.allowed_hosts": allowed_hosts,
        "node.allowed_origins": allowed_origins,
        "node.insecure_allow_remote": insecure_allow_remote,
        "node.max_held": max_held,
        "node.held_expiry_s": held_expiry_s,
        "node.max_scabbard_services": max_scabbard_services,
        "node.scabbard_idle_s": scabbard_idle_s,
    }
    try:
        settings = load_settings(flags, config_file=config_file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    for warning in settings.warnings:
        click.echo(f"WARNING: {warning}", err=True)
    check_bind(host, settings)
    if settings.node.token:
        add_secret(settings.node.token)
    try:
        failpoints.configure()  # fault tests only; nothing armed when unset
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    tune_gc()
    # The redacting handler, as the gateway's: the node's token never reaches its log.
    configure_logging(settings.log.level, json_lines=settings.log.json)
    options: dict[str, Any] = {
        "shards": shards,
        "ephemeral": ephemeral,
        "max_pending": max_pending,
        "commit_delay_ms": commit_delay_ms,
        "snapshot_every": snapshot_every,
        "dedupe_window": dedupe_window,
        "keep_logs": keep_logs,
        "max_held": settings.node.max_held,
        "held_expiry_s": settings.node.held_expiry_s,
        "max_waiters": settings.node.max_waiters,
    }
    try:
        asyncio.run(_serve(host, port, data_dir, options, settings))
    except LedgerqError as exc:  # a data directory in use, unwritable or not a node's
        raise click.ClickException(str(exc)) from exc


def check_bind(host: str, settings: Settings) -> None:
    """Refuse, loudly, to listen beyond loopback without a token (unless told to)."""
    if is_loopback(host) or settings.node.token:
        return
    if not settings.node.insecure_allow_remote:
        raise click.ClickException(
            f"refusing to listen on {host} without a token: anyone who reaches that address "
            "could submit batches and read the ledger. Set a token (--token or "
            "LEDGERQ_NODE_TOKEN), listen on 127.0.0.1, or pass --insecure-allow-remote"
        )
    click.echo(
        f"WARNING: ledgerq node listens on {host} without a token (--insecure-allow-remote): "
        "anyone who reaches it may submit batches and read the ledger",
        err=True,
    )


async def _serve(
    host: str, port: int, data_dir: Path | None, options: dict[str, Any], settings: Settings
) -> None:
    # Handle SIGINT/SIGTERM before anything else: a stop asked for during start-up (or
    # the instant the node says it listens) closes the node cleanly once it has opened,
    # writing what its replay committed, instead of killing it by the default action.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    tracer = memdebug.from_environment()  # debugging only: LEDGERQ_NODE_TRACEMALLOC
    if tracer is not None:
        loop.add_signal_handler(signal.SIGUSR2, tracer.dump)
    node = await Node.open(data_dir, **options)
    scabbard = ScabbardServices(
        data_dir,
        max_services=settings.node.max_scabbard_services,
        idle_s=settings.node.scabbard_idle_s,
        **options,
    )
    access = AccessPolicy(
        token=settings.node.token,
        allowed_hosts=_split(settings.node.allowed_hosts),
        allowed_origins=_split(settings.node.allowed_origins),
    )
    limits = RestLimits(
        max_status_ids=settings.node.max_status_ids,
        max_event_streams=settings.node.max_event_streams,
    )
    app = extend_node_app(
        make_app(node, scabbard=scabbard, access=access, bound_host=host, limits=limits), node
    )
    try:
        runner = await start_listening(app, settings, host, port)
    except OSError as exc:
        await scabbard.close()
        await node.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {bind_failure(exc)}") from exc
    try:
        bound = runner.addresses[0] if runner.addresses else (host, port)
        # Tests read this line to learn the port when binding port 0.
        click.echo(f"ledgerq node listening on http://{bound[0]}:{bound[1]}", err=True)
        await stop.wait()
    finally:
        await runner.cleanup()
        await scabbard.close()
        await node.close()


async def start_listening(
    app: web.Application, settings: Settings, host: str, port: int
) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` as ``ledgerq node`` does; returns the
    runner (``cleanup()`` stops it). Raises ``OSError`` when it cannot listen.

    The connections are guarded as the gateway's
    (:class:`~ledgerq.ingest.guard.GuardedSite`): ``http.*`` deadlines and
    idle timeout, ``node.max_connections`` in all and
    ``node.max_connections_per_address`` per client address. A compressed
    body is inflated only by a handler that reads it, bounded and off the
    event loop (:mod:`ledgerq.httpbody`): never by aiohttp.
    """
    limits = dataclasses.replace(
        settings.http,
        max_connections=settings.node.max_connections,
        max_connections_per_address=settings.node.max_connections_per_address,
    )
    app.middlewares.insert(0, guard_middleware)  # the guard learns where each request stands
    # No per-request access log: a busy gateway posts thousands of batches a second.
    runner = web.AppRunner(
        app,
        shutdown_timeout=2.0,
        access_log=None,
        auto_decompress=False,
        keepalive_timeout=limits.keepalive_s,
    )
    await runner.setup()
    try:
        await GuardedSite(runner, limits, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _split(value: str) -> tuple[str, ...]:
    return tuple(v for v in value.split(",") if v)
