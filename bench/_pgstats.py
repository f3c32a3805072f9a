"""PostgreSQL's own counters around one ``ledgerq serve`` run (``bench pgshape``).

:class:`ShapeProbe` is told of each step of a run
(:class:`bench._systems.RunProbe`) and reads, for the run's database only:

* before the gateway connects: ``pg_stat_statements.track = all`` (the
  statements functions and triggers run are counted too, as *nested*) and
  ``track_functions = all``, set on the database;
* once the gateway listens: ``SETTLE_S`` of waiting (a session sends its
  table, function and database counters at most once a second, an idle one
  within ten seconds: the start-up's migrations would otherwise land after
  the reset), then the database's statistics reset (``pg_stat_reset()``,
  ``pg_stat_statements_reset`` for its ``dbid``); ``pg_stat_wal`` is the whole
  server's and others may be measuring it, so it is read before and after
  instead of reset; the CPU of the database's sessions and of the server's
  background processes, from ``/proc``;
* once every batch is final: that CPU again;
* once the gateway exited and every session of the database ended (a
  session that ends sends what it had not sent): everything else.

The rest is arithmetic on what was read, and the names of statements:
``pg_stat_statements`` keeps a statement's text with its constants replaced
by ``$n``; :func:`statement_name` finds the named query it came from
(``queries.sql``, ``claims.sql``) or the function whose body holds it
(``schema.sql``).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import aiohttp
import click
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import TupleRow

from ledgerq.claims.queries import claim_queries
from ledgerq.store.sqlfiles import canonical_schema, load_queries

#: Seconds between the gateway listening and the reset (see the module's docstring).
SETTLE_S = 11.0
#: How long the gateway's sessions may take to end once it exited.
SESSIONS_END_S = 30.0

# -- what is read -------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """One statement's counters (``pg_stat_statements``), its query ids merged."""

    name: str
    toplevel: bool
    calls: int
    rows: int
    total_ms: float
    wal_records: int = 0
    wal_bytes: int = 0


@dataclass(frozen=True)
class TableStats:
    name: str
    inserted: int
    updated: int
    hot: int
    deleted: int
    seq_scans: int
    idx_scans: int


@dataclass(frozen=True)
class IndexStats:
    table: str
    name: str
    scans: int
    partial: bool
    size_bytes: int


@dataclass(frozen=True)
class FunctionStats:
    name: str
    calls: int
    total_ms: float
    self_ms: float


@dataclass(frozen=True)
class Wal:
    records: int
    fpi: int
    bytes: int

    def __sub__(self, other: Wal) -> Wal:
        return Wal(self.records - other.records, self.fpi - other.fpi, self.bytes - other.bytes)


@dataclass
class Shape:
    """Everything one run made PostgreSQL do, as counted; :meth:`per_batch` divides."""

    strategy: str
    services: int
    per_service: int
    committed: int = 0
    throughput: float = 0.0
    ideal_throughput: float | None = None
    ideal_cpu_ms: float | None = None
    gateway_cpu_s: float = 0.0
    backends_cpu_s: float = 0.0
    background_cpu_s: float = 0.0
    commits: int = 0
    rollbacks: int = 0
    server_wal: Wal = field(default_factory=lambda: Wal(0, 0, 0))
    statements: list[Statement] = field(default_factory=list)
    tables: list[TableStats] = field(default_factory=list)
    indexes: list[IndexStats] = field(default_factory=list)
    functions: list[FunctionStats] = field(default_factory=list)
    #: The gateway's own counters (its ``/metrics``): what its writes answer to.
    gateway: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.strategy}, {self.services} × {self.per_service}"

    def per_batch(self, value: float) -> float:
        return value / self.committed if self.committed else 0.0

    def top_level(self) -> list[Statement]:
        return [s for s in self.statements if s.toplevel]

    def nested(self) -> list[Statement]:
        return [s for s in self.statements if not s.toplevel]

    def rows_written(self) -> int:
        return sum(t.inserted + t.updated + t.deleted for t in self.tables)

    def index_entries(self) -> int:
        by_table = {t.name: t for t in self.tables}
        return sum(index_entries(by_table[i.table]) for i in self.indexes if i.table in by_table)


def index_entries(table: TableStats) -> int:
    """Entries written into one index of ``table``: one per row inserted and per
    non-HOT update (a HOT update writes none). For a partial index an upper
    bound: only rows its predicate admits get one."""
    return table.inserted + table.updated - table.hot


