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

"""

from __future__ import annotations

import logging
import socket
from contextlib import AsyncExitStack

from ledgerq.claims import ClaimManager, SingleInstanceLock
from ledgerq.config import Settings
from ledgerq.errors import StoreError, StoreUnavailableError
from ledgerq.store.sqlite import path_from_url

log = logging.getLogger(__name__)

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
    sqlite_locked_by_supervisor: bool = False,
) -> ClaimManager | None:
    """Take the SQLite lock or start claiming on PostgreSQL; None without claims.

    ``sqlite_locked_by_supervisor``: the supervisor of ``serve --workers`` holds the
    SQLite lock for this worker.
    """
    db = settings.db
    if db.startswith("sqlite:///") and sqlite_locked_by_supervisor:
        return None
    if db.startswith("sqlite:///"):
        lock = SingleInstanceLock(path_from_url(db))
        lock.acquire()
        stack.callback(lock.release)
        return None
    if not db.startswith(("postgresql://", "postgres://")):
        return None
    if address is None:
        address = advertised_address(*settings.bind_address)
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
        report.claim_count,
    )
    return claims
