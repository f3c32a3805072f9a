"""One gateway per SQLite file.

SQLite serves a single gateway instance: claims and fencing need PostgreSQL.
:class:`SingleInstanceLock` takes an exclusive, non-blocking ``flock`` on
``<database file>.lock`` for as long as the gateway runs. The operating system
drops the lock when the process ends, however it ends (``SIGKILL`` included),
so a crash never leaves a stale lock behind; the pid written into the file is
only there to make the error message useful.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from ledgerq.errors import LedgerqError


class InstanceLockedError(LedgerqError):
    """Another gateway already serves this SQLite database."""


class SingleInstanceLock:
    """Exclusive use of a SQLite database file by this process."""

    def __init__(self, database: str | os.PathLike[str]) -> None:
        self.database = Path(database)
        self.path = self.database.with_name(self.database.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`InstanceLockedError` saying who holds it."""
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LedgerqError(
                f"cannot create the lock file of the SQLite database {self.database}: "
                f"{exc.strerror} ({exc.filename}); check the path and its permissions"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise InstanceLockedError(
                f"another ledgerq gateway (pid {holder}) is already serving the SQLite "
                f"database {self.database}; stop it first, or use PostgreSQL "
                "(--db postgresql://...) to run several gateway instances"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # Unlock before close; the file stays (removing it would race a
            # second process that opened it but has not locked it yet).
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> SingleInstanceLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
