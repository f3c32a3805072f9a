"""The real ``ledgerq node`` process: SIGKILL and restart keeps state and statuses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_address, make_intkey_batch

pytestmark = pytest.mark.slow
SIGNER = Signer.generate()
#: The console script installed beside this interpreter (the real CLI).
LEDGERQ = str(Path(sys.executable).parent / "ledgerq")


class NodeProcess:
    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                LEDGERQ,
                "node",
                "--bind",
                "127.0.0.1:0",
                "--data-dir",
                str(data_dir),
                "--shards",
                "2",
                *extra,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # blocks until the node says where it listens
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
        else:
            raise AssertionError(f"node exited with {self.proc.wait()}")

    def request(self, method: str, path: str, body: bytes | None = None, ctype: str = "") -> Any:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if ctype:
            req.add_header("Content-Type", ctype)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def statuses(self, ids: list[str], wait: int = 10) -> list[str]:
        doc = self.request("GET", f"/batch_statuses?id={','.join(ids)}&wait={wait}")
        return [d["status"] for d in doc["data"]]

    def value(self, name: str) -> int:
        import base64

        doc = self.request("GET", f"/state/{make_address(name)}")
        return int(cbor2.loads(base64.b64decode(doc["data"]))[name])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture
def procs() -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.kill()


def post(node: NodeProcess, batches: list[Any]) -> None:
    node.request("POST", "/batches", encode_batch_list(batches), "application/octet-stream")


def test_sigkill_and_restart_keeps_everything(tmp_path: Path, procs: list[NodeProcess]) -> None:
    first = NodeProcess(tmp_path, "--snapshot-every", "7")
    procs.append(first)
    batches = [make_intkey_batch(SIGNER, [("set", "n", 0)])]
    batches += [make_intkey_batch(SIGNER, [("inc", "n", 1)]) for _ in range(20)]
    bad = make_intkey_batch(SIGNER, [("dec", "n", 1000)])
    for i in range(0, len(batches), 3):
        post(first, batches[i : i + 3])
    post(first, [bad])
    ids = [b.header_signature for b in batches]
    assert set(first.statuses(ids)) == {"COMMITTED"}
    assert first.statuses([bad.header_signature]) == ["INVALID"]
    assert first.value("n") == 20
    first.kill()
    assert any(p.name.startswith("snapshot") for p in tmp_path.iterdir())

    second = NodeProcess(tmp_path)
    procs.append(second)
    assert second.value("n") == 20  # nothing executed twice
    assert set(second.statuses(ids, wait=0)) == {"COMMITTED"}
    assert second.statuses([bad.header_signature], wait=0) == ["INVALID"]
    post(second, batches[-3:])  # resubmitting committed batches changes nothing
    later = make_intkey_batch(SIGNER, [("inc", "n", 1)])
    post(second, [later])
    assert second.statuses([later.header_signature]) == ["COMMITTED"]
    assert second.value("n") == 21
    second.kill()


def test_sigkill_with_pending_batches(tmp_path: Path, procs: list[NodeProcess]) -> None:
    """Durable mode: batches accepted but not committed survive a kill; ephemeral forgets."""
    for ephemeral in (False, True):
        data = tmp_path / ("ephemeral" if ephemeral else "durable")
        extra = ["--ephemeral"] if ephemeral else []
        node = NodeProcess(data, "--commit-delay-ms", "600000", *extra)
        procs.append(node)
        batch = make_intkey_batch(SIGNER, [("set", "p", 5)])
        post(node, [batch])
        assert node.statuses([batch.header_signature], wait=0) == ["PENDING"]
        node.kill()
        again = NodeProcess(data, *extra)
        procs.append(again)
        expected = "UNKNOWN" if ephemeral else "COMMITTED"
        assert again.statuses([batch.header_signature], wait=10) == [expected]
        again.kill()


def test_cli_help_lists_the_options() -> None:
    out = subprocess.run(
        [LEDGERQ, "node", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    ).stdout
    for option in (
        "--bind",
        "--data-dir",
        "--shards",
        "--ephemeral",
        "--max-pending",
        "--commit-delay-ms",
    ):
        assert option in out
