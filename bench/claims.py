"""``ledgerq bench claims``: the claim cycle with 10,000 services, on PostgreSQL.

On a fresh database with ``--services`` claim rows (and one open batch per
service, so nothing is idle), measured with the real :class:`ClaimManager`
and an injected clock (time moves 1 s per cycle, as with the default
renewal period):

* **claiming every free service**: one instance alone takes all of them in
  its first cycle (time of that cycle, services claimed);
* **steady state**: that instance holding them all, ``--cycles`` cycles
  (p50/p90/max wall time per cycle; WAL the database wrote per cycle);
* **three instances**: the services shared 3 ways, every instance's cycles
  timed; then one instance stops renewing and the cycle of a survivor that
  voids and takes its services over is timed;
* **renewal alone**: the statement each instance runs per period now (the
  heartbeat: its own row) beside the one it ran before the lease (an
  ``UPDATE`` of every claim row it holds), both under ``EXPLAIN (ANALYZE,
  WAL)`` in transactions rolled back.

WAL per cycle is read with ``pg_waldump`` (``bench/_wal.py``): only this
database's records count, whatever else the server is doing.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Sequence

import click
import psycopg

from bench import _wal, report
from bench._harness import DEFAULT_PG, create_database, drop_database
from ledgerq.claims import ClaimManager, ClaimSettings
from ledgerq.clock import ManualClock
from ledgerq.store import open_store

T0 = 1_700_000_000_000
PERIOD_MS = 1_000

_OPEN_BATCHES = """
INSERT INTO batches (service_id, batch_id, signer_public_key, trace, serialized_batch)
SELECT 'svc-' || lpad(g::text, 6, '0'), md5(g::text) || md5('b' || g), '02', false, ''
FROM generate_series(1, %(n)s) AS g
"""

#: The renewal before the lease: every claim row of the instance, each period.
_OLD_RENEW = """
UPDATE service_id_claims
SET expiry_1 = %(now)s + 5000, expiry_2 = %(now)s + 5500, updated_at = %(now)s
WHERE claimant = %(me)s
"""


def _pct(values: Sequence[float], p: float) -> float:
    return report.percentile(list(values), p)


def _ms(values: Sequence[float]) -> str:
    return (
        f"p50 {statistics.median(values):.1f} ms, p90 {_pct(values, 90):.1f} ms, "
        f"max {max(values):.1f} ms"
    )


async def _prepare(url: str, services: int) -> None:
    async with await open_store(url):
        pass
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_OPEN_BATCHES.encode(), {"n": services})
        conn.execute(
            "INSERT INTO service_id_claims (service_id, unclaimed_since, created_at, updated_at)"
            " SELECT DISTINCT service_id, %s::bigint, %s::bigint, %s::bigint FROM batches",
            (T0, T0, T0),
        )
        conn.execute("VACUUM ANALYZE")


def _manager(url: str, name: str, clock: ManualClock) -> ClaimManager:
    return ClaimManager(url, ClaimSettings(instance_id=name), clock=clock)


async def _timed(manager: ClaimManager) -> tuple[float, int]:
    started = time.perf_counter()
    report_ = await manager.cycle()
    return (time.perf_counter() - started) * 1000, report_.claim_count


def _explain_wal(url: str, sql: str, params: dict[str, object]) -> tuple[float, int]:
    """(execution ms, WAL bytes) of one statement, rolled back."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            ("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + sql).encode(), params
        ).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0][0]
    return float(plan["Execution Time"]), int(plan["Plan"].get("WAL Bytes", 0))


async def measure(url: str, services: int, cycles: int) -> dict[str, object]:
    clock = ManualClock(T0)
    out: dict[str, object] = {}
    a = _manager(url, "bench-a", clock)
    async with a:
        ms, held = await _timed(a)
        out["claim_all"] = (ms, held)
        times: list[float] = []
        mark = _wal.begin(url)
        for _ in report.track(range(cycles), "steady cycles, one instance", total=cycles):
            clock.advance(PERIOD_MS)
            ms, held = await _timed(a)
            times.append(ms)
        out["steady"] = times
        out["steady_held"] = held
        out["wal_per_cycle"] = None if mark is None else _wal.bytes_since(mark, url) / cycles
        # Renewal alone, now and before the lease, on the same rows.
        sql = _queries()["heartbeat"]
        out["heartbeat"] = _explain_wal(
            url,
            sql,
            {
                "me": "bench-a",
                "now": clock(),
                "address": None,
                "ttl_ms": 5_000,
                "slow_ttl_ms": 5_500,
            },
        )
        out["old_renew"] = _explain_wal(url, _OLD_RENEW, {"me": "bench-a", "now": clock()})
        # Three instances: b and c join; hand-over shares the services.
        b, c = _manager(url, "bench-b", clock), _manager(url, "bench-c", clock)
        async with b, c:
            for _ in range(12):
                clock.advance(PERIOD_MS)
                for m in (a, b, c):
                    await m.cycle()
            shared: list[float] = []
            for _ in report.track(range(cycles), "steady cycles, three instances", total=cycles):
                clock.advance(PERIOD_MS)
                for m in (a, b, c):
                    ms, _held = await _timed(m)
                    shared.append(ms)
            out["shared"] = shared
            out["shared_held"] = [len(m.claimed_services()) for m in (a, b, c)]
            # c stops renewing; a and b take its services over after the TTL.
            takeover: list[tuple[float, int, int]] = []
            for _ in range(8):
                clock.advance(PERIOD_MS)
                for m in (a, b):
                    started = time.perf_counter()
                    rep = await m.cycle()
                    took = (time.perf_counter() - started) * 1000
                    if rep.voided or rep.claimed:
                        takeover.append((took, len(rep.voided), len(rep.claimed)))
            out["takeover"] = takeover
            out["after_takeover"] = [len(m.claimed_services()) for m in (a, b)]
            out["deadlocks"] = sum(m.deadlocks for m in (a, b, c))
    return out


