"""End to end against a ledger that is not ours: `ledgerq serve` (its own process) →
the fault ledger (Sawtooth's REST API only: no /events, no /subscriptions), which
judges every POST. After each scenario: no POST of a batch the ledger held
(zero violations), every batch committed, each key's batches committed in the
order they were accepted, each key's final value exact (nothing twice), the
gateway process alive throughout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psycopg
import pytest
from harness import (
    FAST_GATEWAY_ENV,
    Proc,
    Workload,
    check_no_service_locked,
    gateway_proc,
    wait_all_final,
)

from ledgerq.store import open_store
from ledgerq.testing.fault_ledger import MALFORMED_KINDS, FaultLedger, FaultPlan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def judge(
    session: aiohttp.ClientSession,
    gateway: Proc,
    ledger: FaultLedger,
    workload: Workload,
) -> None:
    final = await wait_all_final(session, gateway.url, workload, timeout_s=150)
    assert gateway.process is not None and gateway.process.returncode is None, "gateway died"
    missing = [b for b in workload.all_ids() if b not in final]
    assert not missing, f"{len(missing)} batches not final; ledger counts {ledger.counts}"
    assert ledger.violations == [], f"POSTs of batches the ledger held: {ledger.violations[:5]}"
    assert {s for s in final.values()} == {"COMMITTED"}
    for s, (_service, batches) in enumerate(workload.batches.items()):
        name = workload.name(s)
        assert ledger.state.order[name] == [bid for bid, _ in batches], f"{name} out of order"
        assert ledger.state.values[name] == workload.per_service - 1
    await check_no_service_locked(session, gateway.url)


async def lock_entries_written(url: str) -> tuple[bool, int]:
    """Whether the database keeps the parallel queuer's lock entries, and how
    many entries were ever written. The gateway's sessions report their
    statistics as they end: read once every other session of the database
    has ended (autocommit, so that each read sees them anew)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(200):
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            others = await cur.fetchone()
            if others is not None and others[0] == 0:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the gateway's sessions did not end")
        cur = await conn.execute("SELECT kept FROM lock_entries_kept")
        kept = await cur.fetchone()
        cur = await conn.execute(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'batch_locks'"
        )
        entries = await cur.fetchone()
    assert kept is not None and entries is not None
    return bool(kept[0]), int(entries[0])


