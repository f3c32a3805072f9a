"""Loads the store's SQL: named queries, numbered migrations, canonical schemas.

Queries live in ``sql/<dialect>/queries.sql``, each under a ``-- name: xyz``
header line (the text up to the next header is the query).

Variants of one statement are written once, as a ``-- template: xyz`` whose
``{{slot}}`` places each variant fills. A query whose body is a
``-- fill: xyz`` comment line, followed by ``--   slot: text`` lines, is that
template with those slots filled (an empty text leaves the place empty); a
slot no fill gives is the template of that name (a shared fragment, e.g. the
columns every round returns). A slot neither given nor a template is an
error when the file is read, as is a slot given that the template lacks.

Migrations are
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

_HEADER = re.compile(r"^--\s*(name|template):\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_FILL = re.compile(r"^--\s*fill:\s*([a-z_][a-z0-9_]*)\s*$")
_SLOT_VALUE = re.compile(r"^--\s+([a-z_][a-z0-9_]*):(.*)$")
_SLOT = re.compile(r"\{\{([a-z_][a-z0-9_]*)\}\}")
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
    """Every named query of a dialect, keyed by name, templates filled in."""
    text = _dir(dialect).joinpath("queries.sql").read_text(encoding="utf-8")
    return parse_queries(text, f"{dialect}/queries.sql")


def parse_queries(text: str, where: str) -> dict[str, str]:
    """The named queries of a query file's ``text`` (``where`` names it in errors)."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    templates: dict[str, str] = {}
    fills: dict[str, tuple[str, dict[str, str]]] = {}
    # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        found = queries if kind == "name" else templates
        if name in found:
            what = "query" if kind == "name" else "template"
            raise StoreError(f"{what} {name!r} is defined twice in {where}")
        fill = _fill_of(body) if kind == "name" else None
        if fill is not None:
            fills[name] = fill
        found[name] = _strip_trailing_comments(body)
    for name, (template, slots) in fills.items():
        if template not in templates:
            raise StoreError(f"query {name!r} fills an unknown template {template!r} in {where}")
        queries[name] = _expand(templates[template], slots, templates, f"{name!r} ({where})")
    return queries


def _fill_of(body: str) -> tuple[str, dict[str, str]] | None:
    """A ``-- fill:`` body's template and slot texts; None for a plain query."""
    lines = [line for line in body.splitlines() if line.strip()]
    at = next((i for i, line in enumerate(lines) if _FILL.match(line)), None)
    if at is None:
        return None
    if any(not line.lstrip().startswith("--") for line in lines):
        raise StoreError(f"a fill is comment lines only, no SQL of its own: {body.strip()!r}")
    slots: dict[str, str] = {}
    # The slot lines follow the fill; the comments after them introduce the
    # next query.
    for line in lines[at + 1 :]:
        match = _SLOT_VALUE.match(line)
        if match is None:
            break
        slots[match[1]] = match[2].strip()
    fill = _FILL.match(lines[at])
    assert fill is not None
    return fill[1], slots


def _expand(template: str, slots: dict[str, str], templates: dict[str, str], what: str) -> str:
    used: set[str] = set()

    def fill(text: str) -> str:
        def slot(match: re.Match[str]) -> str:
            name = match[1]
            if name in slots:
                used.add(name)
                return fill(slots[name])
            if name in templates:
                # A fragment alone on its line keeps that line's indentation.
                start = text.rfind("\n", 0, match.start()) + 1
                indent = text[start : match.start()]
                body = fill(templates[name])
                return body.replace("\n", "\n" + indent) if not indent.strip() else body
            raise StoreError(f"{what}: no text for slot {name!r}")

        return _SLOT.sub(slot, text)

    text = fill(template)
    if unused := sorted(set(slots) - used):
        raise StoreError(f"{what}: slots the template has no place for: {unused}")
    return text


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
