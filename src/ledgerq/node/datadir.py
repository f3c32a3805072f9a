"""A node's data directory, held by one process at a time.

:func:`lock_data_dir` takes an exclusive ``flock`` on ``<dir>/LOCK`` (and
writes the holder's pid into it, for the error message of the next one). A
second node on the same directory — another ``ledgerq node``, a gateway's
in-process node, or a second ``Node.open`` in one process — is refused with
a :class:`~ledgerq.errors.NodeDataError` saying who holds it. The lock goes
with the process: a ``kill -9`` releases it, and a copy of the directory is
not locked.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ledgerq.errors import NodeDataError

LOCK_FILE = "LOCK"


class DataDirLock:
    """The held lock; :meth:`release` (idempotent) lets the next node in."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def lock_data_dir(directory: Path) -> DataDirLock:
    """Lock ``directory`` (created if missing) for this node, or refuse clearly."""
    path = directory / LOCK_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        # mkdir over a file says "File exists": name what is really wrong.
        taken = isinstance(exc, FileExistsError | NotADirectoryError)
        raise NodeDataError(
            f"cannot use {directory} as the node data directory: "
            f"{exc.filename} {'is not a directory' if taken else exc.strerror}; "
            "give a directory this process may create and write"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise NodeDataError(
            f"the node data directory {directory} is in use by another node (process "
            f"{holder}); stop it first, or give this node its own directory"
        ) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DataDirLock(directory, fd)
