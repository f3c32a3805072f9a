"""``ledgerq bench restricted``: the round of one HA instance against the whole round.

An instance under high availability asks for the round of the services it
holds. On the population of ``ledgerq bench queuer`` (1,000,000 batches in
10,000 services, PostgreSQL), half the services are given to one instance in
``service_id_claims``; then, interleaved in the same rounds:

* the round over **every service** (``queue_round``);
* the round over **the 5,000 held services, listed** (``queue_round_services``,
  the form a round of woken services takes);
* the round over **the services the claims table gives the instance**
  (``queue_round_claimed``, what the queue source asks for a full round);
* the list form **before** this change (``IN (SELECT DISTINCT ...)``), kept
  here for comparison.

Each is timed as the queue source runs it (narrow: no blobs), statement and
fetch, ``--rounds`` times; the ratio to the whole round is of medians in the
same run. The ``EXPLAIN (ANALYZE, BUFFERS)`` plans of the restricted forms
are printed and written beside the figures.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import click
import psycopg

from bench import report
from bench.queuer import DEFAULT_PG, NOW, WINDOW, _migrate, _pg_database, load_pg
from ledgerq.store.sqlfiles import load_queries

INSTANCE = "bench-instance"

#: queue_round_services before the join (IN over a DISTINCT list).
_BEFORE = """
WITH wanted AS (
    SELECT DISTINCT service_id FROM unnest(%(services)s::text[]) AS w(service_id)
),
busy AS (
    SELECT service_id, min(seq) AS first_seq,
           bool_or(submitted OR status IS NOT DISTINCT FROM 'Pending') AS in_flight
    FROM batches
    WHERE NOT final AND (submitted OR status IS NOT NULL)
      AND service_id IN (SELECT service_id FROM wanted)
    GROUP BY service_id
),
picks AS (
    SELECT first_seq AS seq FROM busy WHERE NOT in_flight
    UNION ALL
    SELECT h.head_seq FROM queue_heads h
    WHERE h.head_seq IS NOT NULL
      AND h.service_id IN (SELECT service_id FROM wanted)
      AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.service_id = h.service_id)
)
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       CASE WHEN %(narrow)s::bool THEN ''::bytea ELSE b.serialized_batch END, b.submitted,
       b.created_at, b.last_attempt_at, b.attempts, b.status, s.error_type, s.error_message
FROM (SELECT seq FROM picks ORDER BY seq) AS picks
JOIN batches b ON b.seq = picks.seq
LEFT JOIN submissions s
    ON NOT %(narrow)s::bool AND s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.status IS NULL OR b.status = 'Unknown' OR b.last_attempt_at IS NULL
   OR b.last_attempt_at <= %(now)s::bigint - %(delay_window_ms)s::bigint
ORDER BY CASE b.status WHEN 'Unknown' THEN 0 WHEN 'Delayed' THEN 1 ELSE 2 END, b.seq
LIMIT %(limit)s::bigint
"""


def _hold_half(url: str, services: int) -> list[str]:
    half = sorted(f"circuit-{s // 100:04d}::s{s % 100:03d}" for s in range(0, services, 2))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE service_id_claims SET claimant = %s, epoch = 1, expiry_1 = %s,"
            " expiry_2 = %s, claimed_at = %s, unclaimed_since = NULL"
            " WHERE service_id = ANY(%s)",
            (INSTANCE, NOW, NOW, NOW, half),
        )
        conn.execute("VACUUM ANALYZE service_id_claims")
    return half


def cases(half: list[str]) -> dict[str, tuple[str, dict[str, object]]]:
    q = load_queries("postgresql")
    base = {"now": NOW, "delay_window_ms": WINDOW, "limit": None, "narrow": True}
    return {
        "every service": (q["queue_round"], base),
        f"{len(half):,} held services, listed": (
            q["queue_round_services"],
            {**base, "services": half},
        ),
        f"{len(half):,} held services, from the claims table": (
            q["queue_round_claimed"],
            {**base, "claimant": INSTANCE},
        ),
        f"{len(half):,} held services, listed, before (IN (SELECT DISTINCT ...))": (
            _BEFORE,
            {**base, "services": half},
        ),
    }


def measure(
    url: str, half: list[str], rounds: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    runs = cases(half)
    times: dict[str, list[float]] = {label: [] for label in runs}
    picks: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        for label, (sql, params) in runs.items():
            picks[label] = len(conn.execute(sql.encode(), params).fetchall())  # warm
        for _ in report.track(range(rounds), "interleaved rounds", total=rounds):
            for label, (sql, params) in runs.items():
                started = time.perf_counter()
                conn.execute(sql.encode(), params).fetchall()
                times[label].append((time.perf_counter() - started) * 1000)
    return times, picks


def plans(url: str, half: list[str]) -> dict[str, str]:
    out = {}
    with psycopg.connect(url) as conn, psycopg.ClientCursor(conn) as cur:
        for label, (sql, params) in cases(half).items():
            if label == "every service":
                continue
            cur.execute(("EXPLAIN (ANALYZE, BUFFERS) " + sql).encode(), params)
            out[label] = "\n".join(str(r[0]) for r in cur.fetchall())
    return out


@click.command("restricted")
@click.option("--batches", default=1_000_000, show_default=True, help="Tracked batches.")
@click.option("--services", default=10_000, show_default=True, help="Services (half are held).")
@click.option("--rounds", default=30, show_default=True, help="Timed rounds per case.")
@click.option("--pg", "pg_admin", default=DEFAULT_PG, show_default=True, help="Admin URL.")
@click.option("--db", "existing", help="Use this already loaded database (skip the load).")
@click.option("--write/--no-write", default=True, help="Write docs/BENCHMARKS.md.")
def command(
    batches: int, services: int, rounds: int, pg_admin: str, existing: str | None, write: bool
) -> None:
    """The round over the services one HA instance holds, beside the whole round."""
    load_before = os.getloadavg()
    if existing:
        url = existing
        half = _hold_half(url, services)
        times, picks = measure(url, half, rounds)
        shown = plans(url, half)
    else:
        with _pg_database(pg_admin, keep=False) as url:
            asyncio.run(_migrate(url))
            load_pg(url, batches, services)
            half = _hold_half(url, services)
            times, picks = measure(url, half, rounds)
            shown = plans(url, half)
    load_after = os.getloadavg()
    whole = statistics.median(times["every service"])
    rows = [
        [
            label,
            f"{picks[label]:,}",
            f"{statistics.median(t):.1f} ms",
            f"{report.percentile(t, 90):.1f} ms",
            f"{min(t):.1f} ms",
            f"{statistics.median(t) / whole:.2f} ×",
        ]
        for label, t in times.items()
    ]
    headers = ["round over", "picks", "median", "p90", "best", "÷ every service"]
    # The list form from before the join is compared on the console only.
    table = report.table(headers, [r for r in rows if "before" not in r[0]])
    click.echo(report.table(headers, rows))
    text = "\n".join(
        [
            f"{batches:,} batches in {services:,} services (the `bench queuer` population), "
            f"{len(half):,} of them held by one instance in `service_id_claims`; narrow rounds "
            f"(statement and fetch), {rounds} rounds, the cases interleaved. Load average "
            f"(1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; after: "
            f"{', '.join(f'{x:.1f}' for x in load_after)}.",
            "",
            table,
        ]
    )
    # The plans explain a figure; the page keeps the figures.
    click.echo(text)
    for label, plan in shown.items():
        click.echo(f"Plan, {label}:\n{plan}\n")
    if write:
        report.write_section("restricted", text)
