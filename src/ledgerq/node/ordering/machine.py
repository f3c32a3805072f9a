"""The ordering machine: the engines wired together and a router between them.

Engines are synchronous state machines (``handle(msg)``, sending through a
``send(address, msg)`` callback); the router decides the delivery order.

* :class:`OrderingMachine` delivers FIFO in a tight loop
  (:meth:`~OrderingMachine.run`) and calls the worker's ``tick`` whenever the
  queue runs dry, until nothing moves. When :meth:`run` returns, every
  candidate submitted so far has finished executing.
* ``base`` reads committed values the shards do not hold (see
  :meth:`~ledgerq.node.ordering.shard.Shard.forget_through`).
* Tests subclass the delivery policy (see ``tests/unit/node``) to deliver the
  pending messages in any order Hypothesis picks: correctness must not
  depend on delivery order.

Messages to the issuer (``TransactionAck``, ``ExecutionSummary``,
``SendLog``) go to the ``issuer`` engine given by the owner.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ledgerq.clock import Clock, now_ms
from ledgerq.node.ordering.executor import Executor
from ledgerq.node.ordering.messages import (
    ISSUER,
    SUPERVISOR,
    WORKER,
    Address,
    KVSDatum,
    KVSKey,
    TransactionCandidate,
    TransactionRequest,
    TxFingerprint,
)
from ledgerq.node.ordering.shard import Shard, StateReader
from ledgerq.node.ordering.supervisor import ExecutionSupervisor
from ledgerq.node.ordering.worker import Worker


class Engine(Protocol):
    def handle(self, msg: Any) -> None: ...


def shard_index_for(shards: int) -> Callable[[KVSKey], int]:
    """Keys are spread by a hash of the key (stable across restarts)."""
    if shards == 1:
        return lambda key: 0

    def index(key: KVSKey) -> int:
        # Sawtooth addresses are already hashes: their tail spreads evenly.
        try:
            return int(key[-8:], 16) % shards
        except ValueError:
            return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % shards

    return index


class OrderingMachine:
    """Worker, supervisor, shards and executors, with a FIFO router."""

    def __init__(
        self,
        issuer: Engine,
        *,
        shards: int = 4,
        state: Mapping[KVSKey, KVSDatum] | None = None,
        batch_size: int = 1024,
        clock: Clock = now_ms,
        first_batch: int = 0,
        history: Mapping[str, tuple[int, int]] | None = None,
        base: StateReader | None = None,
        dedupe_window: int | None = None,
        keep_logs: int = 100_000,
    ) -> None:
        if shards < 1:
            raise ValueError("a node needs at least one shard")
        self._queue: deque[tuple[Address, Any]] = deque()
        self.shard_index = shard_index_for(shards)
        index = self.shard_index
        self.shards = [Shard(i, self.send, base=base) for i in range(shards)]
        for key, value in (state or {}).items():
            self.shards[index(key)].state[key] = value
        self.worker = Worker(
            self.send,
            shards,
            index,
            batch_size=batch_size,
            clock=clock,
            first_batch=first_batch,
            history=history,
            dedupe_window=dedupe_window,
            # A summary holds every value its batch touched: four per summary on average.
            keep_logs=keep_logs,
            keep_log_entries=4 * keep_logs,
        )
        self.supervisor = ExecutionSupervisor(
            self.send,
            self._register,
            self.shard_address,
            [("shard", shard.index) for shard in self.shards],
        )
        self._engines: dict[Address, Engine] = {
            WORKER: self.worker,
            SUPERVISOR: self.supervisor,
            ISSUER: issuer,
        }
        for shard in self.shards:
            self._engines[("shard", shard.index)] = shard
        self.delivered = 0

    def shard_address(self, key: KVSKey) -> Address:
        return ("shard", self.shard_index(key))

    def _register(self, epid: int, executor: Executor) -> None:
        self._engines[epid] = executor

    def send(self, address: Address, msg: Any) -> None:
        self._queue.append((address, msg))

    def submit(
        self, candidate: TransactionCandidate, resubmission: TxFingerprint | None = None
    ) -> None:
        """Queue a ``TransactionRequest``; :meth:`run` processes it."""
        self._queue.append((WORKER, TransactionRequest(candidate, resubmission)))

    def deliver(self, address: Address, msg: Any) -> None:
        engine = self._engines[address]
        engine.handle(msg)
        if type(engine) is Executor and engine.done:
            # Late eager reads for a finished executor are dropped here.
            self._engines[address] = _Retired()

    def run(self, budget: int | None = None) -> bool:
        """Deliver FIFO until idle (or ``budget`` messages); True when idle."""
        queue, engines, worker = self._queue, self._engines, self.worker
        count = 0
        while True:
            while queue:
                address, msg = queue.popleft()
                engine = engines[address]
                engine.handle(msg)
                if type(engine) is Executor and engine.done:
                    engines[address] = _Retired()
                count += 1
                if budget is not None and count >= budget:
                    self.delivered += count
                    return False
            if not worker.tick():
                self.delivered += count
                self._forget_retired()
                return True

    @property
    def pending(self) -> deque[tuple[Address, Any]]:
        return self._queue

    def _forget_retired(self) -> None:
        engines = self._engines
        for address in [a for a, e in engines.items() if type(e) is _Retired]:
            del engines[address]

    def forget_through(self, fingerprint: TxFingerprint) -> None:
        """The owner's ``base`` now holds every write up to ``fingerprint``."""
        for shard in self.shards:
            shard.forget_through(fingerprint)

    def state(self) -> dict[KVSKey, KVSDatum]:
        """The folded state of every shard (complete when :meth:`run` is idle)."""
        merged: dict[KVSKey, KVSDatum] = {}
        for shard in self.shards:
            merged.update(shard.state)
        return merged


class _Retired:
    """Stands in for a finished executor: eager reads it did not need land here."""

    __slots__ = ()

    def handle(self, msg: Any) -> None:
        return None
