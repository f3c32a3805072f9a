"""Settings: flags over environment over file over defaults; invalid values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerq.config import load_settings, parse_bind
from ledgerq.errors import ConfigError


def test_defaults(tmp_path: Path) -> None:
    s = load_settings(environ={}, cwd=tmp_path)
    assert s.db == "sqlite:///ledgerq.sqlite3"
    assert s.ledger == "node"
    assert s.bind == ("127.0.0.1", 8080)
    assert s.node_data_dir == Path("ledgerq-node")
    assert set(s.sources.values()) == {"default"}
    assert s.config_file is None


def test_layers_override_in_order(tmp_path: Path) -> None:
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text('db = "sqlite:///x.db"\nbind = "127.0.0.1:1"\n[submitter]\nslots = 7\n')
    env = {"LEDGERQ_BIND": "127.0.0.1:2", "LEDGERQ_SUBMITTER_MAX_RETRIES": "9"}
    s = load_settings({"bind": "127.0.0.1:3", "ledger": None}, environ=env, cwd=tmp_path)
    assert s.db == "sqlite:///x.db" and s.sources["db"] == "file"
    assert s.bind == ("127.0.0.1", 3) and s.sources["bind"] == "flag"
    assert s.submitter.slots == 7 and s.sources["submitter.slots"] == "file"
    assert s.submitter.max_retries == 9 and s.sources["submitter.max_retries"] == "env"
    assert s.ledger == "node" and s.sources["ledger"] == "default"
    assert s.node_data_dir == Path("x-node")


def test_invalid_values_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"invalid submitter\.slots \(from LEDGERQ_SUBMITTER_SLOTS\)"
    ):
        load_settings(environ={"LEDGERQ_SUBMITTER_SLOTS": "0"}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="invalid ledger"):
        load_settings({"ledger": "http://x"}, environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="invalid bind"):
        load_settings({"bind": "8080"}, environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"invalid log\.json"):
        load_settings(environ={"LEDGERQ_LOG_JSON": "maybe"}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="backoff"):
        load_settings(
            {"submitter.backoff_initial_ms": 10, "submitter.backoff_max_ms": 1},
            environ={},
            cwd=tmp_path,
        )


def test_bad_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "a.toml"
    bad.write_text("[submitter]\nslotz = 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'submitter\.slotz'"):
        load_settings(environ={}, config_file=bad)
    bad.write_text("db = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(environ={"LEDGERQ_CONFIG": str(bad)}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(environ={}, config_file=tmp_path / "missing.toml")


def test_parse_bind() -> None:
    assert parse_bind("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="out of range"):
        parse_bind("h:70000")
