"""``ledgerq node``: run the ledger node with its Sawtooth REST API."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from pathlib import Path

import click
from aiohttp import web

from ledgerq.node import Node
from ledgerq.node.rest import make_app
from ledgerq.node.scabbard import ScabbardServices
from ledgerq.web import extend_node_app


def tune_gc() -> None:
    """Collect young objects less often: this process's heap is mostly messages that
    live microseconds, and the default threshold (700) spends a third of the time in
    the collector at full load (see docs/node.md)."""
    gc.set_threshold(50_000, 20, 100)


def _parse_bind(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:8008")
    return host, int(port)


@click.command("node")
@click.option("--bind", default="127.0.0.1:8008", show_default=True, help="HOST:PORT to serve.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Journal and snapshots; without it the node keeps nothing across restarts.",
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
    help="Hold each executed batch PENDING this long before committing it.",
)
@click.option(
    "--snapshot-every",
    type=click.IntRange(1),
    default=50_000,
    show_default=True,
    help="Write a snapshot after this many commits.",
)
def node(
    bind: str,
    data_dir: Path | None,
    shards: int,
    ephemeral: bool,
    max_pending: int,
    commit_delay_ms: int,
    snapshot_every: int,
) -> None:
    """Run a Sawtooth-compatible ledger node (intkey 1.0) with a REST API.

    Also serves Splinter scabbard routes (/scabbard/CIRCUIT/SERVICE/...), a
    separate ledger per service.
    """
    host, port = _parse_bind(bind)
    tune_gc()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(
        _serve(
            host, port, data_dir, shards, ephemeral, max_pending, commit_delay_ms, snapshot_every
        )
    )


async def _serve(
    host: str,
    port: int,
    data_dir: Path | None,
    shards: int,
    ephemeral: bool,
    max_pending: int,
    commit_delay_ms: int,
    snapshot_every: int,
) -> None:
    options = {
        "shards": shards,
        "ephemeral": ephemeral,
        "max_pending": max_pending,
        "commit_delay_ms": commit_delay_ms,
        "snapshot_every": snapshot_every,
    }
    node = await Node.open(data_dir, **options)  # type: ignore[arg-type]
    scabbard = ScabbardServices(data_dir, **options)
    app = extend_node_app(make_app(node, scabbard=scabbard), node)
    # No per-request access log: a busy gateway posts thousands of batches a second.
    runner = web.AppRunner(app, shutdown_timeout=2.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0] if runner.addresses else (host, port)
    # Tests read this line to learn the port when binding port 0.
    click.echo(f"ledgerq node listening on http://{bound[0]}:{bound[1]}", err=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await scabbard.close()
        await node.close()
