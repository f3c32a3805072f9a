"""Shared fixtures.

PostgreSQL: tests marked ``pg`` get a database of their own on the server
named by ``LEDGERQ_TEST_PG`` (default: the local server at 127.0.0.1:5432,
user postgres). Each database is created for the test run and dropped after.
Under CI (``CI`` set) an unreachable server fails the run; elsewhere the
PostgreSQL tests are skipped with a message saying how to enable them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

PG_ADMIN_URL = os.environ.get("LEDGERQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required in CI: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL} (set LEDGERQ_TEST_PG): {exc}")
    return PG_ADMIN_URL


@pytest.fixture(scope="session")
def make_pg_database(pg_admin_url: str) -> Iterator[Callable[[], str]]:
    """Factory: a fresh, empty PostgreSQL database; returns its URL."""
    created: list[str] = []

    def make() -> str:
        name = f"ledgerq_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return _with_dbname(pg_admin_url, name)

    yield make
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(make_pg_database: Callable[[], str]) -> str:
    """A fresh PostgreSQL database for one test."""
    return make_pg_database()
