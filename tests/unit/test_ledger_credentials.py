"""A ledger URL with ``user:password@``: the password is sent (HTTP Basic, on
every request, by both HTTP clients) and shown nowhere — not in the
dashboard's data, not in ``/services``' ledger problems, not in the log,
not by ``ledgerq config show``; with ``ledger_token`` beside it the
settings are refused before anything starts. Real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

from ledgerq.cli import cli
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError
from ledgerq.ledgers import HttpTimeouts, http_ledger_client
from ledgerq.ledgers.base import Unjudged
from ledgerq.logs import configure_logging
from tests.operator_fakes import batch_list, running_gateway

PASSWORD = "s3cret-pass%2Fx"  # percent-encoded in the URL: "s3cret-pass/x" on the wire
SEEN = "s3cret-pass"
BASIC = "Basic " + base64.b64encode(b"acme:s3cret-pass/x").decode()


@contextlib.asynccontextmanager
async def refusing_ledger() -> AsyncIterator[tuple[int, list[str]]]:
    """A Sawtooth-shaped server that answers every request 404, recording
    each request's Authorization."""
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response(
            {"error": {"code": 404, "title": "Not Found", "message": "no such route"}},
            status=404,
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("lean", [True, False])
async def test_url_credentials_go_as_basic_auth_and_nowhere_else(lean: bool) -> None:
    async with refusing_ledger() as (port, seen):
        client = http_ledger_client(
            f"sawtooth+http://acme:{PASSWORD}@127.0.0.1:{port}", HttpTimeouts(lean=lean)
        )
        try:
            result = await client.submit("svc", "b" * 128, b"")
        finally:
            await client.close()
    assert seen == [BASIC]
    assert isinstance(result, Unjudged)
    assert SEEN not in result.message and "acme" not in result.message
    assert SEEN not in client.description  # type: ignore[attr-defined]


async def test_a_ledger_password_is_in_no_answer_and_no_log_line(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO")  # the redacting handler the commands install
    async with refusing_ledger() as (port, seen):
        url = f"sawtooth+http://acme:{PASSWORD}@127.0.0.1:{port}"
        ledger = http_ledger_client(url)
        flags = {"ledger": url, "submitter.backoff_initial_ms": 5}
        with caplog.at_level(logging.INFO):
            async with running_gateway(flags, ledger) as (gw_url, _gw):  # type: ignore[arg-type]
                async with aiohttp.ClientSession() as http:
                    body, _ids = batch_list(1, "k")
                    headers = {"Content-Type": "application/octet-stream"}
                    async with http.post(
                        f"{gw_url}/batches?service_id=svc", data=body, headers=headers
                    ) as r:
                        assert r.status == 202
                    problem = None
                    for _ in range(200):
                        async with http.get(f"{gw_url}/services") as r:
                            services = await r.text()
                        problem = json.loads(services)["data"][0]["ledger_problem"]
                        if problem is not None:
                            break
                        await asyncio.sleep(0.02)
                    assert problem is not None, services
                    async with http.get(f"{gw_url}/dashboard/data") as r:
                        dashboard = await r.text()
            await ledger.close()
    assert seen and set(seen) == {BASIC}
    assert "127.0.0.1" in json.loads(dashboard)["ledger"]
    logged = caplog.text + capsys.readouterr().err
    assert "answered 404" in logged  # the problem was logged, its URL without the password
    for text in (services, dashboard, logged):
        assert SEEN not in text and "acme:" not in text


def test_url_credentials_and_a_ledger_token_are_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    flags = {"ledger": f"sawtooth+http://acme:{PASSWORD}@ledger:8008", "ledger_token": "t" * 20}
    with pytest.raises(ConfigError, match="ledger_token") as caught:
        load_settings(flags, environ={}, config_file=None)
    assert "Authorization" in str(caught.value) and SEEN not in str(caught.value)
    env = {
        "LEDGERQ_LEDGER": flags["ledger"],
        "LEDGERQ_LEDGER_TOKEN": flags["ledger_token"],
        "LEDGERQ_DB": f"sqlite:///{tmp_path}/db.sqlite3",
    }
    result = CliRunner().invoke(cli, ["serve", "--bind", "127.0.0.1:0"], env=env)
    assert result.exit_code == 1
    assert "ledger_token" in result.output and "listening" not in result.output
    # Each alone is taken; the password is masked when shown.
    del env["LEDGERQ_LEDGER_TOKEN"]
    result = CliRunner().invoke(cli, ["config", "show", "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = {r["key"]: r["value"] for r in json.loads(result.output)["settings"]}
    assert rows["ledger"] == "sawtooth+http://acme:***@ledger:8008"
    assert SEEN not in result.output
