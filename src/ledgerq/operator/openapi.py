"""The hand-written OpenAPI 3 specs shipped in the package, served at ``/openapi.json``.

``ledgerq/operator/gateway.openapi.json`` describes the gateway,
``ledgerq/operator/node.openapi.json`` the node; the test suite checks both
against the running implementations (every documented operation answers in
the documented shapes).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from aiohttp import web


@cache
def load_spec(name: str) -> dict[str, Any]:
    text = resources.files("ledgerq.operator").joinpath(name).read_text(encoding="utf-8")
    spec: dict[str, Any] = json.loads(text)
    return spec


def add_route(app: web.Application, name: str) -> None:
    async def serve(request: web.Request) -> web.Response:
        return web.json_response(load_spec(name))

    app.router.add_get("/openapi.json", serve)
