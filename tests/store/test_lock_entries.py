"""PostgreSQL keeps the parallel queuer's lock entries only once asked (migration 12).

A store whose services are all serial (``open_store(lock_entries=False)`` on
a database that never kept them) writes no ``batch_locks`` rows and no
``blocked_by``; the first store that asks (``lock_entries=True``, or any
``parallel_round``) computes them for every open batch, and from then on
every store of the database keeps them. Checked against a database that kept
them all along: the same entries, the same blockers, the same rounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from ledgerq.clock import ManualClock
from ledgerq.model import Committed, Invalid, Pending, TrackingBatch
from ledgerq.store import BatchTrackingStore, migrate_database, open_store
from ledgerq.store.postgres import ADVISORY_CLASS_LOCK_ENTRIES
from ledgerq.store.sqlfiles import load_migrations

from .test_parallel_round import WINDOW, batch, ready, tid

pytestmark = pytest.mark.pg

P = "1cf126"
A, B, C = (f"{P}{c * 64}" for c in "abc")


def _population() -> list[list[TrackingBatch]]:
    """add_batches calls: keyed, prefixes, unknown access, dependencies within
    one call and across calls, services of every kind."""
    a1 = batch("a", [A], [A])
    a2 = batch("a", [B], [B])
    a3 = batch("a", [A], [], deps=[tid(a2)])
    b1 = batch("b", None, None)
    b2 = batch("b", None, None)
    c1 = batch("c", [P], [P])
    c2 = batch("c", [C], [C])
    c3 = batch("c", [B], [B])
    return [
        [a1, a2, a3, b1],
        [b2, c1, batch("a", [C], [C], deps=[tid(a1)])],
        [c2, c3, batch("b", [A], [A]), batch("d", [A], [A])],
    ]


async def _lock_state(url: str) -> tuple[set[tuple[str, str, str]], dict[str, str | None]]:
    """Every lock entry (batch id, mode, entry) and every open batch's blocker."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT b.batch_id, l.mode, l.entry FROM batch_locks l JOIN batches b ON b.seq = l.seq"
        )
        entries = {(str(r[0]), str(r[1]), str(r[2])) for r in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT b.batch_id, h.batch_id FROM batches b LEFT JOIN batches h"
            " ON h.seq = b.blocked_by WHERE NOT b.final"
        )
        held = {str(r[0]): None if r[1] is None else str(r[1]) for r in await cur.fetchall()}
    return entries, held


