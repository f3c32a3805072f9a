"""Queuer: one round (``queue_round``) over 1,000,000 tracked batches in 10,000 services.

The population is loaded set-based (PostgreSQL ``COPY``, SQLite
``executemany``) into a database migrated by the store itself, then
``ANALYZE``d. Every service has a history of final batches, then its head in
one of the states a busy gateway sees, then new batches waiting behind it:

* 60 % of services are ready (the head is new), 25 % have their head in
  flight (``{submitted, Pending}``), 5 % ``{submitted, None}``, 4 % a
  ``Delayed`` head inside its window and 4 % past it, 2 % ``Unknown``;
* ~20 % of all batches are final (``Committed``), with their submission and
  status rows; the rest wait. Each batch has one intkey transaction that
  reads and writes one of 8 names of its service, chosen at random: the lock
  entries and blockers of the open batches are loaded as ``add_batches``
  would have written them.

Timed: ``store.queue_round(now=..., delay_window_ms=15000)`` (the serial
strategy) and ``store.parallel_round(...)`` (the parallel one), interleaved,
end to end (SQL, transaction hydration, Python objects), for every service
and for half of them (``services=``, what an HA instance passes), full and
``narrow`` (what the gateway's queue source asks for: no blobs, no hydration),
each ``--rounds`` times; the figures are medians and 90th percentiles. With
``--alternatives``, the two designs the parallel round was measured against
(``bench/_parallel_alternatives.py``) are timed on the same population. On
PostgreSQL the statement alone is also timed beside the statement before
``queue_heads`` (the skip scan), interleaved in the same rounds. The PostgreSQL plan is
``EXPLAIN (ANALYZE, BUFFERS)`` of the round's statement; SQLite's is
``EXPLAIN QUERY PLAN``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import click
import psycopg

from bench import _parallel_alternatives as alt
from bench import report
from ledgerq.codec.intkey import make_address
from ledgerq.model import TrackingBatch
from ledgerq.store import open_store
from ledgerq.store.sqlfiles import load_queries

DEFAULT_PG = os.environ.get(
    "LEDGERQ_BENCH_PG",
    os.environ.get("LEDGERQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
)
NOW = 1_700_000_000_000
WINDOW = 15_000
CHUNK = 50_000


@dataclass(frozen=True)
class Row:
    seq: int
    service_id: str
    batch_id: str
    submitted: bool
    created_at: int
    status: str | None
    final: bool
    last_attempt_at: int | None
    attempts: int
    #: The intkey address the batch reads and writes.
    address: str
    #: The latest earlier open batch of the service on the same address.
    blocked_by: int | None


#: Names per service the batches spread over.
NAMES = 8


def _head_state(rng: random.Random) -> tuple[bool, str | None, int | None]:
    """(submitted, status, last_attempt_at) of a service's first non-final batch."""
    x = rng.random()
    if x < 0.60:
        return False, None, None
    if x < 0.85:
        return True, "Pending", NOW - 2_000
    if x < 0.90:
        return True, None, NOW - 100
    if x < 0.94:
        return False, "Delayed", NOW - rng.randrange(WINDOW)
    if x < 0.98:
        return False, "Delayed", NOW - WINDOW - rng.randrange(60_000)
    return False, "Unknown", NOW - 5_000


def service_name(s: int) -> str:
    return f"circuit-{s // 100:04d}::s{s % 100:03d}"


