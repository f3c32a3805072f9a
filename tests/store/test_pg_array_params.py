"""PostgreSQL array parameters: an array literal when no value needs quoting
(cheaper than psycopg's list dumper), the list itself otherwise; both read
back as the same values."""

from __future__ import annotations

import psycopg
import pytest

from ledgerq.store.postgres import PostgresBackend, _column_literal

PLAIN = ["a" * 128, "0123abcdef" * 12, "svc-1", "dc:order_7.2", "Null1", "xnull"]
QUOTED = ["a,b", "NULL", "null", "", "x y", 'q"uote', "back\\slash", "{brace}", "é"]


def test_plain_values_become_a_literal_and_others_stay_a_list() -> None:
    backend = PostgresBackend("postgresql://unused@127.0.0.1/unused")
    assert backend.texts_param(PLAIN) == "{" + ",".join(PLAIN) + "}"
    for odd in QUOTED:
        assert backend.texts_param(["plain", odd]) == ["plain", odd]
    assert backend.texts_param([]) == []
    assert backend.seqs_param([3, 1, 2]) == "{3,1,2}"
    assert backend.seqs_param([]) == "{}"


@pytest.mark.parametrize("values", [PLAIN, ["plain", *QUOTED], []])
def test_either_form_reads_back_as_the_values(pg_url: str, values: list[str]) -> None:
    backend = PostgresBackend(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for prepare in (False, True):
            rows = conn.execute(
                "SELECT v FROM unnest(%(v)s::text[]) WITH ORDINALITY AS t(v, n) ORDER BY n",
                {"v": backend.texts_param(values)},
                prepare=prepare,
            ).fetchall()
            assert [r[0] for r in rows] == values
        seqs = conn.execute(
            "SELECT unnest(%(s)s::bigint[])", {"s": backend.seqs_param([5, -1, 2**40])}
        ).fetchall()
        assert [r[0] for r in seqs] == [5, -1, 2**40]


COLUMNS = [
    ("text[]", ["plain", None, *QUOTED]),
    ("text[]", [None, None]),
    ("bigint[]", [1_763_880_000_000, None, -3]),
    ("bool[]", [True, False, None]),
    ("bytea[]", [b"\x00\xff\\\"'", None, b""]),
    ("int[]", [7]),
]


@pytest.mark.parametrize(("cast", "values"), COLUMNS)
def test_set_write_columns_read_back_as_the_values(
    pg_url: str, cast: str, values: list[object]
) -> None:
    """A set-based write's column (``_column_literal``) reads back as its values."""
    literal = _column_literal(values)
    assert isinstance(literal, str)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for cursor in (psycopg.ClientCursor(conn), conn.cursor()):
            cursor.execute(
                f"SELECT v FROM unnest(%(v)s::{cast}) WITH ORDINALITY AS t(v, n) ORDER BY n",
                {"v": literal},
            )
            assert [r[0] for r in cursor.fetchall()] == values


def test_mixed_columns_stay_a_list() -> None:
    assert _column_literal([1, "a"]) == [1, "a"]
    assert _column_literal([1.5]) == [1.5]
