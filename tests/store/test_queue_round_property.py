"""``queue_round`` in SQL equals the reference rules (``select_round``) on random populations.

Populations are built through the store's own API — every state the store can
hold: new, submitted, Pending with and without ``submitted``, Unknown and
Delayed (waiting or being resubmitted), final with and without ``submitted``
— with ``created_at`` ties, attempt times on both sides of the delay window's
edge, and hundreds of services. The reference round is computed from the same
rows read back with ``list_batches``, so both see identical data.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq.clock import ManualClock
from ledgerq.model import (
    Committed,
    Delayed,
    Invalid,
    Pending,
    TrackingBatch,
    Unknown,
    Valid,
)
from ledgerq.queue.serial import select_round
from ledgerq.store import BatchTrackingStore, open_store

from .conftest import make_batch

SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.pg),
]

NOW = 1_700_000_100_000
WINDOW = 15_000
#: Attempt times around the delay window's edge for NOW.
ATTEMPTS = [NOW - WINDOW - 1, NOW - WINDOW, NOW - WINDOW + 1, NOW - 1, NOW]
STATES = [
    "new",
    "submitted",
    "submitted-pending",
    "pending",
    "unknown",
    "unknown-resubmitting",
    "delayed",
    "delayed-resubmitting",
    "committed",
    "submitted-committed",
    "valid",
    "invalid",
    "submitted-invalid",
]


@dataclass(frozen=True)
class Spec:
    service: int
    created_at: int
    state: str
    attempt: int


specs = st.builds(
    Spec,
    service=st.integers(0, 299),
    created_at=st.sampled_from([NOW - 2_000, NOW - 1_000, NOW - 1_000]),
    # New batches are the common case; make them likelier.
    state=st.sampled_from(["new"] * 4 + STATES),
    attempt=st.sampled_from(ATTEMPTS),
)


@pytest.fixture(params=SQL_BACKENDS)
async def sql_store(
    request: pytest.FixtureRequest, store_url_factory: Callable[[str], str]
) -> AsyncIterator[BatchTrackingStore]:
    async with await open_store(store_url_factory(request.param), clock=ManualClock(NOW)) as s:
        yield s


async def populate(store: BatchTrackingStore, population: list[Spec], chunks: int) -> None:
    batches = [make_batch(f"svc-{s.service:03d}", created_at=s.created_at) for s in population]
    # Several add_batches calls: acceptance order spans requests.
    step = max(1, len(batches) // chunks)
    added: list[TrackingBatch] = []
    for i in range(0, len(batches), step):
        added += await store.add_batches(batches[i : i + step])
    for spec, b in zip(population, added, strict=True):
        await apply(store, b, spec)


async def apply(store: BatchTrackingStore, b: TrackingBatch, spec: Spec) -> None:
    bid, sid, at = b.batch_header, b.service_id, spec.attempt
    match spec.state:
        case "new":
            pass
        case "submitted":
            await store.change_batch_to_submitted(bid, sid, now=at)
        case "submitted-pending":
            await store.change_batch_to_submitted(bid, sid, dlt_status="Pending", now=at)
        case "pending":
            await store.update_batch_status(bid, sid, Pending(), now=at)
        case "unknown":
            await store.update_batch_status(bid, sid, Unknown(), now=at)
        case "unknown-resubmitting":
            await store.update_batch_status(bid, sid, Unknown(), now=at)
            await store.change_batch_to_submitted(bid, sid, now=at)
        case "delayed":
            await store.update_batch_status(bid, sid, Delayed(), now=at)
        case "delayed-resubmitting":
            await store.update_batch_status(bid, sid, Delayed(), now=at - 1)
            await store.change_batch_to_submitted(bid, sid, now=at)
        case "committed":
            await store.update_batch_status(bid, sid, Committed(), now=at)
        case "submitted-committed":
            await store.change_batch_to_submitted(bid, sid, now=at)
            await store.update_batch_status(bid, sid, Committed(), now=at)
        case "valid":
            await store.update_batch_status(bid, sid, Valid(), now=at)
        case "invalid":
            await store.update_batch_status(bid, sid, Invalid(), now=at)
        case "submitted-invalid":
            await store.change_batch_to_submitted(bid, sid, now=at)
            await store.update_batch_status(bid, sid, Invalid(), now=at)
        case other:
            raise AssertionError(other)


async def everything(store: BatchTrackingStore) -> list[TrackingBatch]:
    out: list[TrackingBatch] = []
    after = 0
    while True:
        page = (await store.list_batches(limit=10_000, after_seq=after)).batches
        out += page
        if len(page) < 10_000:
            return out
        after = page[-1].seq or 0


async def check(
    store: BatchTrackingStore,
    *,
    now: int,
    services: list[str] | None = None,
    limit: int | None = None,
) -> None:
    population = await everything(store)
    expected = select_round(population, now=now, delay_window_ms=WINDOW, services=services)
    if limit is not None:
        expected = expected[:limit]
    got = await store.queue_round(now=now, delay_window_ms=WINDOW, services=services, limit=limit)
    assert [(b.service_id, b.batch_header) for b in got] == [
        (b.service_id, b.batch_header) for b in expected
    ]
    assert got == expected  # every field, transactions included
    # A narrow round picks the same batches in the same state; loading them by
    # seq gives back every field.
    narrow = await store.queue_round(
        now=now, delay_window_ms=WINDOW, services=services, limit=limit, narrow=True
    )
    assert [_state(b) for b in narrow] == [_state(b) for b in expected]
    loaded = await store.get_batches_by_seq([b.seq for b in narrow if b.seq is not None])
    assert loaded == sorted(expected, key=lambda b: b.seq or 0)


def _state(b: TrackingBatch) -> tuple[object, ...]:
    return (
        b.service_id,
        b.batch_header,
        b.seq,
        b.submitted,
        b.status_name,
        b.attempts,
        b.last_attempt_at,
        b.created_at,
    )


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    population=st.lists(specs, min_size=1, max_size=60),
    chunks=st.integers(1, 4),
    now=st.sampled_from([NOW, NOW - 1, NOW + WINDOW]),
    subset=st.none() | st.lists(st.integers(0, 310), max_size=40),
    limit=st.none() | st.integers(1, 20),
)
async def test_store_round_equals_the_reference(
    sql_store: BatchTrackingStore,
    population: list[Spec],
    chunks: int,
    now: int,
    subset: list[int] | None,
    limit: int | None,
) -> None:
    # The store is shared by the examples: populations pile up, as in production.
    await populate(sql_store, population, chunks)
    services = None if subset is None else [f"svc-{i:03d}" for i in subset]
    await check(sql_store, now=now, services=services, limit=limit)
    await check(sql_store, now=now)


@pytest.mark.parametrize("seed", [1, 2])
async def test_hundreds_of_services_equal_the_reference(
    sql_store: BatchTrackingStore, seed: int
) -> None:
    rng = random.Random(seed)
    population = [
        Spec(
            service=rng.randrange(400),
            created_at=rng.choice([NOW - 2_000, NOW - 1_000]),
            state=rng.choice(["new"] * 6 + STATES),
            attempt=rng.choice(ATTEMPTS),
        )
        for _ in range(800)
    ]
    await populate(sql_store, population, chunks=5)
    for now in (NOW - 1, NOW, NOW + WINDOW):
        await check(sql_store, now=now)
    some = [f"svc-{i:03d}" for i in rng.sample(range(420), 150)]
    await check(sql_store, now=NOW, services=some)
    await check(sql_store, now=NOW, limit=50)
