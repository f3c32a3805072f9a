"""The claim manager's one PostgreSQL connection and its transactions.

:class:`ClaimSession` runs one transaction at a time on a dedicated
connection (READ COMMITTED), retrying what a retry can fix: a serialization
failure or a deadlock (neither should happen with the claim queries' lock
order, see ``claims.sql``; they are counted), a statement that got no answer
within ``db_timeout_ms``, a dropped connection (replaced). The session's
``idle_in_transaction_session_timeout`` is the claim TTL: a frozen instance
cannot keep claim rows locked past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.rows import dict_row

from ledgerq.claims.queries import claim_queries
from ledgerq.claims.settings import ClaimSettings
from ledgerq.errors import StoreError, StoreUnavailableError

#: The planner's cost of a random page read on the claims' connection.
RANDOM_PAGE_COST = 1.1

T = TypeVar("T")
Row = dict[str, Any]
Conn = psycopg.AsyncConnection[Row]

_RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)


class ClaimSession:
    """Named claim queries in retried transactions on one connection."""

    def __init__(self, url: str, settings: ClaimSettings) -> None:
        self.url = url
        self.settings = settings
        self._queries = claim_queries("postgresql")
        self._conn: Conn | None = None
        # One connection, used by one transaction (or read) at a time.
        self._lock = asyncio.Lock()
        #: Transactions retried after a serialization failure or deadlock.
        self.retries = 0
        #: Of those, deadlocks (the lock order rules them out; tests check).
        self.deadlocks = 0

    async def fetch(self, conn: Conn, name: str, **params: object) -> list[Row]:
        cur = await conn.execute(
            self._queries[name].encode(), {"me": self.settings.instance_id, **params}
        )
        return await cur.fetchall()

    async def execute(self, conn: Conn, name: str, **params: object) -> None:
        await conn.execute(
            self._queries[name].encode(), {"me": self.settings.instance_id, **params}
        )

    async def transact(self, name: str, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction, retrying what a retry can fix."""
        timeout = self.settings.db_timeout_ms / 1000
        last: Exception | None = None
        for attempt in range(self.settings.max_attempts):
            async with self._lock:
                try:
                    conn = await self._connection()
                    async with asyncio.timeout(timeout), conn.transaction():
                        return await fn(conn)
                except _RETRYABLE as exc:
                    last = exc
                    self.retries += 1
                    if isinstance(exc, psycopg.errors.DeadlockDetected):
                        self.deadlocks += 1
                except TimeoutError:
                    last = TimeoutError(
                        f"no answer within db_timeout_ms ({self.settings.db_timeout_ms} ms): "
                        "a slow or overloaded database"
                    )
                    await self.drop()
                    continue
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    last = exc
                    await self.drop()
                    continue
            # Jittered backoff so competing instances stop colliding.
            await asyncio.sleep(random.uniform(0, 0.005 * 2**attempt))
        raise StoreError(
            f"claim step {name!r} of instance {self.settings.instance_id} failed after "
            f"{self.settings.max_attempts} attempts: {last}; the next cycle retries, "
            "check the database if this repeats"
        ) from last

    async def _connection(self) -> Conn:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        timeout = self.settings.db_timeout_ms / 1000
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    row_factory=dict_row,
                    connect_timeout=max(1, int(timeout)),
                ),
                timeout=timeout,
            )
        except (psycopg.OperationalError, TimeoutError) as exc:
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL for claims: {exc}; check the database URL"
            ) from exc
        # A paused instance must not keep locks on claim rows past its TTL.
        await conn.execute(
            f"SET idle_in_transaction_session_timeout = {int(self.settings.ttl_ms)}".encode()
        )
        await conn.execute(f"SET statement_timeout = {int(self.settings.db_timeout_ms)}".encode())
        # Index probes priced as in memory, as the store's sessions
        # (ledgerq.store.postgres.RANDOM_PAGE_COST): a table of one row per
        # service is otherwise read whole to find a few.
        await conn.execute(f"SET random_page_cost = {RANDOM_PAGE_COST}".encode())
        self._conn = conn
        return conn

    async def connection(self) -> Conn:
        """The live connection (opened if needed); for tests and diagnostics."""
        return await self._connection()

    async def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error, TimeoutError):
                await asyncio.wait_for(conn.close(), timeout=self.settings.db_timeout_ms / 1000)
