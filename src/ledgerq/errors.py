"""One error hierarchy for the whole package.

Driver and library errors are translated at the edge (``raise ... from exc``);
every message says what went wrong and, where it can, what to do.
"""

from __future__ import annotations

import functools
from typing import Any


class LedgerqError(Exception):
    """Root of every error ledgerq raises on purpose."""


class ConfigError(LedgerqError):
    """A configuration value is missing or invalid; the message names the key."""


class InvalidBatchError(LedgerqError):
    """A BatchList, batch or transaction broke a rule of the Sawtooth format.

    ``batch_id`` / ``transaction_id`` name the offender when known; ``rule``
    is a short machine-readable name of the broken rule.
    """

    def __init__(
        self,
        message: str,
        *,
        rule: str,
        batch_id: str | None = None,
        transaction_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rule = rule
        self.batch_id = batch_id
        self.transaction_id = transaction_id

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword arguments pickle too: a refusal crosses back from a worker
        # process (ledgerq.procpool) whole.
        return (
            functools.partial(
                InvalidBatchError,
                rule=self.rule,
                batch_id=self.batch_id,
                transaction_id=self.transaction_id,
            ),
            (str(self),),
        )


class StoreError(LedgerqError):
    """The batch tracking store failed."""


class StoreUnavailableError(StoreError):
    """The database cannot be reached; retry later or check the URL."""


class StoreOutageError(StoreUnavailableError):
    """Refused without trying: no PostgreSQL primary answers, as the store
    found and logged once (``ledgerq.store.outage``); retry later."""


class DuplicateBatchError(StoreError):
    """A batch id (per service) or data change id is already tracked."""

    def __init__(
        self,
        message: str,
        *,
        batch_id: str | None = None,
        data_change_id: str | None = None,
        service_id: str | None = None,
        transaction_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.batch_id = batch_id
        self.data_change_id = data_change_id
        self.service_id = service_id
        self.transaction_id = transaction_id


class StoreInputError(StoreError):
    """A value the store cannot hold (empty or over-long id, batch without
    transactions, ...); nothing was written. The message names the value."""


class StatusTransitionError(StoreError):
    """A change the batch lifecycle forbids, e.g. resubmitting a final batch or
    giving it a non-final status; nothing was written."""


class BatchNotFoundError(StoreError):
    """No tracked batch has that id (or data change id) in that service."""


class ServiceNotFoundError(StoreError):
    """No batch of that service id is tracked: there is nothing to control."""


class ControlRefusedError(StoreError):
    """An operator action the service's state does not allow (resume a
    service that is not halted, cancel a batch that may be on the ledger);
    nothing was changed. The message says why and what to do."""


class SchemaVersionError(StoreError):
    """The database schema is older, newer or unknown to this ledgerq."""


class FencedOffError(StoreError):
    """This instance no longer holds the claim it acted on; the write did not land."""


class LedgerError(LedgerqError):
    """A ledger (DLT) call failed: nothing it answered was used.

    ``cause`` is a short, stable name of what went wrong (``HTTP 404``,
    ``malformed status body``, ``connection failed``), so repeated failures
    can be told apart from a new one; the message has the details.
    """

    def __init__(self, message: str, *, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause or "ledger error"


class NodeError(LedgerqError):
    """The embedded ledger node failed."""


class NodeBusyError(NodeError):
    """The node's pending queue is full (HTTP 429); resubmit after a while."""


class NodeDataError(NodeError):
    """The node's data directory is unreadable or was written by something else."""


#: Errors a store reports per write of a group instead of failing the group.
WRITE_REFUSALS = (BatchNotFoundError, FencedOffError, StatusTransitionError, StoreInputError)
