"""SQLite backend: one file database, WAL mode, two connections per store.

Each connection has a dedicated single-thread executor, and an
``asyncio.Lock`` gives each transaction its connection to itself. Write
transactions use the writing connection (so a store's writes are
serialized), read transactions the reading one: under WAL a read sees the
last committed state and never waits for a write in progress.

A transaction runs whole in one go (:meth:`SqliteBackend.run`): writes and
short indexed reads on the event loop's own thread, long reads (rounds over
every service, listings) on the connection's thread. Writes are short
(group-committed pipeline writes, one insert per request), and running them
on a second thread costs more than it saves: each statement releases the
GIL and must win it back from a busy event loop, which on a loaded gateway
stretches a short transaction many times over. (``inline=False``
sends everything to the threads.) The price: while another process holds
the database's write lock (a maintenance command), an inline write waits for
it, up to ``busy_timeout_ms``, with the event loop. Several stores (processes or connections) on
one file coordinate through SQLite's own write lock (``BEGIN IMMEDIATE``,
``busy_timeout``).

Durability: WAL with ``synchronous=FULL`` by default — a commit returns
(and the gateway answers ``202``) only once the write-ahead log is flushed
to disk, so an acknowledged batch survives an operating-system crash or
power loss. Group commit (one transaction for many accepted lists and
outcomes) keeps the flushes few. ``?synchronous=normal`` trades that away
for speed: a commit then survives a crash of the process and the database is
never corrupted, but power loss may undo the last commits — batches already
answered ``202``. Every connection (writer, reader, checkpointer) uses the
same setting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from ledgerq.clock import now_ms
from ledgerq.errors import StoreError, StoreUnavailableError
from ledgerq.model import TrackingBatch
from ledgerq.store import common
from ledgerq.store.migrate import (
    MigrationPlan,
    MigrationResult,
    plan_migration,
    refuse_outdated,
)
from ledgerq.store.sqlfiles import canonical_schema, load_queries
from ledgerq.store.sqlite_gate import WriteGate
from ledgerq.store.sqlstore import ConflictError, Params, Row

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_MS = 10_000
#: Write transactions between two background WAL checkpoints.
CHECKPOINT_EVERY = 256
#: WAL pages at which a commit checkpoints by itself (safety net; SQLite's default is 1000).
WAL_AUTOCHECKPOINT = 20_000

log = logging.getLogger(__name__)


def path_from_url(url: str) -> str:
    """``sqlite:///rel/path`` → ``rel/path``; ``sqlite:////abs/path`` → ``/abs/path``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise StoreError(
            f"not a SQLite URL: {url!r}; write sqlite:///relative/path or sqlite:////absolute/path"
        )
    return url[len(prefix) :].split("?", 1)[0]


@dataclass(frozen=True, slots=True)
class SqliteOptions:
    """Options from the URL's query: ``?busy_timeout_ms=N&synchronous=normal``."""

    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    synchronous: str = "FULL"
    #: Run writes and short reads on the event loop's thread (module notes).
    inline: bool = True


def options_from_url(url: str) -> SqliteOptions:
    query = {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}
    unknown = sorted(set(query) - {"busy_timeout_ms", "synchronous"})
    if unknown:
        raise StoreError(
            f"unknown SQLite URL option(s) {unknown}; known: busy_timeout_ms, synchronous"
        )
    options = SqliteOptions()
    if "busy_timeout_ms" in query:
        try:
            busy = int(query["busy_timeout_ms"])
        except ValueError as exc:
            raise StoreError(
                f"busy_timeout_ms must be an integer of ms; got {query['busy_timeout_ms']!r}"
            ) from exc
        if busy < 0:
            raise StoreError(f"busy_timeout_ms must be >= 0; got {busy}")
        options = replace(options, busy_timeout_ms=busy)
    if "synchronous" in query:
        mode = query["synchronous"].upper()
        if mode not in ("NORMAL", "FULL"):
            raise StoreError(f"synchronous must be normal or full; got {query['synchronous']!r}")
        options = replace(options, synchronous=mode)
    return options


