"""PostgreSQL array parameters: an array literal when no value needs quoting
(cheaper than psycopg's list dumper), the list itself otherwise; both read
back as the same values."""

from __future__ import annotations

import psycopg
import pytest

from ledgerq.store.postgres import PostgresBackend

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
