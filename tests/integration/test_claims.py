"""Claims on PostgreSQL: two-phase expiry, renewal, fair share, hand-over,
release, retries. Time moves through an injected clock; nothing sleeps."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping

import psycopg
import psycopg.errors
import pytest

from ledgerq.claims import ClaimChange, ClaimManager, ClaimSettings
from ledgerq.claims import manager as claims_manager
from ledgerq.claims.manager import WAKE_IDLE_GAP_MS
from ledgerq.claims.queries import claim_queries
from ledgerq.clock import ManualClock
from ledgerq.errors import ConfigError, StoreError
from ledgerq.model import Fence
from tests.integration.claims_helpers import (
    T0,
    claimants,
    counts,
    epochs,
    manager,
    prepare,
    put_batch,
)

pytestmark = pytest.mark.pg

SERVICES = [f"svc{i:02d}" for i in range(9)]


@pytest.fixture
async def db(pg_url: str) -> str:
    await prepare(pg_url)
    return pg_url


async def test_lone_instance_claims_every_service(db: str) -> None:
    clock = ManualClock(T0)
    async with manager(db, "a", clock) as a:
        await a.register_services(SERVICES)
        report = await a.cycle()
        assert report.claimed == tuple(SERVICES)
        assert a.claimed_services() == frozenset(SERVICES)
        fences = [a.fence_for(s) for s in SERVICES]
        # Every claim gets its own epoch, from one sequence.
        assert {f.instance_id for f in fences if f} == {"a"}
        assert len({f.epoch for f in fences if f}) == len(SERVICES)
        assert a.fence_for("svc00") == Fence("a", epochs(db)["svc00"])
        assert a.fence_for("nope") is None
        assert set(claimants(db).values()) == {"a"}


async def test_renewal_keeps_the_epoch_and_the_claim(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["s"])
        await a.cycle()
        fence = a.fence_for("s")
        for _ in range(10):
            clock.advance(1_000)
            await b.cycle()
            await a.cycle()
        assert claimants(db) == {"s": "a"}
        assert a.fence_for("s") == fence


async def test_fast_path_voids_an_idle_claim_after_the_first_expiry(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["idle", "busy", "pending"])
        await a.cycle()
        put_batch(db, "busy", "b1", submitted=True)
        put_batch(db, "pending", "p1", submitted=True, status="Pending")
        put_batch(db, "idle", "i1")  # queued, not submitted: not in flight
        before = epochs(db)
        # a is paused from now on.
        clock.advance(4_999)
        assert (await b.cycle()).voided == ()
        clock.advance(1)
        report = await b.cycle()
        assert report.voided == ("idle", "pending")
        assert claimants(db) == {"idle": "b", "pending": "b", "busy": "a"}
        assert epochs(db)["idle"] > before["idle"]
        # The paused instance no longer trusts claims past their first expiry.
        assert a.fence_for("busy") is None


async def test_slow_path_voids_a_claim_mid_submission_after_the_second_expiry(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["busy", "again"])
        await a.cycle()
        put_batch(db, "busy", "b1", submitted=True)
        # Resubmitting a batch the ledger lost counts as mid-submission too.
        put_batch(db, "again", "u1", submitted=True, status="Unknown")
        old = a.fence_for("busy")
        assert old is not None
        clock.advance(5_499)
        assert (await b.cycle()).voided == ()
        clock.advance(1)
        assert (await b.cycle()).voided == ("again", "busy")
        assert claimants(db) == {"busy": "b", "again": "b"}
        new = b.fence_for("busy")
        assert new is not None and new.instance_id == "b" and new.epoch > old.epoch


async def test_a_mid_submission_service_is_taken_over_within_ttl_plus_one_second(
    db: str,
) -> None:
    # Default timings: the failover target holds for a holder that
    # died between marking a batch submitted and the ledger's answer.
    clock = ManualClock(T0)
    a, b = manager(db, "a", clock), manager(db, "b", clock)
    target = a.settings.ttl_ms + 1_000
    async with a, b:
        await a.register_services(["busy"])
        await a.cycle()  # a's last renewal: it dies mid-POST right after
        put_batch(db, "busy", "b1", submitted=True)
        clock.advance(a.settings.ttl_ms)
        assert (await b.cycle()).voided == ()  # first expiry: still mid-submission
        # b's next cycle is scheduled for the second expiry, inside the target.
        assert b.next_expiry is not None and b.next_expiry - T0 < target
        clock.advance(b.next_expiry - clock())
        assert (await b.cycle()).voided == ("busy",)
        assert b.fence_for("busy") == Fence("b", epochs(db)["busy"])
        assert clock() - T0 < target


async def test_the_holder_stops_posting_before_anyone_may_take_its_service(db: str) -> None:
    clock = ManualClock(T0)
    a, b = manager(db, "a", clock), manager(db, "b", clock)
    async with a, b:
        await a.register_services(["s"])
        await a.cycle()
        fence = a.fence_for("s")
        assert fence is not None
        margin, ttl = a.settings.post_margin_ms, a.settings.ttl_ms
        assert a.may_post("s", fence, now=T0 + ttl - margin - 1)
        assert not a.may_post("s", fence, now=T0 + ttl - margin)
        assert not a.may_post("s", Fence("a", fence.epoch + 1), now=T0)
        # The last attempt a may start comes before b can take the service
        # whatever a was doing.
        put_batch(db, "s", "b1", submitted=True)
        clock.advance(ttl - margin)
        assert (await b.cycle()).voided == ()
        clock.advance(a.settings.slow_ttl_ms - (ttl - margin))
        assert (await b.cycle()).voided == ("s",)
        await a.cycle()  # a learns it no longer holds the service
        assert not a.may_post("s", fence)


async def test_an_instance_never_voids_its_own_expired_claims(db: str) -> None:
    clock = ManualClock(T0)
    async with manager(db, "a", clock) as a:
        await a.register_services(["s"])
        await a.cycle()
        fence = a.fence_for("s")
        clock.advance(60_000)  # paused past both expiries, nobody took over
        report = await a.cycle()
        assert report.voided == ()
        assert fence is not None and a.fence_for("s") == fence


async def test_a_paused_instance_reclaiming_gets_a_new_epoch(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["s"])
        await a.cycle()
        old = a.fence_for("s")
        await b.cycle()
        clock.advance(6_000)
        await b.cycle()  # voids a's idle claim and takes it
        assert claimants(db) == {"s": "b"}
        await b.release()
        await a.cycle()
        assert claimants(db) == {"s": "a"}
        new = a.fence_for("s")
        assert old is not None and new is not None
        assert new.instance_id == "a" and new.epoch > old.epoch


async def test_an_instance_whose_claims_were_taken_over_says_so(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Paused past its lease, an instance wakes to find its services with
    # others: a warning, not only the fenced writes it then has refused.
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["s1", "s2"])
        await a.cycle()
        await b.cycle()
        clock.advance(6_000)  # a is paused
        await b.cycle()
        assert claimants(db) == {"s1": "b", "s2": "b"}
        with caplog.at_level(logging.WARNING, logger="ledgerq.claims.manager"):
            await a.cycle()
        (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert "instance a lost its claims on 2 services (s1, s2)" in line
        assert "its lease ran out 1000 ms ago" in line


async def test_claims_handed_over_or_forgotten_are_not_reported_lost(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock, forget_service_ms=5_000)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["s1", "s2", "done"])
        put_batch(db, "s1", "o1")
        put_batch(db, "s2", "o2")
        put_batch(db, "done", "d1", status="Committed")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE batches SET created_at = %s", (T0,))
        with caplog.at_level(logging.WARNING, logger="ledgerq.claims.manager"):
            await a.cycle()
            await b.cycle()
            for _ in range(8):
                clock.advance(1_000)
                await a.cycle()
                await b.cycle()
        assert "done" not in claimants(db)  # forgotten by a
        assert "b" in claimants(db).values()  # handed over by a
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_new_instance_gets_its_fair_share_within_a_few_periods(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(SERVICES)
        for _ in range(5):
            await a.cycle()
            clock.advance(1_000)
        assert counts(db, "ab") == {"a": 9, "b": 0}
        for _ in range(3):
            clock.advance(1_000)
            await b.cycle()
            await a.cycle()
        assert counts(db, "ab") in ({"a": 5, "b": 4}, {"a": 4, "b": 5})
        assert None not in claimants(db).values()
        # Stable from there on.
        before = claimants(db)
        for _ in range(5):
            clock.advance(1_000)
            await a.cycle()
            await b.cycle()
        assert claimants(db) == before


async def test_hand_over_keeps_services_with_batches_in_flight(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        services = ["s1", "s2", "s3", "s4"]
        await a.register_services(services)
        await a.cycle()
        for s in services[:3]:
            put_batch(db, s, f"{s}-b", submitted=True, status="Pending")
        await b.cycle()
        assert (await a.cycle()).released == ()  # claimed too recently to move
        for _ in range(4):
            clock.advance(1_000)
            await b.cycle()
            assert (await a.cycle()).released == ()
        clock.advance(1_000)
        await b.cycle()
        report = await a.cycle()
        assert report.released == ("s4",)  # the only one with nothing in flight
        await b.cycle()
        assert counts(db, "ab") == {"a": 3, "b": 1}
        # Once a batch is final its service can move.
        put_batch(db, "s1", "s1-b", submitted=True, status="Committed")
        clock.advance(1_000)
        await a.cycle()
        await b.cycle()
        assert counts(db, "ab") == {"a": 2, "b": 2}
        assert claimants(db)["s1"] == "b"


async def test_three_instances_share_and_survive_one_dying(db: str) -> None:
    clock = ManualClock(T0)
    names = ["a", "b", "c"]
    managers = [manager(db, n, clock) for n in names]
    async with managers[0], managers[1], managers[2]:
        await managers[0].register_services([f"s{i:02d}" for i in range(30)])
        # The first to cycle takes everything; the others get their share once
        # those claims are older than the liveness window.
        for _ in range(7):
            clock.advance(1_000)
            for m in managers:
                await m.cycle()
        assert counts(db, names) == {"a": 10, "b": 10, "c": 10}
        # c dies (stops renewing). After the first expiry its services move.
        for _ in range(7):
            clock.advance(1_000)
            for m in managers[:2]:
                await m.cycle()
        assert counts(db, names) == {"a": 15, "b": 15, "c": 0}


async def test_unclaimed_service_is_taken_past_the_grace_period_whatever_the_share(
    db: str,
) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.cycle()
        await b.cycle()  # both alive before any service exists
        await a.register_services(["s1", "s2", "s3", "s4"])
        await a.cycle()
        await b.cycle()
        assert counts(db, "ab") == {"a": 2, "b": 2}
        # A third instance is alive (heartbeat) but never claims anything.
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO gateway_instances VALUES ('c', %s, %s, NULL)", (T0, T0 + 10_000)
            )
        clock.advance(1_000)
        await a.register_services(["s5"])  # S=5, K=3: share 2, a and b are full
        await a.cycle()
        await b.cycle()
        assert claimants(db)["s5"] is None
        clock.advance(2_000)
        await a.cycle()
        assert claimants(db)["s5"] == "a"


async def test_release_on_close_hands_everything_over_at_once(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    await a.cycle()
    await b.cycle()
    await a.register_services(SERVICES)
    await a.cycle()
    await b.cycle()
    assert counts(db, "ab") == {"a": 5, "b": 4}
    await b.close()
    assert b.claimed_services() == frozenset()
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT instance_id FROM gateway_instances").fetchall() == [("a",)]
    await a.cycle()  # no grace period to wait, no share to respect
    assert set(claimants(db).values()) == {"a"}
    await a.close()


async def test_release_of_many_claims_has_no_join_to_misplan_on_stale_statistics(
    db: str,
) -> None:
    """The table was analyzed while nobody held anything, then one instance
    claimed thousands: the release must not hinge on the planner's estimate
    of that instance's claims (joined on its locking CTE, it took a nested
    loop over both, quadratic in the claims held: 10 s for 5,000)."""
    clock = ManualClock(T0)
    services = [f"p{i:05d}" for i in range(3_000)]
    a = manager(db, "a", clock)
    await a.register_services(services)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("ANALYZE service_id_claims")
    await a.cycle()
    assert len(a.claimed_services()) == len(services)
    params = {"me": "a", "now": clock(), "grace_ms": 1_000}
    with psycopg.connect(db) as conn:
        for name in ("lock_all", "release_all"):
            plan = [
                r[0] for r in conn.execute(("EXPLAIN " + claim_queries()[name]).encode(), params)
            ]
            assert not [line for line in plan if "Join" in line or "Nested Loop" in line], plan
        conn.rollback()
    assert await a.release() == tuple(services)
    assert set(claimants(db).values()) == {None}
    await a.close()


async def test_a_take_over_reads_each_services_batches_not_every_unsent_one(
    db: str,
) -> None:
    """A dead instance's services past their second expiry, thousands of
    batches not yet submitted (status None) in a database never analyzed, as
    in a failover while batches pour in: the take-over's statements look for
    a batch left mid-submission among each service's own batches. Read
    through the index on status, each candidate intersected its open batches
    with every unsent one (0.9 s for 500 candidates against 24 ms, seconds
    on a loaded machine, the claim rows locked all the while)."""
    clock = ManualClock(T0)
    services = [f"t{i:03d}" for i in range(300)]
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(services)
        await a.cycle()
        await b.cycle()
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO batches (service_id, batch_id, signer_public_key, trace,"
                " serialized_batch, submitted, status, final)"
                " SELECT 't' || lpad((g % 300)::TEXT, 3, '0'), 'q' || g, '02', FALSE, '',"
                " FALSE, NULL, FALSE FROM generate_series(1, 12000) AS g"
            )
        mid = services[::10]
        for s in mid:
            put_batch(db, s, f"m-{s}", submitted=True)
        held = a.claimed_services()
        clock.advance(5_500)  # a stopped renewing: past its second expiry
        queries = claim_queries()
        params = {
            "me": "b",
            "now": clock(),
            "fallback_ms": 1_000,
            "limit": 500,
            "service_ids": sorted(held),
            "ttl_ms": 5_000,
            "slow_ttl_ms": 5_500,
        }
        with psycopg.connect(db) as conn:
            for name in ("take_candidates", "take_expired"):
                plan = "\n".join(
                    r[0] for r in conn.execute(("EXPLAIN " + queries[name]).encode(), params)
                )
                assert "batches_status_seq_idx" not in plan, plan
            conn.rollback()
        for _ in range(3):
            await b.cycle()
            clock.advance(100)
        assert {s: claimants(db)[s] for s in held} == {s: "b" for s in held}


async def test_listeners_hear_gains_and_losses(db: str) -> None:
    clock = ManualClock(T0)
    heard: list[tuple[frozenset[str], frozenset[str]]] = []
    a = manager(db, "a", clock)
    a.add_listener(lambda gained, lost: heard.append((gained, lost)))
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["s1", "s2"])
        await a.cycle()
        await b.cycle()
        for _ in range(5):
            clock.advance(1_000)
            await b.cycle()
            await a.cycle()
        assert heard[0] == (frozenset({"s1", "s2"}), frozenset())
        assert len(heard) == 2
        assert heard[1][0] == frozenset()
        assert len(heard[1][1]) == 1


async def test_concurrent_cycles_never_double_claim(db: str) -> None:
    clock = ManualClock(T0)
    names = ["a", "b", "c"]
    managers = [manager(db, n, clock) for n in names]
    async with managers[0], managers[1], managers[2]:
        await managers[0].register_services([f"s{i:03d}" for i in range(200)])
        # Instances starting together: the first to claim may take everything
        # (the others' heartbeats are not in yet); hand-over evens it out once
        # those claims are older than the liveness window.
        for _ in range(9):
            clock.advance(1_000)
            await asyncio.gather(*(m.cycle() for m in managers))
            held = [m.claimed_services() for m in managers]
            # Each service held by at most one instance, as its memory says too.
            assert sum(len(h) for h in held) == len(set().union(*held))
        owners = claimants(db)
        assert None not in owners.values()
        got = counts(db, names)
        # Every instance reaches the floor share floor(200 / 3) = 66: hand-over
        # gives up claims only while another is below it, and claims take up
        # to the ceiling 67, so 67/67/66 or, when two claim the freed services
        # at once (each skipping the rows the other locked), 68/66/66.
        assert min(got.values()) >= 200 // 3
        for m in managers:
            assert m.claimed_services() == {s for s, c in owners.items() if c == m.instance_id}


async def test_serialization_failures_are_retried(db: str) -> None:
    clock = ManualClock(T0)
    calls = 0

    async def flaky(conn: psycopg.AsyncConnection[dict[str, object]]) -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise psycopg.errors.SerializationFailure("could not serialize access")
        return "done"

    async with manager(db, "a", clock) as a:
        assert await a._session.transact("test", flaky) == "done"
        assert calls == 3
        calls = -100
        with pytest.raises(StoreError, match="failed after 8 attempts"):
            await a._session.transact("test", flaky)


async def test_a_dropped_connection_is_replaced(db: str) -> None:
    clock = ManualClock(T0)
    async with manager(db, "a", clock) as a:
        await a.register_services(["s"])
        await a.cycle()
        conn = await a._connection()
        pid = conn.info.backend_pid
        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        clock.advance(1_000)
        report = await a.cycle()
        assert report.claim_count == 1
        assert (await a._connection()).info.backend_pid != pid


async def test_unreachable_database_fails_the_cycle_with_a_store_error() -> None:
    settings = ClaimSettings(instance_id="a", db_timeout_ms=500)
    a = ClaimManager("postgresql://postgres@127.0.0.1:1/none", settings)
    with pytest.raises(StoreError, match="cannot connect"):
        await a.cycle(now=T0)


def test_claims_refuse_sqlite() -> None:
    with pytest.raises(ConfigError, match="PostgreSQL"):
        ClaimManager("sqlite:///x.db")


async def test_instances_and_claims_are_visible(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.cycle()
        await b.cycle()
        await a.register_services(["s1", "s2", "s3"])
        await a.cycle()
        clock.advance(6_000)
        await a.cycle()  # b is silent from T0: no longer live, a voids nothing of b's
        instances = {i.instance_id: i for i in await a.list_instances()}
        assert instances["a"].claims == 3
        assert instances["a"].live
        assert instances["a"].heartbeat_at == T0 + 6_000
        assert not instances["b"].live
        assert instances["b"].claims == 0
        claims = await a.claims_for(["s1", "s3", "unknown"])
        assert set(claims) == {"s1", "s3"}
        assert claims["s1"].claimant == "a"
        assert claims["s1"].epoch == epochs(db)["s1"]
        assert claims["s1"].expiry_1 == T0 + 6_000 + 5_000
        assert claims["s1"].expiry_2 == T0 + 6_000 + 5_500


async def test_run_cycles_until_stopped_and_wake_runs_a_cycle_early(db: str) -> None:
    clock = ManualClock(T0)
    # A renewal period far longer than the test: only wake() can start cycle two.
    a = manager(db, "a", clock, renew_interval_ms=600_000, ttl_ms=1_200_000, slow_ttl_ms=1_200_000)
    changes: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    heard_on: list[tuple[threading.Thread, asyncio.AbstractEventLoop]] = []

    def listener(gained: frozenset[str], _lost: frozenset[str]) -> None:
        heard_on.append((threading.current_thread(), asyncio.get_running_loop()))
        changes.put_nowait(gained)

    a.add_listener(listener)
    async with a:
        task = asyncio.create_task(a.run())
        await a.register_services(["s1"])  # registering wakes the loop as well
        assert await asyncio.wait_for(changes.get(), 30) == {"s1"}
        await a.register_services(["s2"])
        assert await asyncio.wait_for(changes.get(), 30) == {"s2"}
        # The cycles ran on the claim thread, the listeners on this loop.
        assert a._thread is not None and a._thread is not threading.current_thread()
        assert heard_on == [(threading.current_thread(), asyncio.get_running_loop())] * 2
        assert a.fence_for("s2") is not None
        a.stop()
        await asyncio.wait_for(task, 30)
    assert not a._thread.is_alive()
    assert a.claimed_services() == frozenset()  # released on close


def _count_full_cycles(a: ClaimManager) -> list[int]:
    """A one-item list counting ``a``'s full cycles (a list: read it after)."""
    full = [0]
    cycle = a.cycle

    async def counted(now: int | None = None) -> object:
        full[0] += 1
        return await cycle(now)

    a.cycle = counted  # type: ignore[method-assign]
    return full


