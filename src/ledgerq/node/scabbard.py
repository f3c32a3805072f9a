"""Splinter scabbard shapes on the node: one separate ledger per ``circuit::service``.

``POST /scabbard/{circuit}/{service}/batches`` and
``GET /scabbard/{circuit}/{service}/batch_statuses?ids=a,b&wait=N`` behave as
the node's Sawtooth routes but on a node of their own (own state, own
journal under ``<data dir>/scabbard/<circuit>--<service>``), opened on first
use with the same options as the main node. Statuses use scabbard's shape:
``[{"id", "status": {"statusType": "Committed"|"Invalid"|"Pending"|"Unknown",
"message": [...]}}]``, an invalid one listing ``{"transaction_id",
"error_message", "error_data"}``.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from ledgerq.node.ledger import COMMITTED, INVALID, PENDING, BatchStatusInfo
from ledgerq.node.runtime import Node

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_TYPES = {COMMITTED: "Committed", INVALID: "Invalid", PENDING: "Pending"}


class ScabbardServices:
    """Nodes by service id, opened lazily; ``close`` closes them all."""

    def __init__(self, data_dir: Path | None, **node_options: Any) -> None:
        self._data_dir = data_dir
        self._options = node_options
        self._nodes: dict[str, Node] = {}
        self._lock = asyncio.Lock()

    @staticmethod
    def valid(circuit: str, service: str) -> bool:
        return bool(_PART.fullmatch(circuit) and _PART.fullmatch(service))

    async def get(self, circuit: str, service: str) -> Node:
        key = f"{circuit}::{service}"
        node = self._nodes.get(key)
        if node is not None:
            return node
        async with self._lock:
            node = self._nodes.get(key)
            if node is None:
                directory = None
                if self._data_dir is not None:
                    directory = self._data_dir / "scabbard" / f"{circuit}--{service}"
                node = await Node.open(directory, **self._options)
                self._nodes[key] = node
        return node

    async def close(self) -> None:
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.close()


def scabbard_json(info: BatchStatusInfo) -> dict[str, Any]:
    message = [
        {
            "transaction_id": t.id,
            "error_message": t.message,
            "error_data": list(t.extended_data),
        }
        for t in info.invalid_transactions
    ]
    return {
        "id": info.id,
        "status": {"statusType": _TYPES.get(info.status, "Unknown"), "message": message},
    }
