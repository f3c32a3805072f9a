"""Two other places the parallel queuer's conflicts could be worked out, timed on
the queuer benchmark's population beside the store's ``parallel_round``:

* **Arrays on the batch row, decided over a window.** Every open batch
  carries its writes on its own row (``text[]`` on PostgreSQL, JSON on
  SQLite); a round reads the first ``window`` open batches of every service
  and applies the rule in Python. No blocker is kept anywhere, so nothing is
  written when a batch becomes final, but every round reads ``window`` rows
  per service, and a batch further down than ``window`` is never picked.
* **An index in the queue source.** Every open batch's lock entries are
  loaded once into memory (at start, and for the services gained on a claim
  takeover); a round reads only the busy batches from the store and walks
  each service's open batches in memory to its first free one. The index must
  then follow every change the store sees (new batches from other instances'
  APIs, final statuses) or be rebuilt.

Both decide with plain Python over exact entries (the population has no
prefixes), the most favourable case for them. They run after the store's
rounds were timed, the index first: the arrays variant adds a column to
``batches`` and fills it, which rewrites the table.
"""

from __future__ import annotations

import gc
import json
import sqlite3
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg

NOW = 1_700_000_000_000
WINDOW = 15_000
#: Open batches per service the windowed round reads.
WINDOWS = (8, 32)

Row = tuple[Any, ...]


def _decide(rows: Iterable[Row], stop_at_first: bool) -> int:
    """Picks of one round over ``(service_id, seq, submitted, status,
    last_attempt_at, entries)`` rows in (service, seq) order: per service its
    first free eligible batch, ``Unknown``/due ``Delayed`` before new ones."""
    picks = 0
    service = None
    held: set[str] = set()
    best: tuple[int, int] | None = None
    done = False
    for sid, seq, submitted, status, last_attempt, entries in rows:
        if sid != service:
            picks += best is not None
            service, held, best, done = sid, set(), None, False
        if done:
            continue
        free = not any(e in held for e in entries)
        held.update(entries)
        if submitted or status == "Pending" or not free:
            continue
        if status == "Delayed" and last_attempt is not None and last_attempt > NOW - WINDOW:
            continue
        cls = 0 if status == "Unknown" else 1 if status == "Delayed" else 2
        if best is None or (cls, seq) < best:
            best = (cls, seq)
        done = stop_at_first and cls == 2
    return picks + (best is not None)


def _timed(call: Callable[[], int], rounds: int) -> tuple[int, list[float]]:
    picks = call()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        assert call() == picks
        times.append((time.perf_counter() - started) * 1000)
    return picks, times


# -- PostgreSQL ----------------------------------------------------------------------

_PG_WINDOW = """
SELECT w.service_id, w.seq, w.submitted, w.status, w.last_attempt_at, w.writes
FROM queue_heads h
CROSS JOIN LATERAL (
    SELECT b.service_id, b.seq, b.submitted, b.status, b.last_attempt_at, b.writes
    FROM batches b
    WHERE b.service_id = h.service_id AND NOT b.final
    ORDER BY b.seq
    LIMIT %(window)s
) w
WHERE h.head_seq IS NOT NULL
ORDER BY w.service_id, w.seq
"""
_PG_BUSY = """
SELECT seq, submitted, status, last_attempt_at FROM batches
WHERE NOT final AND (submitted OR status IS NOT NULL)
"""


Result = tuple[list[tuple[str, int, list[float]]], str]