async def _kept(url: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT kept FROM lock_entries_kept")
        row = await cur.fetchone()
        assert row is not None
        return bool(row[0])


async def _drive(store: BatchTrackingStore, clock: ManualClock) -> list[TrackingBatch]:
    """The population added, some batches made final (heads, blockers, a middle one)."""
    added: list[TrackingBatch] = []
    for call in _population():
        added += await store.add_batches(call)
    a1, a2, _, b1 = added[:4]
    await store.change_batch_to_submitted(a1.batch_header, "a", now=clock())
    await store.update_batch_status(a1.batch_header, "a", Committed(), now=clock())
    await store.update_batch_status(b1.batch_header, "b", Invalid(), now=clock())
    await store.update_batch_status(a2.batch_header, "a", Pending(), now=clock())
    return added


async def _rounds(store: BatchTrackingStore, clock: ManualClock) -> list[list[str]]:
    out = []
    taken: list[int] = []
    while True:
        got = await store.parallel_round(now=clock(), delay_window_ms=WINDOW, exclude=taken)
        if not got:
            return out
        out.append([b.batch_header for b in got])
        taken += [b.seq for b in got if b.seq is not None]


def _by_position(
    added: list[TrackingBatch], state: tuple[set[tuple[str, str, str]], dict[str, str | None]]
) -> tuple[set[tuple[int, str, str]], dict[int, int | None]]:
    """Batch ids replaced by their position in the population (ids differ per run)."""
    pos = {b.batch_header: i for i, b in enumerate(added)}
    # A dependency entry names a transaction: by its batch's position too.
    owner = {tid(b): str(i) for i, b in enumerate(added)}
    entries, held = state
    return (
        {(pos[bid], mode, owner[e] if mode == "d" else e) for bid, mode, e in entries},
        {pos[bid]: None if h is None else pos[h] for bid, h in held.items()},
    )


async def test_a_serial_store_keeps_no_entries_until_one_asks(
    make_pg_database: Callable[[], str], clock: ManualClock
) -> None:
    plain_url, full_url = make_pg_database(), make_pg_database()
    async with await open_store(plain_url, clock=clock, lock_entries=False) as plain:
        plain_added = await _drive(plain, clock)
        assert not await _kept(plain_url)
        entries, held = await _lock_state(plain_url)
        assert entries == set()
        assert set(held.values()) == {None}
        # The serial round does not read them: the head of every service
        # without a batch in flight ("a" has one Pending), as ever.
        heads = await plain.queue_round(now=clock(), delay_window_ms=WINDOW)
        assert {b.service_id for b in heads} == {"b", "c", "d"}
    async with await open_store(full_url, clock=clock, lock_entries=True) as full:
        assert await _kept(full_url)
        full_added = await _drive(full, clock)
        full_state = _by_position(full_added, await _lock_state(full_url))
        full_rounds = await _rounds(full, clock)
    # Another store asking for them computes them for every open batch.
    async with await open_store(plain_url, clock=clock, lock_entries=True) as asked:
        assert await _kept(plain_url)
        assert _by_position(plain_added, await _lock_state(plain_url)) == full_state
        pos = {b.batch_header: i for i, b in enumerate(plain_added)}
        full_pos = {b.batch_header: i for i, b in enumerate(full_added)}
        rounds = [[pos[b] for b in r] for r in await _rounds(asked, clock)]
        assert rounds == [[full_pos[b] for b in r] for r in full_rounds]


async def test_a_parallel_round_asks_and_later_stores_keep_them(
    pg_url: str, clock: ManualClock
) -> None:
    async with await open_store(pg_url, clock=clock, lock_entries=False) as store:
        first = await store.add_batches(
            [batch("s", [A], [A]), batch("s", [B], [B]), batch("s", [A], [A])]
        )
        assert (await _lock_state(pg_url))[0] == set()
        # The held batch is not handed out: the round computed its blocker first.
        assert await ready(store, clock, "s") == [b.batch_header for b in first[:2]]
        assert await _kept(pg_url)
    # A serial store opened afterwards follows the database: entries kept.
    async with await open_store(pg_url, clock=clock, lock_entries=False) as serial:
        [third] = await serial.add_batches([batch("s", [A], [])])
        _, held = await _lock_state(pg_url)
        assert held[third.batch_header] == first[2].batch_header  # the latest writer of A


async def test_a_batch_added_while_entries_are_turned_on_gets_its_own(
    pg_url: str, clock: ManualClock
) -> None:
    async with await open_store(pg_url, clock=clock, lock_entries=False) as store:
        [first] = await store.add_batches([batch("s", [A], [A])])
        # The switch in progress (its exclusive lock held, kept written, not committed).
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            switch = (ADVISORY_CLASS_LOCK_ENTRIES,)
            await conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", switch)
            await conn.execute("UPDATE lock_entries_kept SET kept = TRUE")
            adding = asyncio.create_task(store.add_batches([batch("s", [A], [A])]))
            await _wait_until_blocked(pg_url)
            assert not adding.done()
            # Stands for the repair: the open batch's entries and blocker.
            await conn.execute(
                "INSERT INTO batch_locks VALUES (%s, 's', 'w', %s), (%s, 's', 'r', %s)",
                (first.seq, A, first.seq, A),
            )
            await conn.commit()
        [second] = await adding
        _, held = await _lock_state(pg_url)
        assert held[second.batch_header] == first.batch_header


async def _wait_until_blocked(url: str, timeout_s: float = 10.0) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with asyncio.timeout(timeout_s):
            while True:
                cur = await conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                row = await cur.fetchone()
                if row is not None and row[0] > 0:
                    return
                await asyncio.sleep(0.005)


async def test_a_store_migrated_from_version_11_keeps_its_entries(
    pg_url: str, clock: ManualClock
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at BIGINT NOT NULL)"
        )
        for m in load_migrations("postgresql")[:11]:
            conn.execute(m.sql.encode())
            conn.execute("INSERT INTO schema_version VALUES (%s, %s, 0)", (m.version, m.name))
    result = await migrate_database(pg_url)
    assert result.after >= 12
    assert await _kept(pg_url)
    async with await open_store(pg_url, clock=clock, lock_entries=False) as store:
        first, second = await store.add_batches([batch("s", [A], [A]), batch("s", [A], [A])])
        _, held = await _lock_state(pg_url)
        assert held == {first.batch_header: None, second.batch_header: first.batch_header}


