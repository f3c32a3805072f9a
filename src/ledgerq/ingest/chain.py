"""Sawtooth's read routes on the gateway, answered from its ledger.

Every read route of Sawtooth's REST API (:data:`~ledgerq.ledgers.chain.SAWTOOTH_READS`:
``/state``, ``/state/{address}``, ``/blocks[/{id}]``, the chain's
``/batches[/{id}]``, ``/transactions[/{id}]``, ``/receipts``, ``/peers``,
``/status``) is served at the gateway's root and under a service's prefix
(``/services/{service_id}/…``), so that a Sawtooth client pointed at either
reads what it wrote. The answer is the ledger's (:class:`~ledgerq.ledgers.chain.ChainReads`):
its status, its body in Sawtooth's shapes, its errors with Sawtooth's codes;
the links in it (``link``, ``paging.next``) are moved onto the gateway's
base URL and the prefix the request came by, so that following them stays
on the gateway.

The chain is the ledger's, shared by every service (a Sawtooth ledger has
no services): its reads need a token that reads every service
(:attr:`~ledgerq.scopes.Scope.sees_everything`), else ``403`` — a token
limited to some services would otherwise read the others' data. A ledger
that answers none of these routes (Splinter's scabbard) gets ``501``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from yarl import URL

from ledgerq.ingest.errors import error_body
from ledgerq.ledgers.chain import SAWTOOTH_READS, ChainReads, path_and_query, rebase_links

#: The prefix under which a service's Sawtooth API is served (``--url
#: http://gw:8080/services/svc1`` for a Sawtooth client).
SERVICE_PREFIX = "/services/{service_id}"


def service_prefix(request: web.Request) -> str:
    """The prefix the request came by, as it was written (``/services/svc1``),
    or ``""`` at the root."""
    if "service_id" not in request.match_info:
        return ""
    parts = request.rel_url.raw_path.split("/", 3)
    return "/".join(parts[:3])


def unprefixed_path(request: web.Request) -> str:
    """The request's path without its service's prefix (``/batch_statuses``
    for ``/services/svc1/batch_statuses``)."""
    if "service_id" not in request.match_info:
        return request.path
    return "/" + request.path.split("/", 3)[3] if request.path.count("/") >= 3 else request.path


class ChainRoutes:
    """The gateway's handlers of Sawtooth's read routes over ``reads``
    (``None``: a ledger without them). ``base(request)`` is the base of the
    gateway's absolute links; ``sees_everything(request)`` whether the
    request's token reads every service."""

    def __init__(
        self,
        reads: ChainReads | None,
        *,
        base: Callable[[web.Request], str],
        sees_everything: Callable[[web.Request], bool],
        ledger: str = "the ledger",
    ) -> None:
        self.reads = reads
        self.base = base
        self.sees_everything = sees_everything
        self.ledger = ledger

    def add_to(self, app: web.Application) -> None:
        for method, route in SAWTOOTH_READS:
            handler = self._handler(method, route)
            app.router.add_route(method, route, handler)
            app.router.add_route(method, SERVICE_PREFIX + route, handler)

    def _handler(
        self, method: str, route: str
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.answer(request, method, route)

        return handle

    async def answer(self, request: web.Request, method: str, route: str) -> web.StreamResponse:
        if not self.sees_everything(request):
            return web.json_response(
                error_body(
                    403,
                    "Forbidden",
                    f"{route.split('/')[1]} is the ledger's, shared by every service: reading "
                    "it needs a token that reads every service",
                    "out_of_scope",
                ),
                status=403,
            )
        handler = None if self.reads is None else self.reads.chain_handler(method, route)
        if handler is None:
            return web.json_response(
                error_body(
                    501,
                    "Not Implemented",
                    f"{self.ledger} answers no {method} {route}; ask the ledger itself",
                ),
                status=501,
            )
        prefix = service_prefix(request)
        raw = request.rel_url.raw_path[len(prefix) :]
        inner = request.clone(
            rel_url=URL.build(path=raw, query_string=request.rel_url.raw_query_string, encoded=True)
        )
        response = await handler(inner)
        if isinstance(response, web.Response) and response.content_type == "application/json":
            body = response.body
            if isinstance(body, bytes):
                root = self.base(request) + prefix
                rebased = rebase_links(body, lambda link: root + path_and_query(link))
                if rebased is not body:
                    response.body = rebased
        return response
