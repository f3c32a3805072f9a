"""The in-memory store behaves exactly like SQLite (and so like PostgreSQL,
which passes the same contract): random operation sequences give the same
results, the same errors and the same listings on both."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq.clock import ManualClock
from ledgerq.errors import LedgerqError
from ledgerq.model import (
    BatchStatusName,
    Committed,
    Delayed,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TrackingBatch,
    TransactionReceipt,
    Unknown,
    Valid,
)
from ledgerq.store import BatchTrackingStore, BatchWrite, open_store

from .conftest import make_batch

SERVICES = ("a::1", "b::2")
_BASE = [
    make_batch(SERVICES[i % 2], txns=1 + i % 2, data_change_id=f"d{i}" if i % 3 else None)
    for i in range(6)
]


def _depending(i: int) -> TrackingBatch:
    """Batch ``i`` depending on the next two (a ring, across services), and
    the odd ones also on a transaction no batch tracks."""
    b = _BASE[i]
    deps = [_BASE[(i + k) % len(_BASE)].transactions[0].transaction_header for k in (1, 2)]
    if i % 2:
        deps.insert(1, "e" * 128)
    tx = dataclasses.replace(b.transactions[0], dependencies=tuple(deps))
    return dataclasses.replace(b, transactions=(tx, *b.transactions[1:]))


POOL: list[TrackingBatch] = [_depending(i) for i in range(len(_BASE))]

statuses = st.sampled_from(
    [
        None,
        Pending(),
        Unknown(),
        Delayed(),
        Committed(),
        Valid(),
        Invalid((InvalidTransaction(POOL[0].transactions[0].transaction_header, "bad"),)),
    ]
)
errors = st.one_of(st.none(), st.builds(SubmissionError, st.just("busy"), st.text(max_size=5)))
index = st.integers(0, len(POOL) - 1)


def _id(i: int, by_dc: bool) -> str:
    b = POOL[i]
    return f"dc:{b.data_change_id}" if by_dc and b.data_change_id else b.batch_header


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(index, min_size=1, max_size=3)),
        st.tuples(
            st.just("submit"),
            index,
            st.booleans(),
            st.sampled_from([None, "Pending", "Delayed", "Unknown"]),
            errors,
        ),
        st.tuples(st.just("update"), index, st.booleans(), statuses, errors),
        st.tuples(st.just("updates"), st.lists(st.tuples(index, statuses), max_size=3)),
        st.tuples(st.just("clean"), st.integers(0, 4)),
        st.tuples(st.just("tick"), st.integers(1, 3)),
    ),
    max_size=25,
)


async def _apply(store: BatchTrackingStore, clock: ManualClock, op: tuple[Any, ...]) -> object:
    kind = op[0]
    if kind == "add":
        added = await store.add_batches([POOL[i] for i in op[1]])
        return [b.batch_header for b in added]
    if kind == "submit":
        _, i, by_dc, status, error = op
        return await store.change_batch_to_submitted(
            _id(i, by_dc), POOL[i].service_id, None, status, error
        )
    if kind == "update":
        _, i, by_dc, status, error = op
        receipts = [TransactionReceipt(POOL[i].transactions[0].transaction_header, True)]
        return await store.update_batch_status(
            _id(i, by_dc), POOL[i].service_id, status, receipts, error
        )
    if kind == "updates":
        writes = [BatchWrite(POOL[i].service_id, POOL[i].batch_header, s) for i, s in op[1]]
        return [type(e).__name__ if e else None for e in await store.apply_writes(writes)]
    if kind == "clean":
        return await store.clean_stale_records(clock.value - op[1] * 1000)
    clock.advance(op[1] * 1000)
    return None


def _comparable(batch: TrackingBatch) -> TrackingBatch:
    # seq values may differ (gaps); their order is compared through list order.
    return dataclasses.replace(batch, seq=None)


async def _snapshot(store: BatchTrackingStore) -> dict[str, object]:
    return {
        "all": [_comparable(b) for b in await store.list_batches(limit=100)],
        "counts": await store.status_counts(),
        "services": await store.list_services(),
        "failed": [b.batch_header for b in await store.get_failed_batches()],
        "unsubmitted": [b.batch_header for b in await store.get_unsubmitted_batches()],
        "pending": [
            b.batch_header for b in await store.list_batches_by_status(BatchStatusName.PENDING)
        ],
        "dependency paths": [await _path(store, b) for b in POOL],
    }


async def _path(store: BatchTrackingStore, batch: TrackingBatch) -> object:
    path = await store.dependency_path(batch.service_id, batch.batch_id, 4)
    if path is None:
        return None
    # seq values may differ (gaps).
    return ([dataclasses.replace(s, seq=0) for s in path.steps], path.untracked)


async def _run(ops: list[tuple[Any, ...]], url: str) -> list[object]:
    clock = ManualClock()
    trace: list[object] = []
    async with await open_store(url, clock=clock, lock_entries=True) as store:
        for op in ops:
            try:
                result: object = await _apply(store, clock, op)
            except LedgerqError as exc:
                result = type(exc).__name__
            trace.append((op[0], result, await _snapshot(store)))
    return trace


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(operations)
def test_memory_and_sqlite_agree_on_every_sequence(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = asyncio.run(_run(ops, f"sqlite:///{Path(tmp) / 's.sqlite3'}"))
    memory = asyncio.run(_run(ops, "memory://"))
    assert memory == sqlite
