"""PostgreSQL backend: psycopg 3 async with a connection pool.

Writes are set-based: ``add_batches`` draws the call's seqs from the identity
sequence in one statement, then streams every batch and every transaction
with one binary ``COPY`` per table, inside one transaction (COPY is about four
times faster than ``INSERT ... SELECT FROM unnest(...)`` here). A unique-key
clash aborts the COPY and the whole call. Before inserting, it takes a transaction-scoped
advisory lock per service (in key order, so writers never deadlock): seqs of
one service are then assigned and committed in the same order, and a reader
never sees seq n+1 of a service while seq n is still uncommitted.

Driver errors are translated here: connection failures become
``StoreUnavailableError``, anything else ``StoreError``.

A request waits for a pooled connection up to the pool's timeout while the
database answers, and at most ``outage_timeout_s`` once no primary does
(:mod:`ledgerq.store.outage`): an outage is a prompt ``503``, not a queue of
requests each waiting out the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ledgerq.clock import now_ms
from ledgerq.errors import StoreError, StoreUnavailableError
from ledgerq.model import TrackingBatch
from ledgerq.queue.parallel import BatchAccess
from ledgerq.store import common
from ledgerq.store.migrate import MigrationResult, plan_migration, redact, refuse_outdated
from ledgerq.store.outage import OutageWatch, connect_timeout, first_session
from ledgerq.store.sqlfiles import canonical_schema, load_queries
from ledgerq.store.sqlstore import ConflictError, Params, Row

#: Advisory lock key space of ledgerq: (this, hashtext(...)).
ADVISORY_CLASS_SERVICE = 0x6C71_0001
ADVISORY_CLASS_MIGRATE = 0x6C71_0002
#: The switch of lock entries (``lock_entries_kept``): shared by add_batches.
ADVISORY_CLASS_LOCK_ENTRIES = 0x6C71_0003

#: A comma-joined list of values that go into an array literal unquoted.
_PLAIN_TEXTS = re.compile(r"[0-9A-Za-z_.:-]+(?:,[0-9A-Za-z_.:-]+)*")

# Column types of the binary COPY rows (see copy_batches / copy_transactions).
_BATCH_TYPES = ["int8", "text", "text", "text", "text", "bool", "bytea", "int8", "int8"]
_TRANSACTION_TYPES = [
    "text", "text", "text", "int4", "bytea", "text", "text", "text", "text[]", "text[]", "text[]",
]  # fmt: skip

T = TypeVar("T")

DEFAULT_POOL_TIMEOUT_S = 10.0
#: The longest a request waits for the store once no primary answers
#: (``store.outage_timeout_s``).
DEFAULT_OUTAGE_TIMEOUT_S = 2.0
DEFAULT_STATEMENT_TIMEOUT_MS = 60_000
#: A session idle inside a transaction this long is ended by the server: a
#: frozen gateway must not keep row locks (a fenced write share-locks its
#: claim row) that other instances' claim maintenance waits for.
DEFAULT_IDLE_IN_TRANSACTION_MS = 5_000
#: The planner's cost of a random page read in this store's sessions. The
#: server's default (4) prices every index probe as a disk seek, so for the
#: tables of one row per service (``queue_heads``, ``service_id_claims``) and
#: a young store's ``submissions`` it scans the whole table instead of
#: probing a few keys, and a statement planned once keeps that plan as the
#: table grows. 1.1: the working set is in memory (docs/store.md).
RANDOM_PAGE_COST = 1.1


def _translate(exc: psycopg.Error, url: str) -> StoreError:
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreUnavailableError(
            f"PostgreSQL at {redact(url)} failed: {exc}; check that the server is up and the "
            "URL is right, then retry"
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreUnavailableError(f"PostgreSQL cancelled a statement: {exc}; retry")
    return StoreError(f"PostgreSQL failed: {exc}")


#: Statements whose best plan depends on the length of an array parameter (a
#: list of service ids). Never prepared, so every execution is planned for its
#: own list: once psycopg prepares a statement (its fifth execution), PostgreSQL
#: may switch to a generic plan chosen without the list, many times slower than
#: the plan for the list at hand on thousands of services (docs/BENCHMARKS.md).
PLANNED_EACH_TIME = frozenset({"queue_round_services", "parallel_round_services"})

#: The statements a gateway's ingest and pipeline send on almost every
#: connection: an insert, a take, a status, a take of the batches a final
#: status frees. :meth:`PostgresBackend.warm` prepares them on a few pooled
#: connections as the gateway starts. Otherwise each is prepared in the first
#: message that needs it on each connection, and the server parses and
#: analyses these set-based statements, each a noticeable time, inside the
#: first requests' transactions, once per connection (docs/store.md, "Warm
#: connections").
WARM_STATEMENTS = (
    # add_batches
    "lock_services",
    "lock_queue_heads",
    "allocate_seqs",
    "insert_batch_rows",
    "insert_transaction_rows",
    "insert_service_claims",
    "lock_entries_kept",
    "share_lock_entries_switch",
    "insert_lock_rows",
    "blockers_of",
    # apply_writes: takes, statuses, freed batches
    "lock_finishing_heads",
    "lock_group_rows",
    "batch_states",
    "lock_claims",
    "next_open_checks",
    "record_attempt_set",
    "write_status_checked_set",
    "upsert_submission_error_set",
    "take_freed",
)
#: Pooled connections :meth:`PostgresBackend.warm` opens and prepares.
WARM_CONNECTIONS = 4


_PARAM = re.compile(r"%\((\w+)\)s")


@functools.cache
def _positional(query: str) -> tuple[str, tuple[str, ...]]:
    """``query`` with ``$n`` for its ``%(name)s`` parameters, and their names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return _PARAM.sub(number, query), tuple(names)