def population(batches: int, services: int, seed: int = 7) -> Iterator[Row]:
    """Rows in acceptance order: services interleave, as traffic does."""
    rng = random.Random(seed)
    per = batches // services
    finals = [min(per - 1, rng.randrange(2 * per // 5 + 1)) for _ in range(services)]
    heads = [_head_state(rng) for _ in range(services)]
    # Per service, the latest open batch on each of its addresses.
    latest: list[dict[str, int]] = [{} for _ in range(services)]
    seq = 0
    for i in range(per):
        for s in range(services):
            seq += 1
            sid = service_name(s)
            bid = f"{s:06x}{i:06x}".ljust(128, "b")
            created = NOW - 3_600_000 + i * 1_000
            address = make_address(f"{s}-{rng.randrange(NAMES)}")
            if i < finals[s]:
                yield Row(
                    seq, sid, bid, True, created, "Committed", True, created + 500, 1, address, None
                )
                continue
            blocked_by = latest[s].get(address)
            latest[s][address] = seq
            if i == finals[s]:
                submitted, status, attempt = heads[s]
                attempts = 0 if attempt is None else 1
                yield Row(
                    seq, sid, bid, submitted, created, status, False, attempt, attempts, address,
                    blocked_by,
                )  # fmt: skip
            else:
                yield Row(seq, sid, bid, False, created, None, False, None, 0, address, blocked_by)


# -- loading --------------------------------------------------------------------

_BATCH_COLUMNS = (
    "seq, service_id, batch_id, signer_public_key, trace, serialized_batch, submitted, "
    "created_at, status, final, last_attempt_at, attempts, blocked_by"
)
_TXN_COLUMNS = (
    "service_id, transaction_id, batch_id, position, payload, family_name, family_version, "
    "signer_public_key, inputs, outputs"
)
_KEY = "02" + "ab" * 32
_BLOB = b"\x0a" * 300  # about the size of a one-transaction intkey batch


def _tid(row: Row) -> str:
    return row.batch_id[:12].ljust(128, "t")


def _chunks(batches: int, services: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in population(batches, services):
        chunk.append(row)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def load_pg(url: str, batches: int, services: int) -> None:
    with psycopg.connect(url) as conn, report.progress() as bar:
        task = bar.add_task("PostgreSQL: COPY batches", total=batches)
        for chunk in _chunks(batches, services):
            with conn.cursor() as cur:
                with cur.copy(f"COPY batches ({_BATCH_COLUMNS}) FROM STDIN") as copy:
                    for r in chunk:
                        copy.write_row(
                            (
                                r.seq,
                                r.service_id,
                                r.batch_id,
                                _KEY,
                                False,
                                _BLOB,
                                r.submitted,
                                r.created_at,
                                r.status,
                                r.final,
                                r.last_attempt_at,
                                r.attempts,
                                r.blocked_by,
                            )
                        )
                with cur.copy(f"COPY transactions ({_TXN_COLUMNS}) FROM STDIN") as copy:
                    for r in chunk:
                        copy.write_row(
                            (
                                r.service_id,
                                _tid(r),
                                r.batch_id,
                                0,
                                b"p",
                                "intkey",
                                "1.0",
                                _KEY,
                                [r.address],
                                [r.address],
                            )
                        )
                with cur.copy("COPY batch_locks (seq, service_id, mode, entry) FROM STDIN") as copy:
                    for r in chunk:
                        if not r.final:
                            copy.write_row((r.seq, r.service_id, "w", r.address))
                attempted = [r for r in chunk if r.attempts]
                with cur.copy(
                    "COPY submissions (service_id, batch_id, last_checked, times_checked, "
                    "created_at, updated_at) FROM STDIN"
                ) as copy:
                    for r in attempted:
                        at = r.last_attempt_at
                        copy.write_row((r.service_id, r.batch_id, at, 1, at, at))
                with cur.copy(
                    "COPY batch_statuses (service_id, batch_id, dlt_status, created_at, "
                    "updated_at) FROM STDIN"
                ) as copy:
                    for r in chunk:
                        if r.status is not None:
                            at = r.last_attempt_at or r.created_at
                            copy.write_row((r.service_id, r.batch_id, r.status, at, at))
            conn.commit()
            bar.advance(task, len(chunk))
        conn.execute(
            "INSERT INTO service_id_claims (service_id, unclaimed_since) "
            "SELECT DISTINCT service_id, %s::bigint FROM batches ON CONFLICT DO NOTHING",
            (NOW,),
        )
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def load_sqlite(path: str, batches: int, services: int) -> None:
    conn = sqlite3.connect(path)
    try:
        with report.progress() as bar:
            task = bar.add_task("SQLite: executemany batches", total=batches)
            for chunk in _chunks(batches, services):
                conn.executemany(
                    f"INSERT INTO batches ({_BATCH_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        (
                            r.seq,
                            r.service_id,
                            r.batch_id,
                            _KEY,
                            0,
                            _BLOB,
                            int(r.submitted),
                            r.created_at,
                            r.status,
                            int(r.final),
                            r.last_attempt_at,
                            r.attempts,
                            r.blocked_by,
                        )
                        for r in chunk
                    ),
                )
                conn.executemany(
                    f"INSERT INTO transactions ({_TXN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        (
                            r.service_id,
                            _tid(r),
                            r.batch_id,
                            0,
                            b"p",
                            "intkey",
                            "1.0",
                            _KEY,
                            json.dumps([r.address]),
                            json.dumps([r.address]),
                        )
                        for r in chunk
                    ),
                )
                conn.executemany(
                    "INSERT INTO batch_locks (seq, service_id, mode, entry) VALUES (?,?,'w',?)",
                    ((r.seq, r.service_id, r.address) for r in chunk if not r.final),
                )
                conn.executemany(
                    "INSERT INTO submissions (service_id, batch_id, last_checked, times_checked, "
                    "created_at, updated_at) VALUES (?,?,?,1,?,?)",
                    (
                        (
                            r.service_id,
                            r.batch_id,
                            r.last_attempt_at,
                            r.last_attempt_at,
                            r.last_attempt_at,
                        )
                        for r in chunk
                        if r.attempts
                    ),
                )
                conn.executemany(
                    "INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, "
                    "updated_at) VALUES (?,?,?,?,?)",
                    (
                        (
                            r.service_id,
                            r.batch_id,
                            r.status,
                            r.last_attempt_at or r.created_at,
                            r.last_attempt_at or r.created_at,
                        )
                        for r in chunk
                        if r.status is not None
                    ),
                )
                conn.commit()
                bar.advance(task, len(chunk))
        conn.execute("ANALYZE")
        conn.commit()
    finally:
        conn.close()


