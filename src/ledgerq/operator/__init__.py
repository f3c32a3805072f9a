"""What an operator sees of a gateway or node over HTTP, besides the ledger API.

:func:`gateway_app` builds the gateway's aiohttp application: the REST API of
:mod:`ledgerq.ingest.api`, plus ``/metrics`` (:mod:`ledgerq.operator.metrics`),
``/openapi.json``, the dashboard at ``/`` (:mod:`ledgerq.operator.dashboard`) and
the security middlewares of :mod:`ledgerq.operator.security` as configured.
:func:`extend_node_app` adds ``/metrics`` and ``/openapi.json`` to a node's
application.

May import: the foundation, ``config``, ``ingest`` (its JSON shapes),
``ledgers.base`` (to count what the ledger answers) and ``node`` (its
metrics). Never the store modules or the pipeline stages.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import generate_latest

from ledgerq.config import Settings, ledger_password
from ledgerq.ingest.guard import LIMITS
from ledgerq.logs import add_secret
from ledgerq.node import Node
from ledgerq.operator import dashboard, openapi
from ledgerq.operator.metrics import CONTENT_TYPE, GatewayMetrics, node_registry
from ledgerq.operator.security import (
    add_security_headers,
    cors_middleware,
    host_middleware,
    parse_origins,
    service_id_middleware,
    token_middleware,
)

__all__ = ["GatewayMetrics", "extend_node_app", "gateway_app"]

METRICS_KEY: web.AppKey[GatewayMetrics] = web.AppKey("metrics", GatewayMetrics)


class OperatedGateway(Protocol):
    """What the operator endpoints read of a running gateway."""

    settings: Settings
    metrics: GatewayMetrics
    store: Any
    api: Any

    @property
    def claims(self) -> Any: ...


def register_secrets(settings: Settings) -> None:
    """Keep the tokens (the clients' and the one sent to the ledger) and the
    database's and the ledger's passwords out of every log line."""
    for token, _scope in settings.auth.scoped_tokens:
        add_secret(token)
    if settings.ledger_token:
        add_secret(settings.ledger_token)
    for password in (urlsplit(settings.db).password, ledger_password(settings.ledger)):
        if password:
            add_secret(password)


def secure(app: web.Application, settings: Settings) -> None:
    """Install the connection limits (``http.*``, applied by the guarded site
    that serves the app), the security headers and the middlewares
    (outermost first: Host check, CORS, tokens, service id)."""
    register_secrets(settings)
    app[LIMITS] = settings.http
    app.on_response_prepare.append(add_security_headers)
    app.middlewares.append(
        host_middleware(
            [h for h in settings.allowed_hosts.split(",") if h],
            bound_host=settings.bind_address[0],
            public_url=settings.public_url,
            trust_forwarded=settings.trust_forwarded,
        )
    )
    origins = parse_origins(settings.cors.origins)
    if origins:
        app.middlewares.append(cors_middleware(origins))
    if settings.auth.has_token:
        app.middlewares.append(token_middleware(settings.auth.scoped_tokens))
    app.middlewares.append(service_id_middleware)


def gateway_app(gateway: OperatedGateway) -> web.Application:
    app: web.Application = gateway.api.app()
    secure(app, gateway.settings)
    # Each token is a tenant with its fair share (ledgerq.ingest.fairness).
    gateway.api.set_tenants(len(gateway.settings.auth.scoped_tokens))
    app[METRICS_KEY] = gateway.metrics

    async def metrics(request: web.Request) -> web.Response:
        await gateway.metrics.refresh(gateway.store)
        return web.Response(
            body=await gateway.metrics.scrape(), headers={"Content-Type": CONTENT_TYPE}
        )

    app.router.add_get("/metrics", metrics)
    node = getattr(getattr(gateway, "ledger", None), "node", None)
    if isinstance(node, Node):
        # The in-process node's counters, on the gateway's own /metrics.
        gateway.metrics.add_node(node)
    openapi.add_route(app, "gateway.openapi.json")
    dashboard.add_routes(app, gateway)
    return app


def extend_node_app(app: web.Application, node: Any) -> web.Application:
    """``/metrics``, ``/openapi.json`` and the gateway's security headers
    (``Server`` without versions among them) on a node's app."""
    registry = node_registry(node)
    app.on_response_prepare.append(add_security_headers)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/metrics", metrics)
    openapi.add_route(app, "node.openapi.json")
    return app
