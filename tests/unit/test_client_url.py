"""The client commands' ``--url`` (or ``$LEDGERQ_URL``): a URL, checked before any request."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ledgerq.cli import cli

BATCH_ID = "a" * 128


@pytest.mark.parametrize(
    "args",
    [["services"], ["instances"], ["batches"], ["status", BATCH_ID], ["submit", "--generate", "1"]],
)
@pytest.mark.parametrize("url", ["127.0.0.1:8080", "localhost", "http://", "ftp://gw.example"])
def test_a_gateway_url_without_http_is_wrong_usage(args: list[str], url: str) -> None:
    for given in (["--url", url], []):
        result = CliRunner().invoke(cli, [*args, *given], env={"LEDGERQ_URL": url})
        assert result.exit_code == 2, result.output
        assert "is not the gateway's URL; write http://HOST:PORT" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["services", "--limit", "0"],
        ["services", "--limit", "10001"],
        ["batches", "--limit", "0"],
        ["batches", "--limit", "1001"],
    ],
)
def test_a_limit_out_of_range_is_wrong_usage_before_any_request(args: list[str]) -> None:
    # Port 9 answers no one: a request would be exit 3 (or, reaching a gateway, a 400: 4).
    result = CliRunner().invoke(cli, [*args, "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--limit'" in result.output
