"""Operator endpoints under many services: what a scrape or a dashboard refresh costs.

A gateway (not running its pipeline) over a SQLite store holding
``--services`` services with ``--per-service`` queued batches each; the
endpoints are called ``--requests`` times each over loopback and their
latency reported (p50/p99), with the size of the answer. ``/metrics`` reads
batch counts and every service's queue depth from the store at each scrape.
Also the per-call overhead of the metrics proxy around the ledger client.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp
import click
from aiohttp import web

from bench import report
from ledgerq.codec import Signer, to_tracking_batch
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.config import load_settings
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers.base import Accepted, CommitEvent, LedgerBatchStatus, SubmitResult
from ledgerq.operator import gateway_app
from ledgerq.operator.metrics import GatewayMetrics
from ledgerq.store import open_store


class NullLedger:
    description = "null"

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        return Accepted()

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        return ()

    def events(self) -> AsyncIterator[CommitEvent] | None:
        return None

    def triggers(self) -> AsyncIterator[None] | None:
        return None

    async def close(self) -> None:
        pass


async def _fill(db: str, services: int, per_service: int) -> None:
    signer = Signer.generate()
    async with await open_store(db) as store:
        with report.progress() as bar:
            task = bar.add_task("fill the store", total=services)
            for s in range(services):
                batches = [
                    to_tracking_batch(
                        make_intkey_batch(signer, [("set", f"b{s}-{i}", i)]), f"svc-{s:05d}"
                    )
                    for i in range(per_service)
                ]
                await store.add_batches(batches)
                bar.advance(task)


async def _measure(url: str, path: str, n: int) -> tuple[float, float, int]:
    times: list[float] = []
    size = 0
    async with aiohttp.ClientSession() as http:
        for _ in range(n):
            t0 = time.perf_counter()
            async with http.get(url + path) as r:
                body = await r.read()
                assert r.status == 200, (path, r.status)
            times.append((time.perf_counter() - t0) * 1000)
            size = len(body)
    return report.percentile(times, 50), report.percentile(times, 99), size


async def _proxy_overhead(calls: int) -> tuple[float, float]:
    raw = NullLedger()
    wrapped = GatewayMetrics().instrument(raw)

    async def loop(ledger: NullLedger) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(calls):
                await ledger.submit("s", f"b{i}", b"")
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best

    return await loop(raw), await loop(wrapped)  # type: ignore[arg-type]


async def _run(services: int, per_service: int, requests: int) -> str:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-operator-") as folder:
        db = f"sqlite:///{folder}/b.sqlite3"
        await _fill(db, services, per_service)
        settings = load_settings({"db": db, "bind": "127.0.0.1:0"}, environ={})
        store = await open_store(db)
        gateway = Gateway(settings, store, NullLedger())
        runner = web.AppRunner(gateway_app(gateway))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        rows = []
        try:
            for path in ("/metrics", "/services?limit=1000", "/dashboard/data", "/health"):
                p50, p99, size = await _measure(url, path, requests)
                rows.append((f"`GET {path}`", f"{p50:.1f}", f"{p99:.1f}", f"{size / 1024:.1f}"))
            async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
                text = await r.text()
            series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        finally:
            await runner.cleanup()
            await store.close()
    raw_us, wrapped_us = await _proxy_overhead(20_000)
    return (
        f"A gateway over SQLite with {services:,} services × {per_service} queued batches "
        f"({services * per_service:,} batches); each endpoint called {requests} times in turn "
        "over loopback.\n\n"
        + report.table(["endpoint", "p50 ms", "p99 ms", "answer KiB"], rows)
        + f"\n\n`/metrics` exposes {series} samples for {services:,} services (per-service "
        f"depth bounded to the top {settings.metrics.top_services} plus `other`). "
        f"Metrics proxy around the ledger client: {raw_us:.2f} µs per `submit` unwrapped, "
        f"{wrapped_us:.2f} µs wrapped (a counter, a histogram, a timestamp). "
        f"Load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after: "
        "other work shared the machine."
    )


@click.command()
@click.option("--services", default=5_000, show_default=True)
@click.option("--per-service", default=4, show_default=True)
@click.option("--requests", default=50, show_default=True)
@click.option("--write/--no-write", default=True, show_default=True)
def command(services: int, per_service: int, requests: int, write: bool) -> None:
    """Latency of /metrics, /services and the dashboard data with many services."""
    markdown = asyncio.run(_run(services, per_service, requests))
    click.echo(markdown)
    if write:
        report.write_section("operator", markdown)
