"""A pool of worker processes for CPU-heavy work off an event loop.

Decoding and verifying a large BatchList costs seconds of CPU (tens of
thousands of secp256k1 signatures). On the event loop that stalls every
request; on threads it still competes with the loop for the GIL (protobuf
parsing holds it). So the gateway (:mod:`ledgerq.ingest.decoding`) and the
node (:mod:`ledgerq.node.decoding`) hand such work to a :class:`WorkerPool`:

* ``workers`` processes, started on first use with ``spawn`` (nothing of
  the parent's state is copied), stopped with :meth:`WorkerPool.close`;
* on Linux every worker dies with its parent (``PR_SET_PDEATHSIG``): a
  process killed with SIGKILL leaves no worker behind;
* at a scheduling :class:`Priority`: ``normal``, a ``nice`` value, or
  ``idle`` (``SCHED_IDLE``: the worker runs only on CPU nothing else of
  ordinary priority wants, and any such task that wakes preempts it at once).

A worker answers the function's result; an exception it raises crosses back
as itself (it must pickle: :class:`~ledgerq.errors.InvalidBatchError` does),
raised in the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: Highest ``nice`` value Linux knows.
MAX_NICE = 19


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
    """Up to ``workers`` processes at ``priority``, started on first :meth:`run`."""

    def __init__(self, workers: int, *, priority: Priority = NORMAL) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self.priority = priority
        self._pool: ProcessPoolExecutor | None = None

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
                initargs=(os.getpid(), self.priority),
            )
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def pids(self) -> list[int]:
        """The workers' process ids (for tests and diagnostics)."""
        pool = self._pool
        processes = getattr(pool, "_processes", None) or {}
        return sorted(processes)

    def close(self) -> None:
        """Stop the workers (waits for the work under way; queued work is cancelled)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


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


def _start_worker(parent_pid: int, priority: Priority) -> None:
    """In a worker, first: die with the parent, then lower the priority."""
    die_with(parent_pid)
    set_priority(priority)


def set_priority(priority: Priority) -> None:
    """Lower the calling process's priority (best effort: a refusal leaves it as is)."""
    with contextlib.suppress(OSError):
        # Never higher than the parent's: a nice value only goes up.
        if priority.nice > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, priority.nice)
    if priority.idle and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