def cpu_delta(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU seconds used between two readings by processes alive at the second: one
    started meanwhile counts whole, one that ended meanwhile is missed."""
    return sum(used - before.get(pid, 0.0) for pid, used in after.items())


def merge_statements(rows: Iterable[Statement]) -> list[Statement]:
    """One row per (name, level), by total time, the longest first."""
    merged: dict[tuple[str, bool], Statement] = {}
    for r in rows:
        m = merged.get((r.name, r.toplevel))
        if m is not None:
            r = Statement(
                r.name,
                r.toplevel,
                m.calls + r.calls,
                m.rows + r.rows,
                m.total_ms + r.total_ms,
                m.wal_records + r.wal_records,
                m.wal_bytes + r.wal_bytes,
            )
        merged[(r.name, r.toplevel)] = r
    return sorted(merged.values(), key=lambda s: -s.total_ms)


# -- naming statements --------------------------------------------------------------

_COMMENT = re.compile(r"--[^\n]*")
_LITERAL = re.compile(
    r"'(?:[^']|'')*'|%\(\w+\)s|%s|\$\d+|\b\d+(?:\.\d+)?\b|\b(?:true|false)\b"
    r"|(?<!is )(?<!not )\bnull\b"
)
_SPACE = re.compile(r"\s+")
_PREPARED = re.compile(r"^prepare lq_(\w+) as ")
_FOREIGN_KEY = re.compile(r'^select \? from only "\w+"\."(\w+)" x where ')
_FUNCTION = re.compile(r"CREATE FUNCTION (\w+)\(.*?\$\$(.*?)\$\$", re.S)


def canonical(sql: str) -> str:
    """``sql`` without comments, whitespace collapsed, lower case, its parameters
    and constants as ``?``: how a query file's text and the text
    ``pg_stat_statements`` kept for it (constants replaced by ``$n``; a
    ``NULL`` value is a constant, ``IS NULL`` is not) meet."""
    text = _SPACE.sub(" ", _COMMENT.sub(" ", sql)).lower()
    return _LITERAL.sub("?", text).strip().rstrip(";").strip()


@cache
def known_queries() -> dict[str, str]:
    """Canonical text -> name, for the store's named queries and the claim cycle's."""
    out = {canonical(sql): name for name, sql in load_queries("postgresql").items()}
    out |= {canonical(sql): f"claims.{name}" for name, sql in claim_queries().items()}
    return out


@cache
def function_bodies() -> dict[str, str]:
    """Name -> canonical body of every function of the store's schema."""
    return {m[1]: canonical(m[2]) for m in _FUNCTION.finditer(canonical_schema("postgresql"))}


def statement_name(
    text: str,
    nested: bool = False,
    known: Mapping[str, str] | None = None,
    functions: Mapping[str, str] | None = None,
    width: int = 60,
) -> str:
    """A readable name for a statement ``pg_stat_statements`` reports: the name
    it was prepared under (``PREPARE lq_<name>``), the named query of that
    text, a foreign key's check, or, ``nested``, ``function: statement`` for a
    statement of a function's body (PL/pgSQL runs ``PERFORM x`` as ``SELECT
    x`` and drops ``INTO``: the start of the text is looked for too); else the
    start of its text."""
    known = known_queries() if known is None else known
    functions = function_bodies() if functions is None else functions
    form = canonical(text)
    prepared = _PREPARED.match(form)
    if prepared:
        return prepared[1]
    if form in known:
        return known[form]
    foreign_key = _FOREIGN_KEY.match(form)
    if foreign_key:
        return f"foreign key check: {foreign_key[1]}"
    short = form if len(form) <= width else form[: width - 1] + "…"
    if not nested:
        return short
    inner = form.removeprefix("select ")
    for function, body in functions.items():
        if form[:40] in body or (inner != form and f"perform {inner[:40]}" in body):
            return f"{function}: {short}"
    return short


# -- the gateway's side ---------------------------------------------------------------

#: The gateway's counters that say what its writes answer to, by their names in
#: ``/metrics`` (a labelled one as ``name{value}``).
GATEWAY_COUNTERS = (
    "ledgerq_submission_attempts",
    "ledgerq_ledger_statuses",
    "ledgerq_monitor_polls",
    "ledgerq_follow_asked_batches",
    "ledgerq_follow_scans",
    "ledgerq_batches_taken_with_final",
)


def parse_counters(text: str) -> dict[str, float]:
    """The :data:`GATEWAY_COUNTERS` of a Prometheus text exposition, one entry
    per series: ``name`` or ``name{label value}``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in GATEWAY_COUNTERS:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # the _created series
            label = ",".join(sample.labels.values())
            out[f"{family.name}{{{label}}}" if label else family.name] = sample.value
    return out


async def gateway_counters(url: str) -> dict[str, float]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(f"{url}/metrics") as resp,
    ):
        resp.raise_for_status()
        return parse_counters(await resp.text())


# -- reading PostgreSQL -------------------------------------------------------------

Conn = psycopg.Connection[TupleRow]


def _db_name(url: str) -> str:
    return url.rpartition("/")[2].partition("?")[0]


def _proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def require_pg_stat_statements(admin_url: str) -> None:
    """Refuse, saying what to do, a server that cannot count statements; create
    the extension in the admin database when the server loads it but it is not
    there."""
    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            row = conn.execute("SHOW shared_preload_libraries").fetchone()
            loaded = str(row[0]) if row else ""
            if "pg_stat_statements" not in [x.strip() for x in loaded.split(",")]:
                raise click.ClickException(
                    f"the PostgreSQL server at {admin_url} does not load pg_stat_statements "
                    f"(shared_preload_libraries = {loaded!r}): add it to shared_preload_libraries "
                    "in postgresql.conf and restart the server; bench pgshape counts the "
                    "gateway's statements with it"
                )
            available = conn.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'"
            ).fetchone()
            if available is None:
                raise click.ClickException(
                    f"the PostgreSQL server at {admin_url} has no pg_stat_statements extension "
                    "to create: install PostgreSQL's contrib modules"
                )
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    except psycopg.Error as exc:
        raise click.ClickException(
            f"cannot read pg_stat_statements on {admin_url} (it needs a superuser): {exc}"
        ) from exc


class ShapeProbe:
    """A :class:`bench._systems.RunProbe` that fills ``shape`` (see the module's docstring)."""

    def __init__(self, admin_url: str, shape: Shape, settle_s: float = SETTLE_S) -> None:
        self.admin_url = admin_url
        self.shape = shape
        self.settle_s = settle_s
        self._backends: dict[int, float] = {}
        self._background: dict[int, float] = {}
        self._wal = Wal(0, 0, 0)

    async def created(self, db: str) -> None:
        await asyncio.to_thread(self._track_all, _db_name(db))

    async def started(self, db: str) -> None:
        await asyncio.sleep(self.settle_s)
        await asyncio.to_thread(self._reset, db)

    async def finished(self, db: str, urls: Sequence[str]) -> None:
        self.shape.gateway = await gateway_counters(urls[0])
        backends, background = await asyncio.to_thread(self._cpu_now, _db_name(db))
        self.shape.backends_cpu_s = cpu_delta(self._backends, backends)
        # Background processes are the server's: only those alive at both readings.
        alive = {p: c for p, c in background.items() if p in self._background}
        self.shape.background_cpu_s = cpu_delta(self._background, alive)

    async def stopped(self, db: str) -> None:
        await asyncio.to_thread(self._read_all, db)

    def _track_all(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE \"{name}\" SET pg_stat_statements.track = 'all'")
            conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'all'")

    def _reset(self, db: str) -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_reset()")
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                " WHERE datname = %s), 0)",
                (_db_name(db),),
            )
            self._wal = _wal(conn)
        self._backends, self._background = self._cpu_now(_db_name(db))

    def _cpu_now(self, name: str) -> tuple[dict[int, float], dict[int, float]]:
        """CPU so far of the database's sessions, and of the server's background
        processes (those of no database, or of this one: its autovacuum)."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid, backend_type = 'client backend' FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND (datname = %s OR datname IS NULL)",
                (name,),
            ).fetchall()
        sessions: dict[int, float] = {}
        background: dict[int, float] = {}
        for pid, client in rows:
            used = _proc_cpu_s(int(pid))
            if used is not None:
                (sessions if client else background)[int(pid)] = used
        return sessions, background

    def _read_all(self, db: str) -> None:
        name = _db_name(db)
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            _wait_sessions_ended(conn, name)
            self.shape.server_wal = _wal(conn) - self._wal
            self.shape.statements = _statements(conn, name)
        with psycopg.connect(db, autocommit=True) as conn:
            _read_database(conn, self.shape)


def _wal(conn: Conn) -> Wal:
    row = conn.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
    assert row is not None
    return Wal(int(row[0]), int(row[1]), int(row[2]))


def _wait_sessions_ended(conn: Conn, name: str) -> None:
    deadline = time.monotonic() + SESSIONS_END_S
    while True:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
        if row is not None and row[0] == 0:
            return
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"sessions of {name} still open {SESSIONS_END_S:.0f} s after the gateway "
                "exited: their statistics would be incomplete"
            )
        time.sleep(0.1)  # another process's sessions ending: polled


def _statements(conn: Conn, name: str) -> list[Statement]:
    rows = conn.execute(
        "SELECT query, toplevel, calls, rows, total_exec_time, wal_records, wal_bytes"
        " FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
        (name,),
    ).fetchall()
    return merge_statements(
        Statement(
            statement_name(str(q), not t), bool(t), int(c), int(n), float(ms), int(wr), int(wb)
        )
        for q, t, c, n, ms, wr, wb in rows
    )


def _read_database(conn: Conn, shape: Shape) -> None:
    row = conn.execute(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    shape.commits, shape.rollbacks = int(row[0]), int(row[1])
    shape.tables = [
        TableStats(str(r[0]), *(int(x) for x in r[1:]))
        for r in conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,"
            " coalesce(seq_scan, 0), coalesce(idx_scan, 0)"
            " FROM pg_stat_user_tables ORDER BY relname"
        ).fetchall()
    ]
    shape.indexes = [
        IndexStats(str(t), str(i), int(s), bool(p), int(b))
        for t, i, s, p, b in conn.execute(
            "SELECT s.relname, s.indexrelname, s.idx_scan, x.indpred IS NOT NULL,"
            " pg_relation_size(s.indexrelid)"
            " FROM pg_stat_user_indexes s JOIN pg_index x ON x.indexrelid = s.indexrelid"
            " ORDER BY s.relname, s.indexrelname"
        ).fetchall()
    ]
    shape.functions = [
        FunctionStats(str(n), int(c), float(t), float(s))
        for n, c, t, s in conn.execute(
            "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
            " ORDER BY total_time DESC"
        ).fetchall()
    ]
