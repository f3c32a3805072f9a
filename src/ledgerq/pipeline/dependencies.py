"""Declared dependencies: whether a batch may go to the ledger now.

A Sawtooth transaction names, in its header's ``dependencies``, transactions
that must be applied before it. A ledger that enforces them (a validator,
``ledgerq node``) holds a batch whose dependencies it has not committed —
and a validator drops it silently later — so a queuer that sends such a
batch ahead of its dependencies stalls its service. Before a batch is taken,
:meth:`DependencyCheck.resolve` decides (``docs/queuer.md``, "Declared
dependencies"):

* every dependency committed (a tracked batch ``Committed``, or a
  transaction the ledger says it committed) → :class:`Ready`;
* a dependency ledgerq tracks in a batch not sent yet (accepted later,
  queued behind, in this service or another) → :class:`TakeFirst`: that
  batch goes first (its own dependencies resolved the same way), then this
  one — if the producer can take it (it holds that service, and nothing of
  it is in flight); else the service waits for it;
* a tracked dependency in flight → :class:`Wait` for that batch (the
  waiting service is woken when it is final);
* a dependency the ledger judged ``Invalid``, or an operator cancelled →
  :class:`Fail`: the batch fails too, at once, without a POST;
* a dependency ledgerq does not track: the ledger is asked; committed →
  ready; not seen (or the ledger cannot say) → :class:`Wait`, asked again
  later. No timer ever makes such a batch ``Invalid``: that would be a guess.

Transactions of the batch itself are not dependencies to resolve: the
ledger applies a batch's transactions in order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledgerq.errors import LedgerError
from ledgerq.model import BatchStatusName, TrackingBatch

#: How deep a chain of batches of one service pulled forward is followed.
MAX_DEPTH = 32
#: Transactions the ledger said it committed, remembered at most.
MAX_KNOWN = 100_000


class DependencyState(Protocol):
    """The tracked batch of a transaction (``ledgerq.store.base.DependencyState``)."""

    @property
    def transaction_id(self) -> str: ...

    @property
    def service_id(self) -> str: ...

    @property
    def batch_id(self) -> str: ...

    @property
    def status(self) -> BatchStatusName | None: ...

    @property
    def submitted(self) -> bool: ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def committed(self) -> bool: ...

    @property
    def failed(self) -> bool: ...


class DependencyPath(Protocol):
    """What decides (``ledgerq.store.base.DependencyPath``)."""

    @property
    def steps(self) -> Sequence[DependencyState]: ...

    @property
    def untracked(self) -> Sequence[str]: ...


class DependencyStore(Protocol):
    """The store role of the check (and of the pipelined strategy's)."""

    async def dependency_states(
        self, transaction_ids: Collection[str]
    ) -> Mapping[str, DependencyState]: ...

    async def dependency_path(
        self, service_id: str, batch_id: str, max_steps: int
    ) -> DependencyPath | None: ...

    async def get_batches_by_id(self, batch_ids: Collection[str]) -> list[TrackingBatch]: ...


class TransactionLedger(Protocol):
    """The ledger role of the check (a :class:`~ledgerq.ledgers.LedgerClient`)."""

    async def transaction_committed(self, transaction_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Ready:
    """Every dependency is committed: the batch may go."""


@dataclass(frozen=True, slots=True)
class TakeFirst:
    """A batch this one depends on, not sent yet, goes first (of this service
    or another). ``reason``: what the service waits for if it cannot."""

    batch: TrackingBatch
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Not now: ``reason`` is what the service waits for (its lock reason)."""

    reason: str
    #: The tracked batch waited for (the service is woken once it is final).
    on: str | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """A dependency failed: the batch fails too, with ``reason``."""

    reason: str


Resolution = Ready | TakeFirst | Wait | Fail
READY = Ready()


def dependencies_of(batch: TrackingBatch) -> list[str]:
    """The transaction ids ``batch`` depends on, outside itself, in order."""
    own = {t.transaction_header for t in batch.transactions}
    seen: dict[str, None] = {}
    for t in batch.transactions:
        for d in t.dependencies:
            if d not in own:
                seen.setdefault(d)
    return list(seen)


class DependencyCheck:
    def __init__(self, store: DependencyStore, ledger: TransactionLedger) -> None:
        self._store = store
        self._ledger = ledger
        #: Untracked transactions the ledger said it committed (they stay so).
        self._known: OrderedDict[str, None] = OrderedDict()

    def known(self, transaction_id: str) -> bool:
        """Whether the ledger said it committed this untracked transaction."""
        return transaction_id in self._known

    async def resolve(self, batch: TrackingBatch) -> Resolution:
        if not dependencies_of(batch):
            return READY
        # One read gives the path the decision follows: from the batch, its
        # first dependency not committed, that one's, and so on while they
        # are not sent. Walked here as the rules read, batch by batch.
        path = await self._store.dependency_path(batch.service_id, batch.batch_id, MAX_DEPTH)
        if path is None:
            return Wait(f"waits: batch {batch.batch_id} is not tracked")
        chain = [batch.batch_id]
        service_id = batch.service_id
        verdict: Resolution | None = None
        for state in path.steps:
            d = state.transaction_id
            if state.failed:
                how = "was cancelled" if state.cancelled else "the ledger judged INVALID"
                verdict = Fail(
                    f"depends on transaction {d} of batch {state.batch_id} (service "
                    f"{state.service_id!r}), which {how}"
                )
                break
            where = _where(d, state, service_id)
            if state.submitted or state.status is BatchStatusName.PENDING:
                verdict = Wait(f"waits for {where}, in flight", state.batch_id)
            elif state.batch_id in chain:
                verdict = Fail(f"depends on {where}, which depends on it in turn: a cycle")
            elif len(chain) >= MAX_DEPTH:
                verdict = Wait(f"waits for {where}: too long a chain of batches to send first")
            if verdict is not None:
                break
            chain.append(state.batch_id)
            service_id = state.service_id
        if verdict is None:
            # The last batch of the path: every dependency it has tracked is
            # committed; those untracked the ledger answers for.
            verdict = await self._ask_ledger(path.untracked)
        level = len(chain) - 1
        if level == 0 or isinstance(verdict, Wait):
            return verdict
        # A batch on the path decided Ready or Fail: it goes first (a failed
        # one fails on its own, then the batch).
        state = path.steps[level - 1]
        where = _where(state.transaction_id, state, _service_before(path, batch, level - 1))
        found = await self._store.get_batches_by_id([state.batch_id])
        if not found:
            return Wait(f"waits for {where}", state.batch_id)
        return TakeFirst(found[0], f"waits for {where}, not committed yet")

    async def _ask_ledger(self, untracked: Sequence[str]) -> Ready | Wait:
        for d in untracked:
            if d in self._known:
                continue
            try:
                committed = await self._ledger.transaction_committed(d)
            except LedgerError as exc:
                return Wait(f"waits for transaction {d}: the ledger could not be asked ({exc})")
            if not committed:
                return Wait(f"waits for transaction {d}, not seen on the ledger")
            self._known[d] = None
            while len(self._known) > MAX_KNOWN:
                self._known.popitem(last=False)
        return READY


def _service_before(path: DependencyPath, batch: TrackingBatch, index: int) -> str:
    """The service of the batch before ``path.steps[index]``."""
    return batch.service_id if index == 0 else path.steps[index - 1].service_id


def _where(d: str, state: DependencyState, service_id: str) -> str:
    """Names dependency ``d`` of a batch of ``service_id``."""
    where = f"transaction {d} of batch {state.batch_id}"
    if state.service_id != service_id:
        where += f" of service {state.service_id!r}"
    return where
