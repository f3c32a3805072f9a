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
    assert s.bind_address == ("127.0.0.1", 8080)
    assert s.node_data_dir == Path("ledgerq-node")
    assert set(s.sources.values()) == {"default"}
    assert s.config_file is None


def test_layers_override_in_order(tmp_path: Path) -> None:
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text('db = "sqlite:///x.db"\nbind = "127.0.0.1:1"\n[submitter]\nslots = 7\n')
    env = {"LEDGERQ_BIND": "127.0.0.1:2", "LEDGERQ_SUBMITTER_MAX_RETRIES": "9"}
    s = load_settings({"bind": "127.0.0.1:3", "ledger": None}, environ=env, cwd=tmp_path)
    assert s.db == "sqlite:///x.db" and s.sources["db"] == "file"
    assert s.bind_address == ("127.0.0.1", 3) and s.sources["bind"] == "flag"
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


@pytest.mark.parametrize(
    ("toml", "key", "why"),
    [
        # Not text: refused by name, not an AttributeError from deep inside.
        ("bind = 8080", "bind", "an integer is not text"),
        ("db = 1", "db", "an integer is not text"),
        ('ledger = ["node"]', "ledger", "an array is not text"),
        ('allowed_hosts = ["a.example", 1]', "allowed_hosts", "an integer is not text"),
        ("[auth]\ntoken = 12345678901234567890", "auth.token", "an integer is not text"),
        # Numbers that would have been changed or made meaningless without a word.
        ("[submitter]\nslots = 1.5", "submitter.slots", "1.5 is not a whole number"),
        ("[http]\nkeepalive_s = nan", "http.keepalive_s", "nan is not a finite number"),
        ("[monitor]\nwait_s = inf", "monitor.wait_s", "inf is not a finite number"),
        # Not a number: refused by what it is, not by int()'s complaint about its type.
        ("delay_window_ms = 2024-01-01", "delay_window_ms", "a date is not an integer"),
        ("[claims]\nttl_ms = 2024-01-01T10:00:00", "claims.ttl_ms", "a datetime is not an integer"),
        ("[http]\nkeepalive_s = 10:00:00", "http.keepalive_s", "a time is not a number"),
        ("[submitter]\nslots = [4]", "submitter.slots", "an array is not an integer"),
        ("decode_yield_share = 1979-05-27", "decode_yield_share", "a date is not a number"),
        ("[http]\nkeepalive_s = true", "http.keepalive_s", "a boolean is not a number"),
    ],
)
def test_a_file_value_of_the_wrong_type_is_refused_naming_the_key(
    tmp_path: Path, toml: str, key: str, why: str
) -> None:
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=rf"invalid {key} \(from {cfg}\): {why}"):
        load_settings(environ={}, cwd=tmp_path)


def test_a_list_key_takes_a_toml_array_or_comma_separated_text(tmp_path: Path) -> None:
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text(
        'allowed_hosts = ["A.example", " b.example "]\n[cors]\norigins = "https://x.example"\n'
    )
    s = load_settings(environ={}, cwd=tmp_path)
    assert s.allowed_hosts == "a.example,b.example"
    assert s.cors.origins == "https://x.example"


def test_whole_numbers_may_be_written_as_floats_or_strings(tmp_path: Path) -> None:
    (tmp_path / "ledgerq.toml").write_text('workers = "2"\n[submitter]\nslots = 2.0\n')
    s = load_settings(environ={}, cwd=tmp_path)
    assert s.workers == 2 and s.submitter.slots == 2


