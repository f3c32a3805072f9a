"""Safe defaults of a real ``ledgerq serve`` process, as an operator meets them.

A misspelt ``LEDGERQ_*`` variable and a bind beyond loopback without a token
stop the command with a message naming the problem; ``--insecure-allow-remote``
lets it start with a warning. A gateway started with a token and scoped
tokens (given as JSON in ``LEDGERQ_AUTH_TOKENS``) refuses unauthenticated
reads, keeps each tenant to its services, refuses a foreign ``Host`` and
sends the security headers — all over real sockets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.operator_fakes import batch_list

LEDGERQ = str(Path(sys.executable).parent / "ledgerq")
ADMIN = "admin-token-5f1c2a9e0b7d"
ACME = "acme-token-5f1c2a9e0b7d"

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERQ_")}
    return {**base, **extra}


def _refused(tmp_path: Path, *args: str, **env: str) -> str:
    result = subprocess.run(
        [LEDGERQ, "serve", "--db", f"sqlite:///{tmp_path}/g.sqlite3", *args],
        cwd=tmp_path,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    return result.stderr


Start = Callable[..., tuple[str, list[str]]]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    procs: list[subprocess.Popen[str]] = []

    def run(*args: str, **env: str) -> tuple[str, list[str]]:
        proc = subprocess.Popen(
            [LEDGERQ, "serve", "--db", f"sqlite:///{tmp_path}/g.sqlite3", *args],
            cwd=tmp_path,
            env=_env(**env),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        procs.append(proc)
        assert proc.stderr is not None
        lines: list[str] = []
        for line in proc.stderr:  # ends if the process dies: the assert says why
            lines.append(line)
            found = re.search(r"ledgerq gateway listening on (http://[^\s,]+)", line)
            if found:
                return found.group(1), lines
        raise AssertionError("".join(lines))

    yield run
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stderr:
                proc.stderr.close()


def test_a_misspelt_variable_stops_serve_naming_it(tmp_path: Path) -> None:
    err = _refused(tmp_path, "--bind", "127.0.0.1:0", LEDGERQ_AUTH_TOKN=ADMIN)
    assert "unknown environment variable LEDGERQ_AUTH_TOKN" in err
    assert "did you mean LEDGERQ_AUTH_TOKEN?" in err


def test_a_misspelt_variable_stops_node_and_config_show_too(tmp_path: Path) -> None:
    for command in (["node", "--bind", "127.0.0.1:0"], ["config", "show"]):
        result = subprocess.run(
            [LEDGERQ, *command],
            cwd=tmp_path,
            env=_env(LEDGERQ_NODE_TOKN=ADMIN),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, result.stderr
        assert "did you mean LEDGERQ_NODE_TOKEN?" in result.stderr
        assert ADMIN not in result.stderr


def test_a_wide_bind_without_a_token_is_refused_unless_insecure(
    tmp_path: Path, start: Start
) -> None:
    err = _refused(tmp_path, "--bind", "0.0.0.0:0")
    assert "refusing to listen on 0.0.0.0 without a token" in err
    assert "--insecure-allow-remote" in err
    _url, lines = start("--bind", "0.0.0.0:0", "--workers", "1", "--insecure-allow-remote")
    assert any("WARNING" in line and "without a token" in line for line in lines)


async def test_a_served_gateway_with_scoped_tokens_keeps_tenants_apart(
    tmp_path: Path, start: Start
) -> None:
    tokens = [{"name": "acme", "token": ACME, "services": ["acme-*"]}]
    # Two workers: the tokens reach each worker process through its spec.
    url, _lines = start(
        "--bind",
        "127.0.0.1:0",
        "--workers",
        "2",
        LEDGERQ_AUTH_TOKEN=ADMIN,
        LEDGERQ_AUTH_TOKENS=json.dumps(tokens),
    )
    octet = {"Content-Type": "application/octet-stream"}
    acme = {"Authorization": f"Bearer {ACME}"}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    # A connection per request: the kernel spreads them over both workers.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(url, connector=connector) as http:
        for path in (
            "/tracking/batches",
            "/blocks",
            "/batch_statuses?id=x",
            "/services",
            "/metrics",
            "/dashboard/data",
        ):
            async with http.get(path) as r:
                assert r.status == 401, path
                assert (await r.json())["error"]["code"] == 401
        async with http.get("/health") as r:
            assert r.status == 200
        async with http.get("/") as r:
            assert r.status == 200
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            assert r.headers["X-Content-Type-Options"] == "nosniff"

        body, _ids = batch_list(1, "a")
        async with http.post(
            "/batches?service_id=acme-1", data=body, headers={**octet, **acme}
        ) as r:
            assert r.status == 202
        body, _ids = batch_list(1, "b")
        async with http.post(
            "/batches?service_id=globex-1", data=body, headers={**octet, **acme}
        ) as r:
            assert r.status == 403
            assert "'globex-1'" in (await r.json())["error"]["message"]
        async with http.post(
            "/batches?service_id=globex-1", data=body, headers={**octet, **admin}
        ) as r:
            assert r.status == 202
        for _ in range(6):
            async with http.get("/services", headers=acme) as r:
                assert [s["service_id"] for s in (await r.json())["data"]] == ["acme-1"]
        async with http.get("/services", headers=admin) as r:
            assert {s["service_id"] for s in (await r.json())["data"]} == {"acme-1", "globex-1"}

        async with http.get("/services", headers={**acme, "Host": "rebound.example"}) as r:
            assert r.status == 421
            assert "allowed_hosts" in (await r.json())["error"]["message"]
