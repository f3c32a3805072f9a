"""The gateway's dashboard: a static page at ``/`` and the JSON it polls.

The page (``static/index.html``, ``dashboard.js``, ``dashboard.css``; no
build step, no CDN) refreshes itself every two seconds from
``GET /dashboard/data`` (batch counts by status, per-second throughput of the
last minutes, the most recently accepted batches with their status and
error, the ledger's open problems; a token limited to some services sees
only their recent batches, and no instance-wide counts, throughput or
ledger problems: all three are ``null``), ``GET /services`` (with each service's
open ledger problem and what stops it: paused, halted, waiting for a declared
dependency) and ``GET /instances``. Each service's row has buttons to pause,
resume, skip past the batch it halted at and cancel queued batches (listed
by ``GET /services/{id}``, checked to choose); each asks for confirmation
first, then posts to ``/services/{id}/...`` (:mod:`ledgerq.ingest.control`)
with the page's token, and says what the gateway answered. Recent batches and
throughput are what this gateway accepted and saw reach a final status:
with ``serve --workers`` the worker that answers adds the other workers'
(each worker counts its own; behind one port a client's posts are spread
over them), the recent batches then in acceptance order across them. Other
instances on the same database (other ``ledgerq serve``) are not included.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

from aiohttp import web

from ledgerq.errors import StoreUnavailableError
from ledgerq.ingest.api import batch_json, scope_of

#: The longest the dashboard waits for a store read (then 503).
STORE_WAIT_S = 10.0

_ASSETS = {
    "dashboard.js": "application/javascript",
    "dashboard.css": "text/css",
}


def _asset(name: str) -> bytes:
    return resources.files("ledgerq.operator").joinpath("static", name).read_bytes()


def add_routes(app: web.Application, gateway: Any) -> None:
    async def index(request: web.Request) -> web.Response:
        return web.Response(
            body=_asset("index.html"),
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _ASSETS:
            raise web.HTTPNotFound()
        return web.Response(
            body=_asset(name),
            content_type=_ASSETS[name],
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def data(request: web.Request) -> web.Response:
        try:
            return await read_data(request)
        except TimeoutError as exc:
            # The store did not answer in time: unavailable, as any read says (503).
            raise StoreUnavailableError(
                f"the store did not answer within {STORE_WAIT_S:g} s"
            ) from exc

    async def read_data(request: web.Request) -> web.Response:
        try:
            recent_n = int(request.query.get("recent", "30"))
            seconds = int(request.query.get("seconds", "300"))
            if not (1 <= recent_n <= 200 and 10 <= seconds <= 600):
                raise ValueError
        except ValueError:
            return web.json_response(
                {
                    "error": {
                        "code": 400,
                        "title": "Bad Query",
                        "message": "recent is 1-200, seconds 10-600",
                    }
                },
                status=400,
            )
        metrics = gateway.metrics
        scope = scope_of(request)
        throughput = metrics.throughput(seconds)
        wanted = [(i, s) for i, s in list(metrics.recent)[::-1] if scope.covers(s)][:recent_n]
        parts = []
        if metrics.peer_dashboards is not None:
            parts = await metrics.peer_dashboards(
                throughput["seconds"], throughput["until"] // 1000
            )
        for part in parts:
            for key in ("accepted", "final"):
                throughput[key] = [a + b for a, b in zip(throughput[key], part[key], strict=True)]
            theirs = [(str(i), str(s)) for i, s in part["recent"][::-1]]
            wanted.extend([(i, s) for i, s in theirs if scope.covers(s)][:recent_n])
        wanted = list(dict.fromkeys(wanted))
        # One read for all of them (a batch id names one batch: its service
        # must be the one recorded with it, as a scoped token was checked on).
        by_id = {
            b.batch_id: b
            for b in await asyncio.wait_for(
                gateway.store.get_batches_by_id([i for i, _ in wanted]), STORE_WAIT_S
            )
        }
        batches = [by_id[i] for i, s in wanted if i in by_id and by_id[i].service_id == s]
        if parts:
            # Several workers' batches: newest first by acceptance order.
            batches = sorted(batches, key=lambda b: b.seq or 0, reverse=True)[:recent_n]
        recent = [batch_json(b) for b in batches]
        # Counts, throughput and the ledger's bursts are instance-wide: only
        # for a token that sees every service (null for a scoped one; the page
        # then hides them). A burst's message is the last failure of any
        # service: a Splinter URL naming a circuit, a status read's batch ids.
        everything = scope.sees_everything
        counts = (
            await asyncio.wait_for(gateway.store.status_counts(), STORE_WAIT_S)
            if everything
            else None
        )
        health = getattr(gateway, "health", None)
        return web.json_response(
            {
                "counts": counts,
                "throughput": throughput if everything else None,
                "recent": recent,
                "ledger": gateway.ledger.description,
                "ledger_health": health.snapshot() if health and everything else None,
            }
        )

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/dashboard/data", data)
