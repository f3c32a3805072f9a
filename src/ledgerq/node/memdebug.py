"""A debugging aid: where the node's heap grows, by allocation site, on demand.

With ``LEDGERQ_NODE_TRACEMALLOC=FILE`` set, ``ledgerq node`` traces its
allocations (:mod:`tracemalloc`, ``LEDGERQ_NODE_TRACEMALLOC_FRAMES`` frames
per traceback, 8 by default) and, at each ``SIGUSR2``, appends to ``FILE``
the allocations alive then, grouped by traceback, compared with the first
``SIGUSR2`` and with the previous one (largest growth first); also the
process's anonymous memory, malloc's arenas (``mallinfo2``), pymalloc's
summary (only when not tracing: tracemalloc hides it) and the objects the
collector tracks, counted by type. With ``..._FRAMES=0`` nothing is traced
(the node runs at full speed) and only those counts are written. Tracing
slows the node down several times; never set it in production.

``ledgerq bench node_history --tracemalloc FILE`` sends the signal at every
tenth of its run.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

ENV = "LEDGERQ_NODE_TRACEMALLOC"
ENV_FRAMES = "LEDGERQ_NODE_TRACEMALLOC_FRAMES"
_TOP = 25


class HeapTracer:
    """Snapshots on demand, each written as a difference to the first and the last."""

    def __init__(self, path: Path, frames: int = 8) -> None:
        self.path = path
        self._first: tracemalloc.Snapshot | None = None
        self._last: tracemalloc.Snapshot | None = None
        self._count = 0
        self._types: Counter[str] | None = None
        if frames > 0 and not tracemalloc.is_tracing():
            tracemalloc.start(frames)

    def dump(self, note: str = "") -> None:
        gc.collect()
        self._count += 1
        lines = [
            f"=== snapshot {self._count} at {time.strftime('%H:%M:%S')} {note}".rstrip(),
            *_process_memory(),
        ]
        types = Counter(type(o).__name__ for o in gc.get_objects())
        first = self._types
        if first is not None:
            grown = sorted(types.items(), key=lambda kv: kv[1] - first[kv[0]], reverse=True)
            lines.append("--- objects the collector tracks, growth since the first snapshot")
            lines.extend(f"{n - first[t]:+d} {t} (now {n})" for t, n in grown[:_TOP])
        else:
            self._types = types
        if tracemalloc.is_tracing():
            lines += self._traced()
        with self.path.open("a") as out:
            out.write("\n".join(lines) + "\n\n")

    def _traced(self) -> list[str]:
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
                tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
            )
        )
        traced, peak = tracemalloc.get_traced_memory()
        lines = [
            f"traced {traced / 2**20:.1f} MiB (peak {peak / 2**20:.1f} MiB), "
            f"{len(snapshot.traces)} blocks",
        ]
        for title, base in (("since the first", self._first), ("since the last", self._last)):
            if base is None:
                continue
            lines.append(f"--- growth {title} snapshot, by traceback")
            stats = snapshot.compare_to(base, "traceback")
            stats.sort(key=lambda s: s.size_diff, reverse=True)
            for stat in stats[:_TOP]:
                lines.append(
                    f"{stat.size_diff / 2**20:+.2f} MiB, {stat.count_diff:+d} blocks "
                    f"(now {stat.size / 2**20:.2f} MiB in {stat.count})"
                )
                lines.extend(f"    {frame}" for frame in stat.traceback.format()[-16:])
        lines.append("--- largest now, by line")
        for line_stat in snapshot.statistics("lineno")[:_TOP]:
            lines.append(
                f"{line_stat.size / 2**20:.2f} MiB in {line_stat.count}: {line_stat.traceback[0]}"
            )
        if self._first is None:
            self._first = snapshot
        self._last = snapshot
        return lines


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _process_memory() -> list[str]:
    """RssAnon, malloc's arenas (all threads') and pymalloc's summary, as lines."""
    lines = []
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS", "RssAnon", "RssFile")):
            lines.append(" ".join(line.split()))
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        lines.append(
            f"malloc: arenas {info.arena / 2**20:.1f} MiB, in use {info.uordblks / 2**20:.1f}"
            f" MiB, free in arenas {info.fordblks / 2**20:.1f} MiB, mmapped "
            f"{info.hblkhd / 2**20:.1f} MiB in {info.hblks}"
        )
        lines.extend(_arenas(libc))
    except (OSError, AttributeError):
        lines.append("malloc: mallinfo2 not available")
    # pymalloc's statistics go to the C stderr: borrow fd 2 for a moment.
    with tempfile.TemporaryFile("w+") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        for line in out.read().splitlines():
            if line.startswith(("# arenas allocated current", "# bytes in", "Total")) or (
                "unused pools" in line
            ):
                lines.append("pymalloc " + " ".join(line.split()))
    return lines


def _arenas(libc: ctypes.CDLL) -> list[str]:
    """Each malloc arena's size and free space (``malloc_info``'s XML, summarised)."""
    import re

    with tempfile.NamedTemporaryFile("r", suffix=".xml") as out:
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
        libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.fclose.argtypes = (ctypes.c_void_p,)
        stream = libc.fopen(out.name.encode(), b"w")
        if not stream:
            return []
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        xml = out.read()
    lines = []
    for nr, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', xml, re.S):
        current = re.search(r'<system type="current" size="(\d+)"', body)
        free = re.search(
            r'<total type="fast" count="\d+" size="(\d+)"/>\s*'
            r'<total type="rest" count="\d+" size="(\d+)"',
            body,
        )
        size = int(current.group(1)) if current else 0
        freed = sum(int(x) for x in free.groups()) if free else 0
        lines.append(
            f"malloc arena {nr}: {size / 2**20:.1f} MiB, free in it {freed / 2**20:.1f} MiB"
        )
    return lines


def from_environment() -> HeapTracer | None:
    """The tracer the environment asks for (None: not asked)."""
    path = os.environ.get(ENV)
    if not path:
        return None
    return HeapTracer(Path(path), int(os.environ.get(ENV_FRAMES, "8")))
