"""Execution supervisor: hands out executors, never waiting for running ones.

``SpawnExecutor`` always yields a fresh :class:`Executor` at once and answers
``ExecutorPIDAssigned`` to the curator. It never waits for an executor to
finish: an executor may be waiting for a candidate with an earlier
fingerprint that has no executor yet, so waiting could deadlock (see the
spec's life cycle). Finished executors are forgotten by the router.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ledgerq.node.ordering.executor import Executor, ShardOf
from ledgerq.node.ordering.messages import (
    Address,
    ExecutorPIDAssigned,
    SpawnExecutor,
    UnknownMessageError,
)

Send = Callable[[Address, Any], None]
Register = Callable[[int, Executor], None]


class ExecutionSupervisor:
    def __init__(
        self, send: Send, register: Register, shard_of: ShardOf, shards: Sequence[Address]
    ) -> None:
        self._send = send
        self._register = register
        self._shard_of = shard_of
        self._shards = tuple(shards)
        self._next_epid = 1

    def handle(self, msg: object) -> None:
        if type(msg) is not SpawnExecutor:
            raise UnknownMessageError(self, msg)
        epid = self._next_epid
        self._next_epid += 1
        self._register(epid, Executor(epid, self._send, self._shard_of, self._shards))
        self._send(msg.curator, ExecutorPIDAssigned(epid))
