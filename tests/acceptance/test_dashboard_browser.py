"""The dashboard in headless Chromium (Debian's ``chromium``) against a gateway with real batches.

The page is rendered twice: ``--dump-dom`` to check that the data the
gateway holds (batch and service ids, counts) is in the DOM the page's script
built, and ``--screenshot`` saved as ``test-artifacts/dashboard.png``; under the
parallel strategy, the services table's in-flight count and what holds each
service's next batch (which earlier batch, which address); with
``serve --workers 2``, the workers table (each worker's index, pid, role).
The service controls are driven over the DevTools protocol (a websocket on
127.0.0.1): the test clicks the buttons, answers the confirmation dialogs and
checks what the store then holds. Chromium's virtual time budget lets the
page's fetches complete before the DOM is taken, without the test sleeping.
Skipped where chromium is missing
(``make test`` installs it when it can); under CI a skip fails the run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench._cluster import Process
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_address, make_intkey_batch
from ledgerq.model import BatchWrite, Invalid, InvalidTransaction
from tests.ledger_fakes import ScriptedLedger
from tests.operator_fakes import batch_list, running_gateway

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
OCTET = {"Content-Type": "application/octet-stream"}

pytestmark = pytest.mark.slow


def _need_chromium() -> str:
    if CHROMIUM is None:
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    return CHROMIUM


async def _chromium(*args: str) -> str:
    # Chromium's helper processes may still write the profile as it is removed.
    with tempfile.TemporaryDirectory(
        prefix="ledgerq-chromium-", ignore_cleanup_errors=True
    ) as profile:
        proc = await asyncio.create_subprocess_exec(
            _need_chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=8000",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


async def test_dashboard_renders_real_batches_and_saves_a_screenshot() -> None:
    _need_chromium()
    async with running_gateway() as (url, _gw):
        async with aiohttp.ClientSession() as http:
            posted: dict[str, list[str]] = {}
            for service, n in (("orders-eu", 6), ("orders-us", 4), ("billing", 3)):
                body, ids = batch_list(n, service)
                async with http.post(
                    f"{url}/batches", params={"service_id": service}, data=body, headers=OCTET
                ) as r:
                    assert r.status == 202
                posted[service] = ids
            for service, ids in posted.items():
                async with http.get(
                    f"{url}/batch_statuses",
                    params={"id": ",".join(ids), "service_id": service, "wait": "20"},
                ) as r:
                    statuses = {e["status"] for e in (await r.json())["data"]}
                assert statuses == {"COMMITTED"}
        dom = await _chromium("--dump-dom", url + "/")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        shot.unlink(missing_ok=True)
        await _chromium("--window-size=1400,1100", f"--screenshot={shot}", url + "/")
    assert 'data-loaded="true"' in dom
    for service in posted:
        assert service in dom
    # The most recent batch, shortened to 16 characters in its row.
    assert posted["billing"][-1][:16] in dom
    total = sum(len(ids) for ids in posted.values())
    cards = dict(re.findall(r'data-status="(\w+)">(\d+)<', dom))
    assert cards["Committed"] == str(total)
    assert "Committed</span>" in dom  # the recent batches' status badges
    assert shot.is_file() and shot.stat().st_size > 10_000


async def test_dashboard_asks_for_the_token_and_uses_one_from_the_fragment() -> None:
    _need_chromium()
    token = "dash-token-0123456789ab"
    scoped = "tenant-token-0123456789ab"
    flags = {
        "auth.token": token,
        "auth.tokens": [{"name": "tenant", "token": scoped, "services": ["guarded-*"]}],
    }
    async with running_gateway(flags, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            headers = {**OCTET, "Authorization": f"Bearer {token}"}
            for service in ("guarded-svc", "other-tenant"):
                body, _ids = batch_list(2, service)
                async with http.post(
                    f"{url}/batches", params={"service_id": service}, data=body, headers=headers
                ) as r:
                    assert r.status == 202
        locked = await _chromium("--dump-dom", url + "/")
        opened = await _chromium("--dump-dom", f"{url}/#token={token}")
        tenant = await _chromium("--dump-dom", f"{url}/#token={scoped}")
    assert '<div id="token-box">' in locked  # shown: no longer hidden
    assert "guarded-svc" not in locked
    # The page runs under its Content-Security-Policy (own script and style only).
    assert 'data-loaded="true"' in opened and "guarded-svc" in opened
    assert "other-tenant" in opened
    # A scoped token's page: its services only, no instance-wide counts.
    assert 'data-loaded="true"' in tenant and "guarded-svc" in tenant
    assert "other-tenant" not in tenant
    assert '<section id="counts" class="cards" hidden="">' in tenant


def _service_row(dom: str, service: str) -> list[str]:
    """The text of each cell of ``service``'s row in the services table."""
    rows = re.findall(r"<tr>(.*?)</tr>", dom, flags=re.S)
    for row in rows:
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cells and cells[0] == service:
            return cells
    raise AssertionError(f"no row for {service} in the services table")