@pytest.mark.parametrize("db", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
async def test_ambiguous_posts_are_asked_about_never_resent_blindly(
    tmp_path: Path, session: aiohttp.ClientSession, db: str, request: pytest.FixtureRequest
) -> None:
    plan = FaultPlan(
        commit_delay_ms=20,
        drop_after_accept=0.12,
        error_500_after_accept=0.05,
        busy_503=0.08,
        busy_429=0.04,
        forget=0.05,
        status_503=0.03,
    )
    # Every fault of the plan happens at least once, whatever the timing.
    async with FaultLedger(plan, seed=11, each_fault_once=True) as ledger:
        url = request.getfixturevalue("pg_url") if db == "pg" else f"sqlite:///{tmp_path}/gw.db"
        gateway = gateway_proc(tmp_path, url, f"sawtooth+{ledger.url}")
        try:
            await gateway.start()
            workload = Workload(services=12, per_service=6)
            await workload.post(session, gateway.url, waves=2)
            await judge(session, gateway, ledger, workload)
            for fault in ("dropped_after_accept", "error_500_after_accept", "forgotten"):
                assert ledger.counts[fault] > 0, ledger.counts
            # Some batches were sent again, each only after the ledger forgot it.
            assert any(r.posts > 1 for r in ledger.batches.values())
        finally:
            await gateway.stop()
        if db == "pg":
            # Every service serial: none of the gateway's stores (its own, the
            # claim thread's) turned the parallel queuer's lock entries on.
            assert await lock_entries_written(url) == (False, 0)


@pytest.mark.parametrize("db", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
async def test_404s_and_malformed_bodies_for_a_while_change_nothing(
    tmp_path: Path, session: aiohttp.ClientSession, db: str, request: pytest.FixtureRequest
) -> None:
    plan = FaultPlan(commit_delay_ms=20, drop_after_accept=0.05, busy_503=0.05, forget=0.03)
    async with FaultLedger(plan, seed=5, each_fault_once=True) as ledger:
        url = request.getfixturevalue("pg_url") if db == "pg" else f"sqlite:///{tmp_path}/gw.db"
        gateway = gateway_proc(tmp_path, url, f"sawtooth+{ledger.url}")
        try:
            await gateway.start()
            # "A while" counted in requests, not seconds: the first requests
            # (posts and status reads alike) answer 404, the status reads
            # after them malformed bodies of every kind. Every batch needs a
            # post and a status read, so both counts are used up.
            ledger.fault_next(not_found=10, malformed_statuses=len(MALFORMED_KINDS))
            workload = Workload(services=12, per_service=6)
            await workload.post(session, gateway.url, waves=2)
            await wait_all_final(session, gateway.url, workload, timeout_s=60)
            await judge(session, gateway, ledger, workload)
            assert ledger.counts["not_found"] == 10, ledger.counts
            malformed = {k for k, n in ledger.counts.items() if k.startswith("malformed_") and n}
            assert malformed == {f"malformed_{k}" for k in MALFORMED_KINDS}, ledger.counts
        finally:
            await gateway.stop()


async def test_a_wrong_url_leaves_every_batch_waiting_and_says_why(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    async with FaultLedger(FaultPlan(commit_delay_ms=5, not_found=True)) as ledger:
        gateway = gateway_proc(tmp_path, f"sqlite:///{tmp_path}/gw.db", f"sawtooth+{ledger.url}")
        try:
            await gateway.start()
            workload = Workload(services=3, per_service=3)
            await workload.post(session, gateway.url, waves=1)
            # Wait until every service shows the ledger's answer as its problem.
            problems: list[dict[str, object]] = []
            for _ in range(400):
                async with session.get(f"{gateway.url}/services") as r:
                    rows = (await r.json())["data"]
                problems = [r["ledger_problem"] for r in rows if r["ledger_problem"]]
                if len(problems) == 3:
                    break
                await asyncio.sleep(0.02)
            assert len(problems) == 3, rows
            assert {p["cause"] for p in problems} == {"HTTP 404"}
            async with session.get(f"{gateway.url}/tracking/batches?limit=100") as r:
                batches = (await r.json())["data"]
            assert not [b for b in batches if b["status"] in ("Invalid", "Committed")]
            # The operator fixes it: everything commits, in order, and nothing twice.
            ledger.plan = ledger.plan.updated({"not_found": False})
            await judge(session, gateway, ledger, workload)
            async with session.get(f"{gateway.url}/services") as r:
                assert not [r for r in (await r.json())["data"] if r["ledger_problem"]]
        finally:
            await gateway.stop()


@pytest.mark.parametrize("db", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
async def test_killed_after_a_final_status_took_the_next_batch_before_its_post(
    tmp_path: Path, session: aiohttp.ClientSession, db: str, request: pytest.FixtureRequest
) -> None:
    # The gateway dies right after the transaction that made a batch final
    # and recorded its service's next batch taken, before that batch's POST.
    # The next instance must ask the ledger about it (UNKNOWN) before it is
    # posted, post it once, and keep every service in order.
    async with FaultLedger(FaultPlan(commit_delay_ms=20)) as ledger:
        url = request.getfixturevalue("pg_url") if db == "pg" else f"sqlite:///{tmp_path}/gw.db"
        args = ["serve", "--db", url, "--ledger", f"sawtooth+{ledger.url}", "--bind"]
        env = {**FAST_GATEWAY_ENV, "LEDGERQ_CONFIG": ""}
        gateway = Proc(
            [*args, "127.0.0.1:0"],
            tmp_path / "gateway.log",
            env={**env, "LEDGERQ_FAILPOINTS": "taken_with_final=kill@4"},
        )
        try:
            await gateway.start()
            workload = Workload(services=6, per_service=5)
            await workload.post(session, gateway.url, waves=1)
            assert gateway.process is not None
            await asyncio.wait_for(gateway.process.wait(), 60)  # killed at the failpoint
            gateway = Proc([*args, "127.0.0.1:0"], tmp_path / "gateway2.log", env=env)
            await gateway.start()
            await judge(session, gateway, ledger, workload)
            async with await open_store(url) as store:
                listed = (await store.list_batches(limit=1000)).batches
        finally:
            await gateway.stop()
        # Taken (attempts) more often than posted: the take the kill cut short.
        cut = [b for b in listed if b.attempts > ledger.batches[b.batch_id].posts]
        assert cut, [(b.attempts, ledger.batches[b.batch_id].posts) for b in listed]
        for b in cut:
            record = ledger.batches[b.batch_id]
            assert record.posts == 1 and record.first_post_ms is not None
            assert ledger.first_answer_ms[b.batch_id] < record.first_post_ms
