"""What a gateway needs, depending on its store, to share (or not share) work.

* PostgreSQL: a :class:`~ledgerq.claims.ClaimManager`. Its first claim cycle
  runs before the gateway serves, so the queue starts with this instance's
  share (if a step of it fails, e.g. on a claim row another instance holds
  locked, the gateway starts anyway and the next cycle retries; an
  unreachable database stops it); leaving the exit stack releases every claim, which the caller
  arranges to happen after the submitter drained.
* SQLite: the :class:`~ledgerq.claims.SingleInstanceLock` on the database
  file, held until the exit stack closes; a second gateway on the same file
  fails here with :class:`~ledgerq.claims.lock.InstanceLockedError`.
* ``memory://``: nothing (one process by construction).

:class:`ClaimBoundLedger` is the submitter's ledger under high availability:
a POST attempt lasts at most as long as the claim it was made under (as last
renewed when it started), not the whole HTTP submit timeout (``docs/ha.md``,
"Safety", rule 2).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack

from ledgerq.claims import ClaimManager, SingleInstanceLock
from ledgerq.config import Settings
from ledgerq.errors import StoreError, StoreUnavailableError
from ledgerq.ledgers.base import (
    Abandoned,
    CommitEvent,
    LedgerBatchStatus,
    LedgerClient,
    SubmitResult,
)
from ledgerq.store.sqlite import path_from_url

log = logging.getLogger(__name__)

#: ``(service_id, batch_id)`` → ms left on the claim the submission was taken under.
PostBudget = Callable[[str, str], int]


class ClaimBoundLedger:
    """A :class:`~ledgerq.ledgers.base.LedgerClient` whose POSTs end with their claim.

    Each ``submit`` is given the time left, as last renewed, on the claim its
    submission was taken under; a POST without an answer by then is
    abandoned (the connection is closed) and reported
    :class:`~ledgerq.ledgers.base.Abandoned` (ambiguous, but no ledger
    problem), so the batch stays ``submitted`` and whoever holds the service
    asks the ledger before anything is resent. Everything else is forwarded unchanged.
    """

    def __init__(self, inner: LedgerClient, budget_ms: PostBudget) -> None:
        self.inner = inner
        self._budget_ms = budget_ms
        self.description = inner.description
        #: POSTs abandoned because their claim was about to lapse.
        self.abandoned = 0

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        budget = self._budget_ms(service_id, batch_id)
        if budget <= 0:
            return Abandoned("this instance's claim on the service lapsed before the POST")
        try:
            async with asyncio.timeout(budget / 1000):
                return await self.inner.submit(service_id, batch_id, serialized_batch)
        except TimeoutError:
            self.abandoned += 1
            return Abandoned(
                f"no answer within the {budget} ms left on this instance's claim on the "
                "service; the POST was abandoned"
            )

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        return await self.inner.batch_statuses(service_id, batch_ids, wait_s=wait_s)

    def events(self) -> AsyncIterator[CommitEvent] | None:
        return self.inner.events()

    def triggers(self) -> AsyncIterator[None] | None:
        return self.inner.triggers()

    async def close(self) -> None:
        await self.inner.close()


#: Bind addresses that name no one address: every interface.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def advertised_address(host: str, port: int) -> str:
    """Where an instance's API is reached, as ``/instances`` shows it: the
    bound host, or this machine's name for a wildcard bind (``0.0.0.0:8080``
    on every machine tells an operator nothing)."""
    if host in WILDCARD_HOSTS:
        host = socket.gethostname() or host
    return f"{host}:{port}"


async def open_high_availability(
    settings: Settings,
    stack: AsyncExitStack,
    *,
    address: str | None = None,
    sqlite_lock_held: bool = False,
) -> ClaimManager | None:
    """Take the SQLite lock or start claiming on PostgreSQL; None without claims.

    ``sqlite_lock_held``: the supervisor of ``serve --workers`` holds the
    SQLite lock for this worker.
    """
    db = settings.db
    if db.startswith("sqlite:///") and sqlite_lock_held:
        return None
    if db.startswith("sqlite:///"):
        lock = SingleInstanceLock(path_from_url(db))
        lock.acquire()
        stack.callback(lock.release)
        return None
    if not db.startswith(("postgresql://", "postgres://")):
        return None
    if address is None:
        address = advertised_address(*settings.bind)
    claims = ClaimManager(db, settings.claims, address=address)
    stack.push_async_callback(claims.close)
    try:
        report = await claims.cycle()
    except StoreUnavailableError:
        raise  # no database at all: refuse to start
    except StoreError as exc:
        # Another instance may hold a claim row locked for a while (it froze
        # mid-write); the run loop tries again every renewal interval.
        log.warning("first claim cycle of %s failed, retrying: %s", claims.instance_id, exc)
        return claims
    log.info(
        "instance %s holds %d services after its first claim cycle",
        claims.instance_id,
        report.held,
    )
    return claims
