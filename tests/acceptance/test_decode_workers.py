"""A real ``ledgerq serve``: its decoding workers run at ``decode_priority``
and die with the gateway when it is killed with SIGKILL."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bench._cluster import Process
from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.ingest.decoding import POOL_BYTES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's"),
]


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` and that are multiprocessing workers."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("priority", "nice", "policy"), [("7", 7, "SCHED_OTHER"), ("idle", 19, "SCHED_IDLE")]
)
def test_serve_decodes_at_its_priority_and_its_workers_die_with_it(
    tmp_path: Path, priority: str, nice: int, policy: str
) -> None:
    env = {"LEDGERQ_DECODE_PRIORITY": priority, "LEDGERQ_WORKERS": "1"}
    gateway = Process(
        "serve",
        ["serve", "--db", f"sqlite:///{tmp_path / 'q.sqlite3'}", "--bind", "127.0.0.1:0"],
        env,
        tmp_path,
    )
    workers: list[int] = []
    try:
        signer = Signer.generate()
        body = encode_batch_list(
            [make_intkey_batch(signer, [("set", f"k{i}", i)]).serialized for i in range(600)]
        )
        assert len(body) >= POOL_BYTES  # decoded in a worker
        request = urllib.request.Request(
            f"{gateway.url}/batches?service_id=s",
            data=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            assert answer.status == 202
        workers = _children(gateway.proc.pid)
        assert workers, "no decoding worker found"
        # A nice value only goes up: never below the suite's own (a run
        # under `nice` starts above 0).
        expected = max(nice, os.getpriority(os.PRIO_PROCESS, 0))
        for pid in workers:
            assert os.getpriority(os.PRIO_PROCESS, pid) == expected
            assert os.sched_getscheduler(pid) == getattr(os, policy)
        gateway.kill()  # SIGKILL: no shutdown of the pool
        deadline = time.monotonic() + 30  # the kernel's signal, not a speed
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if _alive(pid)], "workers outlived the gateway"
    finally:
        gateway.kill()