def pg_alternatives(url: str, rounds: int) -> Result:
    out: list[tuple[str, int, list[float]]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        # The index first: the arrays variant rewrites the table.
        index = _index(lambda q: conn.execute(q).fetchall(), _PG_BUSY, rounds)
        started = time.perf_counter()
        conn.execute("ALTER TABLE batches ADD COLUMN writes TEXT[]")
        conn.execute(
            "UPDATE batches b SET writes = ARRAY[l.entry] FROM batch_locks l WHERE l.seq = b.seq"
        )
        conn.execute("VACUUM ANALYZE batches")
        filled = time.perf_counter() - started
        for window in WINDOWS:

            def windowed(window: int = window) -> int:
                rows = conn.execute(_PG_WINDOW, {"window": window}).fetchall()
                return _decide(rows, stop_at_first=False)

            picks, times = _timed(windowed, rounds)
            out.append(
                (f"arrays on the row, first {window} open batches per service", picks, times)
            )
        out.append(index)
    return out, f"Filling the arrays of the open batches took {filled:.0f} s."


# -- SQLite --------------------------------------------------------------------------

_SQLITE_WINDOW = """
WITH RECURSIVE services(service_id) AS (
    SELECT min(service_id) FROM batches WHERE NOT final
    UNION ALL
    SELECT (SELECT min(o.service_id) FROM batches o
            WHERE NOT o.final AND o.service_id > services.service_id)
    FROM services WHERE services.service_id IS NOT NULL
)
SELECT b.service_id, b.seq, b.submitted, b.status, b.last_attempt_at, b.writes
FROM services s
JOIN batches b ON b.seq IN (
    SELECT o.seq FROM batches o WHERE NOT o.final AND o.service_id = s.service_id
    ORDER BY o.seq LIMIT :window
)
ORDER BY b.service_id, b.seq
"""
_SQLITE_BUSY = """
SELECT seq, submitted, status, last_attempt_at FROM batches
WHERE NOT final AND (submitted OR status IS NOT NULL)
"""


def sqlite_alternatives(path: str, rounds: int) -> Result:
    out: list[tuple[str, int, list[float]]] = []
    conn = sqlite3.connect(path)
    try:
        index = _index(lambda q: conn.execute(q).fetchall(), _SQLITE_BUSY, rounds)
        started = time.perf_counter()
        conn.execute("ALTER TABLE batches ADD COLUMN writes TEXT")
        conn.execute(
            "UPDATE batches SET writes = (SELECT json_array(l.entry) FROM batch_locks l "
            "WHERE l.seq = batches.seq) WHERE NOT final"
        )
        conn.commit()
        filled = time.perf_counter() - started
        for window in WINDOWS:

            def windowed(window: int = window) -> int:
                rows = conn.execute(_SQLITE_WINDOW, {"window": window}).fetchall()
                decoded = ((*r[:5], json.loads(r[5])) for r in rows)
                return _decide(decoded, stop_at_first=False)

            picks, times = _timed(windowed, rounds)
            out.append(
                (f"arrays on the row, first {window} open batches per service", picks, times)
            )
        out.append(index)
    finally:
        conn.close()
    return out, f"Filling the arrays of the open batches took {filled:.0f} s."


# -- the queue source's index ----------------------------------------------------------


def _index(
    fetch: Callable[[str], Sequence[Row]], busy_sql: str, rounds: int
) -> tuple[str, int, list[float]]:
    """Build the in-memory index once (timed, its memory measured), then time
    rounds that read only the busy batches."""
    gc.collect()
    tracemalloc.start()
    started = time.perf_counter()
    index: dict[str, list[tuple[int, tuple[str, ...]]]] = {}
    for sid, seq, entry in fetch(
        "SELECT service_id, seq, entry FROM batch_locks WHERE mode <> 'd' ORDER BY service_id, seq"
    ):
        entries = index.setdefault(sid, [])
        if entries and entries[-1][0] == seq:
            entries[-1] = (seq, (*entries[-1][1], entry))
        else:
            entries.append((seq, (entry,)))
    built = time.perf_counter() - started
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()

    def round_() -> int:
        state = {seq: (submitted, status, at) for seq, submitted, status, at in fetch(busy_sql)}
        picks = 0
        for sid, batches in index.items():
            # Walk the service's open batches up to its first free new one.
            rows = []
            for seq, entries in batches:
                submitted, status, at = state.get(seq, (False, None, None))
                rows.append((sid, seq, submitted, status, at, entries))
                if (
                    status is None
                    and not submitted
                    and not any(e in r[5] for r in rows[:-1] for e in entries)
                ):
                    break
            picks += _decide(rows, stop_at_first=True)
        return picks

    picks, times = _timed(round_, rounds)
    label = (
        f"index in the queue source ({sum(map(len, index.values())):,} open batches: "
        f"built in {built:.1f} s, {memory / 2**20:.0f} MiB of Python objects)"
    )
    return label, picks, times
