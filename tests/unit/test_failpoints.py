"""Failpoints: parsing, counting hits, and what each action does.

``kill`` and ``stop`` act on a real child process here; the chaos tests use
them on ``ledgerq serve`` (``tests/acceptance/test_ha_chaos.py``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ledgerq import failpoints
from ledgerq.errors import ConfigError, StoreUnavailableError


@pytest.fixture(autouse=True)
def disarm() -> Iterator[None]:
    yield
    failpoints.configure({})


def test_entries_parse_with_a_default_count_of_one() -> None:
    assert failpoints.parse("before_post=kill@3, claim_cycle=stop,submitting=drop@1") == {
        "before_post": ("kill", 3),
        "claim_cycle": ("stop", 1),
        "submitting": ("drop", 1),
    }
    assert failpoints.parse("") == {}


@pytest.mark.parametrize(
    "spec",
    [
        "before_pots=kill",
        "before_post=explode",
        "before_post",
        "before_post=kill@0",
        "before_post=kill@x",
    ],
)
def test_typos_are_refused_naming_the_variable(spec: str) -> None:
    with pytest.raises(ConfigError, match="LEDGERQ_FAILPOINTS"):
        failpoints.parse(spec)


def test_unset_means_nothing_fires() -> None:
    failpoints.configure({})
    for point in failpoints.POINTS:
        failpoints.failpoint(point)


def test_drop_fires_once_at_the_counted_hit() -> None:
    failpoints.configure({"LEDGERQ_FAILPOINTS": "after_response=drop@3"})
    failpoints.failpoint("after_response")
    failpoints.failpoint("before_post")  # other points do not count
    failpoints.failpoint("after_response")
    with pytest.raises(StoreUnavailableError, match="after_response"):
        failpoints.failpoint("after_response")
    failpoints.failpoint("after_response")  # once only


_CHILD = """
import sys
from ledgerq import failpoints
failpoints.configure({"LEDGERQ_FAILPOINTS": sys.argv[1]})
failpoints.failpoint("before_post")
print("passed", flush=True)
failpoints.failpoint("before_post")
print("after", flush=True)
"""


def test_kill_ends_the_process_at_the_point() -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, "before_post=kill@2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL
    assert child.stdout == "passed\n"


def test_stop_freezes_the_process_until_sigcont() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, "before_post=stop@2"],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "passed\n"
            deadline = time.monotonic() + 30
            while True:
                with open(f"/proc/{child.pid}/stat") as f:
                    state = f.read().rpartition(")")[2].split()[0]
                if state == "T":
                    break
                assert time.monotonic() < deadline, state
                time.sleep(0.01)  # waiting for the child to reach the point
            child.send_signal(signal.SIGCONT)
            assert child.stdout.readline() == "after\n"
            assert child.wait(30) == 0
        finally:
            child.kill()