def _queries() -> dict[str, str]:
    from ledgerq.claims.queries import claim_queries

    return claim_queries()


@click.command("claims")
@click.option("--services", default=10_000, show_default=True, help="Claim rows (services).")
@click.option("--cycles", default=200, show_default=True, help="Timed cycles per case.")
@click.option("--pg", default=DEFAULT_PG, show_default=True, help="PostgreSQL admin URL.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(services: int, cycles: int, pg: str, write: bool) -> None:
    """Claim cycle cost with many services: claiming, steady renewal, takeover."""
    load_before = os.getloadavg()
    url = create_database(pg, "bench_claims")
    try:
        asyncio.run(_prepare(url, services))
        got = asyncio.run(measure(url, services, cycles))
    finally:
        drop_database(pg, url)
    load_after = os.getloadavg()
    claim_ms, claimed = got["claim_all"]  # type: ignore[misc]
    steady: list[float] = got["steady"]  # type: ignore[assignment]
    shared: list[float] = got["shared"]  # type: ignore[assignment]
    hb_ms, hb_wal = got["heartbeat"]  # type: ignore[misc]
    old_ms, old_wal = got["old_renew"]  # type: ignore[misc]
    wal = got["wal_per_cycle"]
    takeover: list[tuple[float, int, int]] = got["takeover"]  # type: ignore[assignment]
    rows = [
        [
            f"one instance claims {services:,} free services",
            f"{claimed:,} claimed in one cycle",
            f"{claim_ms:.0f} ms",
            "≤ 1 s, one cycle",
        ],
        [
            f"one instance holding {got['steady_held']:,}, {cycles} cycles",
            "steady (nothing moves)",
            _ms(steady),
            "p50 ≤ 20 ms",
        ],
        [
            "WAL written per steady cycle (this database's records, pg_waldump)",
            "mean over the cycles above",
            "n/a (WAL not readable)" if wal is None else f"{wal:,.0f} bytes",
            "≤ 1 KiB per renewal",
        ],
        [
            f"three instances holding {got['shared_held']}, {cycles} cycles each",
            "steady",
            _ms(shared),
            "",
        ],
    ]
    takeover_rows = [
        [
            "a survivor's cycle after one of three stopped",
            f"voided {v:,}, claimed {c:,}",
            f"{ms:.0f} ms",
            "",
        ]
        for ms, v, c in takeover
    ]
    renew_rows = [
        ["heartbeat (the lease: one row)", f"{hb_ms:.2f} ms", f"{hb_wal:,} bytes"],
        [
            f"before the lease: UPDATE of the {services:,} claim rows held",
            f"{old_ms:.1f} ms",
            f"{old_wal:,} bytes",
        ],
    ]
    text = "\n".join(
        [
            f"{services:,} services, each with one open batch; the real `ClaimManager` on one "
            "PostgreSQL database, time injected (1 s per cycle). Machine load average (1, 5, 15 "
            f"min) before: {', '.join(f'{x:.1f}' for x in load_before)}; after: "
            f"{', '.join(f'{x:.1f}' for x in load_after)} (a shared machine: other work ran "
            "meanwhile). Deadlocks reported to the claim managers: "
            f"{got['deadlocks']}.",
            "",
            report.table(["case", "what happened", "time per cycle", "target"], rows),
        ]
    )
    # The takeover's cycles and the renewal statement alone are printed, not written:
    # the section keeps the cases the targets name.
    detail = "\n".join(
        [
            report.table(["case", "what happened", "time per cycle", "target"], takeover_rows),
            "",
            "Renewal alone, `EXPLAIN (ANALYZE, WAL)` of the statement, rolled back:",
            "",
            report.table(["statement", "execution", "WAL"], renew_rows),
            "",
            f"After the takeover the survivors hold {got['after_takeover']}.",
        ]
    )
    click.echo(text)
    click.echo(detail)
    click.echo(json.dumps({k: v for k, v in got.items() if k not in ("steady", "shared")}))
    if write:
        report.write_section("claims", text)