async def _lock_entry_scans(conn: psycopg.AsyncConnection[object], seq: int) -> int:
    """Scans of batch_locks by making batch ``seq`` final, in a transaction rolled back."""
    async with conn.transaction(force_rollback=True):
        await conn.execute(
            "UPDATE batches SET status = 'Committed', final = TRUE WHERE seq = %s", (seq,)
        )
        cur = await conn.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0)"
            " FROM pg_stat_xact_user_tables WHERE relname = 'batch_locks'"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_a_serial_store_releases_batches_without_reading_lock_entries(
    make_pg_database: Callable[[], str], clock: ManualClock
) -> None:
    # Nothing kept, nothing to delete or re-point: the release moves the head only.
    plain_url, full_url = make_pg_database(), make_pg_database()
    for url, keep in ((plain_url, False), (full_url, True)):
        async with await open_store(url, clock=clock, lock_entries=keep) as store:
            first, _ = await store.add_batches([batch("s", [A], [A]), batch("s", [A], [A])])
            assert first.seq is not None
        async with await psycopg.AsyncConnection.connect(url) as conn:
            assert (await _lock_entry_scans(conn, first.seq) > 0) is keep


async def test_a_batch_made_final_while_entries_are_turned_on_releases_them(
    pg_url: str, clock: ManualClock
) -> None:
    # The release reads lock_entries_kept after the queue_heads locks the
    # switch holds: once the switch committed, the entries it wrote for the
    # batch go and the batch it held is free.
    async with await open_store(pg_url, clock=clock, lock_entries=False) as store:
        first, second = await store.add_batches([batch("s", [A], [A]), batch("s", [A], [A])])
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            await conn.execute(
                "SELECT pg_advisory_xact_lock(%s, 0)", (ADVISORY_CLASS_LOCK_ENTRIES,)
            )
            await conn.execute("SELECT 1 FROM queue_heads ORDER BY service_id FOR UPDATE")
            await conn.execute("UPDATE lock_entries_kept SET kept = TRUE")
            # Stands for the repair: the open batches' entries and blocker.
            await conn.execute(
                "INSERT INTO batch_locks VALUES (%s, 's', 'w', %s), (%s, 's', 'w', %s)",
                (first.seq, A, second.seq, A),
            )
            await conn.execute(
                "UPDATE batches SET blocked_by = %s WHERE seq = %s", (first.seq, second.seq)
            )
            finishing = asyncio.create_task(
                store.update_batch_status(first.batch_header, "s", Committed(), now=clock())
            )
            await _wait_until_blocked(pg_url)
            assert not finishing.done()
            await conn.commit()
        await finishing
        entries, held = await _lock_state(pg_url)
        assert entries == {(second.batch_header, "w", A)}
        assert held == {second.batch_header: None}
