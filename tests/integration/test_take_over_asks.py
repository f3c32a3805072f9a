"""The slow path of a take-over, against the fault ledger: the batches a dead
instance left mid-submission are asked about in one status read while their
claims move, the answers recorded together, and nothing the ledger holds is
POSTed again (the fault ledger counts such a POST as a violation)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from ledgerq.claims import ClaimManager, ClaimSettings
from ledgerq.clock import ManualClock
from ledgerq.codec import Signer
from ledgerq.codec.decode import to_tracking_batch
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.config import load_settings
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers import HttpTimeouts, http_ledger_client
from ledgerq.ledgers.base import Accepted, LedgerBatchStatus
from ledgerq.model import BatchStatusName, BatchWrite
from ledgerq.store import open_store
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan
from tests.integration.claims_helpers import T0, claimants, manager

pytestmark = pytest.mark.pg

SIGNER = Signer.generate()


@pytest.mark.parametrize("commit_delay_ms", [0, 60_000])
async def test_batches_left_mid_submission_are_asked_about_together_as_the_claims_move(
    pg_url: str, tmp_path: Path, commit_delay_ms: int
) -> None:
    # "held": its first batch reached the ledger (committed at once, or still
    # pending a minute later), "lost": its first batch never did. Each has a
    # second batch behind it, and "idle" one queued batch (the fast path).
    batches = {
        (service, n): to_tracking_batch(
            make_intkey_batch(SIGNER, [("set" if n == 1 else "inc", f"{service}-k", 1)]),
            service,
            created_at=T0 + n,
        )
        for service in ("held", "lost")
        for n in (1, 2)
    }
    idle = to_tracking_batch(make_intkey_batch(SIGNER, [("set", "idle-k", 1)]), "idle", T0)
    h1, l1 = batches["held", 1], batches["lost", 1]
    plan = FaultPlan(commit_delay_ms=commit_delay_ms)
    async with FaultLedger(plan) as ledger, await open_store(pg_url) as store:
        await store.add_batches([*batches.values(), idle], now=T0)
        settings = load_settings(
            {"db": pg_url, "ledger": f"sawtooth+{ledger.url}", "bind": "127.0.0.1:0"},
            environ={},
            cwd=tmp_path,
        )
        client = http_ledger_client(settings.ledger, HttpTimeouts(connect=3, submit=10))
        reads: list[tuple[str, ...]] = []
        read = client.batch_statuses

        async def spy_read(
            service_id: str, ids: Sequence[str], *, wait_s: float = 0.0
        ) -> tuple[LedgerBatchStatus, ...]:
            reads.append(tuple(ids))
            return await read(service_id, ids, wait_s=wait_s)

        client.batch_statuses = spy_read  # type: ignore[method-assign]
        groups: list[list[BatchWrite]] = []
        apply = store.apply_writes

        async def spy_apply(writes: Sequence[BatchWrite]) -> list[object]:
            groups.append(list(writes))
            return await apply(writes)  # type: ignore[return-value]

        store.apply_writes = spy_apply  # type: ignore[method-assign]
        clock = ManualClock(T0)
        a, b = manager(pg_url, "a", clock), manager(pg_url, "b", clock)
        async with a, b:
            await a.cycle()  # a claims all three, then dies mid-submission:
            for batch in (h1, l1):
                await store.change_batch_to_submitted(
                    batch.batch_id, batch.service_id, now=T0, fence=a.fence_for(batch.service_id)
                )
            assert await client.submit("held", h1.batch_id, h1.serialized_batch) == Accepted()
            await b.cycle()  # b's first renewal: it holds nothing yet
            gateway = Gateway(settings, store, client, claims=b)
            task = asyncio.create_task(gateway.run())
            try:
                # b renews every second; a's services move at a's first expiry
                # (idle, fast path) and second expiry (the slow path).
                for step in (1_000,) * 5 + (a.settings.slow_ttl_ms - a.settings.ttl_ms,):
                    clock.advance(step)
                    await b.cycle()
                assert claimants(pg_url) == {"held": "b", "lost": "b", "idle": "b"}
                want = BatchStatusName.PENDING if commit_delay_ms else BatchStatusName.COMMITTED
                async with asyncio.timeout(60):
                    while True:
                        got = {
                            bid: await store.get_batch(bid, s)
                            for s, bid in (("held", h1.batch_id), ("lost", l1.batch_id))
                        }
                        lost = got[l1.batch_id]
                        held = got[h1.batch_id]
                        if (
                            lost is not None
                            # Resent under its own id: accepted (with the
                            # ledger committing a minute later), or committed.
                            and lost.status_name is want
                            and held is not None
                            and held.status_name is want
                        ):
                            break
                        await asyncio.sleep(0.05)
            finally:
                gateway.stop()
                await asyncio.wait_for(task, 60)
                await client.close()
    # Asked about in one read, both services' batches...
    assert any({h1.batch_id, l1.batch_id} <= set(ids) for ids in reads), reads
    assert gateway.take_over.asked == 2 and gateway.take_over.applied == 2
    # ...the answers recorded in one transaction: "held" as the ledger has it,
    # "lost" Unknown (then resent under its own id).
    answered = [
        {w.id: w.status for w in group if not w.attempt and w.id in (h1.batch_id, l1.batch_id)}
        for group in groups
    ]
    together = [g for g in answered if len(g) == 2]
    assert together, answered
    first = together[0]
    assert getattr(first[l1.batch_id], "name", None) is BatchStatusName.UNKNOWN
    assert getattr(first[h1.batch_id], "name", None) is want
    # The held batch was never POSTed again; the lost one once, by its new holder.
    assert ledger.violations == []
    report = ledger.report()["batches"]
    assert report[h1.batch_id]["posts"] == 1
    assert report[l1.batch_id]["posts"] == 1


async def test_with_the_claim_cycles_on_their_thread_the_answers_are_recorded_there(
    pg_url: str, tmp_path: Path
) -> None:
    # As a gateway runs it: b's claim cycles on their own thread, which reads
    # the ledger's answers and records them with a store of its own under
    # the new claims' fences; the gateway's writer only resends what the
    # ledger lost. Real time, short claim timings.
    timings = {"renew_interval_ms": 200, "ttl_ms": 1_000, "slow_ttl_ms": 1_200}
    batches = {
        (service, n): to_tracking_batch(
            make_intkey_batch(SIGNER, [("set" if n == 1 else "inc", f"{service}-t", 1)]),
            service,
            created_at=T0 + n,
        )
        for service in ("held", "lost")
        for n in (1, 2)
    }
    h1, l1 = batches["held", 1], batches["lost", 1]
    async with (
        FaultLedger(FaultPlan(commit_delay_ms=0)) as ledger,
        await open_store(pg_url) as store,
    ):
        await store.add_batches(list(batches.values()), now=T0)
        settings = load_settings(
            {"db": pg_url, "ledger": f"sawtooth+{ledger.url}", "bind": "127.0.0.1:0"},
            environ={},
            cwd=tmp_path,
        )
        client = http_ledger_client(settings.ledger, HttpTimeouts(connect=3, submit=10))
        mine: list[BatchWrite] = []
        apply = store.apply_writes

        async def spy_apply(writes: Sequence[BatchWrite]) -> list[object]:
            mine.extend(writes)
            return await apply(writes)  # type: ignore[return-value]

        a = ClaimManager(pg_url, ClaimSettings(instance_id="a", **timings))
        b = ClaimManager(pg_url, ClaimSettings(instance_id="b", **timings))
        async with a, b:
            await a.cycle()  # a claims both, then dies mid-submission
            for batch in (h1, l1):
                await store.change_batch_to_submitted(
                    batch.batch_id, batch.service_id, fence=a.fence_for(batch.service_id)
                )
            assert await client.submit("held", h1.batch_id, h1.serialized_batch) == Accepted()
            await b.cycle()
            # The gateway's writes from here on (the set-up's were a's).
            store.apply_writes = spy_apply  # type: ignore[method-assign]
            gateway = Gateway(settings, store, client, claims=b)
            tasks = [asyncio.create_task(gateway.run()), asyncio.create_task(b.run())]
            try:
                async with asyncio.timeout(60):
                    while True:
                        got = [
                            await store.get_batch(x.batch_id, x.service_id)
                            for x in batches.values()
                        ]
                        if all(
                            g is not None and g.status_name is BatchStatusName.COMMITTED
                            for g in got
                        ):
                            break
                        await asyncio.sleep(0.05)
            finally:
                gateway.stop()
                b.stop()
                await asyncio.wait_for(asyncio.gather(*tasks), 60)
                await client.close()
        assert claimants(pg_url) == {"held": None, "lost": None}  # released at the end
    assert gateway.take_over.asked == 2 and gateway.take_over.applied == 2
    # The answers did not go through the gateway's writer: "held" was never
    # written there (the claim thread recorded it Committed), "lost" only from
    # its resend on (the claim thread recorded it Unknown).
    assert [w for w in mine if w.id == h1.batch_id] == []
    lost = [w for w in mine if w.id == l1.batch_id]
    assert lost and lost[0].attempt, lost
    assert ledger.violations == []
    report = ledger.report()["batches"]
    assert report[h1.batch_id]["posts"] == 1
    assert report[l1.batch_id]["posts"] == 1


async def test_the_next_batches_of_services_taken_over_with_work_come_from_the_claim_thread(
    pg_url: str, tmp_path: Path
) -> None:
    # The fast path as a gateway runs it: b's claim thread takes a's services
    # with work over at the first expiry, reads their next batches with its
    # own store and hands them to the queue; every batch is committed once,
    # in order (an intkey inc before its set is invalid).
    timings = {"renew_interval_ms": 200, "ttl_ms": 1_000, "slow_ttl_ms": 1_200}
    batches = [
        to_tracking_batch(
            make_intkey_batch(SIGNER, [("set" if n == 1 else "inc", f"{service}-t", 1)]),
            service,
            created_at=T0 + n,
        )
        for service in ("s1", "s2", "s3")
        for n in (1, 2, 3)
    ]
    async with (
        FaultLedger(FaultPlan(commit_delay_ms=0)) as ledger,
        await open_store(pg_url) as store,
    ):
        await store.add_batches(batches, now=T0)
        settings = load_settings(
            {"db": pg_url, "ledger": f"sawtooth+{ledger.url}", "bind": "127.0.0.1:0"},
            environ={},
            cwd=tmp_path,
        )
        client = http_ledger_client(settings.ledger, HttpTimeouts(connect=3, submit=10))
        a = ClaimManager(pg_url, ClaimSettings(instance_id="a", **timings))
        b = ClaimManager(pg_url, ClaimSettings(instance_id="b", **timings))
        async with a, b:
            await a.cycle()  # a claims them all, then dies before submitting
            assert set(claimants(pg_url).values()) == {"a"}
            await b.cycle()
            gateway = Gateway(settings, store, client, claims=b)
            tasks = [asyncio.create_task(gateway.run()), asyncio.create_task(b.run())]
            try:
                async with asyncio.timeout(60):
                    while True:
                        got = [await store.get_batch(x.batch_id, x.service_id) for x in batches]
                        if all(
                            g is not None and g.status_name is BatchStatusName.COMMITTED
                            for g in got
                        ):
                            break
                        await asyncio.sleep(0.05)
            finally:
                gateway.stop()
                b.stop()
                await asyncio.wait_for(asyncio.gather(*tasks), 60)
                await client.close()
    # The first batch of each service came from the claim thread's read.
    assert gateway.take_over.handed == 3
    assert ledger.violations == []
    report = ledger.report()["batches"]
    assert all(report[x.batch_id]["posts"] == 1 for x in batches)
