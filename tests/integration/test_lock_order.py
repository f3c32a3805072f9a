"""Lock order: claim cycles (renewal, voiding, claiming, hand-over, clean-up)
of three instances and the store's fenced group writes and inserts, run hard
against each other on one PostgreSQL database, never deadlock.

The rule (``claims.sql``, docs/ha.md "Lock order"): fenced writes lock batch
rows then claim rows, in key order, and wait; the claim cycle never waits for
a claim row (SKIP LOCKED, in service order) and renews one row of its own.
A deadlock surfaces as PostgreSQL's ``deadlock detected`` in whichever
transaction it picks: the writers' and inserters' errors and the claim
managers' retries are all counted. The test waits on the work, never on time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import psycopg
import psycopg.errors
import pytest

from ledgerq.claims import ClaimManager
from ledgerq.clock import ManualClock
from ledgerq.errors import StoreError
from ledgerq.model import Committed, Pending, Unknown
from ledgerq.store import BatchTrackingStore, BatchWrite, open_store
from tests.integration.claims_helpers import T0, manager
from tests.store.conftest import make_batch

pytestmark = pytest.mark.pg

SERVICES = [f"s{i:02d}" for i in range(48)]
WRITERS = 4
GROUPS_PER_WRITER = 120
CYCLES = 60


def _deadlocked(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.errors.DeadlockDetected):
            return True
        seen = seen.__cause__
    return False


class Tally:
    def __init__(self) -> None:
        self.deadlocks: list[str] = []
        self.landed = 0
        self.refused = 0
        self.inserted = 0

    def store_error(self, where: str, exc: StoreError) -> None:
        if _deadlocked(exc):
            self.deadlocks.append(f"{where}: {exc}")
        else:
            raise exc


async def _open_batches(url: str) -> dict[str, list[str]]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT service_id, batch_id FROM batches WHERE NOT final ORDER BY seq"
        )
        out: dict[str, list[str]] = {}
        for service_id, batch_id in await cur.fetchall():
            out.setdefault(service_id, []).append(batch_id)
        return out


async def _writer(
    store: BatchTrackingStore,
    url: str,
    holder: Callable[[str], ClaimManager | None],
    rng: random.Random,
    tally: Tally,
) -> None:
    for n in range(GROUPS_PER_WRITER):
        if n % 20 == 0:
            open_ = await _open_batches(url)
        writes = []
        for service_id in rng.sample(SERVICES, 10):
            claims = holder(service_id)
            fence = None if claims is None else claims.fence_for(service_id)
            if fence is None or not open_.get(service_id):
                continue
            batch_id = open_[service_id][0]
            kind = rng.choice(["attempt", "attempt", "pending", "unknown", "commit"])
            if kind == "attempt":
                writes.append(BatchWrite(service_id, batch_id, attempt=True, fence=fence))
            else:
                status = {"pending": Pending(), "unknown": Unknown(), "commit": Committed()}[kind]
                writes.append(BatchWrite(service_id, batch_id, status, fence=fence))
                if kind == "commit":
                    open_[service_id].pop(0)
        # Every fenced group of the gateway goes through apply_writes, in any
        # order of services: the store sorts and locks.
        rng.shuffle(writes)
        try:
            results = await store.apply_writes(writes)
        except StoreError as exc:
            tally.store_error("group write", exc)
            continue
        tally.landed += sum(r is None for r in results)
        tally.refused += sum(r is not None for r in results)


async def _inserter(store: BatchTrackingStore, rng: random.Random, tally: Tally) -> None:
    # New batches for services of every kind: busy, claimed, idle (whose
    # claim rows the clean-up may be deleting right now).
    for _ in range(80):
        batches = [make_batch(s) for s in rng.sample(SERVICES, 6)]
        try:
            await store.add_batches(batches)
        except StoreError as exc:
            tally.store_error("insert", exc)
            continue
        tally.inserted += len(batches)


async def _cycles(claims: ClaimManager, clock: ManualClock, cycles: int) -> None:
    for _ in range(cycles):
        clock.advance(150)
        try:
            await claims.cycle()
        except StoreError as exc:
            if not _deadlocked(exc):
                raise


async def test_claim_cycles_and_fenced_writes_never_deadlock(pg_url: str) -> None:
    clock = ManualClock(T0)
    store = await open_store(pg_url, clock=clock)
    # Short clean-up period: claim rows of idle services are deleted while
    # batches for them arrive.
    fast = {"forget_service_ms": 2_000}
    a, b, c = (manager(pg_url, n, clock, **fast) for n in "abc")
    managers = [a, b, c]
    tally = Tally()
    rng = random.Random(15)
    async with store, a, b, c:
        await store.add_batches([make_batch(s) for s in SERVICES for _ in range(4)])
        for m in managers:
            await m.cycle()

        def holder(service_id: str) -> ClaimManager | None:
            return next((m for m in managers if m.fence_for(service_id)), None)

        async with asyncio.timeout(600):
            await asyncio.gather(
                *(_writer(store, pg_url, holder, random.Random(i), tally) for i in range(WRITERS)),
                _inserter(store, rng, tally),
                _cycles(a, clock, CYCLES),
                _cycles(b, clock, CYCLES),
                # c stops renewing half-way: its claims are voided (fast and
                # slow path) while the others write to them.
                _cycles(c, clock, CYCLES // 2),
            )
        deadlocks = tally.deadlocks + [
            f"claim manager {m.instance_id}: {m.deadlocks}" for m in managers if m.deadlocks
        ]
        assert not deadlocks, deadlocks
        # The run did contend: writes landed and were fenced off, batches arrived.
        assert tally.landed > 100 and tally.refused > 0 and tally.inserted > 0, vars(tally)
        # The clean-up never left a service with open batches without a claim row.
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            cur = await conn.execute(
                "SELECT DISTINCT b.service_id FROM batches b WHERE NOT b.final AND NOT EXISTS"
                " (SELECT 1 FROM service_id_claims c WHERE c.service_id = b.service_id)"
            )
            assert await cur.fetchall() == []


async def test_finishing_consecutive_batches_of_one_service_never_deadlocks(pg_url: str) -> None:
    """Groups that make consecutive batches of one service final at once.

    Making batch k final re-points batch k+1's blocker (the release trigger
    writes k+1's row), while another group holds k+1 to make it final too and
    waits for the service's queue_heads row: the heads, then the rows the
    trigger writes, must be locked first, in one order.
    """
    store = await open_store(pg_url)
    tally = Tally()
    services = ["one", "two"]
    async with store:
        batches = [make_batch(s) for _ in range(120) for s in services]
        await store.add_batches(batches)
        per_service = {s: [b.batch_header for b in batches if b.service_id == s] for s in services}
        # Consecutive pairs of one service, handed out to the writers in turn.
        pairs = asyncio.Queue[list[BatchWrite]]()
        for s in services:
            ids = per_service[s]
            for k in range(0, len(ids) - 1, 2):
                pairs.put_nowait([BatchWrite(s, ids[k], Committed())])
                pairs.put_nowait([BatchWrite(s, ids[k + 1], Committed())])

        async def finisher() -> None:
            while not pairs.empty():
                writes = pairs.get_nowait()
                try:
                    results = await store.apply_writes(writes)
                except StoreError as exc:
                    tally.store_error("finishing write", exc)
                    continue
                tally.landed += sum(r is None for r in results)

        async with asyncio.timeout(600):
            await asyncio.gather(*(finisher() for _ in range(6)))
        assert not tally.deadlocks, tally.deadlocks
        assert tally.landed == len(batches)
        assert await _open_batches(pg_url) == {}
