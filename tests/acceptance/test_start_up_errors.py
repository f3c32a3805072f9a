"""``ledgerq serve`` and ``ledgerq node`` that cannot start: one line saying why, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The console script installed beside this interpreter (the real CLI).
LEDGERQ = str(Path(sys.executable).parent / "ledgerq")


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERQ_")}
    return subprocess.run(
        [LEDGERQ, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield int(other.getsockname()[1])


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--workers", "1"],
        ["serve", "--workers", "2"],
        ["node"],
    ],
)
def test_a_port_in_use_is_named_without_a_traceback(
    tmp_path: Path, taken_port: int, command: list[str]
) -> None:
    done = _run(tmp_path, *command, "--bind", f"127.0.0.1:{taken_port}")
    assert done.returncode == 1, done.stderr
    assert f"Error: cannot listen on 127.0.0.1:{taken_port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert "never awaited" not in done.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refused_at_the_port_leaves_no_database_behind(
    tmp_path: Path, taken_port: int, workers: str
) -> None:
    # The SQLite file (and its lock file, and with one worker the in-process
    # node's data) were made before the port was tried.
    done = _run(tmp_path, "serve", "--workers", workers, "--bind", f"127.0.0.1:{taken_port}")
    assert done.returncode == 1, done.stderr
    assert "Address already in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_node_refuses_a_port_out_of_range(tmp_path: Path) -> None:
    done = _run(tmp_path, "node", "--bind", "127.0.0.1:70000")
    assert done.returncode == 2
    assert "port 70000 is out of range 0-65535" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            ["node", "--data-dir", "a-file/node"],
            "cannot use a-file/node as the node data directory",
        ),
        (
            ["serve", "--workers", "1", "--node-data-dir", "a-file"],
            "cannot use a-file as the node data directory: a-file is not a directory",
        ),
        (
            ["serve", "--workers", "2", "--db", "sqlite:///a-file/q.sqlite3"],
            "cannot create the lock file of the SQLite database a-file/q.sqlite3",
        ),
    ],
)
def test_a_path_that_cannot_be_written_is_named_without_a_traceback(
    tmp_path: Path, command: list[str], says: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = _run(tmp_path, *command, "--bind", f"127.0.0.1:{port}")
    assert done.returncode == 1, done.stderr
    assert f"Error: {says}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_node_data_directory_in_use_is_named_without_a_traceback(tmp_path: Path) -> None:
    from ledgerq.node.datadir import lock_data_dir

    held = lock_data_dir(tmp_path / "node")
    try:
        done = _run(tmp_path, "node", "--data-dir", "node", "--bind", "127.0.0.1:0")
    finally:
        held.release()
    assert done.returncode == 1, done.stderr
    assert (
        f"Error: the node data directory node is in use by another node (process {os.getpid()})"
        in done.stderr
    )
    assert "Traceback" not in done.stderr


def _node_store(tmp_path: Path) -> Path:
    """A node data directory whose store has one commit; its ``data.mdb``."""
    from ledgerq.node.disk import CommitRecord, LmdbStore

    store = LmdbStore(tmp_path / "node" / "store")
    store.write([CommitRecord(1, "ab" * 64, "COMMITTED", None, (), b"", ())], 1, 1)
    store.close()
    return tmp_path / "node" / "store" / "data.mdb"


def test_a_node_store_cut_short_is_named_without_a_crash(tmp_path: Path) -> None:
    data = _node_store(tmp_path)
    os.truncate(data, data.stat().st_size // 2)  # a read past its end would be a SIGBUS
    done = _run(tmp_path, "node", "--data-dir", "node", "--bind", "127.0.0.1:0")
    assert done.returncode == 1, done.stderr
    assert f"Error: the node store's {Path('node/store/data.mdb')} is cut short" in done.stderr
    assert "move it aside" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_damaged_node_store_is_named_without_a_traceback(tmp_path: Path) -> None:
    data = _node_store(tmp_path)
    with data.open("r+b") as f:  # the key filter's pages, which opening reads
        f.seek(100 * 4096)
        f.write(b"\xa5" * (200 * 4096))
    done = _run(tmp_path, "node", "--data-dir", "node", "--bind", "127.0.0.1:0")
    assert done.returncode == 1, done.stderr
    assert "Error: the node store in node/store is damaged" in done.stderr
    assert "move it aside" in done.stderr
    assert "Traceback" not in done.stderr