async def test_dashboard_shows_what_is_in_flight_and_what_holds_the_next_batch() -> None:
    """A parallel service with three independent batches at the ledger and a fourth
    held by the first (it writes the same name): the row says 3 in flight and
    names the holding batch and the address; a serial service's row says 1 and
    nothing holds it by a key."""
    _need_chromium()
    signer = Signer.generate()
    ledger = ScriptedLedger()  # accepts everything and keeps it pending
    first = [make_intkey_batch(signer, [("set", n, 0)]) for n in ("a", "b", "c")]
    held = make_intkey_batch(signer, [("inc", "a", 1)])
    serial = [make_intkey_batch(signer, [("set", n, 0)]) for n in ("a", "b")]
    flags = {"queuer.strategy_by_service": "par::*=parallel", "submitter.poll_timeout_s": 0.05}
    async with running_gateway(flags, ledger) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            for service, batches in (("par::1", [*first, held]), ("ser::1", serial)):
                async with http.post(
                    f"{url}/batches",
                    params={"service_id": service},
                    data=encode_batch_list(batches),
                    headers=OCTET,
                ) as r:
                    assert r.status == 202, await r.text()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while True:  # until /services reports what the page must show
                async with http.get(f"{url}/services") as r:
                    listed = {s["service_id"]: s for s in (await r.json())["data"]}
                par, ser = listed.get("par::1", {}), listed.get("ser::1", {})
                if (
                    par.get("in_flight") == 3
                    and par.get("blocked_by")
                    and ser.get("in_flight") == 1
                ):
                    break
                assert loop.time() < deadline, (par, ser)
                await asyncio.sleep(0.05)
        dom = await _chromium("--dump-dom", url + "/")
    assert 'data-loaded="true"' in dom
    address = make_address("a")
    service, strategy, _depth, in_flight, blocked_by, *_ = _service_row(dom, "par::1")
    assert (service, strategy, in_flight) == ("par::1", "parallel", "3")
    assert blocked_by == f"{first[0].header_signature[:16]}… (writes {address[:16]}…)"
    assert f'title="writes {address}"' in dom
    _s, strategy, _depth, in_flight, blocked_by, *_ = _service_row(dom, "ser::1")
    assert (strategy, in_flight, blocked_by) == ("serial", "1", "–")


async def test_dashboard_shows_the_workers_of_serve_workers_2(tmp_path: Path) -> None:
    _need_chromium()
    env = {
        "LEDGERQ_DB": f"sqlite:///{tmp_path / 'g.sqlite3'}",
        "LEDGERQ_BIND": "127.0.0.1:0",
        "LEDGERQ_NODE_EPHEMERAL": "true",
        "LEDGERQ_WORKERS": "2",
        "LEDGERQ_CONFIG": "",
    }
    gw = Process("gw", ["serve"], env, tmp_path)
    try:

        def workers() -> list[dict[str, object]]:
            with urllib.request.urlopen(f"{gw.url}/instances", timeout=30) as resp:
                return list(json.loads(resp.read()).get("workers", []))

        for _ in range(600):  # both workers have said hello (every second)
            if len(await asyncio.to_thread(workers)) == 2:
                break
            assert gw.alive, gw.tail(40)
            await asyncio.sleep(0.1)
        expected = await asyncio.to_thread(workers)
        assert len(expected) == 2, expected
        dom = await _chromium("--dump-dom", gw.url + "/")
    finally:
        gw.kill()
    table = re.search(r'<table id="workers">(.*?)</table>', dom, re.S)
    assert table is not None, dom[-2000:]
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1).split("</thead>")[-1], re.S)
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in rows]
    assert [(c[0], c[1], c[2]) for c in cells] == [
        (str(w["index"]), str(w["pid"]), str(w["role"])) for w in expected
    ]
    assert [c[2] for c in cells] == ["gateway", "ingest"]


class Browser:
    """Headless Chromium driven over the DevTools protocol (a websocket on
    127.0.0.1): what a user's clicks do, with the page's own script."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http = http
        self.ws = ws
        self._id = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls) -> AsyncIterator[Browser]:
        with tempfile.TemporaryDirectory(
            prefix="ledgerq-chromium-", ignore_cleanup_errors=True
        ) as profile:
            proc = await asyncio.create_subprocess_exec(
                _need_chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1500,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                port_file = Path(profile) / "DevToolsActivePort"
                for _ in range(600):  # Chromium writes it once it listens
                    if port_file.is_file() and port_file.read_text().strip():
                        break
                    assert proc.returncode is None, "chromium exited"
                    await asyncio.sleep(0.05)
                port = int(port_file.read_text().split()[0])
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                        pages = [t for t in await r.json() if t["type"] == "page"]
                    async with http.ws_connect(pages[0]["webSocketDebuggerUrl"]) as ws:
                        yield cls(http, ws)
            finally:
                # Its renderers and helpers too: they share its session.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self.ws.send_json({"id": self._id, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=30)
            if message.get("id") == self._id:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    async def eval(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def until(self, expression: str, what: str) -> Any:
        """The value of ``expression`` once truthy (the page polls every 2 s)."""
        for _ in range(400):
            value = await self.eval(expression)
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"the page never showed {what}")


#: Page helpers: a service's row, a button of it, the confirmation dialog.
ROW = """
window.row = (id) => [...document.querySelectorAll("#services tbody tr")]
  .find((r) => r.cells[0] && r.cells[0].textContent === id);
