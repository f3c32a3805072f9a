"""End to end with declared dependencies: the ``intkey load`` shape (batches
whose transactions depend on transactions of earlier batches, posted out of
dependency order by concurrent posters) through `ledgerq serve` (its own
process) to a ledger that treats dependencies as a Sawtooth validator does
(the fault ledger: it holds a batch whose dependencies are not committed and
drops it silently later) and to `ledgerq node`. After each run: every batch
committed, each after the batches it depends on, no batch held by the ledger
nor dropped, no POST of a batch the ledger had (zero violations)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from harness import check_no_service_locked, gateway_proc, node_proc

from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan
from ledgerq.testing.intkey_load import IntkeyLoad

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STRATEGIES = ["serial", "parallel", "pipelined"]
DBS = ["sqlite", pytest.param("pg", marks=pytest.mark.pg)]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def _db(db: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if db == "sqlite":
        return f"sqlite:///{tmp_path}/gw.sqlite3"
    url: str = request.getfixturevalue("make_pg_database")()
    return url


async def _statuses(session: aiohttp.ClientSession, gateway: str, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i in range(0, len(ids), 100):
        async with session.post(f"{gateway}/batch_statuses", json=ids[i : i + 100]) as r:
            assert r.status == 200, await r.text()
            out.update({d["id"]: d["status"] for d in (await r.json())["data"]})
    return out


async def _until_final(
    session: aiohttp.ClientSession, gateway: str, load: IntkeyLoad, timeout_s: float
) -> dict[str, str]:
    ids = load.all_ids()
    statuses: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        statuses = await _statuses(session, gateway, ids)
        if all(statuses.get(b) in ("COMMITTED", "INVALID") for b in ids):
            break
        await asyncio.sleep(0.2)
    return statuses


@pytest.mark.parametrize("db", DBS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("shape", ["star", "chain"])
async def test_the_intkey_load_shape_commits_every_batch_after_its_dependencies(
    tmp_path: Path,
    session: aiohttp.ClientSession,
    request: pytest.FixtureRequest,
    db: str,
    strategy: str,
    shape: str,
) -> None:
    # A short hold: a batch the gateway sent too early would be dropped
    # within the run and show as a drop (and as a stall).
    plan = FaultPlan(commit_delay_ms=20, dependency_hold_s=20)
    load = IntkeyLoad(services=3, per_service=12, shape=shape, seed=7)
    async with FaultLedger(plan) as ledger:
        gateway = gateway_proc(
            tmp_path,
            _db(db, tmp_path, request),
            f"sawtooth+{ledger.url}",
            extra=["--strategy", strategy],
        )
        try:
            gw = await gateway.start()
            await load.post(session, gw, posters=5, per_post=5)
            statuses = await _until_final(session, gw, load, timeout_s=150)
            records = ledger.batches
            order = {b: r.commit_seq for b, r in records.items() if r.commit_seq is not None}
            problems = load.judge(statuses, order)
            assert problems == [], problems
            assert ledger.violations == [], ledger.violations[:3]
            assert ledger.counts["dropped_after_hold"] == 0
            assert ledger.counts["held"] == 0, "a batch was sent before its dependencies"
            await check_no_service_locked(session, gw)
        finally:
            await gateway.stop()


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_the_intkey_load_shape_through_the_gateway_to_the_node(
    tmp_path: Path, session: aiohttp.ClientSession, strategy: str
) -> None:
    node = node_proc(tmp_path)
    node_url = await node.start()
    load = IntkeyLoad(services=2, per_service=15, shape="star", seed=3)
    gateway = gateway_proc(
        tmp_path,
        f"sqlite:///{tmp_path}/gw.sqlite3",
        f"sawtooth+{node_url}",
        extra=["--strategy", strategy],
    )
    try:
        gw = await gateway.start()
        await load.post(session, gw, posters=5, per_post=5)
        statuses = await _until_final(session, gw, load, timeout_s=150)
        assert {statuses.get(b) for b in load.all_ids()} == {"COMMITTED"}
        await check_no_service_locked(session, gw)
    finally:
        await gateway.stop()
        await node.stop()
