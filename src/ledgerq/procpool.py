"""A pool of worker processes for CPU-heavy work off an event loop.

Decoding and verifying a large BatchList costs seconds of CPU (tens of
thousands of secp256k1 signatures). On the event loop that stalls every
request; on threads it still competes with the loop for the GIL (protobuf
parsing holds it). So the gateway (:mod:`ledgerq.ingest.decoding`) and the
node (:mod:`ledgerq.node.decoding`) hand such work to a :class:`WorkerPool`:

* ``workers`` processes, started on first use with ``spawn`` (nothing of
  the parent's state is copied, and the parent's main module is not run
  again: :func:`main_left_alone`), stopped with :meth:`WorkerPool.close`;
* on Linux every worker dies with its parent (``PR_SET_PDEATHSIG``): a
  process killed with SIGKILL leaves no worker behind;
* at a scheduling :class:`Priority`: ``normal``, a ``nice`` value, or
  ``idle`` (``SCHED_IDLE``: the worker runs only on CPU nothing else of
  ordinary priority wants, and any such task that wakes preempts it at once),
  lowered from the parent the moment a worker is started, so that its
  start-up (``spawn`` imports the parent's main module) runs at it too.

A worker answers the function's result; an exception it raises crosses back
as itself (it must pickle: :class:`~ledgerq.errors.InvalidBatchError` does),
raised in the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import importlib.machinery
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: Highest ``nice`` value Linux knows.
MAX_NICE = 19

#: The capacity asked of the pipes between a pool and its workers (Linux; the
#: kernel's default is 64 KiB, an unprivileged process may ask up to
#: ``/proc/sys/fs/pipe-max-size``, 1 MiB by default).
PIPE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Priority:
    """A worker's scheduling priority: ``nice`` (0–19, higher yields more)
    and, if ``idle``, the ``SCHED_IDLE`` policy besides."""

    nice: int = 0
    idle: bool = False

    @classmethod
    def parse(cls, text: str | int) -> Priority:
        """``normal``, ``idle`` or a nice value 0–19 (raises ``ValueError``)."""
        value = str(text).strip().lower()
        if value == "normal":
            return cls()
        if value == "idle":
            return cls(nice=MAX_NICE, idle=True)
        try:
            nice = int(value)
        except ValueError:
            raise ValueError(f"{text!r}: use idle, normal or a nice value 0-{MAX_NICE}") from None
        if not 0 <= nice <= MAX_NICE:
            raise ValueError(f"{text!r}: a nice value is 0-{MAX_NICE}")
        return cls(nice=nice)

    def __str__(self) -> str:
        if self.idle:
            return "idle"
        return "normal" if self.nice == 0 else str(self.nice)


NORMAL = Priority()


class WorkerPool:
    """Up to ``workers`` processes at ``priority``, started on first :meth:`run`.

    ``setup``: called in each worker as it starts, with ``setup_args`` (both
    must pickle; shared ``multiprocessing`` values of the ``spawn`` context
    may be among the arguments: they are handed over as the worker starts)."""

    def __init__(
        self,
        workers: int,
        *,
        priority: Priority = NORMAL,
        setup: Callable[..., None] | None = None,
        setup_args: tuple[Any, ...] = (),
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self.priority = priority
        self._setup = setup
        self._setup_args = setup_args
        self._pool: ProcessPoolExecutor | None = None
        #: Workers whose priority was lowered from here.
        self._known: set[int] = set()

    @property
    def started(self) -> bool:
        return self._pool is not None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker (``fn`` and its arguments must pickle)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(), self.priority, self._setup, self._setup_args),
            )
            widen_pipes(self._pool)
        known = self._known
        with main_left_alone():
            future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        # A worker is started by the submission, with ``spawn``: before its
        # initializer runs it imports the parent's main module (the whole
        # command line tool: most of a second of CPU). Lowered from here at
        # once, that start-up runs at the worker's priority too.
        if self.priority != NORMAL and len(known) < self.workers:
            for pid in self.pids():
                if pid not in known:
                    known.add(pid)
                    set_priority(self.priority, pid)
        return await future

    def pids(self) -> list[int]:
        """The workers' process ids (for tests and diagnostics)."""
        pool = self._pool
        processes = getattr(pool, "_processes", None) or {}
        return sorted(processes)

    def close(self) -> None:
        """Stop the workers (waits for the work under way; queued work is cancelled)."""
        pool, self._pool = self._pool, None
        self._known = set()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def widen_pipes(pool: ProcessPoolExecutor, size: int = PIPE_BYTES) -> list[int]:
    """Ask a larger capacity of the pool's two pipes (Linux; best effort).

    Each result crosses back through one pipe, read by the pool's manager
    thread in this process, and each call's arguments through another,
    written by the queue's feeder thread. At the kernel's default of 64 KiB a
    result of a megabyte (a decoded POST of 500 transactions) takes some
    sixteen reads, and each read gives the interpreter lock back: while the
    event loop is busy, the thread waits up to the switch interval (5 ms) to
    take it again before it reads on, and meanwhile the worker sits blocked
    in its write instead of decoding the next body. With the pipe as large
    as a whole result the worker writes it at once and goes on. Answers the
    capacities obtained (the kernel's own, where it refused)."""
    sizes: list[int] = []
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    getsize = getattr(fcntl, "F_GETPIPE_SZ", None)
    call_queue = getattr(pool, "_call_queue", None)
    result_queue = getattr(pool, "_result_queue", None)
    for queue in (call_queue, result_queue):
        reader = getattr(queue, "_reader", None)
        if reader is None or setsize is None or getsize is None:
            continue
        fd = reader.fileno()
        for ask in (size, _pipe_max_size()):
            try:
                fcntl.fcntl(fd, setsize, ask)
                break
            except OSError:  # above what this process may ask
                continue
        with contextlib.suppress(OSError):
            sizes.append(fcntl.fcntl(fd, getsize))
    return sizes


def _pipe_max_size() -> int:
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1024 * 1024


@contextlib.contextmanager
def main_left_alone() -> Iterator[None]:
    """Workers started meanwhile do not run the parent's main module again.

    ``spawn`` imports the parent's ``__main__`` in every worker before its
    initializer runs, unless it is a package's ``__main__``; for the
    ``ledgerq`` command line script that is the whole tool, several times
    what a decoding worker needs. The functions a
    pool runs are found by their module's name, never in ``__main__``, so
    while a submission starts workers the main module is marked as one
    ``spawn`` leaves alone. (A worker is started synchronously by the
    submission, on this thread.)"""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = None


_PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> None:
    """SIGKILL the calling process when its parent dies (Linux), starting now.

    Exits at once if the parent is already gone (it died before the call
    could watch it). Used by the pool's workers and by ``serve --workers``'s
    gateway processes.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _start_worker(
    parent_pid: int,
    priority: Priority,
    setup: Callable[..., None] | None = None,
    setup_args: tuple[Any, ...] = (),
) -> None:
    """In a worker, first: die with the parent, then lower the priority, then ``setup``."""
    die_with(parent_pid)
    set_priority(priority)
    if setup is not None:
        setup(*setup_args)


def set_priority(priority: Priority, pid: int = 0) -> None:
    """Lower the priority of process ``pid`` (0: the calling process; best
    effort: a refusal leaves it as is)."""
    with contextlib.suppress(OSError):
        # Never higher than the parent's: a nice value only goes up.
        if priority.nice > os.getpriority(os.PRIO_PROCESS, pid):
            os.setpriority(os.PRIO_PROCESS, pid, priority.nice)
    if priority.idle and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
