"""Store contract: ``parallel_round``, the per-key parallel queuer set-based, on every backend.

The cases the random populations of ``test_parallel_round_property.py`` reach
rarely, stated one by one: dependencies inside one ``add_batches`` call and
across calls, a blocker that becomes final while an earlier conflicting batch
is still open, access sets read back as sent, and batches tracked before the
store recorded access sets.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

import psycopg
import pytest

from ledgerq.clock import ManualClock
from ledgerq.model import Committed, Invalid, Pending, TrackingBatch, TrackingTransaction
from ledgerq.queue.parallel import select_parallel_round
from ledgerq.store import BatchTrackingStore, BatchWrite, migrate_database, open_store
from ledgerq.store.sqlfiles import load_migrations
from ledgerq.store.sqlite import path_from_url, split_script

from .conftest import hex_id

WINDOW = 15_000
A, B, C = (f"1cf126{c * 64}" for c in "abc")


def batch(
    service: str,
    reads: Sequence[str] | None = (),
    writes: Sequence[str] | None = (),
    deps: Sequence[str] = (),
) -> TrackingBatch:
    bid = hex_id("b")
    return TrackingBatch(
        service_id=service,
        batch_header=bid,
        data_change_id=None,
        signer_public_key="02" + "ab" * 32,
        trace=False,
        serialized_batch=b"batch:" + bid.encode(),
        transactions=(
            TrackingTransaction(
                family_name="intkey",
                family_version="1.0",
                transaction_header=hex_id("t"),
                payload=b"p",
                signer_public_key="03" + "cd" * 32,
                service_id=service,
                inputs=None if reads is None else tuple(reads),
                outputs=None if writes is None else tuple(writes),
                dependencies=tuple(deps),
            ),
        ),
    )


def tid(b: TrackingBatch) -> str:
    return b.transactions[0].transaction_header


async def picks(
    store: BatchTrackingStore, clock: ManualClock, exclude: Sequence[int] = ()
) -> list[str]:
    got = await store.parallel_round(now=clock(), delay_window_ms=WINDOW, exclude=exclude)
    return [b.batch_header for b in got]


async def ready(store: BatchTrackingStore, clock: ManualClock, service: str) -> list[str]:
    """Every batch the service may have in flight now: ask, exclude, ask again."""
    taken: list[int] = []
    out: list[str] = []
    while True:
        got = await store.parallel_round(
            now=clock(), delay_window_ms=WINDOW, services=[service], exclude=taken
        )
        if not got:
            return out
        out.append(got[0].batch_header)
        assert got[0].seq is not None
        taken.append(got[0].seq)


async def test_access_sets_are_read_back_as_sent(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    sent = batch("s", reads=[A.upper(), "1cf1"], writes=[], deps=["ff" * 64])
    legacy = batch("s", reads=None, writes=None)
    [stored, stored_legacy] = await store.add_batches([sent, legacy])
    got = await store.get_batch(stored.batch_header, "s")
    assert got is not None and got.transactions == sent.transactions
    got = await store.get_batch(stored_legacy.batch_header, "s")
    assert got is not None and got.transactions[0].inputs is None


async def test_independent_batches_are_all_ready_one_per_round(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    added = await store.add_batches([batch("s", [k], [k]) for k in (A, B, C)])
    assert await picks(store, clock) == [added[0].batch_header]
    assert await ready(store, clock, "s") == [b.batch_header for b in added]


async def test_a_dependency_inside_one_call_blocks_the_later_batch(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    first = batch("s", [A], [A])
    second = batch("s", [B], [B], deps=[tid(first)])
    other = batch("s", [C], [C])
    added = await store.add_batches([first, second, other])
    assert await ready(store, clock, "s") == [added[0].batch_header, added[2].batch_header]
    await store.update_batch_status(added[0].batch_header, "s", Committed(), now=clock())
    assert await ready(store, clock, "s") == [added[1].batch_header, added[2].batch_header]


async def test_a_dependency_across_calls_blocks_until_the_batch_is_final(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    [first] = await store.add_batches([batch("s", [A], [A])])
    [second] = await store.add_batches([batch("s", [B], [B], deps=[tid(first)])])
    # Dependencies on another service's transactions order nothing.
    [elsewhere] = await store.add_batches([batch("t", [B], [B], deps=[tid(first)])])
    assert await ready(store, clock, "s") == [first.batch_header]
    assert await ready(store, clock, "t") == [elsewhere.batch_header]
    # Invalid releases what it holds, as Committed does.
    await store.update_batch_status(first.batch_header, "s", Invalid(), now=clock())
    assert await ready(store, clock, "s") == [second.batch_header]


async def test_a_batch_stays_held_while_any_earlier_conflicting_batch_is_open(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    # w1 writes A, w2 writes B, r reads both: held by both; w2 becomes final
    # first, then w1.
    w1, w2, r = await store.add_batches(
        [batch("s", [], [A]), batch("s", [], [B]), batch("s", [A, B])]
    )
    assert await ready(store, clock, "s") == [w1.batch_header, w2.batch_header]
    await store.change_batch_to_submitted(w2.batch_header, "s", now=clock())
    await store.update_batch_status(w2.batch_header, "s", Pending(), now=clock())
    await store.update_batch_status(w2.batch_header, "s", Committed(), now=clock())
    assert await ready(store, clock, "s") == [w1.batch_header]
    await store.update_batch_status(w1.batch_header, "s", Committed(), now=clock())
    assert await ready(store, clock, "s") == [r.batch_header]


async def test_blockers_made_final_in_one_group_release_together(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    # Every batch writes A: each blocks the next. One group write (one
    # statement on PostgreSQL) makes b1, b2 and b3 final while b0 is open:
    # b4 is then held by b0 alone, and free once b0 is final. In another
    # service, the head and the two after it become final together: the
    # next one is free at once.
    b = await store.add_batches([batch("s", [], [A]) for _ in range(6)])
    c = await store.add_batches([batch("t", [], [A]) for _ in range(4)])
    await store.update_batch_status(b[0].batch_header, "s", Pending(), now=clock())
    writes = [
        BatchWrite(x.service_id, x.batch_header, Committed(), now=clock())
        for x in [b[3], c[1], b[1], c[0], b[2], c[2]]
    ]
    assert await store.apply_writes(writes) == [None] * len(writes)
    assert await ready(store, clock, "s") == []
    assert await ready(store, clock, "t") == [c[3].batch_header]
    await store.update_batch_status(b[0].batch_header, "s", Committed(), now=clock())
    assert await ready(store, clock, "s") == [b[4].batch_header]
    await store.apply_writes(
        [BatchWrite("s", x.batch_header, Invalid(), now=clock()) for x in b[4:]]
    )
    assert await ready(store, clock, "s") == []
    [last] = await store.add_batches([batch("s", [], [A])])
    assert await ready(store, clock, "s") == [last.batch_header]


async def test_prefixes_and_unknown_access_block_what_they_cover(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    ns, leaf, legacy, after = await store.add_batches(
        [
            batch("s", [], ["1CF126"]),
            batch("s", [A]),
            batch("s", None, None),
            batch("s", ["ab" * 35]),
        ]
    )
    assert await ready(store, clock, "s") == [ns.batch_header]
    await store.update_batch_status(ns.batch_header, "s", Committed(), now=clock())
    assert await ready(store, clock, "s") == [leaf.batch_header]
    await store.update_batch_status(leaf.batch_header, "s", Committed(), now=clock())
    assert await ready(store, clock, "s") == [legacy.batch_header]
    await store.update_batch_status(legacy.batch_header, "s", Committed(), now=clock())
    assert await ready(store, clock, "s") == [after.batch_header]


async def test_round_equals_the_reference_after_cleaning(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    old = await store.add_batches([batch("s", [A], [A]) for _ in range(3)])
    for b in old[:2]:
        await store.update_batch_status(b.batch_header, "s", Committed(), now=clock() - 10_000)
    await store.clean_stale_records(clock() - 5_000)
    await store.add_batches([batch("s", [A], [A]), batch("s", [B], [B])])
    everything = list((await store.list_batches(limit=100)).batches)
    expected = select_parallel_round(everything, now=clock(), delay_window_ms=WINDOW)
    assert await store.parallel_round(now=clock(), delay_window_ms=WINDOW) == expected
    assert await ready(store, clock, "s") == [old[2].batch_header, everything[-1].batch_header]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
async def test_batches_tracked_before_the_migration_go_one_at_a_time(
    backend: str, store_url_factory: Callable[[str], str], clock: ManualClock
) -> None:
    """Their access is not known: each is held by the open batch before it,
    and holds every batch after it."""
    url = store_url_factory(backend)
    migrations = load_migrations(backend)
    locks = next(m.version for m in migrations if m.name.endswith("parallel_locks"))
    before = [m for m in migrations if m.version < locks]
    rows = [("s", f"{i:02x}".ljust(128, "a")) for i in range(3)]
    if backend == "sqlite":
        with sqlite3.connect(path_from_url(url)) as conn:
            conn.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at INTEGER NOT NULL)"
            )
            for m in before:
                for statement in split_script(m.sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (m.version, m.name))
            for service, bid in rows:
                conn.execute(
                    "INSERT INTO batches (service_id, batch_id, signer_public_key, trace,"
                    " serialized_batch, created_at) VALUES (?, ?, '02', 0, x'00', 1)",
                    (service, bid),
                )
    else:
        with psycopg.connect(url) as pg:
            pg.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at BIGINT NOT NULL)"
            )
            for m in before:
                pg.execute(m.sql)  # type: ignore[arg-type]
                pg.execute("INSERT INTO schema_version VALUES (%s, %s, 0)", (m.version, m.name))
            for service, bid in rows:
                pg.execute(
                    "INSERT INTO batches (service_id, batch_id, signer_public_key, trace,"
                    " serialized_batch, created_at) VALUES (%s, %s, '02', false, '\\x00', 1)",
                    (service, bid),
                )
    await migrate_database(url)
    async with await open_store(url, clock=clock, lock_entries=True) as store:
        [new] = await store.add_batches([batch("s", [A], [A])])
        assert await ready(store, clock, "s") == [rows[0][1]]
        for _, bid in rows:
            await store.update_batch_status(bid, "s", Committed(), now=clock())
        assert await ready(store, clock, "s") == [new.batch_header]


async def test_services_show_what_is_in_flight_and_what_holds_the_next_batch(
    store: BatchTrackingStore, clock: ManualClock
) -> None:
    w, r, free = await store.add_batches(
        [batch("a", [], [A.upper()]), batch("a", [A]), batch("a", [B], [B])]
    )
    first = batch("b", [C], [C])
    [first, second] = await store.add_batches([first, batch("b", [B], [B], deps=[tid(first)])])
    await store.change_batch_to_submitted(w.batch_header, "a", dlt_status="Pending", now=clock())
    await store.update_batch_status(free.batch_header, "a", Pending(), now=clock())
    by_id = {s.service_id: s for s in await store.list_services()}
    a, b = by_id["a"], by_id["b"]
    assert (a.in_flight, a.next_batch_id) == (2, r.batch_header)
    assert (a.blocker_batch_id, a.blocker_kind, a.blocker_on) == (w.batch_header, "writes", A)
    assert (b.in_flight, b.next_batch_id, b.blocker_batch_id) == (0, first.batch_header, None)
    await store.change_batch_to_submitted(first.batch_header, "b", now=clock())
    b = {s.service_id: s for s in await store.list_services()}["b"]
    assert (b.in_flight, b.next_batch_id) == (1, second.batch_header)
    assert (b.blocker_batch_id, b.blocker_kind, b.blocker_on) == (
        first.batch_header,
        "depends",
        tid(first),
    )


@pytest.mark.pg
async def test_a_store_upgraded_to_set_based_release_keeps_its_holds(
    store_url_factory: Callable[[str], str], clock: ManualClock
) -> None:
    """A store at the version before the set-based release trigger, with open
    batches holding each other and a head already moved by the old
    triggers, is migrated in place: what it holds is released as before."""
    url = store_url_factory("postgresql")
    migrations = load_migrations("postgresql")
    release = next(m.version for m in migrations if m.name == "set_based_release")
    bids = [f"{i:02x}".ljust(128, "c") for i in range(5)]
    with psycopg.connect(url) as pg:
        pg.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at BIGINT NOT NULL)"
        )
        for m in migrations[: release - 1]:
            pg.execute(m.sql)  # type: ignore[arg-type]
            pg.execute("INSERT INTO schema_version VALUES (%s, %s, 0)", (m.version, m.name))
        seqs: list[int] = []
        for bid in bids:
            row = pg.execute(
                "INSERT INTO batches (service_id, batch_id, signer_public_key, trace,"
                " serialized_batch, created_at, blocked_by)"
                " VALUES ('s', %s, '02', false, '\\x00', 1, %s) RETURNING seq",
                (bid, seqs[-1] if seqs else None),
            ).fetchone()
            assert row is not None
            seqs.append(row[0])
            pg.execute("INSERT INTO batch_locks VALUES (%s, 's', 'w', %s)", (row[0], A.lower()))
        # The old triggers release the first batch.
        pg.execute(
            "UPDATE batches SET status = 'Committed', final = TRUE WHERE seq = %s", (seqs[0],)
        )
    result = await migrate_database(url)
    assert (result.before, result.after) == (release - 1, len(migrations))
    async with await open_store(url, clock=clock, lock_entries=True) as store:
        assert await ready(store, clock, "s") == [bids[1]]
        assert await store.queue_round(now=clock(), delay_window_ms=WINDOW) == [
            await store.get_batch(bids[1], "s")
        ]
        writes = [BatchWrite("s", bid, Committed(), now=clock()) for bid in bids[1:3]]
        assert await store.apply_writes(writes) == [None, None]
        assert await ready(store, clock, "s") == [bids[3]]
        [picked] = await store.queue_round(now=clock(), delay_window_ms=WINDOW)
        assert picked.batch_header == bids[3]
        await store.update_batch_status(bids[3], "s", Committed(), now=clock())
        assert await ready(store, clock, "s") == [bids[4]]
