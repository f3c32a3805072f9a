"""The client commands through the real CLI against a real ``ledgerq serve`` process.

One gateway (SQLite store, in-process node, an API token) serves the whole
module; every command runs as its own ``ledgerq`` process, and its exit code
and output are checked. The gateway's log is checked never to contain the token.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerq.ledgers.inprocess import NodeClient
from tests.operator_fakes import batch_list

LEDGERQ = str(Path(sys.executable).parent / "ledgerq")
TOKEN = "cli-test-token-5f1c2a9e"

pytestmark = pytest.mark.slow
#: Services halt-* halt on an INVALID batch (the others continue).
SERVE_FLAGS = ("--bind", "127.0.0.1:0", "--on-invalid-for", "halt-*=halt")


def _env(**extra: str) -> dict[str, str]:
    """This environment without any LEDGERQ_* setting, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERQ_")}
    return {**base, **extra}


class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url
        self.log: list[str] = []


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("gateway")
    proc = subprocess.Popen(
        [LEDGERQ, "serve", "--db", f"sqlite:///{folder}/g.sqlite3", *SERVE_FLAGS],
        cwd=folder,
        env=_env(LEDGERQ_AUTH_TOKEN=TOKEN, LEDGERQ_LOG_LEVEL="debug"),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    try:
        url = ""
        lines: list[str] = []
        for line in proc.stderr:  # ends if the process dies: the assert below says why
            lines.append(line)
            found = re.search(r"ledgerq gateway listening on (http://[^\s,]+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "".join(lines)
        served = Served(proc, url)
        served.log = lines
        drain = threading.Thread(target=lambda: served.log.extend(proc.stderr or ()))
        drain.start()
        yield served
        proc.terminate()
        assert proc.wait(30) == 0
        drain.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()


def ledgerq(
    *args: str, token: str | None = TOKEN, answer: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = _env() if token is None else _env(LEDGERQ_TOKEN=token)
    return subprocess.run(
        [LEDGERQ, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        input=answer,
    )


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.stdout, result.stderr
    return json.loads(result.stdout)


def test_submit_generate_commits_everything_in_order(gateway: Served) -> None:
    done = ledgerq("submit", "--generate", "60", "--services", "3", "--url", gateway.url, "--json")
    assert done.returncode == 0, done.stderr
    summary = _json(done)
    assert (summary["committed"], summary["invalid"], summary["services"]) == (60, 0, 3)
    service, ids = next(iter(summary["batch_ids"].items()))
    assert len(ids) == 20

    status = ledgerq("status", *ids[:5], "-s", service, "--wait", "--url", gateway.url, "--json")
    assert status.returncode == 0, status.stderr
    assert [e["status"] for e in _json(status)["data"]] == ["COMMITTED"] * 5

    listed = ledgerq("batches", "-s", service, "--status", "committed", "--url", gateway.url,
                     "--json")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    # Acceptance order is creation order.
    assert [b["id"] for b in _json(listed)["data"]] == ids

    table = ledgerq("batches", "-s", service, "--limit", "5", "--url", gateway.url)
    assert table.returncode == 0 and ids[0][:16] in table.stdout and "--after" in table.stdout

    services = _json(ledgerq("services", "--url", gateway.url, "--json"))
    depths = {s["service_id"]: s["queue_depth"] for s in services["data"]}
    assert depths[service] == 0

    single = ledgerq("instances", "--url", gateway.url)
    assert single.returncode == 0 and "single instance" in single.stdout
    # The ledger it submits to (the default: the in-process node).
    assert f"submitting to: {NodeClient.DESCRIPTION}" in single.stdout


def test_the_quickstart_status_step_finds_a_batch_by_id_alone(gateway: Served) -> None:
    # The quickstart: generate, list committed batches, copy an id, ask its status.
    done = ledgerq("submit", "--generate", "20", "--services", "4", "--url", gateway.url)
    assert done.returncode == 0, done.stderr
    listed = ledgerq("batches", "--status", "Committed", "--limit", "5", "--full-ids",
                     "--url", gateway.url)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    ids = re.findall(r"\b[0-9a-f]{128}\b", listed.stdout)
    assert len(ids) == 5, listed.stdout
    status = ledgerq("status", ids[-1], "--wait", "--url", gateway.url)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "COMMITTED" in status.stdout and "gen-" in status.stdout


def test_a_batch_list_file_with_an_invalid_batch_exits_5(gateway: Served, tmp_path: Path) -> None:
    from ledgerq.codec import Signer, encode_batch_list
    from ledgerq.codec.intkey import make_intkey_batch

    # An inc of a key never set: the ledger finds it INVALID.
    bad = make_intkey_batch(Signer.generate(), [("inc", "never-set-key", 1)])
    path = tmp_path / "bad.batchlist"
    path.write_bytes(encode_batch_list([bad]))
    result = ledgerq("submit", str(path), "-s", "file-svc", "--url", gateway.url)
    assert result.returncode == 5, result.stderr
    assert "1 invalid" in result.stderr

    good_body, _ = batch_list(3, "file-ok")
    path.write_bytes(good_body)
    ok = ledgerq("submit", str(path), "-s", "file-ok", "--url", gateway.url, "--json")
    assert ok.returncode == 0, ok.stderr
    assert _json(ok)["committed"] == 3


def test_exit_codes_for_unknown_unauthorized_and_unreachable(gateway: Served) -> None:
    unknown = ledgerq("status", "ab" * 64, "--url", gateway.url)
    assert unknown.returncode == 7, unknown.stderr

    anonymous = ledgerq("submit", "--generate", "1", "--url", gateway.url, token=None)
    assert anonymous.returncode == 4
    assert "--token" in anonymous.stderr and "LEDGERQ_TOKEN" in anonymous.stderr

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    for args in (["status", "ab" * 64], ["batches"], ["services"], ["instances"]):
        down = ledgerq(*args, "--url", closed)
        assert down.returncode == 3, (args, down.stderr)
        assert "ledgerq serve" in down.stderr

    usage = ledgerq("submit", "--url", gateway.url)
    assert usage.returncode == 2


def test_metrics_and_dashboard_on_the_real_gateway(gateway: Served) -> None:
    import urllib.request

    # With a token set, /metrics needs it like every other read.
    request = urllib.request.Request(
        gateway.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        text = r.read().decode()
    assert "ledgerq_batches_accepted_total" in text
    assert 'ledgerq_submission_attempts_total{response="accepted"}' in text
    # The in-process node's own series are on the gateway's /metrics too.
    assert "ledgerq_node_transactions_committed_total" in text
    with urllib.request.urlopen(gateway.url + "/", timeout=10) as r:
        assert b"ledgerq" in r.read()


def test_the_token_never_reaches_the_log(gateway: Served) -> None:
    # Runs last in the module: everything above went through this gateway.
    ledgerq("submit", "--generate", "2", "--url", gateway.url, token="wrong-" + TOKEN)
    log = "".join(gateway.log)
    assert "submission started" in log  # the log was captured at all
    assert TOKEN not in log


def _post(gateway: Served, tmp_path: Path, service: str, batches: list[Any]) -> list[str]:
    """Post ``batches`` to ``service`` with ``ledgerq submit --no-wait``; their ids."""
    from ledgerq.codec import encode_batch_list

    path = tmp_path / f"{service}-{len(list(tmp_path.iterdir()))}.batchlist"
    path.write_bytes(encode_batch_list(batches))
    done = ledgerq("submit", str(path), "-s", service, "--no-wait", "--url", gateway.url)
    assert done.returncode == 0, done.stderr
    return [b.header_signature for b in batches]


def test_service_pause_cancel_resume_and_history(gateway: Served, tmp_path: Path) -> None:
    from ledgerq.codec import Signer
    from ledgerq.codec.intkey import make_intkey_batch

    url = ("--url", gateway.url)
    unknown = ledgerq("service", "pause", "svc-nothing", *url)
    assert unknown.returncode == 4
    assert unknown.stderr.strip().splitlines() == [
        "Error: HTTP 404 Not Found: no batch of service 'svc-nothing' is tracked; check the "
        "service id"
    ]
    signer = Signer.generate()
    [first] = _post(gateway, tmp_path, "svc-ops", [make_intkey_batch(signer, [("set", "ops", 0)])])
    assert ledgerq("status", first, "--wait", *url).returncode == 0
    paused = ledgerq("service", "pause", "svc-ops", *url)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("service svc-ops: paused by auth.token at ")
    later = [make_intkey_batch(signer, [("inc", "ops", 1)]) for _ in range(2)]
    doomed, kept = _post(gateway, tmp_path, "svc-ops", later)

    # Cancel asks first; no (or no answer) cancels nothing.
    for answer in ("n\n", ""):
        refused = ledgerq("service", "cancel", "svc-ops", doomed, *url, answer=answer)
        assert refused.returncode == 1
        assert "Cancel 1 batch(es) of service svc-ops?" in refused.stderr
        assert "not confirmed: nothing was cancelled" in refused.stderr
    cancelled = ledgerq("service", "cancel", "svc-ops", doomed, *url, answer="y\n")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "1 batch(es) cancelled by auth.token" in cancelled.stdout
    status = ledgerq("status", doomed, *url)
    assert status.returncode == 5  # INVALID to a Sawtooth client
    assert "Cancelled" in status.stdout and "cancelled by auth.token at" in status.stdout
    again = ledgerq("service", "cancel", "svc-ops", doomed, "--yes", *url)
    assert again.returncode == 4
    assert len(again.stderr.strip().splitlines()) == 1
    assert "HTTP 409 Refused: batch " in again.stderr and "final" in again.stderr

    assert ledgerq("service", "resume", "svc-ops", *url).returncode == 0
    assert ledgerq("status", kept, "--wait", *url).returncode == 0
    not_paused = ledgerq("service", "resume", "svc-ops", *url)
    assert not_paused.returncode == 4
    assert "HTTP 409 Refused: service 'svc-ops' is not paused" in not_paused.stderr
    not_halted = ledgerq("service", "skip", "svc-ops", *url)
    assert not_halted.returncode == 4
    assert "service svc-ops is not halted" in not_halted.stderr

    history = _json(ledgerq("service", "history", "svc-ops", "--json", *url))
    actions = [(a["action"], a["actor"]) for a in history["data"]["history"]]
    assert actions == [("resume", "auth.token"), ("cancel", "auth.token"), ("pause", "auth.token")]
    assert history["data"]["history"][1]["batch_ids"] == [doomed]
    table = ledgerq("service", "history", "svc-ops", "--limit", "2", *url)
    assert table.returncode == 0, table.stderr
    assert "service svc-ops: 0 queued of 3; nothing holds it" in table.stdout
    assert "cancel" in table.stdout and "pause" not in table.stdout
    assert "more: --before" in table.stdout


def test_service_skip_resumes_a_halted_service(gateway: Served, tmp_path: Path) -> None:
    from ledgerq.codec import Signer
    from ledgerq.codec.intkey import make_intkey_batch

    url = ("--url", gateway.url)
    signer = Signer.generate()
    # An inc of a key never set is INVALID: halt-* services halt there.
    bad, good = _post(
        gateway,
        tmp_path,
        "halt-cli",
        [
            make_intkey_batch(signer, [("inc", "halt-cli-never-set", 1)]),
            make_intkey_batch(signer, [("set", "halt-cli", 1)]),
        ],
    )
    assert ledgerq("status", bad, "--wait", *url).returncode == 5
    state = _json(ledgerq("service", "history", "halt-cli", "--json", *url))["data"]
    assert state["halted"]["batch_id"] == bad
    assert state["lock_reason"].startswith(f"halted at batch {bad}: ")
    pending = _json(ledgerq("status", good, *url, "--json"))["data"]
    assert [e["status"] for e in pending] == ["PENDING"]
    refused = ledgerq("service", "skip", "halt-cli", *url, answer="n\n")
    assert refused.returncode == 1
    assert f"Resume service halt-cli past batch {bad}" in refused.stderr
    assert "the service stays halted" in refused.stderr
    skipped = ledgerq("service", "skip", "halt-cli", "--yes", *url)
    assert skipped.returncode == 0, skipped.stderr
    assert "resumed past its invalid batch by auth.token" in skipped.stdout
    assert ledgerq("status", good, "--wait", *url).returncode == 0
