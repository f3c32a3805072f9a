"""``bench pgshape`` kept from rotting: how it names the statements
``pg_stat_statements`` reports, its arithmetic per committed batch, its
tables, and its refusal of a server that does not count statements."""

from __future__ import annotations

import click
import psycopg
import pytest

from bench._pgstats import (
    FunctionStats,
    IndexStats,
    Shape,
    Statement,
    TableStats,
    Wal,
    canonical,
    cpu_delta,
    index_entries,
    merge_statements,
    parse_counters,
    require_pg_stat_statements,
    statement_name,
)
from bench.pgshape import (
    _parse_strategies,
    gateway_table,
    indexes_table,
    statements_table,
    summary_table,
)


def test_a_statement_prepared_by_the_store_is_named_by_its_query() -> None:
    text = "PREPARE lq_write_status_checked_set AS UPDATE batches b SET status = s.status"
    assert statement_name(text) == "write_status_checked_set"


def test_a_statement_is_named_by_the_query_file_whatever_pg_stat_statements_replaced() -> None:
    # As pg_stat_statements keeps claims.sql's release_all: the parameters, the
    # NULL values and the comments gone (IS NULL is no constant and stays).
    text = (
        "UPDATE service_id_claims\nSET claimant = $1,\n    expiry_1 = $2,\n    expiry_2 = $3,\n"
        "    claimed_at = $4,\n    unclaimed_since = $5 - $6,\n    updated_at = $7\n"
        "WHERE claimant = $8\nRETURNING service_id"
    )
    assert statement_name(text) == "claims.release_all"
    assert statement_name("SELECT kept FROM lock_entries_kept") == "lock_entries_kept"
    assert canonical("a IS NULL AND b = NULL AND c = 'Unknown' -- why\n AND d = 10") == (
        "a is null and b = ? and c = ? and d = ?"
    )


def test_a_nested_statement_is_named_by_the_function_whose_body_holds_it() -> None:
    perform = "SELECT ledgerq_release(services, coalesce(released, $1))"
    assert statement_name(perform, nested=True).startswith("ledgerq_batches_updated: ")
    delete = "DELETE FROM batch_locks WHERE seq = ANY(p_released)"
    assert statement_name(delete, nested=True).startswith("ledgerq_release: ")
    # A top-level statement is the gateway's own, whatever a function's body says.
    assert statement_name("BEGIN") == "begin"
    fk = 'SELECT 1 FROM ONLY "public"."batches" x WHERE "service_id" OPERATOR(pg_catalog.=) $1'
    assert statement_name(fk.replace("SELECT 1", "SELECT $2"), nested=True) == (
        "foreign key check: batches"
    )


def test_an_unknown_statement_is_shown_by_the_start_of_its_text() -> None:
    name = statement_name("SELECT pg_notify($1, $2)")
    assert name == "select pg_notify(?, ?)"
    long = statement_name("SELECT " + ", ".join(f"c{i}" for i in range(40)) + " FROM t", width=20)
    assert len(long) == 20 and long.endswith("…")


def test_statements_merge_by_name_and_level_the_longest_first() -> None:
    merged = merge_statements(
        [
            Statement("a", True, 2, 4, 1.0, 3, 300),
            Statement("b", True, 1, 1, 5.0),
            Statement("a", True, 3, 6, 2.0, 1, 100),
            Statement("a", False, 1, 1, 9.0),
        ]
    )
    assert merged == [
        Statement("a", False, 1, 1, 9.0),
        Statement("b", True, 1, 1, 5.0),
        Statement("a", True, 5, 10, 3.0, 4, 400),
    ]


def test_index_entries_are_inserts_and_non_hot_updates() -> None:
    table = TableStats(
        "batches", inserted=10, updated=30, hot=5, deleted=2, seq_scans=0, idx_scans=0
    )
    assert index_entries(table) == 35
    shape = _shape()
    assert shape.index_entries() == 35 + 35 + 10  # two indexes of batches, one of transactions
    assert shape.rows_written() == 10 + 30 + 2 + 10
    assert shape.per_batch(shape.rows_written()) == 5.2


