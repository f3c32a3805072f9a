"""Rounds over a list of services are planned for their list on PostgreSQL:
never prepared, so no generic plan chosen without the list's length."""

from __future__ import annotations

from typing import Any

from ledgerq.store.postgres import PLANNED_EACH_TIME, _Session
from ledgerq.store.sqlfiles import load_queries


class _Cursor:
    async def fetchall(self) -> list[Any]:
        return []


class _Conn:
    def __init__(self) -> None:
        self.prepare: dict[str, Any] = {}

    async def execute(self, query: str, params: Any, *, prepare: Any = None) -> _Cursor:
        self.prepare[query] = prepare
        return _Cursor()


class _Backend:
    queries = load_queries("postgresql")


async def test_list_rounds_are_never_prepared_and_the_others_may_be() -> None:
    conn = _Conn()
    session = _Session(conn, _Backend())  # type: ignore[arg-type]
    for name in ("queue_round_services", "parallel_round_services", "queue_round_claimed"):
        await session.fetchall(name, {})
    q = _Backend.queries
    assert conn.prepare[q["queue_round_services"]] is False
    assert conn.prepare[q["parallel_round_services"]] is False
    assert conn.prepare[q["queue_round_claimed"]] is None  # psycopg's default
    assert set(q) >= PLANNED_EACH_TIME
