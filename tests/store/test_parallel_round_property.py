"""``parallel_round`` in SQL equals the reference rules (``select_parallel_round``)
on random populations.

Batches get random transactions reading and writing random entries — full
addresses, namespace and shorter prefixes, the empty prefix, upper case,
addresses with a non-hex tail, unknown (``None``) sets — and random
dependencies on earlier batches' transactions (of their own service or not,
added by the same call or an earlier one). They are added in several calls
with random ledger outcomes applied in random order in between, so the
store's blockers are computed at insert against partly final services and
recomputed as batches become final in any order. The reference round is
computed from the same rows read back with ``list_batches``; both are asked
with random ``exclude``, ``services``, ``limit`` and ``per_service``.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq.clock import ManualClock
from ledgerq.model import (
    BatchStatusName,
    Committed,
    Delayed,
    Invalid,
    Pending,
    TrackingBatch,
    TrackingTransaction,
    Unknown,
    Valid,
)
from ledgerq.queue.parallel import select_parallel_round
from ledgerq.store import BatchTrackingStore, BatchWrite, open_store

from .test_queue_round_property import ATTEMPTS, NOW, STATES, WINDOW, apply, everything

SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.pg),
]

NAMESPACE = "1cf126"
KEYS = [NAMESPACE + c * 64 for c in "0123"]
ENTRIES = [
    *KEYS,
    KEYS[1].upper(),  # the same address as KEYS[1]
    KEYS[2] + "ff",  # longer than an address: compared by its first 70
    NAMESPACE + "0" * 20 + "-x",  # a non-hex character ends the entry
    NAMESPACE,  # every key
    "1cf1",
    "ab" * 35,  # another namespace
    "",  # everything
]
entry_sets = st.none() | st.lists(st.sampled_from(ENTRIES), max_size=3)
_ids = itertools.count(1)


@dataclass(frozen=True)
class TxnSpec:
    reads: list[str] | None
    writes: list[str] | None
    #: Depend on a transaction of the batch this many places before (0: none).
    back: int


@dataclass(frozen=True)
class Spec:
    service: int
    txns: list[TxnSpec]
    state: str
    attempt: int


specs = st.builds(
    Spec,
    service=st.integers(0, 5),
    txns=st.lists(
        st.builds(
            TxnSpec,
            reads=entry_sets,
            writes=entry_sets,
            back=st.sampled_from([0, 0, 0, 1, 2, 5]),
        ),
        min_size=1,
        max_size=2,
    ),
    state=st.sampled_from(["new"] * 6 + STATES),
    attempt=st.sampled_from(ATTEMPTS),
)


@pytest.fixture(params=SQL_BACKENDS)
async def sql_store(
    request: pytest.FixtureRequest, store_url_factory: Callable[[str], str]
) -> AsyncIterator[BatchTrackingStore]:
    async with await open_store(
        store_url_factory(request.param), clock=ManualClock(NOW), lock_entries=True
    ) as s:
        yield s


def build(specs_: list[Spec], earlier: list[TrackingBatch]) -> list[TrackingBatch]:
    """Batches for ``specs_``; dependencies point into ``earlier`` + these."""
    out: list[TrackingBatch] = []
    for spec in specs_:
        service = f"svc-{spec.service}"
        bid = f"{next(_ids):08x}".ljust(128, "b")
        txns = []
        for t in spec.txns:
            pool = earlier + out
            deps = ()
            if t.back and len(pool) >= t.back:
                deps = (pool[-t.back].transactions[0].transaction_header,)
            txns.append(
                TrackingTransaction(
                    family_name="intkey",
                    family_version="1.0",
                    transaction_header=f"{next(_ids):08x}".ljust(128, "7"),
                    payload=b"p",
                    signer_public_key="03" + "cd" * 32,
                    service_id=service,
                    inputs=None if t.reads is None else tuple(t.reads),
                    outputs=None if t.writes is None else tuple(t.writes),
                    dependencies=deps,
                )
            )
        out.append(
            TrackingBatch(
                service_id=service,
                batch_header=bid,
                data_change_id=None,
                signer_public_key="02" + "ab" * 32,
                trace=False,
                serialized_batch=b"batch:" + bid.encode(),
                created_at=NOW - 1_000,
                transactions=tuple(txns),
            )
        )
    return out


async def check(
    store: BatchTrackingStore,
    rng: random.Random,
    *,
    now: int,
    services: list[str] | None = None,
    limit: int | None = None,
) -> None:
    population = await everything(store)
    live = [b.seq for b in population if not b.is_final and b.seq is not None]
    exclude = sorted(rng.sample(live, k=rng.randint(0, min(4, len(live)))))
    per_service = rng.choice([1, 1, 2, 3, 8])
    for skip in ([], exclude):
        expected = select_parallel_round(
            population,
            now=now,
            delay_window_ms=WINDOW,
            services=services,
            exclude=skip,
            per_service=per_service,
        )
        if limit is not None:
            expected = expected[:limit]
        got = await store.parallel_round(
            now=now,
            delay_window_ms=WINDOW,
            services=services,
            limit=limit,
            exclude=skip,
            per_service=per_service,
        )
        assert [(b.service_id, b.seq) for b in got] == [(b.service_id, b.seq) for b in expected]
        assert got == expected  # every field, transactions and their access sets included
        narrow = await store.parallel_round(
            now=now,
            delay_window_ms=WINDOW,
            services=services,
            limit=limit,
            narrow=True,
            exclude=skip,
            per_service=per_service,
        )
        assert [b.seq for b in narrow] == [b.seq for b in expected]


async def grow(
    store: BatchTrackingStore, population: list[Spec], chunks: int, rng: random.Random
) -> None:
    """Add in ``chunks`` calls; between them, apply a random part of the
    outcomes of what is added so far, in random order."""
    added: list[tuple[TrackingBatch, Spec]] = []
    step = max(1, len(population) // chunks)
    for i in range(0, len(population), step):
        part = population[i : i + step]
        batches = build(part, [b for b, _ in added])
        stored = await store.add_batches(batches)
        added += list(zip(stored, part, strict=True))
        waiting = [item for item in added if item[1].state != "new"]
        rng.shuffle(waiting)
        for b, spec in waiting[: rng.randint(0, len(waiting))]:
            await apply(store, b, spec)  # type: ignore[arg-type]
            added.remove((b, spec))
    rest = [item for item in added if item[1].state != "new"]
    rng.shuffle(rest)
    for b, spec in rest:
        await apply(store, b, spec)  # type: ignore[arg-type]


def writes_of(b: TrackingBatch, spec: Spec) -> list[BatchWrite]:
    """The writes ``apply`` makes for ``spec``, as ``apply_writes`` takes them."""
    bid, sid, at = b.batch_header, b.service_id, spec.attempt

    def attempt(status: BatchStatusName | None = None) -> BatchWrite:
        return BatchWrite(sid, bid, status, attempt=True, now=at)

    match spec.state:
        case "new":
            return []
        case "submitted":
            return [attempt()]
        case "submitted-pending":
            return [attempt(BatchStatusName.PENDING)]
        case "pending":
            return [BatchWrite(sid, bid, Pending(), now=at)]
        case "unknown":
            return [BatchWrite(sid, bid, Unknown(), now=at)]
        case "unknown-resubmitting":
            return [BatchWrite(sid, bid, Unknown(), now=at), attempt()]
        case "delayed":
            return [BatchWrite(sid, bid, Delayed(), now=at)]
        case "delayed-resubmitting":
            return [BatchWrite(sid, bid, Delayed(), now=at - 1), attempt()]
        case "committed":
            return [BatchWrite(sid, bid, Committed(), now=at)]
        case "submitted-committed":
            return [attempt(), BatchWrite(sid, bid, Committed(), now=at)]
        case "valid":
            return [BatchWrite(sid, bid, Valid(), now=at)]
        case "invalid":
            return [BatchWrite(sid, bid, Invalid(), now=at)]
        case "submitted-invalid":
            return [attempt(), BatchWrite(sid, bid, Invalid(), now=at)]
        case other:
            raise AssertionError(other)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    population=st.lists(specs, min_size=1, max_size=40),
    chunks=st.integers(1, 3),
    group=st.integers(2, 40),
    seed=st.integers(0, 2**16),
)
async def test_outcomes_written_in_groups_equal_the_reference(
    sql_store: BatchTrackingStore, population: list[Spec], chunks: int, group: int, seed: int
) -> None:
    """Many batches of a service become final in one statement (a group
    write): consecutive blockers of one batch, a blocker and the batch it
    holds, in any order; the blockers left are those of the rule."""
    rng = random.Random(seed)
    step = max(1, len(population) // chunks)
    added: list[tuple[TrackingBatch, Spec]] = []
    for i in range(0, len(population), step):
        part = population[i : i + step]
        stored = await sql_store.add_batches(build(part, [b for b, _ in added]))
        added += list(zip(stored, part, strict=True))
        rng.shuffle(added)
        k = rng.randint(0, len(added))
        take, added = added[:k], added[k:]
        writes = [w for b, spec in take for w in writes_of(b, spec)]
        for g in range(0, len(writes), group):
            part = writes[g : g + group]
            assert await sql_store.apply_writes(part) == [None] * len(part)
        await check(sql_store, rng, now=NOW)
    writes = [w for b, spec in added for w in writes_of(b, spec)]
    assert await sql_store.apply_writes(writes) == [None] * len(writes)
    await check(sql_store, rng, now=NOW)
    await check(sql_store, rng, now=NOW + WINDOW)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    population=st.lists(specs, min_size=1, max_size=40),
    chunks=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    now=st.sampled_from([NOW, NOW + WINDOW]),
    subset=st.none() | st.lists(st.integers(0, 7), max_size=4),
    limit=st.none() | st.integers(1, 4),
)
async def test_store_parallel_round_equals_the_reference(
    sql_store: BatchTrackingStore,
    population: list[Spec],
    chunks: int,
    seed: int,
    now: int,
    subset: list[int] | None,
    limit: int | None,
) -> None:
    rng = random.Random(seed)
    # The store is shared by the examples: populations pile up, as in production.
    await grow(sql_store, population, chunks, rng)
    services = None if subset is None else [f"svc-{i}" for i in subset]
    await check(sql_store, rng, now=now, services=services, limit=limit)
    await check(sql_store, rng, now=now)


@pytest.mark.parametrize("seed", [1, 2])
async def test_many_services_and_keys_equal_the_reference(
    sql_store: BatchTrackingStore, seed: int
) -> None:
    rng = random.Random(seed)

    def entries() -> list[str] | None:
        return (
            None
            if rng.random() < 0.02
            else rng.sample(ENTRIES[:4] + ENTRIES[7:], rng.randint(0, 2))
        )

    population = [
        Spec(
            service=rng.randrange(40),
            txns=[
                TxnSpec(entries(), entries(), rng.choice([0, 0, 0, 0, 1, 3]))
                for _ in range(rng.randint(1, 2))
            ],
            state=rng.choice(["new"] * 8 + STATES),
            attempt=rng.choice(ATTEMPTS),
        )
        for _ in range(400)
    ]
    await grow(sql_store, population, chunks=8, rng=rng)
    for now in (NOW - 1, NOW, NOW + WINDOW):
        await check(sql_store, rng, now=now)
    await check(sql_store, rng, now=NOW, services=[f"svc-{i}" for i in range(0, 40, 3)])
    await check(sql_store, rng, now=NOW, limit=7)


def _fresh_free(population: list[TrackingBatch]) -> set[int]:
    """The never-taken batches the rule lets go now (every place of every service)."""
    picks = select_parallel_round(
        population, now=NOW, delay_window_ms=WINDOW, per_service=len(population) + 1
    )
    return {
        b.seq for b in picks if b.batch_status is None and not b.submitted and b.seq is not None
    }


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    population=st.lists(specs, min_size=1, max_size=40),
    chunks=st.integers(1, 3),
    finals=st.integers(1, 12),
    all_of_them=st.booleans(),
    seed=st.integers(0, 2**16),
)
async def test_final_statuses_take_what_they_free(
    sql_store: BatchTrackingStore,
    population: list[Spec],
    chunks: int,
    finals: int,
    all_of_them: bool,
    seed: int,
) -> None:
    """A group of final statuses with ``take_freed`` (the parallel queuer's
    final → freed merge) takes only batches the rule frees with them — never
    one free before, never one still held — at most ``take_freed`` per status,
    every one of them when the limits allow, each recorded taken; what it
    leaves is the store's round. On SQLite it takes nothing."""
    rng = random.Random(seed)
    await sql_store.parallel_round(now=NOW, delay_window_ms=WINDOW)  # keeps lock entries
    await grow(sql_store, population, chunks, rng)
    before = await everything(sql_store)
    free_before = _fresh_free(before)
    open_ = [b for b in before if not b.is_final]
    # The earliest open batches (the likeliest to hold others), or any.
    chosen = open_[:finals] if rng.random() < 0.5 else rng.sample(open_, k=min(finals, len(open_)))
    writes = [
        BatchWrite(
            b.service_id,
            b.batch_header,
            rng.choice([Committed(), Invalid()]),
            now=NOW + 5,
            take_freed=100 if all_of_them else rng.choice([1, 2, 100]),
            freed=[],
        )
        for b in chosen
    ]
    assert await sql_store.apply_writes(writes) == [None] * len(writes)
    taken = [b for w in writes for b in (w.freed or [])]
    after = await everything(sql_store)
    by_seq = {b.seq: b for b in after}
    if not sql_store.takes_freed:
        assert taken == []
        return
    taken_seqs = {b.seq for b in taken}
    assert len(taken_seqs) == len(taken)
    for w in writes:
        assert len(w.freed or []) <= w.take_freed
        seqs = [b.seq for b in w.freed or []]
        assert seqs == sorted(seqs)
    # As if nothing had been taken: what the final statuses freed.
    untaken = [dataclasses.replace(b, submitted=False) if b.seq in taken_seqs else b for b in after]
    # A batch declaring dependencies goes through the queue, which checks them.
    declaring = {b.seq for b in after if any(t.dependencies for t in b.transactions)}
    freed = _fresh_free(untaken) - free_before - declaring
    assert taken_seqs <= freed
    if all_of_them:
        assert taken_seqs == freed
    old = {b.seq: b for b in before}
    for b in taken:
        stored = by_seq[b.seq]
        assert stored.submitted and stored.attempts == old[b.seq].attempts + 1
        assert stored.last_attempt_at == NOW + 5
        assert b == stored  # every field, transactions included
    # What was freed and not taken is the store's to pick.
    assert _fresh_free(after) == (_fresh_free(untaken) - taken_seqs)
    await check(sql_store, rng, now=NOW)
