"""Writing benchmark figures down, and showing progress while measuring.

Each benchmark owns one section of ``docs/BENCHMARKS.md``, delimited by
``<!-- bench:NAME -->`` markers; a new run replaces its own section and leaves
the others alone. Every section records the command, the machine and the date.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shlex
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "docs" / "BENCHMARKS.md"
console = Console(stderr=True)

_HEADER = """# Benchmarks

Figures measured by `ledgerq bench ...` (see `bench/`). Each section is
rewritten by its own benchmark and says which command produced it, on which
machine and when. Figures are never asserted by tests.
"""


def machine() -> str:
    """A one-line description of the machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB RAM"
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def invocation() -> str:
    """The command line that is running, as a user would type it."""
    argv = list(sys.argv)
    if argv and argv[0].endswith("ledgerq"):
        argv[0] = "ledgerq"
    return shlex.join(argv)


def write_section(
    name: str,
    markdown: str,
    *,
    command: str | None = None,
    path: Path | None = None,
    heading: str | None = None,
) -> Path:
    """Replace (or append) the section ``name`` of docs/BENCHMARKS.md (or ``path``).

    An appended section is preceded by ``heading`` (default ``## `ledgerq bench
    NAME```) unless ``markdown`` has a ``##`` heading of its own; a replaced one
    keeps whatever heading stands before its markers.
    """
    target = path or BENCHMARKS_MD
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    body = (
        f"<!-- bench:{name} -->\n"
        f"_Command:_ `{command or invocation()}`  \n"
        f"_Machine:_ {machine()}  \n"
        f"_Date:_ {today}; load average (1, 5, 15 min) when written: {load}\n\n"
        f"{markdown.strip()}\n"
        f"<!-- /bench:{name} -->"
    )
    text = target.read_text() if target.exists() else _HEADER
    pattern = re.compile(
        rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: body, text)
    else:
        # A new section gets a heading the headline table can link to, unless
        # its own text brings one.
        title = (
            ""
            if re.search(r"^## ", markdown, re.M)
            else f"## {heading or f'`ledgerq bench {name}`'}\n\n"
        )
        text = text.rstrip() + "\n\n" + title + body + "\n"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text if text.endswith("\n") else text + "\n")
    console.print(f"[green]figures written to {target} ({name})")
    return target


def progress() -> Progress:
    """A progress bar for long loops: ``with progress() as p: task = p.add_task(...)``."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar."""
    with progress() as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            yield item
            bar.advance(task)


def table(headers: list[str], rows: Iterable[Iterable[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[rank]