#: Lists up to this many batches, and this many bytes of serialized batches,
#: are inserted by statements bound on the client and sent with the COMMIT;
#: larger ones are COPYed in binary (insert_batches): literals cost less client
#: CPU for small lists, COPY less time for large ones; the bound lies between
#: (figures in docs/design-notes.md).
LITERAL_MAX_BATCHES = 200
LITERAL_MAX_BYTES = 512 * 1024


def _text_array(values: Sequence[str | None]) -> str:
    """An array literal of ``values``, every element quoted (any text)."""
    if not values:
        return "{}"
    if None not in values:
        joined = '","'.join(cast("Sequence[str]", values))
        if "\\" not in joined and '"' not in joined:
            return '{"' + joined + '"}'
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in values
        )
        + "}"
    )


def _int_array(values: Sequence[int | None]) -> str:
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def _bytea_array(values: Sequence[bytes]) -> str:
    # Each element \\x<hex>, unquoted: the array parser takes the backslash
    # escape, bytea reads the hex.
    return "{" + ",".join(["\\\\x" + v.hex() for v in values]) + "}"


def _column_literal(values: Sequence[Any]) -> Any:
    """The array literal of one column of a set-based write (``<name>_set``)
    when its values are all of one simple type or ``None``; else the list
    (psycopg's list dumper). The dumper runs Python code for every element;
    a literal is one join, on the hot path of every set-based write."""
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return "{" + ",".join(["NULL"] * len(values)) + "}"
    if len(kinds) > 1:
        return list(values)
    [kind] = kinds
    if kind is bool:
        return "{" + ",".join("NULL" if v is None else "t" if v else "f" for v in values) + "}"
    if kind is int:
        return _int_array(values)
    if kind is str:
        return _text_array(values)
    if kind is bytes:
        return "{" + ",".join(["NULL" if v is None else "\\\\x" + v.hex() for v in values]) + "}"
    return list(values)


def _texts_or_null(values: Sequence[str] | None) -> str | None:
    """The literal of one row's array (an element of a text[] of literals):
    unquoted when every value is plain, as addresses are."""
    if values is None:
        return None
    joined = ",".join(values)
    if (
        values
        and _PLAIN_TEXTS.fullmatch(joined)
        and joined.count(",") == len(values) - 1
        and not any(len(v) == 4 and v.lower() == "null" for v in values)
    ):
        return "{" + joined + "}"
    return _text_array(values)


def _batch_rows(batches: Sequence[TrackingBatch]) -> Params:
    """The batches' columns but ``seqs`` and ``blocked_by`` (known in the transaction)."""
    return {
        "service_ids": _text_array([b.service_id for b in batches]),
        "batch_ids": _text_array([b.batch_header for b in batches]),
        "data_change_ids": _text_array([b.data_change_id for b in batches]),
        "signer_public_keys": _text_array([b.signer_public_key for b in batches]),
        "traces": "{" + ",".join("t" if b.trace else "f" for b in batches) + "}",
        "serialized_batches": _bytea_array([b.serialized_batch for b in batches]),
        "created_ats": _int_array([b.created_at for b in batches]),
    }