def _translate(exc: sqlite3.Error) -> StoreError:
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return StoreUnavailableError(
            f"the SQLite database stayed locked by another writer past busy_timeout: {exc}; retry"
        )
    return StoreError(f"SQLite failed: {exc}")


def split_script(script: str) -> list[str]:
    """Split a SQL script into complete statements (triggers included)."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in buffer.splitlines()
    ):
        raise StoreError(f"incomplete SQL statement at the end of a script: {buffer[:80]!r}")
    return statements


def _translated(fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
    try:
        return fn(conn)
    except sqlite3.IntegrityError as exc:
        if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
            raise ConflictError(str(exc)) from exc
        raise StoreError(f"SQLite refused the write: {exc}") from exc
    except sqlite3.Error as exc:
        raise _translate(exc) from exc


class _Connection:
    """One sqlite3 connection, owned by its own single-thread executor."""

    def __init__(self, path: str, options: SqliteOptions, name: str) -> None:
        self.path = path
        self.options = options
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ledgerq-{name}")
        self.conn: sqlite3.Connection | None = None
        # One transaction at a time on this connection.
        self.lock = asyncio.Lock()

    def _connection(self) -> sqlite3.Connection:
        conn = self.conn
        if conn is None:
            raise StoreError("the store is closed; open it again with open_store")
        return conn

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the connection's thread."""
        conn = self._connection()
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, _translated, fn, conn
        )

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Start ``fn(connection)`` on the connection's thread at once."""
        conn = self._connection()
        return asyncio.get_running_loop().run_in_executor(self.executor, _translated, fn, conn)

    def call_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the calling thread (the caller holds ``lock``)."""
        return _translated(fn, self._connection())

    async def open(self) -> None:
        busy_ms = self.options.busy_timeout_ms

        def open_conn() -> sqlite3.Connection:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                timeout=busy_ms / 1000,
                # Used from its own thread or, under ``lock``, from the event
                # loop's (SqliteBackend.run's inline writes).
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self.options.synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            return conn

        try:
            self.conn = await asyncio.get_running_loop().run_in_executor(self.executor, open_conn)
        except (sqlite3.Error, OSError) as exc:
            self.executor.shutdown(wait=False)
            raise StoreUnavailableError(
                f"cannot open the SQLite database {self.path!r}: {exc}; check the path "
                "and its permissions"
            ) from exc

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self.executor, conn.close)
        self.executor.shutdown(wait=True)


def _drive(body: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (its session is synchronous) to its end."""
    try:
        body.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    body.close()
    raise RuntimeError("a SQLite transaction body awaited something other than its session")


async def _until_done(work: concurrent.futures.Future[Any]) -> bool:
    """Wait until ``work`` (on a connection's thread) has ended, even through
    cancellations; returns whether the caller was cancelled meanwhile.

    One wake-up of the waiting task when it ends (``run_in_executor`` under
    ``asyncio.shield`` took three loop steps), and the work itself is never
    cancelled: a ``COMMIT`` that has not started yet must still run.
    """
    if work.done():
        return False
    loop = asyncio.get_running_loop()
    waiter: list[asyncio.Future[None]] = [loop.create_future()]

    def wake() -> None:
        if not waiter[0].done():
            waiter[0].set_result(None)

    def done(_work: object) -> None:
        if not loop.is_closed():  # a process shutting down: nobody waits any more
            loop.call_soon_threadsafe(wake)

    work.add_done_callback(done)
    cancelled = False
    while not work.done():
        try:
            await waiter[0]
        except asyncio.CancelledError:
            cancelled = True
            waiter[0] = loop.create_future()
    return cancelled


