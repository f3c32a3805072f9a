"""The commit → next POST merge, in a real gateway on a real store, against a
ledger with only the standard REST API (the fault ledger, which judges every
POST): when a batch becomes final, the same transaction records its
service's next batch taken, and that batch is posted once it committed.

Checked at every POST, from another connection to the database (so only
what is durable counts): every earlier batch of the service is final, the
batch posted is ``submitted``, nothing later is. And after the run: no POST
of a batch the ledger held, each service's batches in order, each posted
once. Every interval is an hour, so nothing seen here comes from a poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ledgerq import failpoints
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.config import load_settings
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers import HttpTimeouts, http_ledger_client
from ledgerq.ledgers.base import LedgerClient, SubmitResult
from ledgerq.store import BatchTrackingStore, open_store
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan

HOUR = "3600"


class WatchedLedger:
    """The gateway's ledger client, checking the store's durable state at each POST."""

    def __init__(self, inner: LedgerClient, reader: BatchTrackingStore) -> None:
        self._inner = inner
        self._reader = reader
        self.problems: list[str] = []
        self.posts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        self.posts += 1
        listed = (await self._reader.list_batches(service_id=service_id, limit=1000)).batches
        at = [b.batch_id for b in listed].index(batch_id)
        for earlier in listed[:at]:
            if not earlier.is_final:
                self.problems.append(f"{batch_id[:8]} posted before {earlier.batch_id[:8]} final")
        if not listed[at].submitted:
            self.problems.append(f"{batch_id[:8]} posted before recorded submitted")
        for later in listed[at + 1 :]:
            if later.submitted:
                self.problems.append(f"{later.batch_id[:8]} submitted with {batch_id[:8]}")
        return await self._inner.submit(service_id, batch_id, serialized_batch)


def _url(db: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if db == "pg":
        url: str = request.getfixturevalue("pg_url")
        return url
    return f"sqlite:///{tmp_path / 'gw.sqlite3'}"


class Run:
    def __init__(self, url: str, ledger: FaultLedger, tmp_path: Path, **env: str) -> None:
        self.url = url
        self.ledger = ledger
        self.settings = load_settings(
            {"db": url, "ledger": f"sawtooth+{ledger.url}", "bind": "127.0.0.1:0"},
            environ={
                "LEDGERQ_MONITOR_POLL_INTERVAL_S": HOUR,
                "LEDGERQ_SUBMITTER_POLL_TIMEOUT_S": HOUR,
                **env,
            },
            cwd=tmp_path,
        )
        self.signer = Signer.generate()
        self.order: dict[str, list[str]] = {}

    async def post(self, http: aiohttp.ClientSession, port: int, services: int, per: int) -> None:
        for s in range(services):
            name = f"k{s}"
            batches = [
                make_intkey_batch(self.signer, [("set", name, 0) if n == 0 else ("inc", name, 1)])
                for n in range(per)
            ]
            self.order[name] = [b.header_signature for b in batches]
            async with http.post(
                f"http://127.0.0.1:{port}/batches",
                params={"service_id": f"svc-{s}"},
                data=encode_batch_list([b.serialized for b in batches]),
                headers={"Content-Type": "application/octet-stream"},
            ) as r:
                assert r.status == 202, await r.text()

    async def until(self, cond: Callable[[], bool], what: str) -> None:
        for _ in range(3000):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"not reached: {what}; ledger counts {self.ledger.counts}")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def _serve(
    run: Run, store: BatchTrackingStore, reader: BatchTrackingStore
) -> tuple[Gateway, WatchedLedger, asyncio.Task[None]]:
    client = WatchedLedger(
        http_ledger_client(run.settings.ledger, HttpTimeouts(connect=3, submit=10)), reader
    )
    gateway = Gateway(run.settings, store, client)  # type: ignore[arg-type]
    task = asyncio.create_task(gateway.run())
    await asyncio.wait_for(gateway.started.wait(), 30)
    return gateway, client, task


async def _stop(gateway: Gateway, task: asyncio.Task[None], client: Any) -> None:
    gateway.stop()
    await asyncio.wait_for(task, 60)
    await client.close()


@pytest.mark.parametrize("db", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
async def test_each_next_batch_is_taken_with_its_predecessors_final_status(
    tmp_path: Path, http: aiohttp.ClientSession, db: str, request: pytest.FixtureRequest
) -> None:
    services, per = 6, 5
    async with FaultLedger(FaultPlan(commit_delay_ms=5)) as ledger:
        run = Run(_url(db, tmp_path, request), ledger, tmp_path)
        async with await open_store(run.url) as store, await open_store(run.url) as reader:
            gateway, client, task = await _serve(run, store, reader)
            try:
                assert gateway.port is not None
                await run.post(http, gateway.port, services, per)
                total = services * per
                await run.until(lambda: ledger.progress()["final"] == total, "all final")
                # The last final status is written after the ledger said so.
                for _ in range(3000):
                    listed = (await store.list_batches(limit=1000)).batches
                    if all(b.is_final for b in listed):
                        break
                    await asyncio.sleep(0.01)
            finally:
                await _stop(gateway, task, client)
            assert client.problems == []
            assert ledger.violations == []
            for name, ids in run.order.items():
                assert ledger.state.order[name] == ids, f"{name} out of order"
                assert ledger.state.values[name] == per - 1
            assert {r.posts for r in ledger.batches.values()} == {1}
            # Every batch after a service's first went out with its
            # predecessor's final status; no poll and no scan moved anything.
            assert gateway.producer.taken_with_final == services * (per - 1)
            assert gateway.producer.follower.scans == 1
            assert {b.attempts for b in listed} == {1}
            assert all(b.is_final for b in listed)


@pytest.mark.parametrize("db", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
async def test_a_batch_taken_but_not_posted_is_asked_about_before_it_is_posted(
    tmp_path: Path,
    http: aiohttp.ClientSession,
    db: str,
    request: pytest.FixtureRequest,
) -> None:
    # The store fails right after a batch was recorded taken with its
    # predecessor's final status, before its POST: as after a crash there,
    # the batch is {submitted} and nobody knows whether the ledger has it.
    # It must be asked about (UNKNOWN) before it is posted, and posted once.
    async with FaultLedger(FaultPlan(commit_delay_ms=5)) as ledger:
        run = Run(
            _url(db, tmp_path, request),
            ledger,
            tmp_path,
            LEDGERQ_MONITOR_POLL_INTERVAL_S="0.2",
        )
        failpoints.configure({failpoints.ENV: "taken_with_final=drop@2"})
        try:
            async with await open_store(run.url) as store, await open_store(run.url) as reader:
                gateway, client, task = await _serve(run, store, reader)
                try:
                    assert gateway.port is not None
                    await run.post(http, gateway.port, 3, 4)
                    await run.until(lambda: ledger.progress()["final"] == 12, "all final")
                finally:
                    await _stop(gateway, task, client)
                listed = (await store.list_batches(limit=1000)).batches
        finally:
            failpoints.configure({})
        assert client.problems == []
        assert ledger.violations == []
        for name, ids in run.order.items():
            assert ledger.state.order[name] == ids
        assert {r.posts for r in ledger.batches.values()} == {1}
        (dropped,) = [b for b in listed if b.attempts == 2]
        record = ledger.batches[dropped.batch_id]
        assert record.first_post_ms is not None
        assert ledger.first_answer_ms[dropped.batch_id] < record.first_post_ms
        assert gateway.producer.taken_with_final >= 1