def _locks_of(
    batches: Sequence[TrackingBatch],
) -> tuple[list[list[tuple[str, str]]], dict[int, int]]:
    """The batches' lock entries, and their dependencies within the call
    (``_Insert.locks``, ``_Insert.within``)."""
    accesses = [BatchAccess.of(b) for b in batches]
    return (
        [common.lock_rows(b, a) for b, a in zip(batches, accesses, strict=True)],
        common.dependencies_within(batches, range(1, len(batches) + 1), accesses),
    )


@dataclass(frozen=True, slots=True)
class _Insert:
    """An ``add_batches`` call's rows, worked out before its transaction."""

    batches: Sequence[TrackingBatch]
    service_ids: list[str]
    #: Per batch, its lock entries ``(mode, entry)``; None: not worked out
    #: (the database did not keep them at the last insert).
    locks: list[list[tuple[str, str]]] | None
    #: Batch index → the index of the latest earlier batch of the call holding
    #: a transaction it depends on (both counted from 1); None with ``locks``.
    within: dict[int, int] | None
    claims: Params
    #: The literal path's rows (None: COPY).
    batch_rows: Params | None
    transaction_rows: Params | None


def _transaction_rows(batches: Sequence[TrackingBatch]) -> Params:
    rows = [(b, position, t) for b in batches for position, t in enumerate(b.transactions)]
    return {
        "service_ids": _text_array([b.service_id for b, _, _ in rows]),
        "transaction_ids": _text_array([t.transaction_header for _, _, t in rows]),
        "batch_ids": _text_array([b.batch_header for b, _, _ in rows]),
        "positions": _int_array([position for _, position, _ in rows]),
        "payloads": _bytea_array([t.payload for _, _, t in rows]),
        "family_names": _text_array([t.family_name for _, _, t in rows]),
        "family_versions": _text_array([t.family_version for _, _, t in rows]),
        "signer_public_keys": _text_array([t.signer_public_key for _, _, t in rows]),
        "inputs": _text_array([_texts_or_null(t.inputs) for _, _, t in rows]),
        "outputs": _text_array([_texts_or_null(t.outputs) for _, _, t in rows]),
        "dependencies": _text_array([_texts_or_null(t.dependencies) for _, _, t in rows]),
    }


@dataclass
class _Prepared:
    """The statements ledgerq prepared (SQL ``PREPARE``) on one connection."""

    names: set[str] = field(default_factory=set)
    #: False after a failed message: some of its PREPAREs may have run.
    known: bool = True


