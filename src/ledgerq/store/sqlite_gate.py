"""The write gate of a SQLite file: processes writing to one file queue in the kernel.

SQLite lets one writer at a time hold a file's write lock; another that asks
(``BEGIN IMMEDIATE``) gets ``SQLITE_BUSY`` and its busy handler *sleeps* and
retries, in steps up to 100 ms, and does so on the event loop's thread (the
store runs short writes inline: ``ledgerq.store.sqlite``). One process never
meets that (its writes are serialized by the writing connection's lock), but
``ledgerq serve --workers N`` on SQLite has N processes inserting into one
file: they took turns by sleeping, and two workers ingested *less* than one.

So every store on a file first takes an exclusive ``flock`` on
``<database>-writers.lock`` around each write transaction: uncontended it is
one system call; contended, the waiting store blocks in a thread (its event
loop keeps serving) and is woken by the kernel the moment the holder lets
go, then finds SQLite's write lock free. Writers that do not take the gate (a
``sqlite3`` shell) are still handled by ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator


class WriteGate:
    """An exclusive ``flock`` on ``<path>-writers.lock``, taken without blocking the loop."""

    def __init__(self, database_path: str) -> None:
        self.path = f"{database_path}-writers.lock"
        self._fd: int | None = None

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        fd = self._fd
        if fd is None:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting = asyncio.get_running_loop().run_in_executor(
                None, fcntl.flock, fd, fcntl.LOCK_EX
            )
            try:
                await asyncio.shield(waiting)
            except asyncio.CancelledError:
                # The thread still gets the lock: give it back once it has.
                waiting.add_done_callback(lambda _: fcntl.flock(fd, fcntl.LOCK_UN))
                raise
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
