"""What the fault ledger knows of transactions, to treat ``dependencies`` as Sawtooth does.

Sawtooth asks two questions of a batch's dependencies, at two moments:

* on arrival (its completer): is every transaction depended on *seen* — in a
  batch that passed this check before (pending, committed or judged since) —
  or committed? If not, the batch waits, registered under each missing
  transaction, until a batch holding it arrives;
* when a block is built (its block publisher and scheduler): is every
  transaction depended on committed, or ahead in the same block? A
  dependency whose batch was judged invalid can never be: the dependent is
  left out of every block.

:class:`DependencyBook` answers both from the states of the batches the
ledger has (:mod:`ledgerq.testing.fault_ledger` keeps those) and keeps the
two waiting lists: batches *held* on arrival, and accepted batches *parked*
until a dependency commits. It decides nothing on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

#: A batch state in which its transactions count as seen.
SEEN_STATES = frozenset({"PENDING", "STUCK", "COMMITTED", "INVALID"})


class DependencyBook:
    def __init__(self, state_of: Callable[[str], str]) -> None:
        #: Batch id -> the ledger's state for it (``UNKNOWN`` if it has none).
        self._state_of = state_of
        #: Transaction id -> the batches that carry it (normally one).
        self._carriers: dict[str, list[str]] = {}
        self._committed: set[str] = set()
        # Transaction id -> batch ids waiting on it, in the order they began
        # to (dicts as ordered sets).
        self._held_on: dict[str, dict[str, None]] = {}
        self._parked_on: dict[str, dict[str, None]] = {}

    def carried(self, batch_id: str, transaction_ids: Iterable[str]) -> None:
        """Record that ``batch_id`` carries these transactions (at its first POST)."""
        for txn in transaction_ids:
            carriers = self._carriers.setdefault(txn, [])
            if batch_id not in carriers:
                carriers.append(batch_id)

    def committed(self, transaction_ids: Iterable[str]) -> None:
        self._committed.update(transaction_ids)

    def carriers(self, txn: str) -> list[str]:
        return list(self._carriers.get(txn, ()))

    def is_committed(self, txn: str) -> bool:
        return txn in self._committed

    def seen(self, txn: str) -> bool:
        return any(self._state_of(b) in SEEN_STATES for b in self._carriers.get(txn, ()))

    def missing(self, dependencies: Sequence[str]) -> tuple[str, ...]:
        """The dependencies neither seen nor committed: the arrival check."""
        return tuple(d for d in dependencies if d not in self._committed and not self.seen(d))

    def blocker(self, dependencies: Sequence[str]) -> tuple[str, str] | None:
        """The commit check: ``("invalid", txn)`` for a dependency that can never
        commit (a batch carrying it was judged INVALID), else ``("wait", txn)``
        for the first one not committed yet, else ``None``."""
        waiting = None
        for dep in dependencies:
            if dep in self._committed:
                continue
            if any(self._state_of(b) == "INVALID" for b in self._carriers.get(dep, ())):
                return ("invalid", dep)
            waiting = waiting or dep
        return None if waiting is None else ("wait", waiting)

    # -- waiting lists ----------------------------------------------------------

    def hold(self, batch_id: str, missing: Iterable[str]) -> None:
        for txn in missing:
            self._held_on.setdefault(txn, {})[batch_id] = None

    def unhold(self, batch_id: str, missing: Iterable[str]) -> None:
        for txn in missing:
            waiting = self._held_on.get(txn)
            if waiting is not None:
                waiting.pop(batch_id, None)
                if not waiting:
                    del self._held_on[txn]

    def held_on(self, transaction_ids: Iterable[str]) -> list[str]:
        """The batches held on any of these transactions (now seen), each once,
        in the order they were held; they are no longer registered under them."""
        out: dict[str, None] = {}
        for txn in transaction_ids:
            out.update(self._held_on.pop(txn, {}))
        return list(out)

    def park(self, batch_id: str, txn: str) -> None:
        self._parked_on.setdefault(txn, {})[batch_id] = None

    def parked_on(self, transaction_ids: Iterable[str]) -> list[str]:
        """The batches parked on any of these transactions (now settled), each once."""
        out: dict[str, None] = {}
        for txn in transaction_ids:
            out.update(self._parked_on.pop(txn, {}))
        return list(out)
