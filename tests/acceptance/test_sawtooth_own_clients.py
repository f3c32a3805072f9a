"""Sawtooth's own clients (``sawtooth``, ``sawset``, ``intkey``) against
``ledgerq node`` and through ``ledgerq serve`` with the service named by the
URL, as they would run against a validator's REST API.

The clients are built from sawtooth-core and sawtooth-sdk-python (Python 3.8,
protobuf 3.20; ``sawtooth`` is on no package index) and never ship with
ledgerq: point ``SAWTOOTH_CLIENTS`` at a directory whose ``bin/``
holds the three commands to run these tests (``make test-sawtooth-clients``;
docs/api.md, "Using an existing Grid or Sawtooth client"). Without it they
are not collected; what they found is kept as tests that need no client
(tests/unit/node/test_sawtooth_clients.py, tests/unit/test_gateway_sawtooth.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._cluster import Process

CLIENTS = os.environ.get("SAWTOOTH_CLIENTS", "")
_MISSING = [c for c in ("sawtooth", "sawset", "intkey") if not Path(CLIENTS, "bin", c).exists()]
if _MISSING:
    raise pytest.UsageError(
        f"SAWTOOTH_CLIENTS={CLIENTS!r}: no {', '.join(_MISSING)} in its bin/ "
        "(make test-sawtooth-clients SAWTOOTH_CORE=... SAWTOOTH_SDK_PYTHON=... builds them)"
    )


class Clients:
    def __init__(self, home: Path, url: str) -> None:
        self.url = url
        self.env = {
            **os.environ,
            "HOME": str(home),
            "USER": "client",
            "LOGNAME": "client",
            "PATH": f"{Path(CLIENTS, 'bin')}:{os.environ['PATH']}",
        }
        self.cwd = home

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            args, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=120
        )
        if ok:
            assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def json(self, *args: str) -> object:
        return json.loads(self.run(*args, "--url", self.url, "-F", "json").stdout)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    workdir = tmp_path_factory.mktemp("node")
    proc = Process("node", ["node", "--bind", "127.0.0.1:0", "--data-dir", "data"], {}, workdir)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, node: Process) -> Iterator[Process]:
    workdir = tmp_path_factory.mktemp("gateway")
    env = {"LEDGERQ_CONFIG": "", "LEDGERQ_WORKERS": "1"}
    args = ["serve", "--db", f"sqlite:///{workdir / 'gw.sqlite3'}"]
    args += ["--ledger", f"sawtooth+{node.url}", "--bind", "127.0.0.1:0"]
    proc = Process("gateway", args, env, workdir)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One client key for every test: the node's settings authorize it once."""
    made = tmp_path_factory.mktemp("home")
    Clients(made, "").run("sawtooth", "keygen")
    return made


@pytest.fixture(params=["node", "gateway"])
def clients(request: pytest.FixtureRequest, home: Path, node: Process, gateway: Process) -> Clients:
    url = node.url if request.param == "node" else f"{gateway.url}/services/svc1"
    return Clients(home, url)


def test_intkey_sets_reads_and_loads(clients: Clients) -> None:
    key = f"k{time.monotonic_ns() % 10**9}"
    u = clients.url
    clients.run("intkey", "set", key, "10", "--url", u, "--wait", "30")
    clients.run("intkey", "inc", key, "5", "--url", u, "--wait", "30")
    clients.run("intkey", "dec", key, "2", "--url", u, "--wait", "30")
    assert clients.run("intkey", "show", key, "--url", u).stdout.strip() == f"{key}: 13"
    missing = clients.run("intkey", "show", f"no{key}", "--url", u, ok=False)
    assert missing.returncode == 1 and "No such key" in missing.stdout + missing.stderr
    clients.run("intkey", "create_batch", "-K", "3", "-c", "6", "-o", "load.intkey")
    clients.run("intkey", "load", "-f", "load.intkey", "-U", u)
    assert f"{key}: 13" in clients.run("intkey", "list", "--url", u).stdout


def test_sawtooth_lists_and_shows_what_it_submitted(clients: Clients) -> None:
    clients.run("intkey", "create_batch", "-K", "2", "-c", "2", "-o", "two.intkey")
    submitted = clients.run(
        "sawtooth", "batch", "submit", "-f", "two.intkey", "--url", clients.url, "--wait", "30"
    )
    assert "COMMITTED" in submitted.stdout or "batches committed" in submitted.stdout.lower()
    batches = clients.json("sawtooth", "batch", "list")
    assert isinstance(batches, list) and batches
    batch_id = batches[0]["batch_id"]
    shown = clients.json("sawtooth", "batch", "show", batch_id)
    assert isinstance(shown, dict) and shown["header_signature"] == batch_id
    [status] = clients.json("sawtooth", "batch", "status", "--wait", "10", batch_id)  # type: ignore[misc]
    # The gateway adds its own fields (ledgerq_status, service_id, ...).
    assert (status["id"], status["status"], status["invalid_transactions"]) == (
        batch_id,
        "COMMITTED",
        [],
    )
    blocks = clients.json("sawtooth", "block", "list")
    assert isinstance(blocks, list) and blocks[-1]["num"] == "0"  # genesis, last of the list
    head = blocks[0]["block_id"]
    clients.json("sawtooth", "block", "show", head)
    transactions = clients.json("sawtooth", "transaction", "list")
    assert isinstance(transactions, list) and transactions
    addresses = clients.run("sawtooth", "state", "list", "1cf126", "--url", clients.url).stdout
    address = addresses.splitlines()[1].split()[0]  # the first row, under the column names
    assert address.startswith("1cf126")
    clients.run("sawtooth", "state", "show", address, "--url", clients.url, "--head", head)
    assert "peers" in clients.run("sawtooth", "status", "show", "--url", clients.url).stdout


def test_sawset_proposes_and_settings_list_shows_it(clients: Clients) -> None:
    keys = clients.cwd / ".sawtooth" / "keys"
    public = (keys / "client.pub").read_text().strip()
    # The first proposal authorizes the client's key (no key is authorized
    # on a new chain); the second, by that key, is adopted at once.
    probe = f"ledgerq.probe.n{time.monotonic_ns()}"
    for setting in (f"sawtooth.settings.vote.authorized_keys={public}", f"{probe}=yes"):
        clients.run(
            "sawset", "proposal", "create", "--url", clients.url, "-k", str(keys / "client.priv"),
            setting,
        )  # fmt: skip
        name, _, value = setting.partition("=")
        for _ in range(100):
            listed = clients.run(
                "sawtooth", "settings", "list", "--url", clients.url, "--format", "json"
            )
            if json.loads(listed.stdout)["settings"].get(name) == value:
                break
            time.sleep(0.1)  # waiting for the node to commit the proposal
        else:
            raise AssertionError(f"{name} never showed {value}: {listed.stdout}")