def test_cpu_counts_processes_started_meanwhile_and_misses_those_gone() -> None:
    assert cpu_delta({1: 1.0, 2: 5.0}, {1: 1.5, 3: 0.25}) == 0.75
    assert Wal(10, 1, 1000) - Wal(4, 0, 400) == Wal(6, 1, 600)


def test_the_tables_are_per_committed_batch() -> None:
    shape = _shape()
    summary = summary_table([shape])
    # 10 batches: gateway 20 ms = 2 ms a batch, 4 × the ideal client's 0.5 ms.
    assert "| serial, 2 × 5 | 50 (0.50 ×) | 0.50 | 2.00 (4.0 ×) | 1.00 (2.0 ×) |" in summary
    assert "| 3.00 | 2.5 | 0.5 | 5.2 | 8.0 |" in summary
    indexes = indexes_table(shape)
    assert "| `batches.batches_open_idx` | ≤ 3.50 (partial) | 0.00 | **never read** | 819 |" in (
        indexes
    )
    assert "| `batches.batches_pkey` | 3.50 | 1.20 | 12 | 819 |" in indexes
    statements = statements_table(shape, top=1)
    assert "| `write_status_set` | top | 2.00 | 3.00 | 400 | 100 | 4.0 | 0.200 |" in statements
    assert "| 2 others (1 top-level) |  | 0.50 | 0.00 | 100 | 0 | 1.0 |  |" in statements


def test_the_gateways_counters_are_read_from_its_metrics() -> None:
    text = (
        "# HELP ledgerq_ledger_statuses_total Batch statuses reported by the ledger.\n"
        "# TYPE ledgerq_ledger_statuses_total counter\n"
        'ledgerq_ledger_statuses_total{status="Committed"} 29.0\n'
        'ledgerq_ledger_statuses_created{status="Committed"} 1.7e9\n'
        "# TYPE ledgerq_follow_asked_batches_total counter\n"
        "ledgerq_follow_asked_batches_total 7.0\n"
        "# TYPE ledgerq_services_claimed gauge\n"
        "ledgerq_services_claimed 10.0\n"
    )
    assert parse_counters(text) == {
        "ledgerq_ledger_statuses{Committed}": 29.0,
        "ledgerq_follow_asked_batches": 7.0,
    }
    shape = _shape()
    shape.gateway = {"ledgerq_follow_asked_batches": 7.0}
    assert "| `ledgerq_follow_asked_batches` | 0.70 |" in gateway_table([shape])


def test_strategies_are_checked() -> None:
    assert _parse_strategies("parallel, serial") == ["parallel", "serial"]
    with pytest.raises(click.BadParameter, match="serial, parallel"):
        _parse_strategies("pipelined")


@pytest.mark.pg
def test_a_server_without_pg_stat_statements_is_refused_saying_so(pg_admin_url: str) -> None:
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        row = conn.execute("SHOW shared_preload_libraries").fetchone()
    if row is not None and "pg_stat_statements" in str(row[0]):
        require_pg_stat_statements(pg_admin_url)  # a server that counts: accepted
        return
    with pytest.raises(click.ClickException, match="shared_preload_libraries") as refused:
        require_pg_stat_statements(pg_admin_url)
    assert "does not load pg_stat_statements" in refused.value.message


def _shape() -> Shape:
    shape = Shape("serial", 2, 5, committed=10, throughput=50.0, ideal_throughput=100.0)
    shape.ideal_cpu_ms = 0.5
    shape.gateway_cpu_s = 0.020
    shape.backends_cpu_s = 0.010
    shape.commits = 30
    shape.statements = [
        Statement("write_status_set", True, 20, 30, 4.0, 10, 1000),
        Statement("begin", True, 5, 0, 1.0),
        Statement("ledgerq_release: update", False, 5, 5, 0.5),
    ]
    shape.tables = [
        TableStats("batches", 10, 30, 5, 2, 0, 7),
        TableStats("transactions", 10, 0, 0, 0, 0, 0),
    ]
    shape.indexes = [
        IndexStats("batches", "batches_open_idx", 0, True, 8192),
        IndexStats("batches", "batches_pkey", 12, False, 8192),
        IndexStats("transactions", "transactions_pkey", 0, False, 8192),
    ]
    shape.functions = [FunctionStats("ledgerq_release", 5, 0.5, 0.4)]
    return shape
