"""End to end over real HTTP: `ledgerq serve` → (fault proxy) → `ledgerq node`, each
its own process. After every scenario: every accepted batch is COMMITTED (the
workload is valid only in order, so a reorder would show as INVALID), per-service
ledger order equals creation order, nothing executed twice, no service locked."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from fault_proxy import Fault, FaultProxy
from harness import (
    Proc,
    Workload,
    check_ledger,
    check_no_service_locked,
    gateway_proc,
    node_proc,
    resubmitted,
    wait_all_final,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def finish(
    session: aiohttp.ClientSession, gateway: str, node: str, workload: Workload
) -> None:
    final = await wait_all_final(session, gateway, workload, timeout_s=90)
    missing = [b for b in workload.all_ids() if b not in final]
    assert not missing, f"{len(missing)} batches not final"
    invalid = [b for b, s in final.items() if s != "COMMITTED"]
    assert not invalid, f"{len(invalid)} batches INVALID: reordered or lost"
    await check_ledger(session, node, workload)
    await check_no_service_locked(session, gateway)


async def test_ordered_batches_commit_in_order(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = node_proc(tmp_path)
    node_url = await node.start()
    gateway = gateway_proc(tmp_path, f"sqlite:///{tmp_path}/gw.sqlite3", f"sawtooth+{node_url}")
    try:
        gw = await gateway.start()
        workload = Workload(services=20, per_service=5)
        await workload.post(session, gw, waves=3)
        await finish(session, gw, node_url, workload)
    finally:
        await gateway.stop()
        await node.stop()


def random_faults(seed: int) -> object:
    rng = random.Random(seed)
    table = [
        (0.15, Fault.BUSY_503),
        (0.05, Fault.BUSY_429),
        (0.05, Fault.DROP_BEFORE),
        (0.05, Fault.DROP_AFTER),
        (0.03, Fault.SLOW),
    ]

    # The faults a test counts on come first, whatever the timing; then the
    # random rolls.
    first = [Fault.BUSY_503, Fault.DROP_BEFORE, Fault.DROP_AFTER]

    def policy(method: str, path: str, n: int) -> Fault:
        if path == "/batch_statuses":
            return Fault.BUSY_503 if rng.random() < 0.05 else Fault.PASS
        if method != "POST" or path != "/batches":
            return Fault.PASS
        if first:
            return first.pop(0)
        r = rng.random()
        for p, fault in table:
            if r < p:
                return fault
            r -= p
        return Fault.PASS

    return policy


@pytest.mark.parametrize("db", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
async def test_faults_between_gateway_and_node(
    tmp_path: Path, session: aiohttp.ClientSession, db: str, request: pytest.FixtureRequest
) -> None:
    node = node_proc(tmp_path, commit_delay_ms=20)
    node_url = await node.start()
    proxy = FaultProxy(node_url, random_faults(7), delay_s=1.5)  # type: ignore[arg-type]
    proxy_url = await proxy.start()
    url = request.getfixturevalue("pg_url") if db == "pg" else f"sqlite:///{tmp_path}/gw.sqlite3"
    gateway = gateway_proc(tmp_path, url, f"sawtooth+{proxy_url}")
    try:
        gw = await gateway.start()
        workload = Workload(services=12, per_service=5)
        await workload.post(session, gw, waves=2)
        await finish(session, gw, node_url, workload)
        for fault in (Fault.BUSY_503, Fault.DROP_BEFORE, Fault.DROP_AFTER):
            assert proxy.counts[fault] > 0, proxy.counts
        assert await resubmitted(session, gw) > 0
    finally:
        await gateway.stop()
        await proxy.close()
        await node.stop()


async def test_node_restarted_ephemeral_forgets_pending(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    # A long commit delay keeps batches PENDING when the node dies.
    node = node_proc(tmp_path, ephemeral=True, commit_delay_ms=300)
    node_url = await node.start()
    proxy = FaultProxy(node_url)
    proxy_url = await proxy.start()
    gateway = gateway_proc(tmp_path, f"sqlite:///{tmp_path}/gw.sqlite3", f"sawtooth+{proxy_url}")
    try:
        gw = await gateway.start()
        workload = Workload(services=12, per_service=4)
        await workload.post(session, gw, waves=1)
        await _until_some_pending(session, gw)
        await node.kill()
        node = node_proc(tmp_path, ephemeral=True, commit_delay_ms=10)
        proxy.upstream = await node.start()
        await finish(session, gw, proxy.upstream, workload)
        # The forgotten batches were found UNKNOWN and sent again.
        assert await resubmitted(session, gw) > 0
    finally:
        await gateway.stop()
        await proxy.close()
        await node.stop()


async def test_gateway_killed_and_restarted_mid_run(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = node_proc(tmp_path, commit_delay_ms=50)
    node_url = await node.start()
    db = f"sqlite:///{tmp_path}/gw.sqlite3"
    gateway: Proc = gateway_proc(tmp_path, db, f"sawtooth+{node_url}")
    try:
        gw = await gateway.start()
        port = int(gw.rsplit(":", 1)[1])
        workload = Workload(services=20, per_service=6)
        await workload.post(session, gw, waves=1)
        await _until_some_pending(session, gw)
        await gateway.kill()
        gateway = gateway_proc(tmp_path, db, f"sawtooth+{node_url}", port=port)
        gw = await gateway.start()
        await finish(session, gw, node_url, workload)
    finally:
        await gateway.stop()
        await node.stop()


async def _until_some_pending(session: aiohttp.ClientSession, gw: str) -> None:
    for _ in range(200):
        async with session.get(
            f"{gw}/tracking/batches", params={"status": "Pending", "limit": "5"}
        ) as r:
            if (await r.json())["data"]:
                return
        await asyncio.sleep(0.01)
    raise AssertionError("no batch became Pending")
