"""Every route the gateway and the node serve has its row in docs/api.md, and
every row names a served route.

The routes are collected from the apps themselves (the gateway's
:class:`~ledgerq.ingest.api.GatewayApi` over an in-memory store, the node's
:func:`~ledgerq.node.rest.make_app` with scabbard) and from the two OpenAPI
specs, which ``tests/acceptance/test_openapi.py`` keeps equal to what the
running processes serve (``/metrics`` and ``/openapi.json`` are added by the
operator wiring), plus the dashboard's routes. Each ``## Gateway`` / ``## Node`` section of
api.md has a table whose rows read ``| `METHOD`[, `METHOD`] | `path` | …``;
path parameters are compared by position, not by name. The gateway's
Sawtooth routes repeated under ``/services/{service_id}`` are documented once,
by the sentence that says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aiohttp import web

from ledgerq.ingest.api import GatewayApi
from ledgerq.ingest.chain import SERVICE_PREFIX
from ledgerq.node import Node
from ledgerq.node.rest import make_app
from ledgerq.node.scabbard import ScabbardServices
from ledgerq.operator import dashboard
from ledgerq.store import open_store

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "api.md"
SPECS = REPO / "src" / "ledgerq" / "operator"
ROW = re.compile(r"^\| *((?:`[A-Z]+`(?:, )?)+) *\| *\[?`([^`]+)`", re.MULTILINE)

Route = tuple[str, str]


def shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def section(heading: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {heading}\n")
    stop = text.find("\n## ", start + 1)
    return text[start : stop if stop > 0 else len(text)]


def documented(heading: str) -> set[Route]:
    rows = set()
    for methods, path in ROW.findall(section(heading)):
        rows |= {(m, shape(path)) for m in re.findall(r"`([A-Z]+)`", methods)}
    return rows


def spec_routes(name: str) -> set[Route]:
    spec = json.loads((SPECS / name).read_text())
    return {
        (method.upper(), shape(path))
        for path, operations in spec["paths"].items()
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    }


def app_routes(app: web.Application) -> set[Route]:
    found = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = str(info.get("path") or info.get("formatter", ""))
        if route.method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            found.add((route.method, shape(path)))
    return found


@pytest.fixture
async def gateway_routes() -> set[Route]:
    store = await open_store("memory://")
    try:
        app = GatewayApi(store).app()
        dashboard.add_routes(app, gateway=None)  # the handlers alone use the gateway
        served = app_routes(app)
    finally:
        await store.close()
    prefixed = {(m, p) for m, p in served if p.startswith(shape(SERVICE_PREFIX) + "/")}
    assert prefixed, "the Sawtooth routes under a service's prefix were not collected"
    return (served - prefixed) | spec_routes("gateway.openapi.json")


@pytest.fixture
async def node_routes() -> set[Route]:
    node = await Node.open(None)
    try:
        served = app_routes(make_app(node, scabbard=ScabbardServices(None, shards=1)))
    finally:
        await node.close()
    return served | spec_routes("node.openapi.json")


def problems(heading: str, served: set[Route]) -> list[str]:
    rows = documented(heading)
    missing = sorted(served - rows)
    stale = sorted(rows - served)
    return [f"{m} {p}: served, no row under '## {heading}' in docs/api.md" for m, p in missing] + [
        f"{m} {p}: a row under '## {heading}' in docs/api.md, not served" for m, p in stale
    ]


def test_the_rows_are_read() -> None:
    # A broken reading must not pass vacuously.
    assert {("POST", "/batches"), ("GET", "/services/{}"), ("POST", "/receipts")} <= documented(
        "Gateway"
    )
    assert ("GET", "/scabbard/{}/{}/batch_statuses") in documented("Node")


def test_every_gateway_route_is_documented(gateway_routes: set[Route]) -> None:
    assert ("POST", "/services/{}/cancel") in gateway_routes
    assert not (found := problems("Gateway", gateway_routes)), "\n".join(found)
    assert "/services/{service_id}" in section("Gateway")


def test_every_node_route_is_documented(node_routes: set[Route]) -> None:
    assert ("GET", "/subscriptions") in node_routes
    assert not (found := problems("Node", node_routes)), "\n".join(found)
