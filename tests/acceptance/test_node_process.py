"""The real ``ledgerq node`` process: SIGKILL and restart keeps state and statuses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
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
    def __init__(self, data_dir: Path, *extra: str, failpoints: str = "") -> None:
        env = {k: v for k, v in os.environ.items() if k != "LEDGERQ_FAILPOINTS"}
        if failpoints:
            env["LEDGERQ_FAILPOINTS"] = failpoints
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
            env=env,
        )
        assert self.proc.stderr is not None
        self.startup: list[str] = []  # what the node logged before it listened
        for line in self.proc.stderr:  # blocks until the node says where it listens
            self.startup.append(line)
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
        body = json.dumps(ids).encode()
        doc = self.request("POST", f"/batch_statuses?wait={wait}", body, "application/json")
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
        if p.proc.stderr is not None and not p.proc.stderr.closed:
            p.proc.stderr.close()


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
    assert (tmp_path / "store").is_dir()

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


def test_sigterm_as_soon_as_it_listens_stops_cleanly_and_keeps_the_replay(
    tmp_path: Path, procs: list[NodeProcess]
) -> None:
    first = NodeProcess(tmp_path, "--snapshot-every", "1000000")
    procs.append(first)
    batches = [make_intkey_batch(SIGNER, [("set", f"t{i}", i)]) for i in range(30)]
    post(first, batches)
    assert set(first.statuses([b.header_signature for b in batches])) == {"COMMITTED"}
    first.kill()  # the journal may hold records the store does not
    for restart in range(2):
        again = NodeProcess(tmp_path)
        procs.append(again)
        again.proc.send_signal(signal.SIGTERM)  # the instant it says it listens
        assert again.proc.wait(30) == 0  # a clean stop, not death by the signal
        assert again.proc.stderr is not None
        again.proc.stderr.close()
        if restart:  # the first stop wrote what its replay committed: nothing to replay
            assert not [line for line in again.startup if "recovered" in line]
    last = NodeProcess(tmp_path)
    procs.append(last)
    assert last.value("t29") == 29
    last.kill()


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def test_a_killed_node_leaves_no_decoding_worker_behind(
    tmp_path: Path, procs: list[NodeProcess]
) -> None:
    node = NodeProcess(tmp_path)
    procs.append(node)
    batches = [make_intkey_batch(SIGNER, [("set", f"d{i}", i)]) for i in range(60)]
    body = encode_batch_list(batches)
    assert len(body) >= 16 * 1024  # decoded in the worker pool
    node.request("POST", "/batches", body, "application/octet-stream")
    assert set(node.statuses([b.header_signature for b in batches])) == {"COMMITTED"}
    workers = _children(node.proc.pid)
    assert workers, "the pool started no worker process"
    node.kill()
    for _ in range(3000):  # the kernel kills them with their parent (bounded wait)
        if not any(Path(f"/proc/{w}").exists() for w in workers):
            break
        time.sleep(0.01)
    left = [w for w in workers if Path(f"/proc/{w}").exists()]
    assert not left, f"worker processes outlived the node: {left}"


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


@pytest.mark.parametrize(
    "point",
    [
        "node_journal_synced=kill@6",  # on disk, not yet acknowledged
        "node_store_write=kill@2",  # mid store write: the store keeps the previous one
        "node_store_written=kill@2",  # store written, journal not yet cut
    ],
)
def test_kill_at_every_durability_step_loses_and_repeats_nothing(
    tmp_path: Path, procs: list[NodeProcess], point: str
) -> None:
    """Every acknowledged batch commits exactly once, wherever the process dies."""
    node = NodeProcess(tmp_path, "--snapshot-every", "3", failpoints=point)
    procs.append(node)
    setter = make_intkey_batch(SIGNER, [("set", "k", 0)])
    incs: list[Any] = []
    acknowledged = []
    batch = setter
    while len(incs) < 2_000:  # until the failpoint kills it, a few store writes in
        try:
            post(node, [batch])
        except OSError:  # the process is gone: this POST was not acknowledged
            break
        acknowledged.append(batch)
        if batch is setter or len(acknowledged) % 4 == 0:
            try:
                node.statuses([batch.header_signature], wait=10)  # let the store catch up
            except OSError:
                break
        batch = make_intkey_batch(SIGNER, [("inc", "k", 1)])
        incs.append(batch)
    assert node.proc.wait(30) == -signal.SIGKILL, "the failpoint did not fire"
    assert node.proc.stderr is not None
    node.proc.stderr.close()
    again = NodeProcess(tmp_path)
    procs.append(again)
    ids = [b.header_signature for b in acknowledged]
    assert set(again.statuses(ids, wait=10)) == {"COMMITTED"}
    everything = again.statuses([b.header_signature for b in incs], wait=0)
    assert again.value("k") == everything.count("COMMITTED")  # each inc applied once
    assert everything.count("COMMITTED") >= len(acknowledged) - 1
    again.kill()


def test_a_wide_bind_without_a_token_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERQ_")}
    done = subprocess.run(
        [LEDGERQ, "node", "--bind", "0.0.0.0:0", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0
    assert "refusing to listen on 0.0.0.0 without a token" in done.stderr
    assert not (tmp_path / "store").exists()  # refused before anything was opened


def test_the_token_guards_the_real_process(tmp_path: Path, procs: list[NodeProcess]) -> None:
    token = "node-token-0123456789abcdef"
    node = NodeProcess(tmp_path, "--token", token)
    procs.append(node)
    with pytest.raises(urllib.error.HTTPError) as refused:
        node.request("GET", "/state")
    assert refused.value.code == 401
    refused.value.close()
    req = urllib.request.Request(node.url + "/state", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    node.kill()


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
