"""`ledgerq node`'s lockdown settings: the token from the flag, the environment or
the settings file, and the refusal to listen beyond loopback without one."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from ledgerq.commands.node import check_bind
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError

TOKEN = "node-token-0123456789abcdef"


def test_the_token_comes_from_the_environment_or_the_settings_file(tmp_path: Path) -> None:
    from_env = load_settings(environ={"LEDGERQ_NODE_TOKEN": TOKEN}, cwd=tmp_path)
    assert from_env.node.token == TOKEN and from_env.sources["node.token"] == "env"
    cfg = tmp_path / "ledgerq.toml"
    cfg.write_text(f'[node]\ntoken = "{TOKEN}"\nallowed_hosts = "node.example"\n')
    from_file = load_settings(environ={}, cwd=tmp_path)
    assert from_file.node.token == TOKEN and from_file.sources["node.token"] == "file"
    flag = load_settings({"node.token": TOKEN[::-1]}, environ={}, cwd=tmp_path)
    assert flag.node.token == TOKEN[::-1]  # the flag wins over the file
    for settings in (from_env, from_file, flag):
        check_bind("0.0.0.0", settings)  # a token: any address


def test_a_weak_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"node\.token.*LEDGERQ_NODE_TOKEN"):
        load_settings(environ={"LEDGERQ_NODE_TOKEN": "short"}, cwd=tmp_path)


def test_beyond_loopback_without_a_token_only_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    none = load_settings(environ={}, cwd=tmp_path)
    for host in ("127.0.0.1", "localhost", "::1"):
        check_bind(host, none)
    for host in ("0.0.0.0", "192.0.2.7", "::"):
        with pytest.raises(click.ClickException, match=f"refusing to listen on {host} without"):
            check_bind(host, none)
    told = load_settings({"node.insecure_allow_remote": True}, environ={}, cwd=tmp_path)
    check_bind("0.0.0.0", told)
    assert "WARNING: ledgerq node listens on 0.0.0.0 without a token" in capsys.readouterr().err
