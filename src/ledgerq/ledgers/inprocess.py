"""The in-process ledger node as a :class:`~ledgerq.ledgers.LedgerClient`.

Direct calls, no HTTP: ``submit`` hands the batch to ``Node.submit`` (which
returns once it is journaled), a full node is ``Busy`` (as its REST API's
429), statuses come from ``Node.batch_statuses`` and final-status events from
``Node.subscribe``, so a commit reaches the follower at once. The node
has no services; ``service_id`` is not sent. Sawtooth's read routes are
answered by the node's own REST handlers (:meth:`NodeClient.chain_handler`),
called directly: the gateway serves the same answers ``ledgerq node`` gives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from ledgerq.codec import decode_batch
from ledgerq.errors import InvalidBatchError, NodeBusyError, NodeError
from ledgerq.ledgers.base import (
    Accepted,
    Busy,
    CommitEvent,
    LedgerBatchStatus,
    Rejected,
    SubmitResult,
    Unreachable,
)
from ledgerq.ledgers.chain import SAWTOOTH_READS, ChainHandler
from ledgerq.ledgers.status import check_ids, sawtooth_status

if TYPE_CHECKING:
    from aiohttp import web

    from ledgerq.node import Node


class NodeClient:
    DESCRIPTION = "in-process node"

    def __init__(self, node: Node) -> None:
        self.node = node
        self.description = self.DESCRIPTION
        self._routes: dict[tuple[str, str], ChainHandler] | None = None

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        try:
            # Verified when the gateway accepted it; decoding only.
            batch = decode_batch(serialized_batch, verify=False)
            await self.node.submit([batch])
        except InvalidBatchError as exc:
            return Rejected(400, str(exc))
        except NodeBusyError as exc:
            return Busy(429, str(exc))
        except NodeError as exc:
            return Unreachable(str(exc))
        return Accepted(202)

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        infos = await self.node.batch_statuses(batch_ids, wait=wait_s or None)
        return check_ids([sawtooth_status(i.to_json()) for i in infos.values()], batch_ids)

    async def transaction_committed(self, transaction_id: str) -> bool:
        return self.node.committed.txn(transaction_id) is not None

    def events(self) -> AsyncIterator[CommitEvent] | None:
        return self._events()

    def triggers(self) -> AsyncIterator[None] | None:
        return None  # the events carry the statuses themselves

    async def _events(self) -> AsyncIterator[CommitEvent]:
        async for event in self.node.subscribe():
            status = sawtooth_status(event.info.to_json())
            yield CommitEvent(status.batch_id, status.status, str(event.seq))

    def chain_handler(self, method: str, route: str) -> ChainHandler | None:
        if (method, route) not in SAWTOOTH_READS:
            return None
        if self._routes is None:
            self._routes = _read_routes(self.node)
        return self._routes.get((method, route))

    async def close(self) -> None:
        pass


def _read_routes(node: Node) -> dict[tuple[str, str], ChainHandler]:
    """The node REST app's handlers of Sawtooth's read routes. The app is
    never served: its handlers answer the gateway's requests (no decoding
    processes: it takes no batches)."""
    from ledgerq.node.decoding import BatchDecoder
    from ledgerq.node.rest import make_app

    app: web.Application = make_app(node, decoder=BatchDecoder(workers=0))
    routes: dict[tuple[str, str], ChainHandler] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if isinstance(path, str) and (route.method, path) in SAWTOOTH_READS:
            routes[(route.method, path)] = route.handler
    return routes
