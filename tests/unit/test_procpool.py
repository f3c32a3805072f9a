"""Worker processes of the gateway's and the node's decoders: they run at the
configured priority and die with their parent, even one killed with SIGKILL."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ledgerq.config import load_settings
from ledgerq.errors import ConfigError
from ledgerq.procpool import PIPE_BYTES, Priority, WorkerPool, _pipe_max_size, set_priority

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

# A parent process: decodes one large BatchList with the decoder named on its
# command line, prints its workers' pids, then waits to be killed.
PARENT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from ledgerq.codec import Signer, encode_batch_list
    from ledgerq.codec.intkey import make_intkey_batch
    from ledgerq.procpool import Priority

    kind, priority = sys.argv[1], sys.argv[2]
    signer = Signer.generate()
    body = encode_batch_list(
        [make_intkey_batch(signer, [("set", f"k{i}", i)]) for i in range(200)]
    )

    async def main():
        if kind == "gateway":
            from ledgerq.ingest.decoding import BatchListDecoder
            decoder = BatchListDecoder(
                max_bytes=10**8, slots=2, pool_bytes=1, priority=Priority.parse(priority)
            )
            batches = await decoder.decode(body, "svc")
        else:
            from ledgerq.node.decoding import BatchDecoder
            decoder = BatchDecoder(pool_bytes=1, workers=2)
            batches = await decoder.decode(body)
        assert len(batches) == 200
        print(json.dumps(decoder.pool.pids()), flush=True)
        time.sleep(600)

    asyncio.run(main())
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has died; only its parent's wait is missing


def _start_parent(kind: str, priority: str) -> tuple[subprocess.Popen[str], list[int]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, kind, priority],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line, f"the parent exited ({parent.wait()}) before naming its workers"
    return parent, json.loads(line)


@pytest.mark.parametrize(
    ("kind", "priority", "nice", "policy"),
    [
        ("gateway", "idle", 19, "SCHED_IDLE"),
        ("gateway", "7", 7, "SCHED_OTHER"),
        ("gateway", "normal", 0, "SCHED_OTHER"),
        ("node", "normal", 0, "SCHED_OTHER"),
    ],
)
def test_workers_run_at_the_priority_and_die_with_a_killed_parent(
    kind: str, priority: str, nice: int, policy: str
) -> None:
    parent, workers = _start_parent(kind, priority)
    # A worker is never made more urgent than its parent, which inherits this
    # process's nice value (a suite run under `nice` starts above 0).
    expected = max(nice, os.getpriority(os.PRIO_PROCESS, 0))
    try:
        assert workers, "no worker was started"
        for pid in workers:
            assert os.getpriority(os.PRIO_PROCESS, pid) == expected
            assert os.sched_getscheduler(pid) == getattr(os, policy)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 30  # generous: the kernel's signal, not a speed
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if _alive(pid)], "workers outlived their parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        assert parent.stdout is not None
        parent.stdout.close()


async def test_a_refusal_crosses_back_whole() -> None:
    from ledgerq.errors import InvalidBatchError

    pool = WorkerPool(1, priority=Priority.parse("idle"))
    try:
        with pytest.raises(InvalidBatchError) as refused:
            await pool.run(_refuse, "bad header")
        assert str(refused.value) == "bad header"
        assert refused.value.rule == "rule_x"
        assert refused.value.batch_id == "b1"
        assert await pool.run(abs, -3) == 3
    finally:
        pool.close()


def _refuse(message: str) -> None:
    from ledgerq.errors import InvalidBatchError

    raise InvalidBatchError(message, rule="rule_x", batch_id="b1")


def test_priority_parsing() -> None:
    assert Priority.parse("idle") == Priority(nice=19, idle=True)
    assert Priority.parse(" NORMAL ") == Priority()
    assert Priority.parse(12) == Priority(nice=12)
    assert [str(Priority.parse(p)) for p in ("idle", "normal", "0", "12")] == [
        "idle",
        "normal",
        "normal",
        "12",
    ]
    for bad in ("low", "-1", "20", ""):
        with pytest.raises(ValueError, match="nice value"):
            Priority.parse(bad)


def test_decode_priority_setting(tmp_path: Path) -> None:
    assert load_settings(environ={}, cwd=tmp_path).decode_priority == "idle"
    env = {"LEDGERQ_DECODE_PRIORITY": "10"}
    assert load_settings(environ=env, cwd=tmp_path).decode_priority == "10"
    where = r"invalid decode_priority \(from LEDGERQ_DECODE_PRIORITY\)"
    with pytest.raises(ConfigError, match=where):
        load_settings(environ={"LEDGERQ_DECODE_PRIORITY": "fast"}, cwd=tmp_path)


def test_the_priority_of_another_process_is_lowered_from_outside() -> None:
    # What the pool does to a worker as it starts, before the worker's own
    # start-up (the parent's main module imported: most of a second) runs.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        set_priority(Priority.parse("idle"), child.pid)
        assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 19
    finally:
        child.kill()
        child.wait(30)


async def test_the_pool_lowers_each_worker_it_starts() -> None:
    pool = WorkerPool(2, priority=Priority.parse("12"))
    try:
        await asyncio.gather(pool.run(time.sleep, 0.2), pool.run(time.sleep, 0.2))
        assert pool.pids() and set(pool.pids()) <= pool._known
        for pid in pool.pids():
            assert os.getpriority(os.PRIO_PROCESS, pid) == max(
                12, os.getpriority(os.PRIO_PROCESS, 0)
            )
    finally:
        pool.close()


def test_a_worker_does_not_run_the_parents_main_script_again(tmp_path: Path) -> None:
    # The ``ledgerq`` script imports the whole tool; spawn would run it again
    # in every worker before the worker's own start-up.
    marker = tmp_path / "imported-again"
    script = tmp_path / "main_script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio
            if __name__ != "__main__":
                open({str(marker)!r}, "a").write(__name__)
            from ledgerq.procpool import WorkerPool

            async def main():
                pool = WorkerPool(1)
                try:
                    print(await pool.run(abs, -2))
                finally:
                    pool.close()

            if __name__ == "__main__":
                asyncio.run(main())
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "2"
    assert not marker.exists(), marker.read_text()


async def test_the_pools_pipes_are_widened_and_carry_results_larger_than_them() -> None:
    """Both pipes of a started pool hold a megabyte (or what the kernel allows
    this process), so a worker writes a decoded POST at once; results larger
    than the pipe still cross whole."""
    allowed = min(PIPE_BYTES, _pipe_max_size())
    pool = WorkerPool(1)
    try:
        big = bytes(range(256)) * (3 * 2**20 // 256)  # 3 MiB: larger than the pipe
        assert await pool.run(bytes, big) == big
        executor = pool._pool
        assert executor is not None
        for queue in (executor._call_queue, executor._result_queue):  # type: ignore[attr-defined]
            assert fcntl.fcntl(queue._reader.fileno(), fcntl.F_GETPIPE_SZ) >= allowed
    finally:
        pool.close()
