"""Sawtooth's read routes on the gateway, answered from its ledger.

Every read route of Sawtooth's REST API (:data:`~ledgerq.ledgers.chain.SAWTOOTH_READS`:
``/state``, ``/state/{address}``, ``/blocks[/{id}]``, the chain's
``/batches[/{id}]``, ``/transactions[/{id}]``, ``/receipts``, ``/peers``,
``/status``) is served by the gateway, so that a Sawtooth client pointed at
it reads what it wrote. The answer is the ledger's (:class:`~ledgerq.ledgers.chain.ChainReads`):
its status, its body in Sawtooth's shapes, its errors with Sawtooth's codes;
the links in it (``link``, ``paging.next``) are moved onto the gateway's
base URL, so that following them stays on the gateway.

The chain is the ledger's, shared by every service (a Sawtooth ledger has
no services): its reads need a token that reads every service
(:attr:`~ledgerq.scopes.Scope.sees_everything`), else ``403`` — a token
limited to some services would otherwise read the others' data. A ledger
that answers none of these routes (Splinter's scabbard) gets ``501``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ledgerq.ingest.errors import error_body
from ledgerq.ledgers.chain import SAWTOOTH_READS, ChainReads, path_and_query, rebase_links


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
        response = await handler(request)
        if isinstance(response, web.Response) and response.content_type == "application/json":
            body = response.body
            if isinstance(body, bytes):
                root = self.base(request)
                rebased = rebase_links(body, lambda link: root + path_and_query(link))
                if rebased is not body:
                    response.body = rebased
        return response
