"""The gateway's operator endpoints over real HTTP: metrics, security, dashboard data."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

import aiohttp
import pytest
from aiohttp import web

import ledgerq.operator
from ledgerq.follow.follower import FollowSettings
from ledgerq.ledgers.base import Accepted, Ambiguous, Busy, Rejected, Unreachable
from ledgerq.logs import add_secret, configure_logging
from ledgerq.operator.metrics import GatewayMetrics, response_label
from tests.operator_fakes import batch_list, running_gateway

OCTET = {"Content-Type": "application/octet-stream"}
TOKEN = "s3cret-token-0123456789"


async def _wait_final(http: aiohttp.ClientSession, url: str, ids: list[str], service: str) -> None:
    async with http.get(
        f"{url}/batch_statuses", params={"id": ",".join(ids), "service_id": service, "wait": "10"}
    ) as r:
        doc = await r.json()
    assert [e["status"] for e in doc["data"]] == ["COMMITTED"] * len(ids)


async def _post_final(http: aiohttp.ClientSession, url: str, n: int, service: str) -> list[str]:
    """Post ``n`` batches to ``service`` and wait for them to be final; their ids."""
    body, ids = batch_list(n, service)
    async with http.post(
        f"{url}/batches", params={"service_id": service}, data=body, headers=OCTET
    ) as r:
        assert r.status == 202
    await _wait_final(http, url, ids, service)
    return ids


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


async def test_metrics_count_batches_attempts_latency_and_bound_service_labels() -> None:
    async with running_gateway({"metrics.top_services": 2}) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            for service, n in (("svc-a", 3), ("svc-b", 2), ("svc-c", 1), ("svc-d", 1)):
                await _post_final(http, url, n, service)
            async with http.get(f"{url}/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain")
                text = await r.text()
    assert _sample(text, "ledgerq_batches_accepted_total") == 7
    assert _sample(text, 'ledgerq_batches{status="Committed"}') == 7
    assert _sample(text, 'ledgerq_submission_attempts_total{response="accepted"}') == 7
    assert _sample(text, "ledgerq_end_to_end_latency_seconds_count") == 7
    assert _sample(text, 'ledgerq_stage_latency_seconds_count{stage="queued"}') == 7
    assert _sample(text, 'ledgerq_stage_latency_seconds_count{stage="ledger"}') == 7
    # Every report counts: a parked read and a safety-net scan may both see
    # one batch's COMMITTED, so at least one per batch.
    assert _sample(text, 'ledgerq_ledger_statuses_total{status="Committed"}') >= 7
    assert _sample(text, 'ledgerq_monitor_polls_total{result="ok"}') >= 1
    assert _sample(text, "ledgerq_queue_depth") == 0
    assert _sample(text, "ledgerq_services") == 4
    # Two named services plus "other": the label set stays bounded.
    depth_series = [
        line for line in text.splitlines() if line.startswith("ledgerq_service_queue_depth{")
    ]
    assert len(depth_series) == 3
    assert any('service_id="other"' in line for line in depth_series)


async def test_two_gateways_in_one_process_keep_separate_registries() -> None:
    async with (
        running_gateway(pipeline=False) as (url_a, _a),
        running_gateway(pipeline=False) as (url_b, _b),
    ):
        async with aiohttp.ClientSession() as http:
            body, _ids = batch_list(2, "only-a")
            async with http.post(
                f"{url_a}/batches", params={"service_id": "only-a"}, data=body, headers=OCTET
            ) as r:
                assert r.status == 202
            async with http.get(f"{url_a}/metrics") as r:
                a = await r.text()
            async with http.get(f"{url_b}/metrics") as r:
                b = await r.text()
    assert _sample(a, "ledgerq_batches_accepted_total") == 2
    assert _sample(b, "ledgerq_batches_accepted_total") == 0


def test_response_labels_are_bounded() -> None:
    assert response_label(Accepted()) == "accepted"
    assert response_label(Busy(429)) == "busy_429"
    assert response_label(Busy(503)) == "busy_503"
    assert response_label(Busy(500)) == "busy"
    assert response_label(Unreachable("x")) == "unreachable"
    assert response_label(Rejected(400, "x")) == "rejected_4xx"
    assert response_label(Rejected(418, "x")) == "rejected_4xx"
    assert response_label(Ambiguous("x")) == "ambiguous"


def test_batches_taken_with_a_final_status_are_counted_by_how() -> None:
    class Producer:
        taken_with_final = 7
        taken_freed = 3

    class Follower:
        parked = scans = asked = waiting_for_slot = 0
        followed: ClassVar[dict[str, object]] = {}
        settings = FollowSettings()

    m = GatewayMetrics()
    m.watch_pipeline(Producer(), Follower(), None)
    text = m.exposition().decode()
    assert _sample(text, 'ledgerq_batches_taken_with_final_total{how="next"}') == 4
    assert _sample(text, 'ledgerq_batches_taken_with_final_total{how="freed"}') == 3


def test_throughput_window_counts_per_second() -> None:
    now = [1_000_000]
    m = GatewayMetrics(clock=lambda: now[0])
    from tests.factories import tracking_batch as batch

    m.batches_accepted([batch("s", 1), batch("s", 2)])
    now[0] += 1000
    m.batches_accepted([batch("s", 3)])
    now[0] += 1000
    tp = m.throughput(3)
    assert tp["accepted"] == [2, 1, 0]
    assert tp["final"] == [0, 0, 0]


async def test_a_token_guards_every_route_but_health_ready_openapi_and_the_page() -> None:
    async with running_gateway({"auth.token": TOKEN}, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            body, _ids = batch_list(1, "guarded")
            async with http.post(f"{url}/batches", data=body, headers=OCTET) as r:
                assert r.status == 401
                assert "Bearer" in r.headers["WWW-Authenticate"]
                assert "token" in (await r.json())["error"]["message"]
            wrong = {**OCTET, "Authorization": "Bearer nope-nope-nope-nope"}
            async with http.post(f"{url}/batches", data=body, headers=wrong) as r:
                assert r.status == 401
            good = {**OCTET, "Authorization": f"Bearer {TOKEN}"}
            async with http.post(f"{url}/batches", data=body, headers=good) as r:
                assert r.status == 202
            for path in (
                "/tracking/batches",
                "/tracking/batches/abc",
                "/batch_statuses?id=abc",
                "/blocks",
                "/services/svc1/state",
                "/services",
                "/instances",
                "/metrics",
                "/dashboard/data",
            ):
                async with http.get(url + path) as r:
                    assert r.status == 401, path
                    assert (await r.json())["error"]["code"] == 401, path
            for path in ("/health", "/", "/static/dashboard.js", "/openapi.json"):
                async with http.get(url + path) as r:
                    assert r.status == 200, path
            async with http.get(url + "/ready") as r:
                assert r.status == 503  # open, and not ready: the pipeline is not running
            auth = {"Authorization": f"Bearer {TOKEN}"}
            for path in (
                "/tracking/batches",
                "/services",
                "/instances",
                "/metrics",
                "/dashboard/data",
            ):
                async with http.get(url + path, headers=auth) as r:
                    assert r.status == 200, path


async def test_no_cors_unless_configured() -> None:
    origin = {"Origin": "https://ops.example"}
    preflight = {**origin, "Access-Control-Request-Method": "POST"}
    async with running_gateway(pipeline=False) as (url, _gw), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/services", headers=origin) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        async with http.options(f"{url}/batches", headers=preflight) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
    async with running_gateway({"cors.origins": "https://ops.example"}, pipeline=False) as (
        url,
        _gw,
    ):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/services", headers=origin) as r:
                assert r.headers["Access-Control-Allow-Origin"] == "https://ops.example"
            async with http.options(f"{url}/batches", headers=preflight) as r:
                assert r.status == 204
                assert "POST" in r.headers["Access-Control-Allow-Methods"]
            other = {"Origin": "https://evil.example"}
            async with http.get(f"{url}/services", headers=other) as r:
                assert "Access-Control-Allow-Origin" not in r.headers


@pytest.mark.parametrize("bad", ["has space", "-leading", "x" * 300, "semi;colon", "#none", "é"])
async def test_service_ids_are_validated(bad: str) -> None:
    async with running_gateway(pipeline=False) as (url, _gw), aiohttp.ClientSession() as http:
        body, _ids = batch_list(1, "v")
        async with http.post(
            f"{url}/batches", params={"service_id": bad}, data=body, headers=OCTET
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["title"] == "Invalid Service Id"
        async with http.post(
            f"{url}/batches", params={"service_id": "circuit-01::svc.A_1"}, data=body, headers=OCTET
        ) as r:
            assert r.status == 202


async def test_body_limit_is_enforced() -> None:
    async with running_gateway({"max_body_bytes": 2048}, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            body, _ids = batch_list(10, "big")
            assert len(body) > 2048
            async with http.post(f"{url}/batches", data=body, headers=OCTET) as r:
                assert r.status == 413


async def test_dashboard_page_assets_and_data() -> None:
    async with running_gateway() as (url, _gw), aiohttp.ClientSession() as http:
        body, ids = batch_list(3, "dash")
        async with http.post(
            f"{url}/batches", params={"service_id": "dash"}, data=body, headers=OCTET
        ) as r:
            assert r.status == 202
        await _wait_final(http, url, ids, "dash")
        async with http.get(url + "/") as r:
            page = await r.text()
        assert "/static/dashboard.js" in page
        assert "http://" not in page.replace("http://www.w3.org", "")  # no CDN
        async with http.get(url + "/static/dashboard.js") as r:
            assert r.status == 200
            assert "javascript" in r.headers["Content-Type"]
        async with http.get(url + "/static/../config.py") as r:
            assert r.status == 404
        async with http.get(url + "/dashboard/data") as r:
            doc = await r.json()
    assert [b["id"] for b in doc["recent"]] == ids[::-1]
    assert {b["status"] for b in doc["recent"]} == {"Committed"}
    assert doc["counts"]["Committed"] == 3
    assert sum(doc["throughput"]["accepted"]) == 3


async def test_dashboard_data_adds_up_the_other_workers(tmp_path: Path) -> None:
    # serve --workers: the worker that answers adds every other worker's
    # throughput and recent batches (each counts what it accepted), read
    # over the workers' sockets.
    from ledgerq.gateway.bus import MetricsSockets

    async with running_gateway() as (url, gw), aiohttp.ClientSession() as http:
        posted = {
            service: await _post_final(http, url, n, service)
            for service, n in (("w0", 3), ("w1", 2))
        }
        # A second worker that accepted the two batches of w1 (as well).
        peer = GatewayMetrics()
        peer.batches_accepted([await gw.store.get_batch(i, "w1") for i in posted["w1"]])
        stop_peer = await MetricsSockets(str(tmp_path), 1, 2).serve(
            peer.exposition, peer.dashboard_part
        )
        try:
            gw.metrics.peer_dashboards = MetricsSockets(str(tmp_path), 0, 2).peer_dashboards
            async with http.get(url + "/dashboard/data", params={"seconds": "60"}) as r:
                doc = await r.json()
        finally:
            await stop_peer()
    assert sum(doc["throughput"]["accepted"]) == 5 + 2
    assert len(doc["throughput"]["accepted"]) == 60
    # Once each, newest first across the workers.
    assert [b["id"] for b in doc["recent"]] == (posted["w0"] + posted["w1"])[::-1]


def test_secrets_are_redacted_from_log_lines(capsys: pytest.CaptureFixture[str]) -> None:
    add_secret(TOKEN)
    for json_lines in (False, True):
        configure_logging("INFO", json_lines=json_lines)
        logging.getLogger("ledgerq.test").warning("token is %s batch=abc service=svc", TOKEN)
    err = capsys.readouterr().err
    assert TOKEN not in err
    assert err.count("***") == 2
    assert '"batch_id": "abc"' in err and '"service_id": "svc"' in err
    logging.getLogger().handlers[:] = []


def test_a_secret_a_json_line_escapes_is_redacted_too(capsys: pytest.CaptureFixture[str]) -> None:
    # A JSON log line writes " and \ escaped: the secret as written must go too.
    token = 'quote"and\\back-0123456789'
    add_secret(token)
    configure_logging("INFO", json_lines=True)
    logging.getLogger("ledgerq.test").warning("token is %s", token)
    err = capsys.readouterr().err
    logging.getLogger().handlers[:] = []
    assert "0123456789" not in err and "***" in err


def test_the_token_sent_to_the_ledger_is_a_log_secret() -> None:
    from ledgerq.config import load_settings
    from ledgerq.logs import redact
    from ledgerq.operator import register_secrets

    token = "ledger-token-0123456789abcdef"
    register_secrets(load_settings({"ledger_token": token}, environ={}))
    assert redact(f"POST with Bearer {token}") == "POST with Bearer ***"


async def test_instrumented_ledger_keeps_the_pipeline_working_under_busy_answers() -> None:
    from tests.operator_fakes import CommittingLedger

    ledger = CommittingLedger()
    body, ids = batch_list(2, "busy")
    ledger.script[ids[0]] = [Busy(503), Busy(429)]
    async with (
        running_gateway(
            {"submitter.backoff_initial_ms": 0, "submitter.backoff_max_ms": 0}, ledger
        ) as (url, _gw),
        aiohttp.ClientSession() as http,
    ):
        async with http.post(
            f"{url}/batches", params={"service_id": "busy"}, data=body, headers=OCTET
        ) as r:
            assert r.status == 202
        await _wait_final(http, url, ids, "busy")
        async with http.get(f"{url}/metrics") as r:
            text = await r.text()
    assert _sample(text, 'ledgerq_submission_attempts_total{response="busy_503"}') == 1
    assert _sample(text, 'ledgerq_submission_attempts_total{response="busy_429"}') == 1
    assert _sample(text, 'ledgerq_submission_attempts_total{response="accepted"}') == 2
    assert _sample(text, 'ledgerq_stage_latency_seconds_count{stage="submit"}') == 4


async def test_node_metrics_and_spec() -> None:
    from ledgerq.node import Node
    from ledgerq.node.rest import make_app
    from ledgerq.operator import extend_node_app

    node = await Node.open(None)
    runner = web.AppRunner(extend_node_app(make_app(node), node))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as http:
            body, ids = batch_list(3, "node-metrics")
            async with http.post(f"{url}/batches", data=body, headers=OCTET) as r:
                assert r.status == 202
            async with http.get(
                f"{url}/batch_statuses", params={"id": ",".join(ids), "wait": "10"}
            ) as r:
                assert {e["status"] for e in (await r.json())["data"]} == {"COMMITTED"}
            async with http.get(f"{url}/metrics") as r:
                text = await r.text()
            async with http.get(f"{url}/openapi.json") as r:
                spec = await r.json()
    finally:
        await runner.cleanup()
        await node.close()
    assert _sample(text, "ledgerq_node_transactions_committed_total") == 3
    assert _sample(text, "ledgerq_node_transactions_submitted_total") == 3
    assert _sample(text, "ledgerq_node_transactions_pending") == 0
    assert _sample(text, "ledgerq_node_final_statuses_total") == 3
    assert spec["info"]["title"] == "ledgerq node"


async def test_ready_says_stopping_once_the_gateway_drains() -> None:
    # A load balancer's readiness probe, or an operator, reading /ready
    # after SIGTERM: the gateway is going away, not coming up.
    async with running_gateway(pipeline=False) as (url, gateway):
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/ready") as r:
                assert r.status == 503
                assert (await r.json())["status"] == "starting"
            gateway.stop()
            async with http.get(url + "/ready") as r:
                assert r.status == 503
                assert (await r.json())["status"] == "stopping"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_the_dashboard_takes_the_token_out_of_the_address_bar(tmp_path: Path) -> None:
    script = (Path(ledgerq.operator.__file__).parent / "static" / "dashboard.js").read_text()
    # The script's start (what it does as it loads), in node with a browser's
    # location, history and storage stood in for.
    start = script[: script.index("function headers()")]
    harness = tmp_path / "run.js"
    harness.write_text(
        'const location = {hash: "#token=s3cret-token&x=1", pathname: "/", search: "?a=b"};\n'
        "const stored = {};\n"
        "const sessionStorage = {setItem: (k, v) => { stored[k] = v; }};\n"
        "let replaced = null;\n"
        "const history = {replaceState: (_s, _t, url) => { replaced = url; }};\n"
        + start
        + "\nconsole.log(JSON.stringify({stored, replaced}));\n"
    )
    out = subprocess.run(
        ["node", str(harness)], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    doc = json.loads(out)
    assert doc["stored"] == {"ledgerq-token": "s3cret-token"}
    assert doc["replaced"] == "/?a=b#x=1"