def test_parse_bind() -> None:
    assert parse_bind("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="out of range"):
        parse_bind("h:70000")


def test_a_misspelt_variable_is_refused_with_the_close_match(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="LEDGERQ_AUTH_TOKN") as caught:
        load_settings(environ={"LEDGERQ_AUTH_TOKN": "x" * 20}, cwd=tmp_path)
    assert "did you mean LEDGERQ_AUTH_TOKEN?" in str(caught.value)
    with pytest.raises(ConfigError, match="unknown environment variable LEDGERQ_WHATEVER"):
        load_settings(environ={"LEDGERQ_WHATEVER": "1"}, cwd=tmp_path)
    # Variables that are not settings but that ledgerq or its tests read are fine.
    env = {"LEDGERQ_TEST_PG": "postgresql://x", "LEDGERQ_URL": "http://x", "OTHER_TOKN": "1"}
    load_settings(environ=env, cwd=tmp_path)


def test_every_ledgerq_variable_the_repository_reads_is_allowed() -> None:
    """The allow-list of variables that are not settings is complete: any
    ``LEDGERQ_*`` name in the package, the tests or the benchmarks is known."""
    import re

    from ledgerq.config import known_variables

    repo = Path(__file__).resolve().parents[2]
    names: dict[str, str] = {}
    for folder in ("src", "tests", "bench", "scripts"):
        for path in sorted((repo / folder).rglob("*.py")) + sorted((repo / folder).rglob("*.sh")):
            for name in re.findall(r"\bLEDGERQ_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
                names.setdefault(name, str(path.relative_to(repo)))
    for on_purpose in (
        "LEDGERQ_AUTH_TOKN",
        "LEDGERQ_NODE_TOKN",
        "LEDGERQ_WHATEVER",
        "LEDGERQ_KEY",
        "LEDGERQ_AUTH_PROTECT_READS",
    ):
        names.pop(on_purpose)  # misspelt, removed or placeholder names the tests use
    assert "LEDGERQ_TEST_PG" in names  # the scan finds them
    unknown = {n: where for n, where in names.items() if n not in known_variables()}
    assert not unknown, f"add to ledgerq.config.OTHER_VARIABLES (and document): {unknown}"


def test_protect_reads_is_gone_and_says_why(tmp_path: Path) -> None:
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text('[auth]\ntoken = "0123456789abcdef0123"\nprotect_reads = true\n')
    with pytest.raises(ConfigError, match=r"auth\.protect_reads.*every read needs a token"):
        load_settings(environ={}, config_file=cfg)
    with pytest.raises(ConfigError, match=r"LEDGERQ_AUTH_PROTECT_READS.*every read needs"):
        load_settings(environ={"LEDGERQ_AUTH_PROTECT_READS": "true"}, cwd=tmp_path)


def test_a_typo_in_the_file_suggests_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text('[auth]\ntokn = "0123456789abcdef0123"\n')
    with pytest.raises(ConfigError, match=r"did you mean 'auth\.token'"):
        load_settings(environ={}, config_file=cfg)


def test_scoped_tokens_from_the_file_and_from_json_in_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text(
        '[[auth.tokens]]\nname = "acme"\ntoken = "acme-0123456789abcdef"\n'
        'services = ["acme-*"]\naccess = "read"\n'
    )
    s = load_settings(environ={}, config_file=cfg)
    ((token, scope),) = s.auth.scoped_tokens
    assert token == "acme-0123456789abcdef"
    assert (scope.name, scope.services, scope.read, scope.write) == (
        "acme",
        ("acme-*",),
        True,
        False,
    )
    assert scope.covers("acme-1") and not scope.covers("globex-1")
    env = {
        "LEDGERQ_AUTH_TOKENS": '[{"name": "g", "token": "globex-0123456789abcdef",'
        ' "services": ["globex::*"], "access": "write"}]'
    }
    s = load_settings(environ=env, cwd=tmp_path)
    ((_token, scope),) = s.auth.scoped_tokens
    assert scope.write and not scope.read and scope.covers("globex::x")
    with pytest.raises(
        ConfigError, match=r"invalid auth\.tokens \(from LEDGERQ_AUTH_TOKENS\).*JSON"
    ):
        load_settings(environ={"LEDGERQ_AUTH_TOKENS": "acme=x"}, cwd=tmp_path)


def test_an_operate_token_operates_and_reads_but_posts_nothing(tmp_path: Path) -> None:
    ops = [{"name": "ops", "token": "ops-0123456789abcdef", "services": ["acme-*"]}]
    ops[0]["access"] = "operate"
    ((_token, scope),) = load_settings(
        {"auth.tokens": ops}, environ={}, cwd=tmp_path
    ).auth.scoped_tokens
    assert (scope.operate, scope.read, scope.write) == (True, True, False)
    for access, allowed in (("read", (False, True, False)), ("read-write", (False, True, True))):
        ops[0]["access"] = access
        ((_token, scope),) = load_settings(
            {"auth.tokens": ops}, environ={}, cwd=tmp_path
        ).auth.scoped_tokens
        assert (scope.operate, scope.read, scope.write) == allowed
    ((_token, full),) = load_settings(
        {"auth.token": "full-0123456789abcdef"}, environ={}, cwd=tmp_path
    ).auth.scoped_tokens
    assert (full.name, full.operate, full.read, full.write) == ("auth.token", True, True, True)
    ops[0]["access"] = "admin"
    with pytest.raises(ConfigError, match="access 'admin': use read, write, read-write, operate"):
        load_settings({"auth.tokens": ops}, environ={}, cwd=tmp_path)


def test_contradictory_tokens_are_refused(tmp_path: Path) -> None:
    same = "same-0123456789abcdef"
    with pytest.raises(ConfigError, match=r"same token as auth\.token"):
        load_settings(
            {"auth.token": same, "auth.tokens": [{"name": "a", "token": same}]},
            environ={},
            cwd=tmp_path,
        )
    twice = [
        {"name": "a", "token": "one-0123456789abcdef"},
        {"name": "a", "token": "two-0123456789abcdef"},
    ]
    with pytest.raises(ConfigError, match="name 'a' is used twice"):
        load_settings({"auth.tokens": twice}, environ={}, cwd=tmp_path)


#: Keys whose empty or 0 value stands for one derived from other settings.
DERIVED_WHEN_EMPTY = {"claims.instance_id", "claims.slow_ttl_ms", "claims.post_margin_ms"}


def test_every_key_is_one_typed_attribute(tmp_path: Path) -> None:
    """KEYS and Settings agree: each key is read as ``settings.<section>.<name>``
    (the ``monitor.*`` keys as ``settings.follower``), with the key's value, and
    every attribute of Settings is a key or a section of keys."""
    from dataclasses import fields

    from ledgerq.config import KEYS, Settings

    s = load_settings(environ={}, cwd=tmp_path)
    sections: set[str] = set()
    for key in KEYS:
        section, _, name = key.name.rpartition(".")
        holder: object = s
        if section:
            attribute = "follower" if section == "monitor" else section
            sections.add(attribute)
            holder = getattr(s, attribute)
        value = getattr(holder, name)
        if key.name not in DERIVED_WHEN_EMPTY:
            assert value == s.values[key.name], key.name
    top = {k.name for k in KEYS if "." not in k.name}
    provenance = {"values", "sources", "config_file", "warnings"}
    assert {f.name for f in fields(Settings)} == top | sections | provenance
    assert not hasattr(s, "__getitem__")  # read by attribute, never by key name


def test_component_defaults_are_the_keys_defaults(tmp_path: Path) -> None:
    from ledgerq.claims import ClaimSettings
    from ledgerq.follow.follower import FollowSettings
    from ledgerq.submit.submitter import SubmitterSettings

    s = load_settings(environ={}, cwd=tmp_path)
    assert s.submitter == SubmitterSettings()
    assert s.follower == FollowSettings()
    assert s.claims == ClaimSettings(instance_id=s.claims.instance_id)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"claims.renew_interval_ms": 0}, r"invalid claims\.renew_interval_ms \(from command"),
        ({"claims.grace_ms": -1}, r"invalid claims\.grace_ms .*must not be negative"),
        ({"claims.instance_id": "x" * 129}, r"invalid claims\.instance_id .*longer than 128"),
        ({"claims.ttl_ms": 1_000}, r"claims\.ttl_ms \(1000\) must exceed claims\.renew_interval"),
        ({"monitor.max_parked": 0}, r"invalid monitor\.max_parked"),
        ({"monitor.backoff_max_ms": 1}, r"monitor\.backoff_max_ms \(1\) must not be below"),
        ({"submitter.max_retries": -1}, r"invalid submitter\.max_retries"),
    ],
)
def test_section_values_are_checked_once_and_named_by_key(
    tmp_path: Path, flags: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(flags, environ={}, cwd=tmp_path)


def test_the_instance_id_is_fixed_once_per_settings(tmp_path: Path) -> None:
    s = load_settings(environ={}, cwd=tmp_path)
    assert s.claims.instance_id and s.claims.instance_id == s.claims.instance_id
    assert load_settings({"claims.instance_id": "gw-a"}, environ={}).claims.instance_id == "gw-a"
