"""Shared fixtures, and the rule that nothing skips silently.

PostgreSQL: tests marked ``pg`` get a database of their own. The server is
the one ``LEDGERQ_TEST_PG`` names (an admin URL such as
``postgresql://postgres@127.0.0.1:5432/postgres``) or, by default, a
throwaway cluster this run starts from the installed server binaries
(``tests/pg_server.py``) and deletes at the end. Each database is created for
one test; on a server `LEDGERQ_TEST_PG` names, dropped after the run.

Skips: the run ends with the list of skipped tests and the reason of each;
under CI (``CI`` set) any skip fails the run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.pg_server import INSTALL_HINT, ClusterError, ThrowawayCluster, find_bindir


def _with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """Admin URL of the run's PostgreSQL server (``LEDGERQ_TEST_PG`` or a throwaway cluster)."""
    named = os.environ.get("LEDGERQ_TEST_PG")
    if named:
        try:
            with psycopg.connect(named, connect_timeout=5, autocommit=True) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            pytest.fail(f"LEDGERQ_TEST_PG={named} is not reachable: {exc}")
        yield named
        return
    bindir = find_bindir()
    if bindir is None:
        pytest.skip(f"no PostgreSQL server binaries ({INSTALL_HINT})")
    cluster = ThrowawayCluster(bindir)
    try:
        url = cluster.start()
    except ClusterError as exc:
        pytest.fail(f"could not start a throwaway PostgreSQL cluster from {bindir}: {exc}")
    try:
        yield url
    finally:
        cluster.stop(remove_in_background=True)


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
    if not os.environ.get("LEDGERQ_TEST_PG"):
        return  # the throwaway cluster goes as a whole, its databases with it
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(make_pg_database: Callable[[], str]) -> str:
    """A fresh PostgreSQL database for one test."""
    return make_pg_database()


# -- nothing skips silently ---------------------------------------------------

_skipped: list[tuple[str, str]] = []


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _skip_reason(report)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and os.environ.get("CI") and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _skipped:
        return
    terminalreporter.section(f"{len(_skipped)} skipped", sep="-", yellow=True, bold=True)
    for nodeid, reason in _skipped:
        terminalreporter.line(f"{nodeid}: {reason}")
    if os.environ.get("CI"):
        terminalreporter.line(
            "CI is set and nothing may skip there: the run fails.", red=True, bold=True
        )
