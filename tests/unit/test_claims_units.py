"""Claim settings, the SQL file parser and the single-instance lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ledgerq.claims import ClaimSettings, SingleInstanceLock, generate_instance_id
from ledgerq.claims.lock import InstanceLockedError
from ledgerq.claims.queries import claim_queries, parse_queries
from ledgerq.errors import ConfigError


def test_defaults_are_valid_and_documented_values() -> None:
    s = ClaimSettings(instance_id="x")
    assert (s.renew_interval_ms, s.ttl_ms, s.slow_ttl_ms, s.grace_ms) == (
        1_000,
        5_000,
        5_500,
        2_000,
    )
    assert s.post_margin_ms == 1_000
    assert s.effective_liveness_ms == 5_000
    # The target: every service (mid-submission ones too) fails over
    # within claim TTL + 1 s of the holder's last renewal.
    assert s.slow_ttl_ms < s.ttl_ms + 1_000


def test_second_expiry_and_post_margin_follow_the_ttl_unless_set() -> None:
    s = ClaimSettings(instance_id="x", renew_interval_ms=200, ttl_ms=1_000)
    assert (s.slow_ttl_ms, s.post_margin_ms) == (1_100, 200)
    tight = ClaimSettings(instance_id="x", renew_interval_ms=900, ttl_ms=1_000)
    assert tight.post_margin_ms == 50  # half the time left between renewals
    s = ClaimSettings(instance_id="x", slow_ttl_ms=9_000, post_margin_ms=300)
    assert (s.slow_ttl_ms, s.post_margin_ms) == (9_000, 300)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"ttl_ms": 1_000}, "ttl_ms"),
        ({"slow_ttl_ms": 4_000}, "slow_ttl_ms"),
        ({"liveness_ms": 500}, "liveness_ms"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"post_margin_ms": 4_000}, "post_margin_ms"),
        ({"db_timeout_ms": 0}, "db_timeout_ms"),
    ],
)
def test_inconsistent_settings_are_refused_naming_the_key(
    kwargs: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError, match=key):
        ClaimSettings(**kwargs)  # type: ignore[arg-type]


def test_generated_instance_ids_are_unique() -> None:
    assert len({generate_instance_id() for _ in range(100)}) == 100
    assert ClaimSettings().instance_id != ClaimSettings(instance_id="").instance_id


def test_parse_queries_splits_on_name_headers() -> None:
    text = "-- name: one\nSELECT 1;\n\n-- name: two\n-- a comment\nSELECT 2;\n"
    assert parse_queries(text) == {"one": "SELECT 1", "two": "-- a comment\nSELECT 2"}
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_every_claim_step_has_its_query() -> None:
    assert {
        "take_candidates",
        "take_expired",
        "heartbeat",
        "claim_share",
        "hand_over_need",
        "hand_over_candidates",
        "hand_over",
        "claimed_digest",
        "claimed",
        "idle_candidates",
        "forget_idle",
        "lock_all",
        "release_all",
        "register_services",
    } <= set(claim_queries())


_HOLDER = """
import sys
from ledgerq.claims import SingleInstanceLock
lock = SingleInstanceLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_second_process_on_the_same_sqlite_file_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "ledgerq.db"
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "locked"
            with pytest.raises(InstanceLockedError, match=rf"pid {holder.pid}.*PostgreSQL"):
                SingleInstanceLock(db).acquire()
        finally:
            holder.kill()  # the lock dies with its process, even on SIGKILL
            holder.wait(timeout=10)
    with SingleInstanceLock(db) as lock:
        assert lock.locked
        with pytest.raises(InstanceLockedError):
            SingleInstanceLock(db).acquire()  # a second lock in one process is refused too
    assert not lock.locked
    again = SingleInstanceLock(db)
    again.acquire()
    again.release()


def test_claim_settings_come_from_the_gateway_settings(tmp_path: Path) -> None:
    from ledgerq.config import load_settings

    env = {"LEDGERQ_CLAIMS_TTL_MS": "8000", "LEDGERQ_CLAIMS_INSTANCE_ID": "gw-1"}
    claims = load_settings(environ=env, cwd=tmp_path).claims
    assert (claims.instance_id, claims.ttl_ms, claims.slow_ttl_ms) == ("gw-1", 8_000, 8_800)
    assert claims.post_margin_ms == 1_600
    generated = load_settings(environ={}, cwd=tmp_path).claims.instance_id
    assert generated and generated != "gw-1"
    with pytest.raises(ConfigError, match="slow_ttl_ms"):
        load_settings(environ={"LEDGERQ_CLAIMS_SLOW_TTL_MS": "1000"}, cwd=tmp_path)


def test_the_idle_clean_up_skips_services_the_store_is_writing_to() -> None:
    # forget_idle try-locks the store's per-service advisory lock, which
    # add_batches holds while it inserts a service's batches and claim row.
    from ledgerq.store.postgres import ADVISORY_CLASS_SERVICE

    query = claim_queries()["forget_idle"]
    assert f"pg_try_advisory_xact_lock({ADVISORY_CLASS_SERVICE}, hashtext(c.service_id))" in query
