"""Splinter scabbard shapes on the node: one separate ledger per ``circuit::service``.

``POST /scabbard/{circuit}/{service}/batches`` and
``GET /scabbard/{circuit}/{service}/batch_statuses?ids=a,b&wait=N`` behave as
the node's Sawtooth routes but on a node of their own (own state, own
journal under ``<data dir>/scabbard/<circuit>/<service>``: one directory per
service, whatever the names — neither part may hold a ``/``), opened on first
use with the same options as the main node. A directory left by an earlier
ledgerq under the old ``<circuit>--<service>`` name is moved to its place when
its name splits only one way; an ambiguous one (``a--b--c``) is refused with a
message saying where to move it. Statuses use scabbard's shape:
``[{"id", "status": {"statusType": "Committed"|"Invalid"|"Pending"|"Unknown",
"message": [...]}}]``, an invalid one listing ``{"transaction_id",
"error_message", "error_data"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerq.errors import NodeBusyError, NodeDataError
from ledgerq.node.commit import COMMITTED, INVALID, PENDING, BatchStatusInfo
from ledgerq.node.node import Node

log = logging.getLogger(__name__)

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
#: Longest circuit or service name (Splinter's circuit ids are 11 characters).
MAX_NAME = 64
_TYPES = {COMMITTED: "Committed", INVALID: "Invalid", PENDING: "Pending"}


#: Key filter blocks of a scabbard service's node (1 MiB; see ``ledgerq.node.idfilter``).
SCABBARD_FILTER_BLOCKS = 1 << 14


class ScabbardServices:
    """Nodes by service id, opened on demand, capped, closed when idle."""

    def __init__(
        self,
        data_dir: Path | None,
        *,
        max_services: int = 64,
        idle_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        **node_options: Any,
    ) -> None:
        self._data_dir = data_dir
        # Many of them may be open: a key filter of 1 MiB each, not the main node's 16.
        node_options.setdefault("filter_blocks", SCABBARD_FILTER_BLOCKS)
        self._options = node_options
        self._nodes: dict[str, Node] = {}
        self._used: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self.max_services = max_services
        self.idle_s = idle_s
        self._clock = clock
        self._reaper: asyncio.Task[None] | None = None

    @staticmethod
    def valid(circuit: str, service: str) -> bool:
        return all(len(p) <= MAX_NAME and _PART.fullmatch(p) for p in (circuit, service))

    @property
    def open_count(self) -> int:
        return len(self._nodes)

    async def get(self, circuit: str, service: str, *, create: bool = True) -> Node | None:
        """The service's node; ``None`` if it does not exist and ``create`` is false.

        Raises :class:`NodeBusyError` when ``max_services`` are open and busy.
        """
        key = f"{circuit}::{service}"
        node = self._nodes.get(key)
        if node is None:
            async with self._lock:
                node = self._nodes.get(key)
                if node is None:
                    node = await self._open(circuit, service, create=create)
                    if node is None:
                        return None
                    self._nodes[key] = node
        self._used[key] = self._clock()
        if self._reaper is None and self._data_dir is not None:
            self._reaper = asyncio.get_running_loop().create_task(
                self._reap(), name="scabbard-reaper"
            )
        return node

    async def _open(self, circuit: str, service: str, *, create: bool) -> Node | None:
        directory = None
        if self._data_dir is not None:
            directory = service_directory(self._data_dir, circuit, service)
            if not create and not directory.is_dir():
                return None
        elif not create:
            return None
        if len(self._nodes) >= self.max_services and not await self._close_one():
            raise NodeBusyError(
                f"{len(self._nodes)} scabbard services are open and busy (limit "
                f"{self.max_services}); try again once some are idle"
            )
        return await Node.open(directory, **self._options)

    async def _close_one(self) -> bool:
        """Close the least recently used idle service (only with a data directory)."""
        if self._data_dir is None:
            return False
        for key in sorted(self._nodes, key=lambda k: self._used.get(k, 0.0)):
            if self._nodes[key].idle:
                await self._close(key)
                return True
        return False

    async def _close(self, key: str) -> None:
        node = self._nodes.pop(key)
        self._used.pop(key, None)
        await node.close()

    async def close_idle(self) -> int:
        """Close the services idle for ``idle_s``; returns how many."""
        if self._data_dir is None:
            return 0
        deadline = self._clock() - self.idle_s
        closed = 0
        async with self._lock:
            for key in list(self._nodes):
                if self._used.get(key, 0.0) <= deadline and self._nodes[key].idle:
                    await self._close(key)
                    closed += 1
        if closed:
            log.info("closed %d idle scabbard service(s)", closed)
        return closed

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.idle_s / 4))
            await self.close_idle()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.close()


def service_directory(data_dir: Path, circuit: str, service: str) -> Path:
    """``<data dir>/scabbard/<circuit>/<service>``, moving an old-style directory there."""
    root = data_dir / "scabbard"
    directory = root / circuit / service
    old = root / f"{circuit}--{service}"
    if not directory.exists() and old.is_dir():
        if old.name.count("--") != 1:
            raise NodeDataError(
                f"{old} was written by an earlier ledgerq under a name that does not say "
                f"which circuit it belongs to; if it is {circuit}::{service}, move it to "
                f"{directory} and start the node again"
            )
        directory.parent.mkdir(parents=True, exist_ok=True)
        old.rename(directory)
        log.info("moved the scabbard service directory %s to %s", old, directory)
    return directory


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