class _SyncSession:
    """The session of :meth:`SqliteBackend.run`: runs on the connection's thread.

    Its coroutines never suspend, so a whole transaction body runs in one
    trip to the connection's thread.
    """

    def __init__(self, backend: SqliteBackend, conn: sqlite3.Connection) -> None:
        self._b = backend
        self._conn = conn
        self._q = backend.queries

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self._conn)

    async def execute(self, name: str, params: Params) -> int:
        count = 0
        for sql in self._b.statements(name):
            count = self._conn.execute(sql, params).rowcount
        return count

    async def executemany(self, name: str, rows: Sequence[Params]) -> None:
        # Statement by statement, each over every row.
        for sql in self._b.statements(name):
            self._conn.executemany(sql, rows)

    async def fetchall(self, name: str, params: Params) -> list[Row]:
        return self._conn.execute(self._q[name], params).fetchall()

    async def fetchone(self, name: str, params: Params) -> Row | None:
        row: Row | None = self._conn.execute(self._q[name], params).fetchone()
        return row

    async def fetchall_many(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        return [self._conn.execute(self._q[name], params).fetchall() for name, params in calls]

    # The transaction commits when its body returns.
    fetchall_committing = fetchall


class _Session:
    def __init__(self, backend: SqliteBackend, connection: _Connection) -> None:
        self._b = backend
        self._c = connection
        self._q = backend.queries

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._c.call(fn)

    async def execute(self, name: str, params: Params) -> int:
        """Run a named query, all its statements in one trip; the last one's row count."""
        statements = self._b.statements(name)

        def run(conn: sqlite3.Connection) -> int:
            count = 0
            for sql in statements:
                count = conn.execute(sql, params).rowcount
            return count

        return await self._c.call(run)

    async def executemany(self, name: str, rows: Sequence[Params]) -> None:
        statements = self._b.statements(name)

        def run(conn: sqlite3.Connection) -> None:
            for sql in statements:
                conn.executemany(sql, rows)

        await self._c.call(run)

    async def fetchall(self, name: str, params: Params) -> list[Row]:
        sql = self._q[name]
        return await self._c.call(lambda c: c.execute(sql, params).fetchall())

    async def fetchone(self, name: str, params: Params) -> Row | None:
        sql = self._q[name]
        row: Row | None = await self._c.call(lambda c: c.execute(sql, params).fetchone())
        return row

    async def fetchall_many(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        sqls = [(self._q[name], params) for name, params in calls]
        return await self._c.call(lambda c: [c.execute(q, p).fetchall() for q, p in sqls])

    # The transaction commits when its body returns.
    fetchall_committing = fetchall


@dataclass(frozen=True, slots=True)
class _Insert:
    """An ``add_batches`` call's rows, worked out before its transaction holds
    the file's writer (their seqs are known only in it)."""

    count: int
    batches: list[dict[str, Any]]
    transactions: list[dict[str, Any]]
    #: Lock entries by the index of their batch in the call; ``None``: not
    #: worked out (the store was not known to keep them), done in the
    #: transaction if it does.
    locks: list[tuple[int, dict[str, Any]]] | None
    rows: Sequence[TrackingBatch]


def _lock_rows(batches: Sequence[TrackingBatch]) -> list[tuple[int, dict[str, Any]]]:
    """The lock entries of an ``add_batches`` call's batches, by their index in it."""
    return [
        (n, {"service_id": b.service_id, "mode": mode, "entry": entry})
        for n, b in enumerate(batches)
        for mode, entry in common.lock_rows(b)
    ]


class SqliteBackend:
    dialect = "sqlite"

    def __init__(self, path: str, options: SqliteOptions | None = None) -> None:
        self.path = path
        self.options = options or SqliteOptions()
        self.queries = load_queries(self.dialect)
        self._statements: dict[str, list[str]] = {}
        # Writes go through one connection; read transactions through another,
        # so under WAL they never queue behind a write. A private in-memory
        # database exists in one connection only, so it uses one for both.
        self._writer = _Connection(path, self.options, "sqlite-write")
        self._reader = (
            self._writer if path == ":memory:" else _Connection(path, self.options, "sqlite-read")
        )
        # WAL checkpoints (they flush to disk) run on their own connection and
        # thread, every CHECKPOINT_EVERY write transactions, not inside a
        # commit on the event loop; the writer's automatic checkpoint is only
        # a safety net at a larger WAL.
        self._checkpointer = (
            None if path == ":memory:" else _Connection(path, self.options, "sqlite-checkpoint")
        )
        #: The database is known to keep lock entries (``lock_entries_kept``).
        self._lock_entries_kept = False
        self._commits = 0
        self._checkpoint_task: asyncio.Task[None] | None = None
        # Processes writing to one file queue for it in the kernel, not in
        # SQLite's sleeping busy handler (ledgerq.store.sqlite_gate).
        self._gate = None if path == ":memory:" else WriteGate(path)

    def statements(self, name: str) -> list[str]:
        """The statements of a named query (most have one)."""
        found = self._statements.get(name)
        if found is None:
            found = self._statements[name] = split_script(self.queries[name] + ";")
        return found

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the writing connection's thread."""
        return await self._writer.call(fn)

    async def connect(self) -> None:
        await self._writer.open()
        if self._gate is not None:
            self._gate.open()
        if self._reader is not self._writer:
            try:
                await self._reader.open()
                if self._checkpointer is not None:
                    await self._checkpointer.open()
                    await self._writer.call(
                        lambda c: c.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT}")
                    )
            except BaseException:
                await self._reader.close()
                await self._writer.close()
                raise

    async def pragma(self, name: str) -> dict[str, Any]:
        """The effective value of ``PRAGMA name`` on each of the store's
        connections, by role (``write``, ``read``, ``checkpoint``)."""
        if not name.isidentifier():
            raise StoreError(f"not a pragma name: {name!r}")
        roles = {"write": self._writer, "read": self._reader, "checkpoint": self._checkpointer}
        found: dict[str, Any] = {}
        for role, connection in roles.items():
            if connection is not None:
                found[role] = await connection.call(
                    lambda c: c.execute(f"PRAGMA {name}").fetchone()[0]
                )
        return found

    def _committed(self) -> None:
        self._commits += 1
        if (
            self._checkpointer is not None
            and self._commits >= CHECKPOINT_EVERY
            and self._checkpoint_task is None
        ):
            self._commits = 0
            self._checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoint())

    async def _checkpoint(self) -> None:
        assert self._checkpointer is not None
        try:
            # PASSIVE: copies what no reader still needs, never blocks a writer.
            await self._checkpointer.call(
                lambda c: c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            )
        except StoreError as exc:
            log.warning("WAL checkpoint failed: %s; retried after more writes", exc)
        finally:
            self._checkpoint_task = None

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[_Session]:
        connection = self._writer if write else self._reader
        async with connection.lock, self._gated(write):
            # IMMEDIATE takes the write lock up front, so a writer never fails
            # half-way on a lock upgrade; readers get a consistent WAL snapshot.
            await connection.call(lambda c: c.execute("BEGIN IMMEDIATE" if write else "BEGIN"))
            try:
                yield _Session(self, connection)
            except BaseException:
                await asyncio.shield(connection.call(lambda c: c.execute("ROLLBACK")))
                raise
            await connection.call(lambda c: c.execute("COMMIT"))

    def _gated(self, write: bool) -> contextlib.AbstractAsyncContextManager[None]:
        if write and self._gate is not None:
            return self._gate.locked()
        return contextlib.nullcontext()

    async def run(
        self,
        body: Callable[[Any], Coroutine[Any, Any, T]],
        *,
        write: bool,
        short: bool = False,
    ) -> T:
        """``body(session)`` in one transaction, in one trip to the connection's thread.

        ``body`` may await only its session's methods (they complete at once
        on that thread); the transaction commits when it returns and rolls
        back when it raises.
        """
        connection = self._writer if write else self._reader
        if short and not write and self.options.inline and not self._writer.lock.locked():
            # A short read runs inline either way; on the idle writing
            # connection it finds the pages the last writes touched in that
            # connection's cache, where the reading connection, whose cache
            # every write elsewhere invalidates, reads them again from the
            # files. (It waits for nothing: the lock is free.)
            connection = self._writer

        def transaction(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = _drive(body(_SyncSession(self, conn)))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        async with connection.lock, self._gated(write):
            if self.options.inline and write and self.options.synchronous == "FULL":
                result = await self._run_then_flush(connection, body)
            elif self.options.inline and (write or short):
                result = connection.call_here(transaction)
            else:
                result = await connection.call(transaction)
        if write:
            self._committed()
        return result

    async def _run_then_flush(
        self, connection: _Connection, body: Callable[[Any], Coroutine[Any, Any, T]]
    ) -> T:
        """A write transaction whose statements run inline and whose ``COMMIT`` —
        the disk flush under ``synchronous=FULL`` — runs on the connection's
        thread, so the event loop keeps running while the disk works."""

        def statements(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                return _drive(body(_SyncSession(self, conn)))
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        result = connection.call_here(statements)
        # Handed to the thread now, not when a task first runs: another writer
        # on this file may block the event loop in BEGIN IMMEDIATE until it ends.
        commit = connection.executor.submit(
            _translated, lambda c: c.execute("COMMIT"), connection._connection()
        )
        # The caller holds the connection's lock until the COMMIT has ended,
        # even when cancelled: the connection is not free before.
        cancelled = await _until_done(commit)
        if commit.exception() is not None:
            # A failed COMMIT leaves the transaction open: end it.
            with contextlib.suppress(StoreError):
                connection.call_here(lambda c: c.execute("ROLLBACK") if c.in_transaction else None)
        if cancelled:
            raise asyncio.CancelledError
        commit.result()  # raises the COMMIT's error
        return result

    def prepare_insert(self, batches: Sequence[TrackingBatch]) -> _Insert:
        return _Insert(
            count=len(batches),
            batches=[
                {
                    "service_id": b.service_id,
                    "batch_id": b.batch_header,
                    "data_change_id": b.data_change_id,
                    "signer_public_key": b.signer_public_key,
                    "trace": b.trace,
                    "serialized_batch": b.serialized_batch,
                    "created_at": b.created_at,
                }
                for b in batches
            ],
            transactions=[
                {
                    "service_id": b.service_id,
                    "transaction_id": t.transaction_header,
                    "batch_id": b.batch_header,
                    "position": position,
                    "payload": t.payload,
                    "family_name": t.family_name,
                    "family_version": t.family_version,
                    "signer_public_key": t.signer_public_key,
                    "inputs": common.json_texts(t.inputs),
                    "outputs": common.json_texts(t.outputs),
                    "dependencies": common.json_texts(t.dependencies),
                }
                for b in batches
                for position, t in enumerate(b.transactions)
            ],
            locks=_lock_rows(batches) if self._lock_entries_kept else None,
            rows=batches,
        )

    async def insert_batches(self, session: Any, prepared: _Insert) -> list[int]:
        q = self.queries

        def insert(conn: sqlite3.Connection) -> list[int]:
            conn.executemany(q["insert_batch"], prepared.batches)
            # The write lock is ours and seq is AUTOINCREMENT: the rows got
            # consecutive seqs ending at the last one inserted.
            last = int(conn.execute(q["last_seq"]).fetchone()[0])
            conn.executemany(q["insert_transaction"], prepared.transactions)
            seqs = list(range(last - prepared.count + 1, last + 1))
            locks = prepared.locks
            if locks is None and self._keeps_lock_entries(conn):
                locks = _lock_rows(prepared.rows)
            if locks:
                for n, row in locks:
                    row["seq"] = seqs[n]
                # One writer at a time: nothing can become final meanwhile.
                conn.executemany(q["insert_lock"], [row for _, row in locks])
                conn.execute(q["block_new_batches"], {"first": seqs[0], "last": seqs[-1]})
            return seqs

        result: list[int] = await session.call(insert)
        return result

    def _keeps_lock_entries(self, conn: sqlite3.Connection) -> bool:
        """Whether the database keeps lock entries (``lock_entries_kept``), read
        in the caller's write transaction: the switch is a write transaction
        too, so what this reads holds until the caller commits. Once kept,
        always kept: not read again."""
        if not self._lock_entries_kept:
            row = conn.execute(self.queries["lock_entries_kept"]).fetchone()
            self._lock_entries_kept = bool(row[0])
        return self._lock_entries_kept

    async def warm(self) -> None:
        """Nothing to prepare: a file's connection opens with the store."""

    async def keep_lock_entries(self) -> bool:
        """Turn lock entries and blockers on (``lock_entries_kept``), after
        writing them for every open batch; ``True`` if this call turned them on.

        One write transaction: SQLite's one writer keeps every other write
        (batches added, batches made final) out until it commits.
        """
        if self._lock_entries_kept:
            return False
        q = self.queries
        # Kept already (the usual case when a store opens again): known
        # without the write lock, which another process may hold.
        async with self._reader.lock:
            kept = await self._reader.call(lambda c: c.execute(q["lock_entries_kept"]).fetchone())
        if kept[0]:
            self._lock_entries_kept = True
            return False

        def switch(conn: sqlite3.Connection) -> bool:
            if self._keeps_lock_entries(conn):
                return False
            conn.execute(q["clear_batch_locks"])
            rows = [
                {"seq": seq, "service_id": service_id, "mode": mode, "entry": entry}
                for seq, service_id, access in common.open_accesses(
                    (*r[:4], *(None if v is None else json.loads(v) for v in r[4:]))
                    for r in conn.execute(q["open_batch_access"])
                )
                for mode, entry in access
            ]
            if rows:
                conn.executemany(q["insert_lock"], rows)
                # Every open batch with entries: the same rule as for new ones.
                conn.execute(q["block_new_batches"], {"first": 0, "last": 2**63 - 1})
            conn.execute(q["keep_lock_entries"])
            return True

        def transaction(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                turned = switch(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return turned

        async with self._writer.lock, self._gated(True):
            turned: bool = await self._writer.call(transaction)
        return turned

    def seqs_param(self, seqs: Sequence[int]) -> str:
        return json.dumps(list(seqs))

    def texts_param(self, values: Sequence[str]) -> str:
        return json.dumps(list(values))

    def keys_param(self, keys: Sequence[tuple[str, str]]) -> dict[str, Any]:
        return {"keys": json.dumps([list(k) for k in keys])}

    async def migrate(self, *, apply: bool, url: str) -> MigrationResult:
        q = self.queries

        def read_plan(conn: sqlite3.Connection) -> MigrationPlan:
            has_version = conn.execute(q["table_exists"], {"name": "schema_version"})
            applied: dict[int, str] | None = None
            if has_version.fetchone()[0]:
                applied = dict(conn.execute(q["schema_version_rows"]).fetchall())
            has_batches = conn.execute(q["table_exists"], {"name": "batches"}).fetchone()[0]
            return plan_migration(self.dialect, applied, bool(has_batches))

        def run(conn: sqlite3.Connection) -> MigrationResult:
            # Check under a read transaction first: opening a current store
            # must not wait for (or block) another writer.
            conn.execute("BEGIN")
            try:
                plan = read_plan(conn)
            finally:
                conn.execute("ROLLBACK")
            if not apply:
                refuse_outdated(plan, url)
            if not plan.pending:
                return MigrationResult(plan.before, plan.after)
            conn.execute("BEGIN IMMEDIATE")
            try:
                plan = read_plan(conn)  # another process may have migrated meanwhile
                if plan.pending:
                    conn.execute(q["schema_version_create"])
                    scripts = (
                        [canonical_schema(self.dialect)]
                        if plan.fresh
                        else [m.sql for m in plan.pending]
                    )
                    for script in scripts:
                        for statement in split_script(script):
                            conn.execute(statement)
                    for m in plan.pending:
                        conn.execute(
                            q["schema_version_insert"],
                            {"version": m.version, "name": m.name, "applied_at": now_ms()},
                        )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return MigrationResult(plan.before, plan.after)

        async with self._writer.lock:
            return await self.call(run)

    async def close(self) -> None:
        if self._checkpoint_task is not None:
            await asyncio.wait([self._checkpoint_task])
        if self._checkpointer is not None:
            await self._checkpointer.close()
        if self._reader is not self._writer:
            await self._reader.close()
        await self._writer.close()
        if self._gate is not None:
            self._gate.close()
