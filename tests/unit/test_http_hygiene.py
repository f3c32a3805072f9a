"""What the gateway and the node answer and log for odd requests, over real
HTTP on 127.0.0.1: a Host that names no host is refused; the node's errors
are JSON without tracebacks and carry the gateway's security headers;
``Server`` names no versions; a malformed request is one log line; the
longest ids fit a status request."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any

import aiohttp
import pytest

from ledgerq.ingest.api import MAX_DATA_CHANGE_ID_LENGTH
from tests.operator_fakes import batch_list, running_gateway
from tests.unit.test_body_bombs import node_port

ODD_HOSTS = ("[::1]@evil.example", "[::1]evil.example", "127.0.0.1@evil.example", "[zz]:80")


async def raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers["content-length"]))
        return int(lines[0].split()[1]), headers, body
    finally:
        writer.close()


async def test_a_host_header_that_names_no_host_is_refused() -> None:
    async with running_gateway() as (url, _gw):
        port = int(url.rsplit(":", 1)[1])
        body, _ids = batch_list(1, "svc")
        for host in ODD_HOSTS:
            request = (
                f"POST /batches?service_id=svc HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            status, _headers, answer = await raw(port, request)
            assert status == 421, (host, answer)
    async with node_port() as port:
        for host in ODD_HOSTS:
            status, _headers, _answer = await raw(
                port, f"GET /state HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            )
            assert status == 403, host


async def test_the_nodes_errors_are_json_without_tracebacks_and_secured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with node_port() as port:
        with caplog.at_level(logging.INFO):
            status, headers, body = await raw(
                port, b"GET /fingerprints/xyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            assert status == 400 and json.loads(body)["error"]["code"] == 60
            long_line = b"GET /state?x=" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            status, long_headers, body = await raw(port, long_line)
            assert 400 <= status < 500 and json.loads(body)["error"]["code"] == status
        for answer in (headers, long_headers):
            assert answer["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in answer["content-security-policy"]
            assert answer["server"] == "ledgerq"
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_server_names_no_versions_and_a_malformed_request_is_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_gateway() as (url, _gw):
        port = int(url.rsplit(":", 1)[1])
        async with aiohttp.ClientSession() as http:
            for path in ("/health", "/no/such/route"):
                async with http.get(url + path) as r:
                    assert r.headers["Server"] == "ledgerq", path
        with caplog.at_level(logging.INFO):
            for request in (
                b"NOT-HTTP\r\n\r\n",
                b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
            ):
                caplog.clear()
                status, headers, _body = await raw(port, request)
                assert status == 400 and headers["server"] == "ledgerq"
                lines = [r for r in caplog.records if r.name.startswith(("ledgerq", "aiohttp"))]
                assert len(lines) == 1, [r.getMessage() for r in lines]
                assert lines[0].exc_info is None and "\n" not in lines[0].getMessage()


async def test_the_longest_data_change_ids_fit_a_status_request() -> None:
    # 1,000 ids of dc: and 256 characters outside the BMP: each escaped by
    # JSON as 256 surrogate pairs.
    ids = [f"dc:{i:04d}" + "\U0001f600" * (MAX_DATA_CHANGE_ID_LENGTH - 4) for i in range(1000)]
    text = json.dumps(ids)
    assert len(text) > 3_000_000
    body: Any = io.BytesIO(text.encode())
    async with running_gateway(pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/batch_statuses", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 200, await r.text()
                data = (await r.json())["data"]
    assert [d["id"] for d in data] == ids and {d["status"] for d in data} == {"UNKNOWN"}
