"""Query files: named queries, and variants written once as a template."""

from __future__ import annotations

import pytest

from ledgerq.errors import StoreError
from ledgerq.store.sqlfiles import load_queries, parse_queries

TEMPLATED = """
-- template: columns
SELECT b.seq, b.status
-- template: round
WITH picks AS (
    SELECT seq FROM batches b
    {{scope}}
)
{{columns}}
FROM picks JOIN batches b USING (seq);

-- name: round_all
-- fill: round
--   scope:

-- The listed services.
-- name: round_listed
-- fill: round
--   scope: WHERE b.service_id IN (SELECT value FROM json_each(:services))

-- name: plain
SELECT 1;
"""


def test_a_fill_is_its_template_with_its_slots_and_fragments_filled_in() -> None:
    queries = parse_queries(TEMPLATED, "test.sql")
    assert set(queries) == {"round_all", "round_listed", "plain"}
    assert queries["round_listed"] == (
        "WITH picks AS (\n"
        "    SELECT seq FROM batches b\n"
        "    WHERE b.service_id IN (SELECT value FROM json_each(:services))\n"
        ")\n"
        "SELECT b.seq, b.status\n"
        "FROM picks JOIN batches b USING (seq)"
    )
    assert "{{" not in queries["round_all"] and "json_each" not in queries["round_all"]
    assert queries["plain"] == "SELECT 1"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            ("--   scope:\n\n-- The", "\n-- The"),
            r"'round_all' \(test.sql\): no text for slot 'scope'",
        ),
        (("--   scope:\n", "--   scope:\n--   extra: x\n"), r"no place for: \['extra'\]"),
        (("-- fill: round\n--   scope:\n", "-- fill: nothing\n"), "unknown template 'nothing'"),
        (("-- name: plain", "-- name: round_all"), "query 'round_all' is defined twice"),
        (("--   scope:\n\n", "--   scope:\nSELECT 2;\n"), "comment lines only"),
    ],
)
def test_a_template_filled_wrong_is_refused_when_the_file_is_read(
    change: tuple[str, str], error: str
) -> None:
    old, new = change
    assert old in TEMPLATED
    with pytest.raises(StoreError, match=error):
        parse_queries(TEMPLATED.replace(old, new, 1), "test.sql")


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_every_round_variant_is_filled_in(dialect: str) -> None:
    queries = load_queries(dialect)
    rounds = [n for n in queries if n.startswith(("queue_round", "parallel_round"))]
    assert len(rounds) >= 6
    for name in rounds:
        assert "{{" not in queries[name] and queries[name].startswith("WITH"), name
        assert queries[name].rstrip().endswith(("::bigint", "-1)")), name
