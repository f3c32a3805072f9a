"""WAL written by one database, measured exactly on a shared PostgreSQL.

``pg_current_wal_insert_lsn()`` is cluster-wide: on a machine where other
databases are busy, a difference of two LSNs counts their writes too. Here
``pg_waldump`` reads the WAL between two LSNs and keeps the records of one
database: those with a block reference into it (``rel TBS/DB/REL``), plus the
commit records of the transactions that wrote them. Record sizes are the
total sizes (full-page images included), as the server wrote them.

Needs read access to the server's ``pg_wal`` directory and ``pg_waldump``
(Debian: ``/usr/lib/postgresql/<v>/bin``); :func:`available` says whether
both are there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

_RECORD = re.compile(
    r"rmgr: (?P<rmgr>\w+)\s+len \(rec/tot\):\s+(?P<rec>\d+)/\s*(?P<tot>\d+), tx:\s+(?P<tx>\d+)"
)
_REL = re.compile(r"rel \d+/(?P<db>\d+)/\d+")


@dataclass(frozen=True)
class Wal:
    start: str
    db_oid: int
    data_dir: str
    waldump: str


def _waldump(conn: psycopg.Connection[tuple[object, ...]]) -> str | None:
    found = shutil.which("pg_waldump")
    if found:
        return found
    version = str(conn.execute("SHOW server_version_num").fetchone()[0])[:2]  # type: ignore[index]
    candidate = Path(f"/usr/lib/postgresql/{version}/bin/pg_waldump")
    return str(candidate) if candidate.exists() else None


def begin(url: str) -> Wal | None:
    """Mark the start of a measurement; None when WAL cannot be read here."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_insert_lsn()::text, (SELECT oid FROM pg_database"
            " WHERE datname = current_database()), current_setting('data_directory')"
        ).fetchone()
        waldump = _waldump(conn)
    assert row is not None
    lsn, oid, data_dir = str(row[0]), int(row[1]), str(row[2])  # type: ignore[call-overload]
    if waldump is None or not Path(data_dir, "pg_wal").is_dir():
        return None
    try:
        next(Path(data_dir, "pg_wal").iterdir())
    except (PermissionError, StopIteration):
        return None
    return Wal(lsn, oid, data_dir, waldump)


def bytes_since(mark: Wal, url: str) -> int:
    """WAL bytes the marked database wrote since ``mark``."""
    with psycopg.connect(url, autocommit=True) as conn:
        # Committed records are flushed: pg_waldump reads them from the
        # current (partial) segment.
        end = str(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])  # type: ignore[index]
    out = subprocess.run(
        [mark.waldump, "-p", str(Path(mark.data_dir, "pg_wal")), "-s", mark.start, "-e", end],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    ours_tx: set[str] = set()
    total = 0
    commits: dict[str, int] = {}
    for line in out.splitlines():
        m = _RECORD.search(line)
        if m is None:
            continue
        rel = _REL.search(line)
        if rel is not None and int(rel.group("db")) == mark.db_oid:
            total += int(m.group("tot"))
            if m.group("tx") != "0":
                ours_tx.add(m.group("tx"))
        elif m.group("rmgr") == "Transaction" and "COMMIT" in line:
            commits[m.group("tx")] = commits.get(m.group("tx"), 0) + int(m.group("tot"))
    return total + sum(n for tx, n in commits.items() if tx in ours_tx)