# -- measuring --------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    label: str
    picks: int
    median_ms: float
    p90_ms: float
    min_ms: float


RoundCall = Callable[[], Awaitable[list[TrackingBatch]]]


async def _interleaved(cases: dict[str, RoundCall], rounds: int) -> list[Timing]:
    """Each case once per round, in turn, so the strategies share the
    machine's moods; the first round of each warms caches and is not timed."""
    picks = {label: len(await call()) for label, call in cases.items()}
    times: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(rounds):
        for label, call in cases.items():
            started = time.perf_counter()
            got = await call()
            times[label].append((time.perf_counter() - started) * 1000)
            assert len(got) == picks[label]
    return [_summarize(label, picks[label], times[label]) for label in cases]


async def measure(url: str, rounds: int, services: int) -> list[Timing]:
    half = [service_name(s) for s in range(0, services, 2)]
    async with await open_store(url) as store:
        cases: dict[str, RoundCall] = {}
        for who, listed in (("every service", None), (f"{len(half):,} listed services", half)):
            for narrow in (False, True):
                how = f"{who}{', narrow' if narrow else ''}"
                cases[f"serial, {how}"] = functools.partial(
                    store.queue_round,
                    now=NOW,
                    delay_window_ms=WINDOW,
                    services=listed,
                    narrow=narrow,
                )
                cases[f"parallel, {how}"] = functools.partial(
                    store.parallel_round,
                    now=NOW,
                    delay_window_ms=WINDOW,
                    services=listed,
                    narrow=narrow,
                )
        return await _interleaved(cases, rounds)


def _summarize(label: str, picks: int, times: list[float]) -> Timing:
    times = sorted(times)
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
    return Timing(label, picks, statistics.median(times), p90, times[0])


def statement_pg(url: str, rounds: int) -> list[Timing]:
    """The round's statement alone: executed and fetched, no hydration.

    Beside it, interleaved in the same rounds, the statement before
    ``queue_heads`` (a skip scan of ``batches_open_idx``), for comparison.
    """
    queries = load_queries("postgresql")
    sql, par = queries["queue_round"], queries["parallel_round_first"]
    cases = {
        "serial, every service, statement only": (sql, {**_PARAMS, "narrow": False}),
        "parallel, every service, statement only": (par, {**_PAR_PARAMS, "narrow": False}),
        "serial, every service, narrow, statement only": (sql, {**_PARAMS, "narrow": True}),
        "parallel, every service, narrow, statement only": (par, {**_PAR_PARAMS, "narrow": True}),
        "serial, every service, skip-scan statement (before `queue_heads`)": (
            _SKIP_SCAN,
            _PARAMS,
        ),
    }
    times: dict[str, list[float]] = {label: [] for label in cases}
    picks: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        for label, (q, params) in cases.items():
            picks[label] = len(conn.execute(q, params).fetchall())
        for _ in range(rounds):
            for label, (q, params) in cases.items():
                started = time.perf_counter()
                conn.execute(q, params).fetchall()
                times[label].append((time.perf_counter() - started) * 1000)
    return [_summarize(label, picks[label], times[label]) for label in cases]


