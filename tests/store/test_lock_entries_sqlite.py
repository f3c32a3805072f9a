"""SQLite keeps the parallel queuer's lock entries only once asked (migration 5),
as PostgreSQL does (``test_lock_entries``).

A store whose services are all serial (``open_store(lock_entries=False)`` on
a database that never kept them) writes no ``batch_locks`` rows and no
``blocked_by``; the first store that asks (``lock_entries=True``, or any
``parallel_round``) computes them for every open batch, and from then on
every store of the database keeps them. Checked against a database that kept
them all along: the same entries, the same blockers, the same rounds.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ledgerq.clock import ManualClock
from ledgerq.store import migrate_database, open_store
from ledgerq.store.sqlfiles import load_migrations

from .test_lock_entries import A, B, _by_position, _drive, _rounds
from .test_parallel_round import batch, ready


def _lock_state(path: Path) -> tuple[set[tuple[str, str, str]], dict[str, str | None]]:
    """Every lock entry (batch id, mode, entry) and every open batch's blocker."""
    with sqlite3.connect(path) as conn:
        entries = {
            (str(r[0]), str(r[1]), str(r[2]))
            for r in conn.execute(
                "SELECT b.batch_id, l.mode, l.entry FROM batch_locks l"
                " JOIN batches b ON b.seq = l.seq"
            )
        }
        held = {
            str(r[0]): None if r[1] is None else str(r[1])
            for r in conn.execute(
                "SELECT b.batch_id, h.batch_id FROM batches b LEFT JOIN batches h"
                " ON h.seq = b.blocked_by WHERE NOT b.final"
            )
        }
    return entries, held


def _kept(path: Path) -> bool:
    with sqlite3.connect(path) as conn:
        return bool(conn.execute("SELECT kept FROM lock_entries_kept").fetchone()[0])


async def test_a_serial_store_keeps_no_entries_until_one_asks(
    tmp_path: Path, clock: ManualClock
) -> None:
    plain_path, full_path = tmp_path / "plain.sqlite3", tmp_path / "full.sqlite3"
    plain_url, full_url = f"sqlite:///{plain_path}", f"sqlite:///{full_path}"
    async with await open_store(plain_url, clock=clock, lock_entries=False) as plain:
        plain_added = await _drive(plain, clock)
        assert not _kept(plain_path)
        entries, held = _lock_state(plain_path)
        assert entries == set()
        assert set(held.values()) == {None}
        # The serial round does not read them: the head of every service
        # without a batch in flight ("a" has one Pending), as ever.
        heads = await plain.queue_round(now=clock(), delay_window_ms=15_000)
        assert {b.service_id for b in heads} == {"b", "c", "d"}
    async with await open_store(full_url, clock=clock, lock_entries=True) as full:
        assert _kept(full_path)
        full_added = await _drive(full, clock)
        full_state = _by_position(full_added, _lock_state(full_path))
        full_rounds = await _rounds(full, clock)
    # Another store asking for them computes them for every open batch.
    async with await open_store(plain_url, clock=clock, lock_entries=True) as asked:
        assert _kept(plain_path)
        assert _by_position(plain_added, _lock_state(plain_path)) == full_state
        pos = {b.batch_header: i for i, b in enumerate(plain_added)}
        full_pos = {b.batch_header: i for i, b in enumerate(full_added)}
        rounds = [[pos[b] for b in r] for r in await _rounds(asked, clock)]
        assert rounds == [[full_pos[b] for b in r] for r in full_rounds]


async def test_a_parallel_round_asks_and_later_stores_keep_them(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "s.sqlite3"
    url = f"sqlite:///{path}"
    async with await open_store(url, clock=clock, lock_entries=False) as store:
        first = await store.add_batches(
            [batch("s", [A], [A]), batch("s", [B], [B]), batch("s", [A], [A])]
        )
        assert _lock_state(path)[0] == set()
        # The held batch is not handed out: the round computed its blocker first.
        assert await ready(store, clock, "s") == [b.batch_header for b in first[:2]]
        assert _kept(path)
    # A serial store opened afterwards follows the database: entries kept.
    async with await open_store(url, clock=clock, lock_entries=False) as serial:
        [third] = await serial.add_batches([batch("s", [A], [])])
        _, held = _lock_state(path)
        assert held[third.batch_header] == first[2].batch_header  # the latest writer of A


async def test_a_serial_store_sees_entries_turned_on_by_another(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A store that found them off reads the switch again at each insert."""
    path = tmp_path / "s.sqlite3"
    url = f"sqlite:///{path}"
    async with await open_store(url, clock=clock, lock_entries=False) as serial:
        [first] = await serial.add_batches([batch("s", [A], [A])])
        async with await open_store(url, clock=clock, lock_entries=True) as parallel:
            assert _kept(path)
            [second] = await serial.add_batches([batch("s", [A], [A])])
            _, held = _lock_state(path)
            assert held == {first.batch_header: None, second.batch_header: first.batch_header}
            assert await ready(parallel, clock, "s") == [first.batch_header]


async def test_a_store_migrated_from_version_4_keeps_its_entries(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at INTEGER NOT NULL)"
        )
        for m in load_migrations("sqlite")[:4]:
            conn.executescript(m.sql)
            conn.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (m.version, m.name))
    url = f"sqlite:///{path}"
    result = await migrate_database(url)
    assert result.after >= 5
    assert _kept(path)
    async with await open_store(url, clock=clock, lock_entries=False) as store:
        first, second = await store.add_batches([batch("s", [A], [A]), batch("s", [A], [A])])
        _, held = _lock_state(path)
        assert held == {first.batch_header: None, second.batch_header: first.batch_header}
