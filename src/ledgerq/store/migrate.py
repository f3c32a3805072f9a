"""Schema versions: decide what to apply, refuse what we don't understand.

The ``schema_version`` table holds one row per applied migration (version,
name, applied_at ms). A fresh database gets the canonical ``schema.sql`` and a
row for every migration, so its history reads as if all were replayed; an
older one gets its missing migrations in order, each in its own transaction.
A database whose versions this ledgerq does not know (newer, or named
differently) or that holds a ``batches`` table without ``schema_version`` is
refused with :class:`~ledgerq.errors.SchemaVersionError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledgerq.errors import SchemaVersionError
from ledgerq.store.sqlfiles import Migration, load_migrations


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    #: Version found (0: empty database).
    before: int
    #: Apply ``schema.sql`` instead of replaying migrations (empty database).
    fresh: bool
    #: Migrations to apply (for a fresh database: every migration, recorded only).
    pending: tuple[Migration, ...]

    @property
    def after(self) -> int:
        return self.pending[-1].version if self.pending else self.before


@dataclass(frozen=True, slots=True)
class MigrationResult:
    before: int
    after: int


def plan_migration(
    dialect: str, applied: dict[int, str] | None, has_batches_table: bool
) -> MigrationPlan:
    """What to do with a database whose ``schema_version`` rows are ``applied``
    (``None``: no ``schema_version`` table)."""
    migrations = load_migrations(dialect)
    latest = len(migrations)
    if applied is None or not applied:
        if has_batches_table:
            raise SchemaVersionError(
                "the database has a 'batches' table but no ledgerq schema_version: it was "
                "not created by ledgerq; point --db at an empty database or a ledgerq one"
            )
        return MigrationPlan(before=0, fresh=True, pending=migrations)
    current = max(applied)
    if current > latest:
        raise SchemaVersionError(
            f"the database schema is at version {current}, newer than this ledgerq "
            f"understands (up to {latest}); upgrade ledgerq to a release that knows it"
        )
    for version, name in sorted(applied.items()):
        expected = migrations[version - 1].name if version >= 1 else None
        if name != expected:
            raise SchemaVersionError(
                f"the database records migration {version} as {name!r}, which this ledgerq "
                f"does not know (expected {expected!r}); it was migrated by a different "
                "ledgerq build: use that build, or an empty database"
            )
    return MigrationPlan(before=current, fresh=False, pending=migrations[current:])


def refuse_outdated(plan: MigrationPlan, url: str) -> None:
    """For ``open_store(migrate=False)``: an outdated schema is an error."""
    if plan.pending:
        raise SchemaVersionError(
            f"the database schema is at version {plan.before}; this ledgerq needs "
            f"{plan.after}: run `ledgerq migrate --db {redact(url)}` first"
        )


def redact(url: str) -> str:
    """The URL without a password, for messages."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