_PARAMS = {"now": NOW, "delay_window_ms": WINDOW, "limit": None}
_PAR_PARAMS = {**_PARAMS, "exclude": [], "per_service": 1}

#: PostgreSQL's queue_round before queue_heads (migration 6): each service's
#: head found by a recursive skip scan, one index probe per service.
_SKIP_SCAN = """
WITH RECURSIVE heads AS (
    (SELECT service_id, seq FROM batches WHERE NOT final ORDER BY service_id, seq LIMIT 1)
    UNION ALL
    SELECT n.service_id, n.seq
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT o.service_id, o.seq FROM batches o
        WHERE NOT o.final AND o.service_id > h.service_id
        ORDER BY o.service_id, o.seq
        LIMIT 1
    ) n
),
busy AS (
    SELECT service_id, min(seq) AS first_seq,
           bool_or(submitted OR status IS NOT DISTINCT FROM 'Pending') AS in_flight
    FROM batches
    WHERE NOT final AND (submitted OR status IS NOT NULL)
    GROUP BY service_id
),
picks AS (
    SELECT first_seq AS seq FROM busy WHERE NOT in_flight
    UNION ALL
    SELECT h.seq FROM heads h
    WHERE NOT EXISTS (SELECT 1 FROM busy WHERE busy.service_id = h.service_id)
)
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM picks
JOIN batches b ON b.seq = picks.seq
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.status IS NULL OR b.status = 'Unknown' OR b.last_attempt_at IS NULL
   OR b.last_attempt_at <= %(now)s::bigint - %(delay_window_ms)s::bigint
ORDER BY CASE b.status WHEN 'Unknown' THEN 0 WHEN 'Delayed' THEN 1 ELSE 2 END, b.seq
LIMIT %(limit)s::bigint
"""


