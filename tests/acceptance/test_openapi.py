"""The shipped OpenAPI specs against the running apps, with schemathesis.

Every documented operation of the gateway and of the node is called with
generated requests (a bounded number per operation) and each answer is
checked against the spec: documented status code, content type and body
schema, and never a 5xx other than the documented ones. Also: every route the
apps serve is in their spec, and every spec path is served.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings

from ledgerq.config import load_settings
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.node import Node
from ledgerq.node.rest import make_app
from ledgerq.node.scabbard import ScabbardServices
from ledgerq.operator import extend_node_app, gateway_app
from ledgerq.operator.openapi import load_spec
from ledgerq.store import open_store

AppFactory = Callable[[], Awaitable[tuple[web.Application, Callable[[], Awaitable[None]]]]]


class ServedApp:
    """An aiohttp app served on 127.0.0.1:0 from a thread with its own event loop."""

    def __init__(self, factory: AppFactory) -> None:
        self.factory = factory
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._error: BaseException | None = None

    async def _main(self) -> None:
        try:
            app, close = await self.factory()
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await close()

    def __enter__(self) -> ServedApp:
        self._thread.start()
        assert self._ready.wait(30), "app did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


async def _gateway_app() -> tuple[web.Application, Callable[[], Awaitable[None]]]:
    folder = tempfile.TemporaryDirectory(prefix="ledgerq-openapi-")
    db = f"sqlite:///{folder.name}/g.sqlite3"
    config = load_settings({"db": db, "bind": "127.0.0.1:0"}, environ={}, cwd=Path(folder.name))
    store = await open_store(db)
    # A ledger that answers Sawtooth's read routes, as the default one does.
    node = await Node.open(None)
    gateway = Gateway(config, store, NodeClient(node))

    async def close() -> None:
        await store.close()
        await node.close()
        folder.cleanup()

    return gateway_app(gateway), close


async def _node_app() -> tuple[web.Application, Callable[[], Awaitable[None]]]:
    node = await Node.open(None)
    scabbard = ScabbardServices(None)

    async def close() -> None:
        await scabbard.close()
        await node.close()

    return extend_node_app(make_app(node, scabbard=scabbard), node), close


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    with ServedApp(_gateway_app) as served:
        yield served.url


@pytest.fixture(scope="module")
def node_url() -> Iterator[str]:
    with ServedApp(_node_app) as served:
        yield served.url


GATEWAY = schemathesis.openapi.from_dict(load_spec("gateway.openapi.json"))
# The event stream never ends by itself and the websocket is no plain HTTP call;
# both have their own tests.
NODE = (
    schemathesis.openapi.from_dict(load_spec("node.openapi.json"))
    .exclude(path="/events")
    .exclude(path="/subscriptions")
)
# A body the schema calls valid (any bytes) need not be a valid BatchList: the
# codec's rules cannot be written as a schema, so that one check is left out.
EXCLUDED = [schemathesis.checks.positive_data_acceptance]
BOUNDED = settings(
    max_examples=10,
    derandomize=True,  # the same cases on every run: CI never flakes on a new one
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _check(case: schemathesis.Case, url: str) -> None:
    if case.query and "wait" in case.query:
        case.query["wait"] = "0"  # a long poll would only make the test slow
    excluded = list(EXCLUDED)
    if case.path == "/ready":
        excluded.append(schemathesis.checks.not_a_server_error)  # 503: documented, not ready
    response = case.call(base_url=url, timeout=30)
    case.validate_response(response, excluded_checks=excluded)


@GATEWAY.parametrize()
@BOUNDED
def test_gateway_matches_its_spec(case: schemathesis.Case, gateway_url: str) -> None:
    _check(case, gateway_url)


@NODE.parametrize()
@BOUNDED
def test_node_matches_its_spec(case: schemathesis.Case, node_url: str) -> None:
    _check(case, node_url)


def _routes(app: web.Application) -> set[tuple[str, str]]:
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        if path and route.method != "HEAD":
            out.add((route.method.lower(), path))
    return out


def _spec_routes(name: str) -> set[tuple[str, str]]:
    spec = load_spec(name)
    return {(m, p) for p, ops in spec["paths"].items() for m in ops}


async def test_every_route_is_documented_and_every_documented_route_served() -> None:
    app, close = await _gateway_app()
    try:
        served = {r for r in _routes(app) if not r[1].startswith("/static/")}
        assert served == _spec_routes("gateway.openapi.json")
    finally:
        await close()
    node_app, node_close = await _node_app()
    try:
        assert _routes(node_app) == _spec_routes("node.openapi.json")
    finally:
        await node_close()
