"""The hand-written OpenAPI 3 specs shipped in the package, served at ``/openapi.json``.

``ledgerq/operator/gateway.openapi.json`` describes the gateway,
``ledgerq/operator/node.openapi.json`` the node; the test suite checks both
against the running implementations (every documented operation answers in
the documented shapes).

A path item marked ``"x-service-prefix": true`` (the gateway's Sawtooth
routes) is written once and served twice: as it is, and under
``/services/{service_id}`` (:data:`SERVICE_PREFIX`), the service named by
the path. :func:`load_spec` adds the prefixed copies.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

from aiohttp import web

SERVICE_PREFIX = "/services/{service_id}"
PREFIX_MARK = "x-service-prefix"
_SERVICE_PARAMETER = {
    "name": "service_id",
    "in": "path",
    "required": True,
    "description": (
        "The service of the batches posted and of the statuses read under this prefix "
        "(Grid: circuit::service)"
    ),
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._\\-:~@+]*$", "maxLength": 64},
}


@cache
def load_spec(name: str) -> dict[str, Any]:
    text = resources.files("ledgerq.operator").joinpath(name).read_text(encoding="utf-8")
    spec: dict[str, Any] = json.loads(text)
    prefixed = {}
    for path, item in spec["paths"].items():
        if item.pop(PREFIX_MARK, False):
            copied = copy.deepcopy(item)
            for method, op in copied.items():
                op["operationId"] = f"{op.get('operationId', method + path)}InService"
                op["parameters"] = [_SERVICE_PARAMETER, *op.get("parameters", [])]
            prefixed[SERVICE_PREFIX + path] = copied
    spec["paths"].update(prefixed)
    return spec


def add_route(app: web.Application, name: str) -> None:
    async def serve(request: web.Request) -> web.Response:
        return web.json_response(load_spec(name))

    app.router.add_get("/openapi.json", serve)