def statement_sqlite(path: str, rounds: int) -> list[Timing]:
    queries = load_queries("sqlite")
    cases = {
        "serial, every service, statement only": (
            queries["queue_round"],
            {**_PARAMS, "narrow": False},
        ),
        "parallel, every service, statement only": (
            queries["parallel_round_first"],
            {**_PARAMS, "narrow": False, "exclude": "[]", "per_service": 1},
        ),
    }
    times: dict[str, list[float]] = {label: [] for label in cases}
    conn = sqlite3.connect(path)
    try:
        picks = {label: len(conn.execute(q, p).fetchall()) for label, (q, p) in cases.items()}
        for _ in range(rounds):
            for label, (q, p) in cases.items():
                started = time.perf_counter()
                conn.execute(q, p).fetchall()
                times[label].append((time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    return [_summarize(label, picks[label], times[label]) for label in cases]


def pg_plan(url: str, name: str = "queue_round") -> str:
    """The plan of a narrow round, the one the queue source asks for."""
    sql = load_queries("postgresql")[name]
    params = {**_PAR_PARAMS, "narrow": True}
    with psycopg.connect(url) as conn, psycopg.ClientCursor(conn) as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return "\n".join(r[0] for r in cur.fetchall())


def sqlite_plan(path: str, name: str = "queue_round") -> str:
    sql = load_queries("sqlite")[name]
    params = {**_PARAMS, "narrow": True, "exclude": "[]", "per_service": 1}
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
    finally:
        conn.close()
    depth: dict[int, int] = {0: -1}
    lines = []
    for node, parent, _, detail in rows:
        depth[node] = depth.get(parent, -1) + 1
        lines.append("  " * depth[node] + detail)
    return "\n".join(lines)


@contextmanager
def _pg_database(admin_url: str, keep: bool) -> Iterator[str]:
    name = f"ledgerq_bench_queuer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin_url)
    try:
        yield urlunsplit(parts._replace(path="/" + name))
    finally:
        if not keep:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _table(timings: list[Timing]) -> str:
    lines = [
        "| round over | picks | median | p90 | best |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(
            f"| {t.label} | {t.picks:,} | {t.median_ms:.1f} ms | {t.p90_ms:.1f} ms "
            f"| {t.min_ms:.1f} ms |"
        )
    return "\n".join(lines)


@click.command(name="queuer")
@click.option("--batches", default=1_000_000, show_default=True, help="Tracked batches.")
@click.option("--services", default=10_000, show_default=True, help="Services they belong to.")
@click.option("--rounds", default=30, show_default=True, help="Timed rounds per case.")
@click.option(
    "--backend",
    "backends",
    type=click.Choice(["postgresql", "sqlite"]),
    multiple=True,
    default=("postgresql", "sqlite"),
    show_default=True,
)
@click.option("--pg", "pg_admin", default=DEFAULT_PG, show_default=True, help="Admin URL.")
@click.option("--keep", is_flag=True, help="Keep the databases (prints where).")
@click.option("--write/--no-write", default=True, help="Write docs/BENCHMARKS.md.")
@click.option(
    "--alternatives/--no-alternatives",
    default=True,
    show_default=True,
    help="Also time the designs the parallel round was measured against.",
)
def command(
    batches: int,
    services: int,
    rounds: int,
    backends: tuple[str, ...],
    pg_admin: str,
    keep: bool,
    write: bool,
    alternatives: bool,
) -> None:
    """One queuer round over a large store, serial and parallel, on PostgreSQL and SQLite."""
    sections = []
    targets: list[report.Target] = []
    summary = (
        f"{batches:,} tracked batches in {services:,} services (shape in `bench/queuer.py`); "
        f"each figure is over {rounds} rounds, the serial strategy's "
        "`store.queue_round()` and the parallel one's `store.parallel_round()` taking turns."
    )
    for backend in backends:
        if backend == "postgresql":
            with _pg_database(pg_admin, keep) as url:
                asyncio.run(_migrate(url))
                started = time.perf_counter()
                load_pg(url, batches, services)
                loaded = time.perf_counter() - started
                timings = asyncio.run(measure(url, rounds, services))
                timings += statement_pg(url, rounds)
                plan = pg_plan(url)
                parallel_plan = pg_plan(url, "parallel_round_first")
                others = _alternatives(alt.pg_alternatives, url, rounds, alternatives)
                if keep:
                    report.console.print(f"kept {url}")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = str(Path(tmp) / "queuer.sqlite3")
                url = f"sqlite:///{path}"
                asyncio.run(_migrate(url))
                started = time.perf_counter()
                load_sqlite(path, batches, services)
                loaded = time.perf_counter() - started
                timings = asyncio.run(measure(url, rounds, services))
                timings += statement_sqlite(path, rounds)
                plan = sqlite_plan(path)
                parallel_plan = sqlite_plan(path, "parallel_round_first")
                others = _alternatives(alt.sqlite_alternatives, path, rounds, alternatives)
        report.console.print(_table(timings))
        report.console.print(
            f"serial round's plan:\n{plan}\nparallel round's plan:\n{parallel_plan}"
        )
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        # The page keeps the rounds over every service; the listed services' rounds
        # (`bench restricted` measures those), the statement-only timings and the skip
        # scan stay on the console.
        rounds_only = [t for t in timings if "statement" not in t.label and "listed" not in t.label]
        if backend == "postgresql":
            targets.append(_target(timings, batches, services))
        sections.append(
            f"### {'PostgreSQL' if backend == 'postgresql' else 'SQLite'}\n\n"
            f"Loaded in {loaded:.0f} s. Load average after measuring (1, 5, 15 min): "
            f"{load}.\n\n{_table(rounds_only)}\n\n{others}"
        )
    if write:
        report.write_section("queuer", f"{summary}\n\n" + "\n".join(sections), targets=targets)


ROUND_TARGET_MS = 100.0  # the narrow serial round over every service (the queue source), PostgreSQL


def _target(timings: list[Timing], batches: int, services: int) -> report.Target:
    best = next((t for t in timings if t.label == "serial, every service, narrow"), None)
    if best is None:
        return report.Target("queuer", "not measured", "no")
    full = batches >= 1_000_000 and services >= 10_000
    return report.Target(
        "queuer",
        f"{best.median_ms:.0f} ms median ({batches:,} batches)",
        "yes" if full and best.median_ms < ROUND_TARGET_MS else "no",
    )


def _alternatives(
    run: Callable[[str, int], alt.Result], where: str, rounds: int, wanted: bool
) -> str:
    """The alternatives' table, in Markdown (empty if not ``wanted``)."""
    if not wanted:
        return ""
    found, note = run(where, rounds)
    timings = [_summarize(label, picks, times) for label, picks, times in found]
    report.console.print(_table(timings))
    return (
        "The parallel round's alternatives on the same population, each deciding "
        f"in Python (`bench/_parallel_alternatives.py`). {note}\n\n{_table(timings)}\n\n"
    )


async def _migrate(url: str) -> None:
    async with await open_store(url):
        pass
