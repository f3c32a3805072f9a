"""Loads the store's SQL: named queries, numbered migrations, canonical schemas.

Queries live in ``sql/<dialect>/queries.sql``, each under a ``-- name: xyz``
header line (the text up to the next header is the query). Migrations are
``sql/<dialect>/migrations/NNNN_title.sql``, applied in number order; the
canonical schema is ``sql/<dialect>/schema.sql`` and must equal what the
migrations produce (a test proves it on each backend).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ledgerq.errors import StoreError

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def _dir(dialect: str) -> resources.abc.Traversable:
    return resources.files("ledgerq.store").joinpath("sql", dialect)


@cache
def load_queries(dialect: str) -> dict[str, str]:
    """Every named query of a dialect, keyed by name."""
    text = _dir(dialect).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise StoreError(f"query {name!r} is defined twice in {dialect}/queries.sql")
        queries[name] = _strip_trailing_comments(body)
    return queries


def _strip_trailing_comments(body: str) -> str:
    """Drop comment lines after the statement (they introduce the next query)."""
    lines = body.strip().splitlines()
    while lines and (lines[-1].lstrip().startswith("--") or not lines[-1].strip()):
        lines.pop()
    return "\n".join(lines).rstrip().rstrip(";")


@cache
def load_migrations(dialect: str) -> tuple[Migration, ...]:
    """The numbered migrations of a dialect, in order, numbered 1, 2, 3, ..."""
    found: list[Migration] = []
    for entry in _dir(dialect).joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise StoreError(
                f"{dialect} migrations skip from {expected - 1} to {migration.version}"
            )
    return tuple(found)


def canonical_schema(dialect: str) -> str:
    return _dir(dialect).joinpath("schema.sql").read_text(encoding="utf-8")


def latest_version(dialect: str) -> int:
    return len(load_migrations(dialect))
