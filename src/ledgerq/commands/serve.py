"""``ledgerq serve``: the gateway, with its store, ledger client and (by default) the node.

Start-up: settings are loaded and validated (an invalid value stops the
command, naming the key), the store is opened (PostgreSQL: a refusal names
every host of the URL and what it answered; ``--wait-for-store SECONDS``
waits that long for a primary first) and migrated, the ledger is
reached (``node``: an in-process node with its data next to the SQLite
file), then the gateway serves until SIGINT or SIGTERM, on which it drains
in-flight submissions before exiting.

With ``--workers N`` (N > 1; by default one per core) this process becomes
the supervisor of N gateway processes behind the same port
(:mod:`ledgerq.gateway.workers`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import click

from ledgerq.config import Settings, load_settings
from ledgerq.errors import ConfigError, LedgerqError
from ledgerq.logs import configure_logging

if TYPE_CHECKING:
    from ledgerq.gateway.service import Gateway


def check_bind(settings: Settings) -> None:
    """Refuse to listen beyond loopback without a token (unless told to, loudly)."""
    from ledgerq.node.access import is_loopback

    host, _ = settings.bind_address
    if is_loopback(host) or settings.auth.has_token:
        return
    if not settings.insecure_allow_remote:
        raise click.ClickException(
            f"refusing to listen on {host} without a token: anyone who reaches that address "
            "could post batches into any service and read them all. Set auth.token "
            "(LEDGERQ_AUTH_TOKEN) or auth.tokens, listen on 127.0.0.1, or pass "
            "--insecure-allow-remote"
        )
    click.echo(
        f"WARNING: the gateway listens on {host} without a token (--insecure-allow-remote): "
        "anyone who reaches it may post and read batches",
        err=True,
    )


def _announce(gateway: Gateway) -> None:
    host, _ = gateway.settings.bind_address
    # Tests read this line to learn the port when binding port 0.
    click.echo(f"ledgerq gateway listening on http://{host}:{gateway.port}", err=True)


@click.command("serve")
@click.option("--db", help="Store URL (default sqlite:///ledgerq.sqlite3).")
@click.option(
    "--ledger",
    help="node (in-process, default), sawtooth+http://HOST:PORT or splinter+http://HOST:PORT.",
)
@click.option("--bind", help="HOST:PORT to listen on (default 127.0.0.1:8080).")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    help="Gateway processes behind the port (default 0: one per core).",
)
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings file."
)
@click.option("--node-data-dir", help="Data directory of the in-process node.")
@click.option(
    "--node-ephemeral/--no-node-ephemeral",
    default=None,
    help="The in-process node forgets pending batches on restart (they report UNKNOWN).",
)
@click.option(
    "--delay-window-ms",
    type=int,
    help="How long a Delayed batch waits before it is resubmitted (default 15000).",
)
@click.option(
    "--strategy",
    type=click.Choice(["serial", "parallel", "pipelined"], case_sensitive=False),
    help="Queuer strategy: serial (one batch of a service in flight, default), "
    "parallel (batches touching different state in flight together) or pipelined "
    "(batches that declare their predecessors in flight together; the ledger keeps "
    "their order).",
)
@click.option(
    "--strategy-for",
    "strategy_for",
    multiple=True,
    metavar="PATTERN=STRATEGY",
    help="The strategy of the service ids matching PATTERN (shell-style; repeatable, "
    "first match wins), overriding --strategy.",
)
@click.option(
    "--on-invalid",
    type=click.Choice(["continue", "halt"], case_sensitive=False),
    help="After an INVALID batch: continue with the service's next batch (default) or "
    "halt the service until an operator resumes it past that batch.",
)
@click.option(
    "--on-invalid-for",
    "on_invalid_for",
    multiple=True,
    metavar="PATTERN=continue|halt",
    help="--on-invalid for the service ids matching PATTERN (shell-style; repeatable, "
    "first match wins).",
)
@click.option(
    "--allowed-hosts",
    help="Comma-separated Host names answered besides the bind address and loopback "
    "[allowed_hosts].",
)
@click.option("--public-url", help="Base URL of the links in answers [public_url].")
@click.option(
    "--default-service",
    help="The service of batches posted without one (empty: none) [default_service].",
)
@click.option(
    "--insecure-allow-remote",
    is_flag=True,
    default=None,
    help="Listen beyond loopback without a token [insecure_allow_remote].",
)
@click.option(
    "--wait-for-store",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="At start-up, wait up to SECONDS for a PostgreSQL primary [store.wait_s].",
)
@click.option("--log-level", help="debug, info, warning or error.")
@click.option("--log-json/--no-log-json", default=None, help="JSON log lines.")
def serve(
    db: str | None,
    ledger: str | None,
    bind: str | None,
    workers: int | None,
    config_file: str | None,
    node_data_dir: str | None,
    node_ephemeral: bool | None,
    delay_window_ms: int | None,
    strategy: str | None,
    strategy_for: tuple[str, ...],
    on_invalid: str | None,
    on_invalid_for: tuple[str, ...],
    allowed_hosts: str | None,
    public_url: str | None,
    default_service: str | None,
    insecure_allow_remote: bool | None,
    wait_for_store: float | None,
    log_level: str | None,
    log_json: bool | None,
) -> None:
    """Run the gateway: REST API, submitter and monitor."""
    flags: dict[str, Any] = {
        "db": db,
        "ledger": ledger,
        "bind": bind,
        "workers": workers,
        "node.data_dir": node_data_dir,
        "node.ephemeral": node_ephemeral,
        "delay_window_ms": delay_window_ms,
        "queuer.strategy": strategy,
        "queuer.strategy_by_service": ",".join(strategy_for) if strategy_for else None,
        "queuer.on_invalid": on_invalid,
        "queuer.on_invalid_by_service": ",".join(on_invalid_for) if on_invalid_for else None,
        "allowed_hosts": allowed_hosts,
        "public_url": public_url,
        "default_service": default_service,
        "insecure_allow_remote": insecure_allow_remote,
        "store.wait_s": wait_for_store,
        "log.level": log_level,
        "log.json": log_json,
    }
    try:
        settings = load_settings(flags, config_file=config_file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    for warning in settings.warnings:
        click.echo(f"WARNING: {warning}", err=True)
    check_bind(settings)
    configure_logging(settings.log.level, json_lines=settings.log.json)
    from ledgerq import failpoints

    try:
        failpoints.configure()  # fault tests only; nothing armed when unset
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    from ledgerq.commands.node import tune_gc
    from ledgerq.gateway.loop import run
    from ledgerq.gateway.run import run_gateway
    from ledgerq.gateway.workers import check_port_free, resolve_workers

    try:
        count = resolve_workers(settings)
        if count > 1:
            asyncio.run(_supervise(settings, count))
            return
        # First the port: a start refused there leaves no database file,
        # lock file or node data behind.
        check_port_free(*settings.bind_address)
        tune_gc()
        run(
            run_gateway(settings, install_signals=True, on_started=_announce),
            settings.event_loop,
        )
    except LedgerqError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass


async def _supervise(settings: Settings, count: int) -> None:
    import signal

    from ledgerq.claims import SingleInstanceLock
    from ledgerq.gateway.workers import Supervisor
    from ledgerq.store import open_store
    from ledgerq.store.sqlite import path_from_url

    # First the port: a start refused there leaves no database file (nor lock
    # file) behind.
    supervisor = Supervisor(settings, count, worker_module="ledgerq.commands.worker")
    lock = None
    try:
        if settings.db.startswith("sqlite:///"):
            # One gateway per SQLite file; this supervisor's workers share it.
            lock = SingleInstanceLock(path_from_url(settings.db))
            lock.acquire()
        # Migrate once, before the workers open the store.
        store = await open_store(
            settings.db,
            migrate=True,
            lock_entries=False,
            pg_outage_timeout_s=settings.store.outage_timeout_s,
            pg_wait_s=settings.store.wait_s,
        )
        await store.close()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, supervisor.stop)

        def announce(sup: Supervisor) -> None:
            # Tests read this line to learn the port when binding port 0.
            click.echo(f"ledgerq gateway listening on {sup.url} ({count} workers)", err=True)

        await supervisor.run(on_ready=announce)
    finally:
        supervisor.close()
        if lock is not None:
            lock.release()
