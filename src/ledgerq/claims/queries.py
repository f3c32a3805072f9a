"""The claim cycle's named SQL queries, read from ``sql/<dialect>/claims.sql``.

A query starts at a ``-- name: xyz`` line and runs to the next one.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a ``.sql`` file into its named queries (comments kept, trailing ``;`` dropped)."""
    queries: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        body = text[match.end() : end].strip().rstrip(";").strip()
        name = match.group(1)
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body
    return queries


@cache
def claim_queries(dialect: str = "postgresql") -> dict[str, str]:
    text = resources.files("ledgerq.claims").joinpath("sql", dialect, "claims.sql").read_text()
    return parse_queries(text)
