"""End to end with the parallel strategy: `ledgerq serve --strategy parallel` (its own
process) against a ledger that judges order per key, and against `ledgerq node`.

* **Fault ledger** (Sawtooth's REST API only, faults on): every batch of a
  service touches one of its 4 names, in chains of ``set`` then ``inc``\\ s.
  Judged: no POST of a batch the ledger held, no two conflicting batches
  pending at the ledger together (``judge_overlaps``), every name's batches
  committed in acceptance order with its exact final value, and batches of
  one service were pending together (the strategy did something).
* **Node**: random operations (``set``/``inc``/``dec``, one or two names per
  batch, some invalid) end with the same verdict for every batch and the same
  value for every name as applying each service's batches one at a time in
  acceptance order (``KeyedWorkload.serial``, the serial oracle).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import cbor2
import pytest
from harness import FAST_GATEWAY_ENV, Proc, check_no_service_locked, node_proc
from prometheus_client.parser import text_string_to_metric_families

from ledgerq.codec.intkey import make_address
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan
from ledgerq.testing.workload import KeyedWorkload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def parallel_gateway(tmp: Path, db: str, ledger: str) -> Proc:
    args = ["serve", "--db", db, "--ledger", ledger, "--bind", "127.0.0.1:0"]
    args += ["--strategy", "parallel"]
    return Proc(args, tmp / "gateway.log", env={**FAST_GATEWAY_ENV, "LEDGERQ_CONFIG": ""})


async def wait_final(
    session: aiohttp.ClientSession, gateway: str, workload: KeyedWorkload, timeout_s: float
) -> dict[str, str]:
    """Ask the gateway until every batch is final; batch id → Sawtooth status."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    final: dict[str, str] = {}
    while len(final) < len(workload.all_ids()) and loop.time() < deadline:
        for service, bs in workload.batches.items():
            ids = [b.header_signature for b in bs if b.header_signature not in final]
            if not ids:
                continue
            async with session.get(
                f"{gateway}/batch_statuses",
                params={"id": ",".join(ids), "service_id": service, "wait": "1"},
            ) as resp:
                assert resp.status == 200, await resp.text()
                for entry in (await resp.json())["data"]:
                    if entry["status"] in ("COMMITTED", "INVALID"):
                        final[entry["id"]] = entry["status"]
    return final


async def taken_with_final(session: aiohttp.ClientSession, gateway: str, how: str) -> float:
    """The gateway's ``ledgerq_batches_taken_with_final_total{how=...}``."""
    async with session.get(f"{gateway}/metrics") as resp:
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "ledgerq_batches_taken_with_final_total"
                and sample.labels.get("how") == how
            ):
                return sample.value
    raise AssertionError(f"no ledgerq_batches_taken_with_final_total{{how={how!r}}}")


@pytest.mark.parametrize("db", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
async def test_parallel_keeps_each_key_in_order_against_a_judging_ledger(
    tmp_path: Path, session: aiohttp.ClientSession, db: str, request: pytest.FixtureRequest
) -> None:
    plan = FaultPlan(
        commit_delay_ms=40,
        busy_503=0.06,
        busy_429=0.03,
        drop_after_accept=0.06,
        error_500_after_accept=0.03,
        forget=0.04,
        status_503=0.03,
    )
    workload = KeyedWorkload(services=6, per_service=24, names=4, seed=3)
    async with FaultLedger(plan, seed=17, judge_overlaps=True, each_fault_once=True) as ledger:
        url = request.getfixturevalue("pg_url") if db == "pg" else f"sqlite:///{tmp_path}/gw.db"
        gateway = parallel_gateway(tmp_path, url, f"sawtooth+{ledger.url}")
        try:
            await gateway.start()
            await workload.post(session, gateway.url, waves=2)
            final = await wait_final(session, gateway.url, workload, timeout_s=200)
            assert gateway.process is not None and gateway.process.returncode is None
            expected = workload.serial()
            assert final == expected.statuses, ledger.counts
            assert ledger.violations == [], [
                (v, ledger.batches[v.batch_id].report()) for v in ledger.violations[:5]
            ]
            assert ledger.overlaps == [], ledger.overlaps[:5]
            assert ledger.state.order == expected.order
            assert ledger.state.values == expected.values
            # Several batches of a service were with the ledger at once.
            assert ledger.peak_pending > workload.services, ledger.peak_pending
            for fault in ("busy_503", "dropped_after_accept", "forgotten"):
                assert ledger.counts[fault] > 0, ledger.counts
            if db == "pg":
                # On PostgreSQL a final status takes the batches it frees in
                # its own transaction (docs/queuer.md): that path ran here.
                freed = await taken_with_final(session, gateway.url, "freed")
                assert freed > 0, freed
            await check_no_service_locked(session, gateway.url)
        finally:
            await gateway.stop()


async def test_parallel_through_the_node_ends_as_a_serial_run(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    workload = KeyedWorkload(services=5, per_service=30, names=6, mix="random", seed=5)
    expected = workload.serial()
    assert "INVALID" in expected.statuses.values()  # the order decides something
    node = node_proc(tmp_path, commit_delay_ms=30)
    await node.start()
    gateway = parallel_gateway(tmp_path, f"sqlite:///{tmp_path}/gw.db", f"sawtooth+{node.url}")
    try:
        await gateway.start()
        await workload.post(session, gateway.url, waves=3)
        final = await wait_final(session, gateway.url, workload, timeout_s=200)
        assert final == expected.statuses
        for s in range(workload.services):
            for k in range(workload.names):
                name = workload.name(s, k)
                async with session.get(f"{node.url}/state/{make_address(name)}") as resp:
                    if name not in expected.values:
                        assert resp.status == 404, (name, await resp.text())
                        continue
                    assert resp.status == 200, await resp.text()
                    value = cbor2.loads(base64.b64decode((await resp.json())["data"]))
                assert value == {name: expected.values[name]}, name
        await check_no_service_locked(session, gateway.url)
    finally:
        await gateway.stop()
        await node.stop()