async def test_a_wake_up_only_claims_and_at_once_after_an_idle_cycle(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wake-up (a new service) before the next full cycle is due is
    answered by the claim alone (one transaction, not the five of a cycle).
    And a full cycle that claimed nothing (an idle gateway's) does not space
    that claim WAKE_IDLE_GAP_MS away: with the idle gap at an hour and full
    cycles ten minutes apart, only a claim at once answers within the wait."""
    monkeypatch.setattr(claims_manager, "WAKE_IDLE_GAP_MS", 3_600_000)
    clock = ManualClock(T0)
    a = manager(db, "a", clock, renew_interval_ms=600_000, ttl_ms=3_600_000, slow_ttl_ms=3_600_001)
    changes: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    a.add_listener(lambda gained, _lost: changes.put_nowait(gained))
    full = _count_full_cycles(a)
    async with a:
        task = asyncio.create_task(a.run())
        await asyncio.sleep(0.2)
        # The first cycle is a full one, and takes nothing.
        assert full[0] == 1 and a.claimed_services() == frozenset()
        await a.register_services(["s1"])  # wakes the claim thread
        assert await asyncio.wait_for(changes.get(), 30) == {"s1"}
        assert a.claim_only_cycles >= 1
        assert full[0] == 1
        assert a.fence_for("s1") is not None
        a.stop()
        await asyncio.wait_for(task, 30)


async def test_wake_ups_in_a_row_keep_the_full_cycles_on_schedule(db: str) -> None:
    """Wake-ups every 50 ms never put the full cycle (renewal, take-over,
    hand-over) off for ever: full cycles keep coming, claims alone answer
    the wake-ups between them. Judged by what happens, not by how fast."""
    clock = ManualClock(T0)
    a = manager(db, "a", clock, renew_interval_ms=1_000, ttl_ms=60_000, slow_ttl_ms=61_000)
    full = _count_full_cycles(a)
    async with a:
        task = asyncio.create_task(a.run())
        await asyncio.sleep(0.05)
        before, claims_before = full[0], a.claim_only_cycles
        loop = asyncio.get_running_loop()
        end = loop.time() + 60.0
        while full[0] - before < 3 or a.claim_only_cycles - claims_before < 2:
            assert loop.time() < end, (full[0] - before, a.claim_only_cycles - claims_before)
            a.wake()
            await asyncio.sleep(0.05)
        a.stop()
        await asyncio.wait_for(task, 30)


async def test_wake_ups_that_find_nothing_to_claim_come_at_the_idle_gap(db: str) -> None:
    """With several instances most wake-ups come from batches of services
    another instance holds: a claim that took nothing spaces the next one
    WAKE_IDLE_GAP_MS apart, not WAKE_GAP_MS (an upper bound on their count:
    a slow machine only makes fewer)."""
    clock = ManualClock(T0)
    a = manager(db, "a", clock, renew_interval_ms=5_000, ttl_ms=60_000, slow_ttl_ms=61_000)
    async with a:
        task = asyncio.create_task(a.run())
        await asyncio.sleep(0.05)
        before = a.claim_only_cycles
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.0
        while loop.time() < end:
            a.wake()
            await asyncio.sleep(0.005)
        quick = a.claim_only_cycles - before
        assert 1 <= quick <= 1.0 / (WAKE_IDLE_GAP_MS / 1000) + 2, quick
        a.stop()
        await asyncio.wait_for(task, 30)


async def test_the_next_cycle_comes_when_a_foreign_claim_can_expire(db: str) -> None:
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    async with a, b:
        await a.register_services(["idle", "busy"])
        await a.cycle()
        put_batch(db, "busy", "b1", submitted=True)
        await b.cycle()
        assert b.next_expiry == T0 + 5_000
        assert b.pause_ms() == 1_000  # a's claims expire later than one interval
        clock.advance(4_600)  # a stopped renewing
        await b.cycle()
        assert b.pause_ms() == 401
        clock.advance(401)
        assert (await b.cycle()).voided == ("idle",)
        # The claim mid-submission can only go at its second expiry; first, a
        # follow-up cycle a tenth of an interval after the one run for the expiry.
        assert b.next_expiry == T0 + 5_500
        assert b.pause_ms() == 100
        clock.advance(100)
        assert (await b.cycle()).voided == ()
        assert b.pause_ms() == 400  # the follow-up was not for an expiry: no other
        clock.advance(400)
        assert (await b.cycle()).voided == ("busy",)


def heartbeats(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT instance_id, heartbeat_at FROM gateway_instances").fetchall()
    return {i: h for i, h in rows}


def winners(url: str, services: list[str], instances: list[str]) -> dict[str, str]:
    """Each service's rendezvous winner among ``instances``, as claims.sql picks it."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT s, (SELECT i FROM unnest(%s::TEXT[]) AS i"
            "           ORDER BY hashtext(s || '/' || i) DESC, i LIMIT 1)"
            " FROM unnest(%s::TEXT[]) AS s",
            (instances, services),
        ).fetchall()
    return {s: w for s, w in rows}


async def test_survivors_split_a_dead_instances_claims_and_each_takes_its_part_at_once(
    db: str,
) -> None:
    # b and c both wake for a's expiry. Each takes over, in its own
    # maintenance, exactly the expired claims whose rendezvous winner it is
    # (whatever its share, and whatever the other has locked meanwhile): the
    # two never skip each other's rows, and nothing waits for a later cycle.
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    c = manager(db, "c", clock)
    theirs = [f"a{i:02d}" for i in range(40)]
    async with a, b, c:
        await a.register_services(theirs)
        await a.cycle()
        await b.register_services(["b1", "b2", "b3"])
        await b.cycle()
        await c.cycle()
        await a.cycle()
        assert a.claimed_services() == frozenset(theirs)
        expected = winners(db, theirs, ["b", "c"])
        assert set(expected.values()) == {"b", "c"}  # both get some (40 services)
        clock.advance(4_000)  # a stopped renewing; b and c renew
        await b.cycle()
        await c.cycle()
        assert b.next_expiry == c.next_expiry == T0 + 5_000
        clock.advance(1_001)  # a's lease has just passed
        gained: list[frozenset[str]] = []
        c.add_listener(lambda g, _lost: gained.append(g))
        with psycopg.connect(db) as busy:  # b's maintenance, under way, holds its part
            busy.execute(
                "SELECT 1 FROM service_id_claims WHERE service_id = ANY(%s) FOR UPDATE",
                ([s for s, w in expected.items() if w == "b"],),
            )
            report = await c.cycle()
        mine = {s for s, w in expected.items() if w == "c"}
        assert set(report.voided) == mine
        assert gained[0] == mine  # heard before the rest of the cycle ran
        report = await b.cycle()
        assert set(report.voided) == {s for s, w in expected.items() if w == "b"}
        owners = claimants(db)
        assert {s: owners[s] for s in theirs} == expected
        assert b.claimed_services() | c.claimed_services() >= set(theirs)


async def test_a_dead_instances_claim_its_winner_leaves_falls_to_anyone(db: str) -> None:
    # The rendezvous winner of an expired claim may itself be paused (lease
    # still valid, no cycle). One renewal interval past the claim's second
    # expiry any live instance takes it.
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    c = manager(db, "c", clock)
    theirs = [f"a{i:02d}" for i in range(40)]
    async with a, b, c:
        await a.register_services(theirs)
        await a.cycle()
        await b.cycle()
        await c.cycle()
        expected = winners(db, theirs, ["b", "c"])
        for_c = {s for s, w in expected.items() if w == "c"}
        # a stops renewing; c renews once more and then stops running cycles
        # (its lease stays valid for 5 s), b goes on.
        clock.advance(4_000)
        await b.cycle()
        await c.cycle()
        clock.advance(1_001)
        report = await b.cycle()
        assert set(report.voided) == set(theirs) - for_c
        slow = a.settings.slow_ttl_ms
        clock.advance(slow - 5_001 + a.settings.renew_interval_ms - 1)
        assert (await b.cycle()).voided == ()  # c's part: c's lease is still valid
        clock.advance(1)
        assert set((await b.cycle()).voided) == for_c
        assert set(claimants(db).values()) == {"b"}


async def test_claim_rows_of_idle_services_are_forgotten_and_come_back(db: str) -> None:
    # forget_service_ms: a claim row whose service has no open batch and no
    # batch accepted for that long is deleted, by its holder or (unclaimed)
    # by anyone; never another instance's claim, never a service with work.
    clock = ManualClock(T0)
    forget = 5_000
    a = manager(db, "a", clock, forget_service_ms=forget)
    b = manager(db, "b", clock, forget_service_ms=forget)
    async with a, b:
        await a.register_services(["done", "open", "recent"])
        await a.cycle()
        await b.register_services(["theirs"])
        await b.cycle()
        assert claimants(db) == {"done": "a", "open": "a", "recent": "a", "theirs": "b"}
        put_batch(db, "done", "d1", status="Committed")
        put_batch(db, "open", "o1")
        put_batch(db, "recent", "r1", status="Committed")
        put_batch(db, "theirs", "t1", status="Committed")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE batches SET created_at = %s", (T0,))
            conn.execute(
                "UPDATE batches SET created_at = %s WHERE service_id = 'recent'", (T0 + forget,)
            )
        forgotten: dict[str, set[str]] = {"a": set(), "b": set()}
        for _ in range(forget // 1_000 + 2):
            clock.advance(1_000)
            forgotten["a"] |= set((await a.cycle()).forgotten)
            forgotten["b"] |= set((await b.cycle()).forgotten)
        assert forgotten == {"a": {"done"}, "b": {"theirs"}}
        assert set(claimants(db)) == {"open", "recent"}
        assert "done" not in a.claimed_services()
        # A new batch for a forgotten service brings its row back (the store's
        # add_batches registers it the same way), and it is claimed again.
        await a.register_services(["done"])
        clock.advance(a.settings.grace_ms + 1)
        await b.cycle()
        await a.cycle()
        assert claimants(db)["done"] in ("a", "b")


async def test_cancelling_run_ends_the_claim_thread_before_the_claims_are_released(
    db: str,
) -> None:
    # The gateway cancels its extra tasks on the way out; the claim thread
    # must end before close() gives the claims back, or a last cycle could
    # claim for an instance row that is gone.
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    gained: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    a.add_listener(lambda g, _lost: gained.put_nowait(g))
    await a.register_services(["s1", "s2"])
    task = asyncio.create_task(a.run())
    assert await asyncio.wait_for(gained.get(), 30) == {"s1", "s2"}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await a.close()
    assert a._thread is not None and not a._thread.is_alive()
    assert set(claimants(db).values()) == {None}
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM gateway_instances").fetchone() == (0,)


async def test_services_with_work_are_taken_over_alone_first_and_the_idle_rest_at_once_after(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cycle takes over at most TAKE_LIMIT expired claims, those of services
    # with a batch waiting first and alone, so their work resumes before
    # thousands of idle services are moved; with more left, the next cycle
    # comes at once. The idle ones are announced idle (nothing to wake),
    # unless a batch came for one before the take-over ended. One
    # mid-submission (slow path) waits for the second expiry and does not
    # hold the rest up.
    from ledgerq.claims import manager as manager_module

    monkeypatch.setattr(manager_module, "TAKE_LIMIT", 3)
    clock = ManualClock(T0)
    a = manager(db, "a", clock)
    b = manager(db, "b", clock)
    services = [f"s{i}" for i in range(10)]
    async with a, b:
        await a.register_services(services)
        await a.cycle()
        await b.cycle()
        put_batch(db, "s7", "w7")
        put_batch(db, "s8", "w8")
        put_batch(db, "s5", "m5", submitted=True)  # mid-submission
        changes: list[ClaimChange] = []
        b.add_change_listener(changes.append)
        clock.advance(a.settings.ttl_ms)
        full_at = clock()
        # The services with work alone first (a small take-over), though
        # idle ones were found with them.
        taken = [set((await b.cycle()).voided)]
        assert taken[0] == {"s7", "s8"}
        assert changes[0].gained >= {"s7", "s8"} and changes[0].idle == frozenset()
        still_idle = b._still_idle

        async def accepted_meanwhile(services: frozenset[str]) -> frozenset[str]:
            # A batch accepted between the take-over's read and its end.
            monkeypatch.setattr(b, "_still_idle", still_idle)
            put_batch(db, "s1", "w1")
            return await still_idle(services)

        monkeypatch.setattr(b, "_still_idle", accepted_meanwhile)
        while b.pause_ms() == 0:
            clock.advance(100)
            taken.append(set((await b.cycle()).voided))
        assert [len(t) for t in taken] == [2, 3, 3, 1]
        # The idle ones are announced idle, but for the one that got a batch.
        assert {"s0", "s1", "s2"} <= changes[1].gained
        assert changes[1].idle == {"s0", "s2"}
        assert [c.idle for c in changes[2:]] == [c.gained for c in changes[2:]]
        # Those cycles, within half a period of the full one, only took over.
        assert heartbeats(db)["b"] == full_at
        assert set().union(*taken) == set(services) - {"s5"}
        clock.advance(a.settings.slow_ttl_ms - a.settings.ttl_ms)
        assert (await b.cycle()).voided == ("s5",)
        assert set(claimants(db).values()) == {"b"}


class _Heard:
    """A take-over listener that notes what it hears, and who held the claims then."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.heard: list[tuple[str, object, dict[str, str | None]]] = []

    def asking(self, batches: object) -> None:
        self.heard.append(("asking", dict(batches), claimants(self.db)))  # type: ignore[call-overload]

    def taken(self, services: frozenset[str]) -> None:
        self.heard.append(("taken", services, claimants(self.db)))

    def won(self, fences: Mapping[str, Fence]) -> None:
        self.heard.append(("won", dict(fences), claimants(self.db)))

    async def hand_to_pipeline(self, services: frozenset[str]) -> frozenset[str]:
        return frozenset()

    def started(self) -> None:
        self.heard.append(("started", None, {}))

    async def ended(self) -> None:
        self.heard.append(("ended", None, {}))


async def test_a_take_over_names_the_batches_left_mid_submission_before_it_moves_the_claims(
    db: str,
) -> None:
    clock = ManualClock(T0)
    a, b = manager(db, "a", clock), manager(db, "b", clock)
    heard = _Heard(db)
    b.add_take_over_listener(heard)
    async with a, b:
        await a.register_services(["busy", "again", "idle", "pending"])
        await a.cycle()
        await b.cycle()
        put_batch(db, "busy", "b1", submitted=True)
        put_batch(db, "again", "u1", submitted=True, status="Unknown")
        put_batch(db, "pending", "p1", submitted=True, status="Pending")
        put_batch(db, "idle", "i1")
        for _ in range(5):
            clock.advance(1_000)
            await b.cycle()
        # First expiry: the fast path moves, nothing mid-submission is named.
        assert set(claimants(db).values()) == {"b", "a"}
        assert heard.heard == []
        clock.advance(a.settings.slow_ttl_ms - a.settings.ttl_ms)
        assert (await b.cycle()).voided == ("again", "busy")
        # Named while a still held them (the ledger is asked in parallel with
        # the claim), then taken, and held by b before anyone hears of it.
        (ask, asked, before), (take, won, after), (win, fences, _) = heard.heard
        assert (ask, asked) == ("asking", {"busy": ("b1",), "again": ("u1",)})
        assert before["busy"] == before["again"] == "a"
        assert (take, won) == ("taken", frozenset({"busy", "again"}))
        assert after["busy"] == after["again"] == "b"
        assert b.fence_for("busy") == Fence("b", epochs(db)["busy"])
        # Then, where the cycle ran, the fences the answers are recorded under.
        assert win == "won"
        assert fences == {s: Fence("b", epochs(db)[s]) for s in ("again", "busy")}


async def test_a_cycle_due_just_before_a_foreign_expiry_starts_at_it(db: str) -> None:
    clock = ManualClock(T0)
    a, b = manager(db, "a", clock), manager(db, "b", clock)
    async with a, b:
        await a.register_services(["s"])
        await a.cycle()
        await b.cycle()
        assert b.next_expiry == T0 + a.settings.ttl_ms
        b._full_cycle_ms = 150  # as measured on a loaded machine
        # A cycle due 200 ms before the expiry ends before it: it runs now.
        clock.advance(a.settings.ttl_ms - 250)
        assert b.cycle_delay_ms() == 0
        # One due 100 ms before it would still run at the expiry: it waits for it.
        clock.advance(150)
        assert b.cycle_delay_ms() == 101
        # Never longer than a quarter of a renewal interval.
        b._full_cycle_ms = 10_000
        clock.advance(-300)
        assert b.cycle_delay_ms() == 0


async def test_at_the_second_expiry_a_take_over_moves_the_services_with_work_alone(
    db: str,
) -> None:
    # Idle services still waiting to be moved do not hold the slow path up:
    # a take-over that finds batches left mid-submission takes only the
    # services with work; the idle ones come in the next, at once.
    clock = ManualClock(T0)
    a, b = manager(db, "a", clock), manager(db, "b", clock)
    async with a, b:
        await a.register_services([f"s{i}" for i in range(6)])
        await a.cycle()
        await b.cycle()
        put_batch(db, "s1", "m1", submitted=True)  # mid-submission
        put_batch(db, "s2", "w2")  # work waiting
        # b's cycles renew it; a is gone. Then straight past a's second
        # expiry, no cycle of b at its first: the idle services are still a's.
        for _ in range(4):
            clock.advance(1_000)
            await b.cycle()
        clock.advance(a.settings.slow_ttl_ms - 4_000)
        assert (await b.cycle()).voided == ("s1", "s2")
        assert b.pause_ms() == 0  # the rest at once
        clock.advance(10)
        assert (await b.cycle()).voided == ("s0", "s3", "s4", "s5")
        assert set(claimants(db).values()) == {"b"}


async def test_take_overs_in_a_row_wait_for_a_second_expiry_just_ahead(db: str) -> None:
    clock = ManualClock(T0)
    b = manager(db, "b", clock)
    async with b:
        await b.cycle()
        b.next_expiry = clock() + 100
        b._full_cycle_ms = 0
        b._more = True  # more expired claims wait: take-overs one after another
        b._take_ms = 150  # the last one's duration, as measured under load
        # The next would still run at the expiry: it starts at it.
        assert b.cycle_delay_ms() == 101
        b._take_ms = 40
        assert b.cycle_delay_ms() == 0


class _HandsToPipeline(_Heard):
    """Sees to some of the services taken with work (hands their next batches
    to the pipeline); notes what it was given and who held the claims then."""

    def __init__(self, db: str, sees_to: set[str], changes: list[ClaimChange]) -> None:
        super().__init__(db)
        self.sees_to = sees_to
        self.changes = changes
        self.given: list[tuple[frozenset[str], dict[str, str | None], int]] = []

    async def hand_to_pipeline(self, services: frozenset[str]) -> frozenset[str]:
        self.given.append((services, claimants(self.db), len(self.changes)))
        return services & self.sees_to


async def test_the_services_taken_with_work_are_handed_over_before_the_change(db: str) -> None:
    # A take-over's listener gets the services it moved with work (not the
    # idle ones, not those left mid-submission) once they are held and
    # before the change listeners hear of them; the change names those it
    # saw to ``ready``.
    clock = ManualClock(T0)
    a, b = manager(db, "a", clock), manager(db, "b", clock)
    async with a, b:
        await a.register_services(["w1", "w2", "idle", "mid"])
        await a.cycle()
        await b.cycle()
        put_batch(db, "w1", "b1")
        put_batch(db, "w2", "b2")
        put_batch(db, "mid", "m1", submitted=True)
        changes: list[ClaimChange] = []
        listener = _HandsToPipeline(db, {"w1"}, changes)
        b.add_take_over_listener(listener)
        b.add_change_listener(changes.append)
        clock.advance(a.settings.ttl_ms)
        while b.pause_ms() == 0 or not changes:
            await b.cycle()
            clock.advance(100)
        (services, claimant_of, heard_before), *rest = listener.given
        assert services == {"w1", "w2"} and rest == []
        assert claimant_of["w1"] == claimant_of["w2"] == "b" and heard_before == 0
        assert changes[0].gained >= {"w1", "w2"} and changes[0].ready == {"w1"}
        # At the second expiry the service left mid-submission is asked
        # about, not handed over.
        clock.advance(a.settings.slow_ttl_ms - a.settings.ttl_ms)
        await b.cycle()
        assert claimants(db)["mid"] == "b"
        assert all("mid" not in given for given, _, _ in listener.given)


async def test_a_failing_hand_over_leaves_the_services_to_the_change(db: str) -> None:
    clock = ManualClock(T0)
    a, b = manager(db, "a", clock), manager(db, "b", clock)

    class Failing(_Heard):
        async def hand_to_pipeline(self, services: frozenset[str]) -> frozenset[str]:
            raise StoreError("no store")

    async with a, b:
        await a.register_services(["w1"])
        await a.cycle()
        await b.cycle()
        put_batch(db, "w1", "b1")
        changes: list[ClaimChange] = []
        b.add_take_over_listener(Failing(db))
        b.add_change_listener(changes.append)
        clock.advance(a.settings.ttl_ms)
        assert "w1" in (await b.cycle()).voided
        assert changes[0].gained >= {"w1"} and changes[0].ready == frozenset()
