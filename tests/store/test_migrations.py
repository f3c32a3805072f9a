"""Migrations: replaying them yields the canonical schema; unknown schemas are refused."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from ledgerq.errors import SchemaVersionError
from ledgerq.store import migrate_database, open_store
from ledgerq.store.sqlfiles import latest_version, load_migrations
from ledgerq.store.sqlite import path_from_url, split_script

SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.pg),
]


def _normalize(sql: str | None) -> str:
    text = re.sub(r"--[^\n]*", "", sql or "")
    return re.sub(r"\s+", " ", text).strip()


def _sqlite_catalog(path: str) -> dict[str, Any]:
    with sqlite3.connect(path) as conn:
        objects = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE name NOT LIKE 'sqlite_%' AND name <> 'schema_version' ORDER BY type, name"
        ).fetchall()
        catalog: dict[str, Any] = {
            "objects": [(t, n, tb, _normalize(s)) for t, n, tb, s in objects]
        }
        for _, name, _, _ in (o for o in objects if o[0] == "table"):
            catalog[f"columns:{name}"] = conn.execute(f"PRAGMA table_xinfo('{name}')").fetchall()
            catalog[f"fks:{name}"] = conn.execute(f"PRAGMA foreign_key_list('{name}')").fetchall()
            indexes = conn.execute(f"PRAGMA index_list('{name}')").fetchall()
            catalog[f"indexes:{name}"] = indexes
            for index in indexes:
                catalog[f"index:{index[1]}"] = conn.execute(
                    f"PRAGMA index_xinfo('{index[1]}')"
                ).fetchall()
        return catalog


_PG_CATALOG = {
    "columns": """
        SELECT table_name, column_name, ordinal_position, data_type, character_maximum_length,
               is_nullable, column_default, is_identity, identity_generation
        FROM information_schema.columns
        WHERE table_schema = 'public' AND table_name <> 'schema_version'
        ORDER BY 1, 3""",
    "storage": """
        SELECT c.relname, a.attname, a.attstorage, a.attidentity
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
          AND a.attnum > 0 AND NOT a.attisdropped AND c.relname <> 'schema_version'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename <> 'schema_version' ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
        FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace
          AND conrelid::regclass::text <> 'schema_version'
        ORDER BY 1, 2""",
    "statistics": """
        SELECT s.stxrelid::regclass::text, s.stxname, s.stxkind::text,
               pg_get_statisticsobjdef_columns(s.oid)
        FROM pg_statistic_ext s WHERE s.stxnamespace = 'public'::regnamespace ORDER BY 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid)
        FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2""",
    "functions": """
        SELECT proname, pg_get_functiondef(oid) FROM pg_proc
        WHERE pronamespace = 'public'::regnamespace ORDER BY 1""",
}


def _pg_catalog(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(q).fetchall() for name, q in _PG_CATALOG.items()}  # type: ignore[arg-type]


def _replay(backend: str, url: str) -> None:
    """Apply every numbered migration, in order, straight through the driver."""
    if backend == "sqlite":
        with sqlite3.connect(path_from_url(url)) as conn:
            for m in load_migrations("sqlite"):
                for statement in split_script(m.sql):
                    conn.execute(statement)
    else:
        with psycopg.connect(url) as conn:
            for m in load_migrations("postgresql"):
                conn.execute(m.sql)  # type: ignore[arg-type]


def _catalog(backend: str, url: str) -> dict[str, Any]:
    return _sqlite_catalog(path_from_url(url)) if backend == "sqlite" else _pg_catalog(url)


def _sql(backend: str, url: str, statement: str) -> None:
    if backend == "sqlite":
        with sqlite3.connect(path_from_url(url)) as conn:
            conn.execute(statement)
    else:
        with psycopg.connect(url) as conn:
            conn.execute(statement)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_replayed_migrations_equal_the_canonical_schema(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    canonical, replayed = store_url_factory(backend), store_url_factory(backend)
    result = await migrate_database(canonical)  # a fresh database gets schema.sql
    assert (result.before, result.after) == (0, latest_version(backend))
    _replay(backend, replayed)
    expected, actual = _catalog(backend, canonical), _catalog(backend, replayed)
    assert expected == actual
    # And the comparison sees what matters: the catalog is not trivially empty.
    flat = repr(expected)
    for needle in ("batches_open_idx", "submissions_touch_updated_at", "last_attempt_at"):
        assert needle in flat


def _at_version(backend: str, url: str, version: int) -> None:
    """Bring an empty database to ``version`` the way an older ledgerq did."""
    migrations = load_migrations(backend)[:version]
    if backend == "sqlite":
        with sqlite3.connect(path_from_url(url)) as conn:
            conn.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at INTEGER NOT NULL)"
            )
            for m in migrations:
                for statement in split_script(m.sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (m.version, m.name))
    else:
        with psycopg.connect(url) as conn:
            conn.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at BIGINT NOT NULL)"
            )
            for m in migrations:
                conn.execute(m.sql)  # type: ignore[arg-type]
                conn.execute("INSERT INTO schema_version VALUES (%s, %s, 0)", (m.version, m.name))


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_upgrading_an_older_database_reaches_the_canonical_schema(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    latest = latest_version(backend)
    canonical = store_url_factory(backend)
    await migrate_database(canonical)
    expected = _catalog(backend, canonical)
    for version in range(1, latest):
        url = store_url_factory(backend)
        _at_version(backend, url, version)
        with pytest.raises(SchemaVersionError, match=f"at version {version}"):
            await open_store(url, migrate=False)
        result = await migrate_database(url)
        assert (result.before, result.after) == (version, latest)
        assert _catalog(backend, url) == expected
        async with await open_store(url, migrate=False) as store:
            assert await store.status_counts() == {}


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_migrate_is_idempotent_and_records_versions(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    url = store_url_factory(backend)
    first = await migrate_database(url)
    second = await migrate_database(url)
    latest = latest_version(backend)
    assert (first.before, first.after) == (0, latest)
    assert (second.before, second.after) == (latest, latest)
    async with await open_store(url, migrate=False) as store:
        assert await store.status_counts() == {}


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_outdated_schema_is_refused_without_migrate(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    url = store_url_factory(backend)
    with pytest.raises(SchemaVersionError, match="ledgerq migrate --db"):
        await open_store(url, migrate=False)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_newer_schema_is_refused(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    url = store_url_factory(backend)
    await migrate_database(url)
    future = latest_version(backend) + 1
    _sql(
        backend,
        url,
        f"INSERT INTO schema_version (version, name, applied_at) VALUES ({future}, 'future', 0)",
    )
    with pytest.raises(SchemaVersionError, match="newer than this ledgerq"):
        await open_store(url)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_unknown_migration_name_is_refused(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    url = store_url_factory(backend)
    await migrate_database(url)
    _sql(backend, url, "UPDATE schema_version SET name = 'someone_elses' WHERE version = 1")
    with pytest.raises(SchemaVersionError, match="does not know"):
        await open_store(url)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_foreign_batches_table_is_refused(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    url = store_url_factory(backend)
    _sql(backend, url, "CREATE TABLE batches (id INTEGER)")
    with pytest.raises(SchemaVersionError, match="not created by ledgerq"):
        await open_store(url)


def _scalar(backend: str, url: str, query: str) -> int:
    if backend == "sqlite":
        with sqlite3.connect(path_from_url(url)) as conn:
            return int(conn.execute(query).fetchone()[0])
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_triggers_stamp_hand_written_updates_with_the_database_clock(
    backend: str, store_url_factory: Callable[[str], str]
) -> None:
    from ledgerq.clock import ManualClock, now_ms
    from ledgerq.model import Pending

    from .conftest import make_batch

    url = store_url_factory(backend)
    clock = ManualClock(1_000_000)  # far in the past
    async with await open_store(url, clock=clock) as store:
        [b] = await store.add_batches([make_batch()])
        await store.update_batch_status(b.batch_header, b.service_id, Pending())
    stamped = "SELECT updated_at FROM batch_statuses"
    assert _scalar(backend, url, stamped) == clock.value  # the store's own write
    before = now_ms()
    _sql(backend, url, "UPDATE batch_statuses SET dlt_status = 'Unknown'")
    assert _scalar(backend, url, stamped) >= before - 1_000


@pytest.mark.pg
async def test_store_writes_run_no_updated_at_trigger_function(
    store_url_factory: Callable[[str], str],
) -> None:
    # The store sets updated_at on every write: the triggers' function runs
    # only for an UPDATE that leaves it unchanged (the test above).
    from ledgerq.model import BatchWrite, Pending
    from ledgerq.store.sqlfiles import load_queries

    from .conftest import make_batch

    url = store_url_factory("postgresql")
    async with await open_store(url) as store:
        [b] = await store.add_batches([make_batch()])
        await store.apply_writes([BatchWrite(b.service_id, b.batch_header, attempt=True)])
        await store.update_batch_status(b.batch_header, b.service_id, Pending())
    queries = load_queries("postgresql")
    calls = (
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
        " WHERE funcname = 'ledgerq_touch_updated_at'"
    )
    with psycopg.connect(url) as conn:
        conn.execute("SET track_functions = 'all'")
        key = {"service_id": b.service_id, "batch_id": b.batch_header, "now": 2_000_000_000_000}
        conn.execute(
            queries["write_status_checked"],  # type: ignore[arg-type]
            {**key, "status": "Committed", "final": True, "submitted": True},
        )
        error = {"error_type": "ambiguous", "error_message": "timeout"}
        conn.execute(queries["upsert_submission_error"], {**key, **error})  # type: ignore[arg-type]
        assert conn.execute(calls).fetchone() == (0,)  # type: ignore[arg-type]
        conn.execute("UPDATE submissions SET times_checked = times_checked + 1")
        assert conn.execute(calls).fetchone() == (1,)  # type: ignore[arg-type]
