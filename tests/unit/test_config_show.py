"""``ledgerq config show`` and the operator settings: sources, validation, secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledgerq.cli import cli
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError

TOKEN = "tok-0123456789abcdef"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ledgerq.toml of the checkout is picked up


def _show(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["config", "show", *args], env=env)
    return result.exit_code, result.output


def test_show_reports_each_value_and_its_source(tmp_path: Path) -> None:
    toml = tmp_path / "ops.toml"
    toml.write_text(
        f'[submitter]\nslots = 7\n[auth]\ntoken = "{TOKEN}"\n[cors]\norigins = "https://a.example"\n'
    )
    toml.chmod(0o600)  # it holds a token (else a warning: see below)
    env = {"LEDGERQ_CONFIG": str(toml), "LEDGERQ_BIND": "127.0.0.1:9999",
           "LEDGERQ_DB": "postgresql://u:pw-secret@db.example/ledgerq"}  # fmt: skip
    code, out = _show(tmp_path, env, "--json")
    assert code == 0, out
    doc = json.loads(out)
    rows = {r["key"]: r for r in doc["settings"]}
    assert doc["config_file"] == str(toml)
    assert (rows["submitter.slots"]["value"], rows["submitter.slots"]["source"]) == (7, "file")
    assert (rows["bind"]["value"], rows["bind"]["source"]) == ("127.0.0.1:9999", "env")
    assert rows["log.level"]["source"] == "default"
    assert rows["cors.origins"]["value"] == "https://a.example"
    # Secrets never shown.
    assert rows["auth.token"]["value"] == "***"
    assert TOKEN not in out and "pw-secret" not in out
    code, table = _show(tmp_path, env)
    assert code == 0 and "submitter.slots" in table and TOKEN not in table


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"LEDGERQ_AUTH_TOKEN": "short"}, "auth.token"),
        ({"LEDGERQ_CORS_ORIGINS": "ops.example"}, "cors.origins"),
        ({"LEDGERQ_METRICS_TOP_SERVICES": "0"}, "metrics.top_services"),
        ({"LEDGERQ_BIND": "nohost"}, "bind"),
        ({"LEDGERQ_SUBMITTER_SLOTS": "many"}, "submitter.slots"),
    ],
)
def test_invalid_values_are_refused_naming_the_key(
    tmp_path: Path, env: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError, match=key):
        load_settings(environ=env, cwd=tmp_path)
    code, out = _show(tmp_path, env)
    assert code == 1
    assert key in out


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ledgerq.toml").write_text("[auth]\ntokn = 'x'\n")
    with pytest.raises(ConfigError, match=r"auth\.tokn"):
        load_settings(environ={}, cwd=tmp_path)


def test_the_token_is_not_echoed_when_refused(tmp_path: Path) -> None:
    bad = "has space in the middle of it"
    code, out = _show(tmp_path, {"LEDGERQ_AUTH_TOKEN": bad})
    assert code == 1 and bad not in out


def test_every_key_and_command_is_documented() -> None:
    from ledgerq.config import KEYS

    docs = Path(__file__).resolve().parents[2] / "docs"
    configuration = (docs / "configuration.md").read_text()
    for key in KEYS:
        assert f"`{key.name}`" in configuration, key.name
    for name in cli.list_commands(None):  # type: ignore[arg-type]
        assert f"`ledgerq {name}" in configuration, name


def test_serve_takes_the_delay_window_as_a_flag_and_refuses_a_negative_one(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(
        cli,
        ["serve", "--db", f"sqlite:///{tmp_path / 'x.sqlite3'}", "--delay-window-ms", "-1"],
        env={},
    )
    assert result.exit_code != 0
    assert "delay_window_ms" in result.output
    assert not (tmp_path / "x.sqlite3").exists()  # refused before anything was opened


def test_show_lists_scoped_tokens_without_their_values(tmp_path: Path) -> None:
    scoped = "acme-0123456789abcdef"
    env = {
        "LEDGERQ_AUTH_TOKENS": json.dumps(
            [{"name": "acme", "token": scoped, "services": ["acme-*"], "access": "read"}]
        )
    }
    code, out = _show(tmp_path, env, "--json")
    assert code == 0, out
    rows = {r["key"]: r for r in json.loads(out)["settings"]}
    assert rows["auth.tokens"]["value"] == [
        {"name": "acme", "token": "***", "services": ["acme-*"], "access": "read"}
    ]
    assert scoped not in out
    code, table = _show(tmp_path, env)
    assert code == 0 and scoped not in table


def test_links_from_two_sources_at_once_are_refused(tmp_path: Path) -> None:
    env = {"LEDGERQ_PUBLIC_URL": "https://gw.example.com", "LEDGERQ_TRUST_FORWARDED": "true"}
    with pytest.raises(ConfigError, match="public_url and trust_forwarded"):
        load_settings(environ=env, cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"invalid public_url"):
        load_settings(environ={"LEDGERQ_PUBLIC_URL": "gw.example.com"}, cwd=tmp_path)


def test_a_settings_file_holding_secrets_that_anyone_may_read_is_warned_about(
    tmp_path: Path,
) -> None:
    toml = tmp_path / "ops.toml"
    toml.write_text(f'[auth]\ntoken = "{TOKEN}"\n')
    env = {"LEDGERQ_CONFIG": str(toml)}
    toml.chmod(0o644)
    result = CliRunner().invoke(cli, ["config", "show", "--json"], env=env)
    assert result.exit_code == 0
    assert "WARNING" in result.stderr and "chmod 600" in result.stderr
    assert "auth.token" in result.stderr and TOKEN not in result.stderr
    json.loads(result.stdout)  # the JSON alone on stdout
    toml.chmod(0o600)
    result = CliRunner().invoke(cli, ["config", "show", "--json"], env=env)
    assert result.exit_code == 0 and "WARNING" not in result.stderr
    # Readable by all but holding no secret: nothing to warn about.
    toml.write_text("[submitter]\nslots = 7\n")
    toml.chmod(0o644)
    result = CliRunner().invoke(cli, ["config", "show", "--json"], env=env)
    assert "WARNING" not in result.stderr
    assert load_settings(config_file=toml, environ={}).warnings == ()
