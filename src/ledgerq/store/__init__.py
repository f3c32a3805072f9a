"""The batch tracking store: where every accepted batch and its fate is recorded.

``open_store(url)`` picks the backend from the URL:

* ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` — embedded,
  one instance (:mod:`ledgerq.store.sqlite`); ``?busy_timeout_ms=N`` sets how
  long a write waits for another writer (default 10 s), by default a
  commit waits for the disk (survives power loss); ``?synchronous=normal``
  trades that for speed (survives a process crash only);
* ``postgresql://user@host:port/db`` — shared by several instances
  (:mod:`ledgerq.store.postgres`);
* ``memory://`` — in-process, for tests (:mod:`ledgerq.store.memory`).

With ``migrate=True`` (the default) the schema is brought up to date first;
with ``migrate=False`` an outdated schema is refused. A schema newer than, or
unknown to, this ledgerq is always refused (``SchemaVersionError``). The
store's semantics are documented in :mod:`ledgerq.store.base` and
``docs/store.md``.

May import: the foundation and :mod:`ledgerq.queue.serial` (the round
rules the memory store applies). Never the pipeline stages, the gateway or
the ledgers.
"""

from __future__ import annotations

from ledgerq.clock import Clock, now_ms
from ledgerq.errors import StoreError
from ledgerq.model import BatchWrite
from ledgerq.store.base import (
    DATA_CHANGE_PREFIX,
    NO_STATUS,
    BatchAcceptor,
    BatchReader,
    BatchTrackingStore,
    GroupWriter,
    SeedWriter,
    ServiceSummary,
)
from ledgerq.store.memory import MemoryStore
from ledgerq.store.migrate import MigrationResult
from ledgerq.store.sqlstore import Backend, SqlStore

__all__ = [
    "DATA_CHANGE_PREFIX",
    "NO_STATUS",
    "BatchAcceptor",
    "BatchReader",
    "BatchTrackingStore",
    "BatchWrite",
    "GroupWriter",
    "MemoryStore",
    "MigrationResult",
    "SeedWriter",
    "ServiceSummary",
    "SqlStore",
    "migrate_database",
    "open_store",
]


def _dialect(url: str) -> str:
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    if scheme == "memory":
        return "memory"
    raise StoreError(
        f"unsupported store URL {url!r}: use sqlite:///path/to/file, "
        "postgresql://user@host:port/dbname or memory://"
    )


async def _open_sql(
    url: str,
    *,
    migrate: bool,
    clock: Clock,
    pg_pool_max_size: int = 8,
    pg_idle_in_transaction_ms: int | None = None,
    pg_outage_timeout_s: float | None = None,
    pg_wait_s: float = 0.0,
) -> tuple[SqlStore, MigrationResult]:
    backend: Backend
    if _dialect(url) == "sqlite":
        from ledgerq.store.sqlite import SqliteBackend, options_from_url, path_from_url

        sqlite = SqliteBackend(path_from_url(url), options_from_url(url))
        await sqlite.connect()
        backend = sqlite
    else:
        from ledgerq.store.postgres import (
            DEFAULT_IDLE_IN_TRANSACTION_MS,
            DEFAULT_OUTAGE_TIMEOUT_S,
            PostgresBackend,
        )

        pg = PostgresBackend(
            url,
            pool_max_size=pg_pool_max_size,
            idle_in_transaction_ms=(
                DEFAULT_IDLE_IN_TRANSACTION_MS
                if pg_idle_in_transaction_ms is None
                else pg_idle_in_transaction_ms
            ),
            outage_timeout_s=(
                DEFAULT_OUTAGE_TIMEOUT_S if pg_outage_timeout_s is None else pg_outage_timeout_s
            ),
        )
        await pg.connect(wait_s=pg_wait_s)
        backend = pg
    store = SqlStore(backend, clock=clock)
    try:
        result = await backend.migrate(apply=migrate, url=url)
    except BaseException:
        await store.close()
        raise
    return store, result


async def open_store(
    url: str,
    *,
    migrate: bool = True,
    clock: Clock = now_ms,
    pg_pool_max_size: int = 8,
    pg_idle_in_transaction_ms: int | None = None,
    pg_outage_timeout_s: float | None = None,
    pg_wait_s: float = 0.0,
    lock_entries: bool = False,
    warm: bool = False,
) -> BatchTrackingStore:
    """Open the store at ``url``; close it with ``await store.close()`` or ``async with``.

    ``pg_idle_in_transaction_ms``: PostgreSQL ends a session of this store
    that leaves a transaction open without a statement for this long (its
    process frozen, say), so its row locks never hold other instances up
    (default ``ledgerq.store.postgres.DEFAULT_IDLE_IN_TRANSACTION_MS``).

    ``pg_outage_timeout_s``: once no PostgreSQL primary answers, a request
    waits at most this long for the store (``store.outage_timeout_s``;
    default ``ledgerq.store.postgres.DEFAULT_OUTAGE_TIMEOUT_S``).

    ``pg_wait_s``: when no PostgreSQL session can be had (no primary yet),
    try again for up to this long before failing (``store.wait_s``).

    ``lock_entries``: PostgreSQL keeps the parallel queuer's lock entries and
    blockers only once a store asked for them; ``True`` asks (for good, for
    the database: a gateway with parallel services), ``False`` (the default)
    leaves the database as it is, so that opening a store to read, migrate or
    answer a take-over never turns them on for a gateway whose services are
    all serial (docs/store.md). A parallel round asks anyway.

    ``warm``: PostgreSQL opens a few pooled connections and prepares the
    statements a gateway sends most on each (``PostgresBackend.warm``), so
    that its first requests do not pay for it.
    """
    if _dialect(url) == "memory":
        return MemoryStore(clock=clock)
    store, _ = await _open_sql(
        url,
        migrate=migrate,
        clock=clock,
        pg_pool_max_size=pg_pool_max_size,
        pg_idle_in_transaction_ms=pg_idle_in_transaction_ms,
        pg_outage_timeout_s=pg_outage_timeout_s,
        pg_wait_s=pg_wait_s,
    )
    try:
        if lock_entries:
            await store.keep_lock_entries()
        if warm:
            await store.warm()
    except BaseException:
        await store.close()
        raise
    return store


async def migrate_database(url: str) -> MigrationResult:
    """Bring the schema at ``url`` up to date; return the versions before and after."""
    if _dialect(url) == "memory":
        return MigrationResult(0, 0)
    store, result = await _open_sql(url, migrate=True, clock=now_ms)
    await store.close()
    return result