class _Session:
    """Runs named queries on one connection.

    A write transaction of :meth:`PostgresBackend.run` is *batched*: its
    ``BEGIN`` is not sent on its own but with its first statement, a set-based
    write (``executemany``), whose result nobody reads, is deferred until the
    next statement or the ``COMMIT``, and :meth:`fetchall_many` sends several
    statements at once. What is sent together goes as one simple-protocol
    message, its parameters bound on the client: the server runs it only once
    it has received all of it, and answers once it has run all of it, so a
    client paused at any moment leaves its session *idle in transaction*
    (where ``idle_in_transaction_session_timeout`` ends it and frees its
    locks), never *active* between two statements of a message, as a
    pipeline that is not yet synced would. One round trip per message instead
    of one per statement; those statements are planned every time.
    """

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], backend: PostgresBackend, *, batched: bool = False
    ) -> None:
        self.conn = conn
        self._q = backend.queries
        self._batched = batched
        #: Statements (client-bound) to send before the next one: BEGIN, deferred writes.
        self._deferred: list[str] = ["BEGIN"] if batched else []
        self._binder: psycopg.AsyncClientCursor[Any] | None = None
        self._backend = backend
        #: Set once fetchall_committing sent the COMMIT.
        self._committed = False

    @property
    def _prepared(self) -> _Prepared:
        return self._backend.prepared_on(self.conn)

    async def prepare(self) -> None:
        """Learn which statements this connection has prepared, when unsure."""
        if not self._prepared.known:
            cur = await self.conn.execute(
                b"SELECT name FROM pg_prepared_statements WHERE name LIKE 'lq\\_%'"
            )
            self._prepared.names = {str(row[0]) for row in await cur.fetchall()}
            self._prepared.known = True

    async def prepare_named(self, names: Sequence[str]) -> None:
        """``PREPARE`` each of ``names`` not yet prepared on this connection, in one message."""
        await self.prepare()
        for name in names:
            if name not in PLANNED_EACH_TIME:
                self._defer_prepare(name)
        await self.flush()

    def _defer_prepare(self, name: str) -> str:
        """The name ``name`` is prepared under on this connection, its
        ``PREPARE`` deferred to go first when the connection has not got it yet."""
        statement = f"lq_{name}"
        if statement not in self._prepared.names:
            self._prepared.names.add(statement)
            self._deferred.append(f"PREPARE {statement} AS {_positional(self._q[name])[0]}")
        return statement

    def _bind(self, name: str, params: Params) -> str:
        """``EXECUTE`` of the query prepared under its name on this connection
        (``PREPARE`` first when it is not yet), its parameters as literals."""
        if self._binder is None:
            self._binder = psycopg.AsyncClientCursor(self.conn)
        if name in PLANNED_EACH_TIME:
            return self._binder.mogrify(self._q[name], params)
        names = _positional(self._q[name])[1]
        statement = self._defer_prepare(name)
        return self._binder.mogrify(
            f"EXECUTE {statement}({', '.join(f'%({n})s' for n in names)})"
            if names
            else f"EXECUTE {statement}",
            params,
        )

    async def _send(self, statements: Sequence[str]) -> list[tuple[list[Row], int]]:
        """The deferred statements, then ``statements``, in one message; the rows
        (empty for a command) and row count of each of ``statements``."""
        texts = [*self._deferred, *statements]
        skip = len(self._deferred)
        self._deferred = []
        cur = psycopg.AsyncClientCursor(self.conn)
        try:
            # A newline before each ';': a statement may end in a line comment.
            await cur.execute("\n;\n".join(texts).encode())
        except BaseException:
            # Which of its PREPAREs ran is unknown: ask before the next one.
            self._prepared.known = False
            raise
        out: list[tuple[list[Row], int]] = []
        more = True
        while more:
            result = cur.pgresult
            rows = (
                await cur.fetchall()
                if result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK
                else []
            )
            out.append((rows, cur.rowcount))
            more = bool(cur.nextset())
        if len(out) != len(texts):
            raise StoreError(f"PostgreSQL answered {len(out)} results for {len(texts)} statements")
        return out[skip:]

    async def flush(self) -> None:
        """Send the deferred statements now (before using ``conn`` directly)."""
        if self._deferred:
            await self._send([])

    async def fetchall_committing(self, name: str, params: Params) -> list[Row]:
        """``name``'s rows, sent with the deferred statements and the ``COMMIT``
        in one message (a batched write transaction's last statement): the
        transaction has ended when this returns, :meth:`commit` does nothing."""
        [(rows, _), _] = await self._send([self._bind(name, params), "COMMIT"])
        self._committed = True
        return rows

    async def commit(self) -> None:
        if self._committed:
            return
        if self._deferred == ["BEGIN"]:
            self._deferred = []  # nothing ran: no transaction to end
            return
        await self._send(["COMMIT"])

    async def rollback(self) -> None:
        self._deferred = []
        if self.conn.info.transaction_status in (
            psycopg.pq.TransactionStatus.INTRANS,
            psycopg.pq.TransactionStatus.INERROR,
        ):
            await self.conn.execute(b"ROLLBACK")

    async def execute(self, name: str, params: Params) -> int:
        if self._deferred:
            [(_, count)] = await self._send([self._bind(name, params)])
            return count
        cur = await self.conn.execute(self._q[name], params)
        return cur.rowcount

    async def executemany(self, name: str, rows: Sequence[Params]) -> None:
        # Not psycopg's pipelined executemany: until a pipeline is synced the
        # server counts the session as active, so a gateway paused in the
        # middle of one would hold its row and claim locks past
        # idle_in_transaction_session_timeout and keep the other instances
        # from taking its services over. A query with a set-based form
        # (``<name>_set``, arrays of columns) is sent once for all rows;
        # others one row at a time. In a batched transaction they are deferred
        # back and sent with the next statement or the COMMIT.
        if not rows:
            return
        if f"{name}_set" not in self._q:
            for row in rows:
                if self._batched:
                    self._deferred.append(self._bind(name, row))
                else:
                    await self.conn.execute(self._q[name], row)
            return
        if name == "upsert_receipt":
            # ON CONFLICT may touch a row once per statement: last one wins.
            by_key = {(r["service_id"], r["transaction_id"]): r for r in rows}
            rows = list(by_key.values())
        columns = {key: _column_literal([row[key] for row in rows]) for key in rows[0]}
        if self._batched:
            self._deferred.append(self._bind(f"{name}_set", columns))
        else:
            await self.conn.execute(self._q[f"{name}_set"], columns)

    async def fetchall(self, name: str, params: Params) -> list[Row]:
        if self._deferred:
            [(rows, _)] = await self._send([self._bind(name, params)])
            return rows
        prepare = False if name in PLANNED_EACH_TIME else None
        cur = await self.conn.execute(self._q[name], params, prepare=prepare)
        return await cur.fetchall()

    async def fetchall_many(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Each query's rows, all sent in one message; they run in list order."""
        if len(calls) == 1 and not self._deferred:
            return [await self.fetchall(*calls[0])]
        if not calls:
            return []
        results = await self._send([self._bind(name, params) for name, params in calls])
        return [rows for rows, _ in results]

    async def fetchone(self, name: str, params: Params) -> Row | None:
        if self._deferred:
            [(rows, _)] = await self._send([self._bind(name, params)])
            return rows[0] if rows else None
        cur = await self.conn.execute(self._q[name], params)
        return await cur.fetchone()


def session_options(url: str, **settings: object) -> str:
    """libpq ``options`` for the store's sessions: those the connection
    string ``url`` carries (``?options=-c search_path=ledgerq``, say), kept,
    then ``settings`` as ``-c name=value``. A setting given in both takes the
    store's value (PostgreSQL applies the last), so the time-outs the gateway
    counts on hold whatever the URL says.

    A connection argument replaces the URL's ``options`` outright, which is
    why they are joined here rather than passed separately."""
    try:
        given = conninfo_to_dict(url).get("options") or ""
    except psycopg.ProgrammingError:
        given = ""  # connect() reports the URL with the driver's own message
    ours = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return f"{given} {ours}" if given else ours


class PostgresBackend:
    dialect = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        pool_max_size: int = 8,
        pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        idle_in_transaction_ms: int = DEFAULT_IDLE_IN_TRANSACTION_MS,
        outage_timeout_s: float = DEFAULT_OUTAGE_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.queries = load_queries(self.dialect)
        self._timeout = pool_timeout_s
        self._prepared: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], _Prepared]
        self._prepared = weakref.WeakKeyDictionary()
        #: Whether the database kept lock entries at this store's last insert
        #: (None: no insert yet).
        self._lock_entries_kept: bool | None = None
        self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=pool_max_size,
            open=False,
            timeout=pool_timeout_s,
            # A connection the pool cannot make is given up after this (the
            # pool grows again when a request asks): its own backoff, which
            # doubles to minutes, never holds the pool empty after an
            # outage. The outage watch probes meanwhile.
            reconnect_timeout=max(outage_timeout_s, 1.0),
            kwargs={
                # Transactions are opened explicitly (``transaction``); a short
                # read runs without one, so it costs one round trip per
                # statement instead of BEGIN and COMMIT around them.
                "autocommit": True,
                # Each host of a multi-host URL gets this long: a host that
                # does not answer at all costs no more than the outage bound.
                "connect_timeout": connect_timeout(outage_timeout_s),
                "options": session_options(
                    url,
                    statement_timeout=int(statement_timeout_ms),
                    idle_in_transaction_session_timeout=int(idle_in_transaction_ms),
                    random_page_cost=RANDOM_PAGE_COST,
                ),
            },
        )
        self.outage = OutageWatch(url, outage_timeout_s, on_up=self._pool.check)

    def prepared_on(self, conn: psycopg.AsyncConnection[Any]) -> _Prepared:
        found = self._prepared.get(conn)
        if found is None:
            found = self._prepared[conn] = _Prepared()
        return found

    async def connect(self, *, wait_s: float = 0.0) -> None:
        """Open the pool; first one session of its own, which fails fast
        naming every host tried and what each answered (instead of the pool
        retrying in the background), or tries again for up to ``wait_s``."""
        try:
            await first_session(self.url, wait_s=wait_s, timeout_s=self.outage.bound_s)
        except StoreUnavailableError:
            await self._pool.close()
            raise
        try:
            await self._pool.open(wait=True, timeout=self._timeout)
        except Exception as exc:
            await self._pool.close()
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL at {redact(self.url)}: {exc}; check that the "
                "server is up and the URL is right"
            ) from exc

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            conn = await self.outage.bounded(lambda: self._pool.getconn(timeout=self._timeout))
        except PoolTimeout as exc:
            raise StoreUnavailableError(
                f"no PostgreSQL connection free within {self._timeout} s; the pool is "
                "exhausted or the server is slow: retry"
            ) from exc
        except psycopg.Error as exc:
            raise _translate(exc, self.url) from exc
        try:
            # As the pool's own connection(): commit or roll back, then back to the pool.
            async with conn:
                try:
                    yield conn
                except BaseException:
                    # psycopg deallocates every prepared statement of a
                    # connection it rolls back (ours too): ask which are left.
                    self.prepared_on(conn).known = False
                    raise
        except psycopg.errors.UniqueViolation as exc:
            raise ConflictError(str(exc)) from exc
        except psycopg.Error as exc:
            if conn.broken:
                # The server went away under the statement: is there one at all?
                self.outage.suspect()
            raise _translate(exc, self.url) from exc
        finally:
            await self._pool.putconn(conn)

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[_Session]:
        async with self._connection() as conn, conn.transaction():
            yield _Session(conn, self)

    async def run(
        self,
        body: Callable[[Any], Coroutine[Any, Any, T]],
        *,
        write: bool,
        short: bool = False,
    ) -> T:
        """``body(session)`` in one transaction; a ``short`` read statement by
        statement, each in its own (autocommit).

        A short read is a few indexed rows (a round of woken services, the
        batches it picked, a status): without BEGIN and COMMIT it takes two
        round trips fewer. Its statements may see different snapshots; each
        reads rows the previous one named (a batch's transactions, its
        receipts), which do not change while the batch is tracked (a batch
        removed by ``clean_stale_records`` in between comes without them).
        """
        if short and not write:
            async with self._connection() as conn:
                return await body(_Session(conn, self))
        if not write:
            async with self.transaction(write=write) as session:
                return await body(session)
        async with self._connection() as conn:
            session = _Session(conn, self, batched=True)
            try:
                await session.prepare()
                result = await body(session)
                await session.commit()
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    await session.rollback()
                raise
            return result

    def prepare_insert(self, batches: Sequence[TrackingBatch]) -> _Insert:
        literal = len(batches) <= LITERAL_MAX_BATCHES and (
            sum(len(b.serialized_batch) for b in batches) <= LITERAL_MAX_BYTES
        )
        service_ids = [b.service_id for b in batches]
        # Access sets only where the database keeps lock entries, as at the
        # last insert (once on, they stay on; the transaction checks).
        locks, within = (None, None) if self._lock_entries_kept is False else _locks_of(batches)
        return _Insert(
            batches=batches,
            service_ids=service_ids,
            locks=locks,
            within=within,
            claims={
                "service_ids": _text_array(service_ids),
                "created_ats": _int_array([b.created_at for b in batches]),
            },
            batch_rows=_batch_rows(batches) if literal else None,
            transaction_rows=_transaction_rows(batches) if literal else None,
        )

    async def insert_batches(self, session: Any, prepared: _Insert) -> list[int]:
        """Three round trips for a list up to :data:`LITERAL_MAX_BATCHES` batches
        and :data:`LITERAL_MAX_BYTES`: the locks, heads and seqs; the lock
        entries and the blockers; the rows, sent with the ``COMMIT``. A larger
        list's rows are ``COPY``ed in binary (less to escape and to parse)."""
        conn: psycopg.AsyncConnection[Any] = session.conn
        q = self.queries
        batches = prepared.batches
        # With BEGIN, in one message: the switch of lock entries (shared),
        # the advisory locks, then the heads.
        _, kept, *_, allocated = await session.fetchall_many(
            [
                ("share_lock_entries_switch", {"lock_class": ADVISORY_CLASS_LOCK_ENTRIES}),
                ("lock_entries_kept", {}),
                (
                    "lock_services",
                    {"lock_class": ADVISORY_CLASS_SERVICE, "service_ids": prepared.service_ids},
                ),
                ("lock_queue_heads", {"service_ids": prepared.service_ids}),
                ("allocate_seqs", {"count": len(batches)}),
            ]
        )
        seqs = sorted(int(row[0]) for row in allocated)
        # Lock entries and blockers only while they are kept (docs/store.md).
        self._lock_entries_kept = bool(kept[0][0])
        blocked_by = await self._blockers(session, prepared, seqs) if kept[0][0] else {}
        if prepared.batch_rows is not None and prepared.transaction_rows is not None:
            # Held: sent with the COMMIT, in one message.
            rows = {
                **prepared.batch_rows,
                "seqs": _int_array(seqs),
                "blocked_by": _int_array([blocked_by.get(seq) for seq in seqs]),
            }
            await session.executemany("insert_batch_rows", [rows])
            await session.executemany("insert_service_claims", [prepared.claims])
            await session.executemany("insert_transaction_rows", [prepared.transaction_rows])
            return seqs
        await session.flush()
        async with conn.cursor() as cur, cur.copy(q["copy_batches"]) as copy:
            copy.set_types(_BATCH_TYPES)
            for seq, b in zip(seqs, batches, strict=True):
                await copy.write_row(
                    (
                        seq,
                        b.service_id,
                        b.batch_header,
                        b.data_change_id,
                        b.signer_public_key,
                        b.trace,
                        b.serialized_batch,
                        b.created_at,
                        blocked_by.get(seq),
                    )
                )
        await conn.execute(q["insert_service_claims"], prepared.claims)
        async with conn.cursor() as cur, cur.copy(q["copy_transactions"]) as copy:
            copy.set_types(_TRANSACTION_TYPES)
            for b in batches:
                for position, t in enumerate(b.transactions):
                    await copy.write_row(
                        (
                            b.service_id,
                            t.transaction_header,
                            b.batch_header,
                            position,
                            t.payload,
                            t.family_name,
                            t.family_version,
                            t.signer_public_key,
                            None if t.inputs is None else list(t.inputs),
                            None if t.outputs is None else list(t.outputs),
                            list(t.dependencies),
                        )
                    )
        return seqs

    async def _blockers(
        self, session: _Session, prepared: _Insert, seqs: Sequence[int]
    ) -> dict[int, int]:
        """Write the new batches' lock entries and find each one's blocker
        (one message: the entries, then ``blockers_of`` over them).

        Runs after ``lock_queue_heads``: a batch becoming final in the same
        services meanwhile has committed, or waits for this transaction.
        """
        locks, within = (
            (prepared.locks, prepared.within)
            if prepared.locks is not None and prepared.within is not None
            else _locks_of(prepared.batches)  # turned on since the last insert
        )
        columns: tuple[list[int], list[str], list[str], list[str]] = ([], [], [], [])
        locked: list[int] = []
        for seq, service_id, rows in zip(seqs, prepared.service_ids, locks, strict=True):
            if rows:
                locked.append(seq)
            for mode, entry in rows:
                columns[0].append(seq)
                columns[1].append(service_id)
                columns[2].append(mode)
                columns[3].append(entry)
        found: dict[int, int] = {}
        if locked:
            _, rows = await session.fetchall_many(
                [
                    (
                        "insert_lock_rows",
                        {
                            "seqs": _int_array(columns[0]),
                            "service_ids": _text_array(columns[1]),
                            "modes": _text_array(columns[2]),
                            "entries": _text_array(columns[3]),
                        },
                    ),
                    ("blockers_of", {"seqs": _int_array(locked)}),
                ]
            )
            found = {int(seq): int(blocker) for seq, blocker in rows if blocker}
        # Dependencies on transactions of this call's own earlier batches:
        # their rows are not written yet.
        for later, earlier in within.items():
            seq = seqs[later - 1]
            found[seq] = max(found.get(seq, 0), seqs[earlier - 1])
        return found

    async def keep_lock_entries(self) -> bool:
        """Turn lock entries and blockers on (``lock_entries_kept``), after
        writing them for every open batch; ``True`` if this call turned them on.

        One transaction: the switch's advisory lock (add_batches waits, or has
        committed), every service's ``queue_heads`` row (no batch becomes
        final meanwhile), then every open batch's entries from its
        transactions' declared access, then every open batch's blocker.
        """
        q = self.queries
        async with self._connection() as conn, conn.transaction():
            switch = {"lock_class": ADVISORY_CLASS_LOCK_ENTRIES}
            await conn.execute(q["lock_entries_switch"], switch)
            cur = await conn.execute(q["lock_entries_kept"])
            row = await cur.fetchone()
            if row is not None and row[0]:
                return False
            await conn.execute(q["lock_all_queue_heads"])
            await conn.execute(q["clear_batch_locks"])
            cur = await conn.execute(q["open_batch_access"])
            rows = [
                (seq, service_id, mode, entry)
                for seq, service_id, access in common.open_accesses(await cur.fetchall())
                for mode, entry in access
            ]
            if rows:
                await conn.execute(
                    q["insert_lock_rows"],
                    {
                        "seqs": _int_array([r[0] for r in rows]),
                        "service_ids": _text_array([r[1] for r in rows]),
                        "modes": _text_array([r[2] for r in rows]),
                        "entries": _text_array([r[3] for r in rows]),
                    },
                )
            await conn.execute(q["repoint_open_batches"])
            await conn.execute(q["keep_lock_entries"])
        return True

    def seqs_param(self, seqs: Sequence[int]) -> str:
        # An array literal, cast by the query (``::bigint[]``): psycopg's
        # list dumper runs Python code for every element.
        return "{" + ",".join(map(str, map(int, seqs))) + "}"

    def texts_param(self, values: Sequence[str]) -> str | list[str]:
        """An array literal when no value needs quoting (batch ids, the usual
        service ids): one check of the joined text, where psycopg's list
        dumper checks every element for quoting; else the list itself."""
        joined = ",".join(values)
        if (
            _PLAIN_TEXTS.fullmatch(joined)
            and joined.count(",") == len(values) - 1  # no value holds a comma
            # an element spelling NULL would be read as NULL
            and not any(len(v) == 4 and v.lower() == "null" for v in values)
        ):
            return "{" + joined + "}"
        return list(values)

    def keys_param(self, keys: Sequence[tuple[str, str]]) -> dict[str, Any]:
        return {"service_ids": [k[0] for k in keys], "batch_ids": [k[1] for k in keys]}

    async def migrate(self, *, apply: bool, url: str) -> MigrationResult:
        q = self.queries
        async with self._connection() as conn, conn.transaction():
            # Two instances starting together: the second waits, then finds
            # the schema current.
            await conn.execute(q["lock_migrations"], {"lock_class": ADVISORY_CLASS_MIGRATE})
            cur = await conn.execute(q["table_exists"], {"name": "schema_version"})
            row = await cur.fetchone()
            applied: dict[int, str] | None = None
            if row and row[0]:
                cur = await conn.execute(q["schema_version_rows"])
                applied = {int(v): str(n) for v, n in await cur.fetchall()}
            cur = await conn.execute(q["table_exists"], {"name": "batches"})
            row = await cur.fetchone()
            plan = plan_migration(self.dialect, applied, bool(row and row[0]))
            if not apply:
                refuse_outdated(plan, url)
            if plan.pending:
                await conn.execute(q["schema_version_create"])
                scripts = (
                    [canonical_schema(self.dialect)]
                    if plan.fresh
                    else [m.sql for m in plan.pending]
                )
                for script in scripts:
                    await conn.execute(script)
                for m in plan.pending:
                    await conn.execute(
                        q["schema_version_insert"],
                        {"version": m.version, "name": m.name, "applied_at": now_ms()},
                    )
        return MigrationResult(plan.before, plan.after)

    async def warm(self, connections: int = WARM_CONNECTIONS) -> None:
        """Open ``connections`` pooled connections (at most the pool's size)
        and prepare :data:`WARM_STATEMENTS` on each, once the schema is
        current: a gateway's first requests then neither wait for a new
        connection nor have the server prepare statements inside their
        transactions. The pool keeps them while they are used (it closes a
        connection above its minimum after ten idle minutes; one opened later
        prepares as it goes)."""
        async with contextlib.AsyncExitStack() as stack:
            conns = [
                await stack.enter_async_context(self._connection())
                for _ in range(min(connections, self._pool.max_size))
            ]
            await asyncio.gather(
                *(_Session(conn, self).prepare_named(WARM_STATEMENTS) for conn in conns)
            )

    async def close(self) -> None:
        await self.outage.close()
        await self._pool.close()