window.press = (id, action) => row(id).querySelector(`button[data-action=${action}]`).click();
window.asked = () => !document.getElementById("action-box").hidden &&
  document.getElementById("action-question").textContent;
window.said = () => document.getElementById("action-result").textContent;
"""


async def test_dashboard_pauses_resumes_skips_and_cancels_after_confirmation() -> None:
    """Each button asks first (Back changes nothing), then acts; the row
    says what stops the service; a refusal shows the gateway's reason."""
    _need_chromium()
    async with running_gateway(pipeline=False) as (url, gw):
        store = gw.store
        async with aiohttp.ClientSession() as http:
            posted: dict[str, list[str]] = {}
            for service, n in (("ops::a", 3), ("ops::b", 2)):
                body, posted[service] = batch_list(n, service.replace(":", "-"))
                async with http.post(
                    f"{url}/batches", params={"service_id": service}, data=body, headers=OCTET
                ) as r:
                    assert r.status == 202
        # ops::b halted at its first batch, as on_invalid = halt leaves it.
        bad = posted["ops::b"][0]
        [batch] = await store.get_batches_by_id([bad])
        tid = batch.transactions[0].transaction_header
        invalid = Invalid((InvalidTransaction(tid, "no such key"),))
        for write in (
            BatchWrite("ops::b", bad, attempt=True),
            BatchWrite("ops::b", bad, invalid, halt="no such key"),
        ):
            assert await store.apply_writes([write]) == [None]

        async with Browser.open() as page:
            await page.send("Page.navigate", url=url + "/")
            await page.until("document.body && document.body.dataset.loaded", "its data")
            await page.eval(ROW)
            await page.until('!!row("ops::b")', "the services")
            halted = await page.eval('row("ops::b").querySelector(".state").textContent')
            assert halted == "halted"
            title = await page.eval('row("ops::b").querySelector(".state").title')
            assert title.startswith(f"halted at batch {bad}: no such key")
            assert await page.eval('row("ops::a").querySelector(".state").textContent') == "running"

            # Pause: asked first; Back changes nothing.
            await page.eval('press("ops::a", "pause")')
            assert (await page.until("asked()", "the question")).startswith("Pause service ops::a?")
            await page.eval('document.getElementById("action-back").click()')
            assert not await page.eval("asked()")
            assert not (await store.service_controls(["ops::a"])).get("ops::a")
            await page.eval('press("ops::a", "pause")')
            await page.until("asked()", "the question")
            await page.eval('document.getElementById("action-confirm").click()')
            assert "ops::a: paused by anonymous" in await page.until("said()", "the answer")
            assert (await store.service_controls(["ops::a"]))["ops::a"].paused
            await page.until(
                '!!row("ops::a").querySelector("button[data-action=resume]")', "resume"
            )
            assert await page.eval('row("ops::a").querySelector(".state").textContent') == "paused"

            # Cancel: the queued batches listed, checked; the last one unchecked.
            await page.eval('press("ops::a", "cancel")')
            assert "Cancel the checked batches of service ops::a?" in await page.until(
                "asked()", "the question"
            )
            boxes = '[...document.querySelectorAll("#action-batches input")]'
            assert await page.eval(f"{boxes}.map((b) => b.value)") == posted["ops::a"]
            await page.eval(f"{boxes}.at(-1).click()")
            await page.eval('document.getElementById("action-confirm").click()')
            await page.until('said().includes("2 batch(es) cancelled")', "the cancel")
            found = await store.get_batches_by_id(posted["ops::a"])
            assert [b.tracking_status for b in found] == ["Cancelled", "Cancelled", None]

            # Skip: resumes the halted service past the batch the row names.
            await page.eval('press("ops::b", "skip")')
            assert f"past its INVALID batch {bad} (no such key)" in await page.until(
                "asked()", "the question"
            )
            await page.eval('document.getElementById("action-confirm").click()')
            await page.until('said().includes("resumed past its invalid batch")', "the skip")
            assert "ops::b" not in await store.service_controls(["ops::b"])

            # A resume someone else made first: the gateway's reason is shown.
            await store.control_service("ops::a", "resume", actor="someone")
            await page.eval('ask("resume", "ops::a")')
            await page.until("asked()", "the question")
            await page.eval('document.getElementById("action-confirm").click()')
            refused = await page.until('said().includes("refused") && said()', "the refusal")
            assert refused == "resume ops::a refused: service 'ops::a' is not paused"
            assert await page.eval('document.getElementById("action-result").className') == "error"
            await page.until('row("ops::b").querySelector(".state").textContent === "running"', "b")
            shot = await page.send("Page.captureScreenshot", format="png")
        history = [(a.action, a.actor) for a in await store.service_actions("ops::a")]
    assert history == [("resume", "someone"), ("cancel", "anonymous"), ("pause", "anonymous")]
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "dashboard-controls.png").write_bytes(base64.b64decode(shot["data"]))
