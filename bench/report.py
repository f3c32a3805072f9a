"""Writing benchmark figures down, and showing progress while measuring.

Each benchmark owns fixed sections of ``docs/BENCHMARKS.md`` (``SECTIONS``),
delimited by ``<!-- bench:NAME -->`` markers; a new run replaces its own
section and leaves the others alone. Every section records the command, the
machine and the date, and the benchmark's figures for the page's targets
(``TARGETS``), from which the table at the top of the page is written.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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

# Every section a benchmark may write, by name, with its heading. A name not
# listed here is refused, so the page holds no section its commands do not
# write, and a rerun replaces its section instead of adding one.
SECTIONS: dict[str, str] = {
    "compare-plain": "Comparison on the plain REST ledger",
    "compare-node": "Comparison on `ledgerq node`",
    "compare-failure": "Comparison: a worker killed",
    "e2e": "Gateway end to end",
    "pipelined": "Pipelined against serial",
    "parallel": "Parallel queuer (SQLite)",
    "parallel-postgresql": "Parallel queuer (PostgreSQL)",
    "deps": "Dependencies out of order",
    "pgshape": "PostgreSQL's work per committed batch",
    "group-write": "Group writes (PostgreSQL)",
    "queuer": "Queuer round",
    "restricted": "Rounds of one instance's services",
    "claims": "Claims at scale",
    "failover": "Failover",
    "failover-scale": "Failover at 10,000 services",
    "failover-primary-lost": "Failover: PostgreSQL's primary lost",
    "soak": "Soak",
    "load": "Load",
    "ingest": "Ingest with workers",
    "hostile": "Hostile clients",
    "node": "Node throughput",
    "node-history": "Node history",
    "node-history-txns": "Node history, ten transactions per batch",
    "store": "Store writes",
    "operator": "Operator endpoints",
    "codec": "Codec",
}

# The targets of the table at the top of the page, in its order: each names
# the section whose benchmark measures it (DESIGN §6 and the issues that set
# targets). A benchmark states its figure for a target with ``Target``.
TARGETS: dict[str, tuple[str, str]] = {
    "plain-sqlite": (
        "plain REST ledger, SQLite: ≥ 0.7 × the ideal client at 50 × 20, ≥ 0.5 × at 1,000 × 5",
        "compare-plain",
    ),
    "plain-pg": (
        "plain REST ledger, PostgreSQL: ≥ 0.7 × the ideal client at 50 × 20, ≥ 0.5 × at 1,000 × 5",
        "compare-plain",
    ),
    "gap": ("commit → next batch p50 ≤ 5 ms (plain ledger, 50 × 20)", "compare-plain"),
    "gateway-cpu": ("gateway CPU ≤ 0.5 ms per committed batch", "compare-plain"),
    "pg-cpu": ("PostgreSQL server CPU ≤ 0.3 ms per committed batch", "pgshape"),
    "e2e": ("in-process node, 1,000 services: ≥ 2,000 batches/s", "e2e"),
    "pipelined": (
        "pipelined ≥ 10 × serial (10 services), ≥ 20 × (one service), 100 ms commits",
        "pipelined",
    ),
    "parallel-sqlite": ("parallel ≥ 5 × serial, 8 independent keys, SQLite", "parallel"),
    "parallel-pg": (
        "parallel ≥ 5 × serial, 8 independent keys, PostgreSQL",
        "parallel-postgresql",
    ),
    "deps": ("`intkey load` through the gateway ≤ 2 × straight to the node", "deps"),
    "queuer": (
        "queuer round, 1,000,000 batches in 10,000 services < 100 ms (PostgreSQL)",
        "queuer",
    ),
    "failover": ("a killed instance's services resume within claim TTL + 1 s", "failover"),
    "pg-failover": (
        "PostgreSQL primary lost, standby promoted: accepting again ≤ 3 s after the promotion; "
        "every request during the outage answered within the bound",
        "failover-primary-lost",
    ),
    "node-rest": ("node ≥ 10,000 intkey tx/s over REST, low contention", "node-history-txns"),
    "node-inprocess": (
        "node in-process ≥ 10,000 intkey tx/s, low contention and all on one key",
        "node",
    ),
    "node-memory": (
        "node memory flat with history: RSS, 100,000 → 1,000,000 batches",
        "node-history",
    ),
    "attacks": (
        "gzip bombs, 2,048 idle sockets: probe p99 ≤ 50 ms, a tenant's POST p99 ≤ 2 × unloaded",
        "hostile",
    ),
    "soak": ("soak with kills and ledger outages: every invariant holds", "soak"),
}


@dataclass(frozen=True)
class Target:
    """A benchmark's figure for one of ``TARGETS``: short, and whether it is met."""

    key: str
    figure: str
    met: str  # "yes", "no", or a few words ("2 of 3 runs")


_HEADER = (
    "# Benchmarks\n\nFigures measured by `ledgerq bench ...` (`bench/`); each section is "
    "rewritten by its own command and says what ran, on which machine and when. The table "
    "at the top is written from the sections. The machines are shared: compare figures "
    "measured side by side in one run. Tests never assert figures.\n"
)

_SUMMARY_HEADING = "## At a glance"
_TARGET_LINE = re.compile(
    r"^<!-- target:(?P<key>[\w-]+) \| (?P<figure>.*?) \| (?P<met>.*?) -->$", re.M
)
_SECTION = re.compile(
    r"<!-- bench:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /bench:(?P=name) -->", re.S
)


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
        f"Python {platform.python_version()}, a secp256k1 verify {verify_us():.0f} µs"
    )


@functools.cache
def verify_us() -> float:
    """This machine's time for one secp256k1 signature check (ledgerq's own
    verify), the median of five rounds of 200: machines differ by up to ten
    times per operation, so each figure says what its machine was."""
    from ledgerq.codec.signing import Signer, verify_signature

    signer = Signer.generate()
    message = b"ledgerq bench"
    signature = signer.sign(message)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            verify_signature(signer.public_key, message, signature)
        rounds.append((time.perf_counter() - start) / 200 * 1e6)
    return statistics.median(rounds)


def invocation() -> str:
    """The command line that is running, as a user would type it."""
    argv = list(sys.argv)
    if argv and argv[0].endswith("ledgerq"):
        argv[0] = "ledgerq"
    return shlex.join(argv)


def _clean(cell: str) -> str:
    # A target's cells live in one HTML comment line and one table cell.
    return " ".join(cell.replace("|", "/").replace("-->", "→").split())


def write_section(
    name: str,
    markdown: str,
    *,
    targets: Iterable[Target] = (),
    command: str | None = None,
    path: Path | None = None,
) -> Path:
    """Replace (or add) the section ``name`` of docs/BENCHMARKS.md (or ``path``).

    ``name`` must be one of ``SECTIONS``, whose heading the section gets;
    ``targets`` are this run's figures for ``TARGETS`` measured by this
    section. The table at the top of the page is then written again from the
    sections' targets.
    """
    if name not in SECTIONS:
        raise ValueError(f"no BENCHMARKS.md section named {name!r}: add it to SECTIONS")
    lines = []
    for target in targets:
        if TARGETS.get(target.key, ("", ""))[1] != name:
            raise ValueError(f"target {target.key!r} is not measured by section {name!r}")
        lines.append(
            f"<!-- target:{target.key} | {_clean(target.figure)} | {_clean(target.met)} -->"
        )
    target_path = path or BENCHMARKS_MD
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    markdown = markdown.strip()
    # A section opening with a paragraph continues the line above it (a line break).
    joint = "\n\n" if re.match(r"[|#*!<>-]|\d+\. ", markdown) else "  \n"
    body = (
        f"<!-- bench:{name} -->\n"
        + "".join(line + "\n" for line in lines)
        + f"_Command:_ `{command or invocation()}` · _Machine:_ {machine()} · "
        f"_Date:_ {today}; load average (1, 5, 15 min) when written: {load}{joint}"
        f"{markdown}\n"
        f"<!-- /bench:{name} -->"
    )
    text = target_path.read_text() if target_path.exists() else _HEADER
    pattern = re.compile(
        rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: body, text)
    else:
        text = text.rstrip() + f"\n\n## {SECTIONS[name]}\n\n" + body + "\n"
    text = with_summary(text)
    target_path.parent.mkdir(parents=True, exist_ok=True)
    target_path.write_text(text if text.endswith("\n") else text + "\n")
    console.print(f"[green]figures written to {target_path} ({name})")
    return target_path


def _anchor(heading: str) -> str:
    # GitHub's anchors: lower case, punctuation dropped, spaces to hyphens.
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _short_machine(line: str) -> str:
    # The CPU's name may hold parentheses of its own ("Intel(R) Xeon(R) ...").
    match = re.match(r"(\d+) cores \((.*?)\)(?=,|$)(?:, (\d+ GiB) RAM)?", line)
    if match is None:
        return line.split(",")[0]
    cpu = re.sub(r"\((R|TM)\)|\bCPU\b|\bProcessor\b|@.*|\d+-Core", "", match[2])
    verify = re.search(r"secp256k1 verify (\d+ µs)", line)
    parts = (f"{match[1]} cores", " ".join(cpu.split()), match[3], verify and f"verify {verify[1]}")
    return ", ".join(x for x in parts if x)


def summary(text: str) -> str:
    """The table at the top of the page, built from the sections' targets."""
    sections = {m["name"]: m["body"] for m in _SECTION.finditer(text)}
    rows = []
    for key, (goal, name) in TARGETS.items():
        body = sections.get(name, "")
        found = {m["key"]: m for m in _TARGET_LINE.finditer(body)}.get(key)
        # A section not written yet has no heading to link to.
        link = (
            f"[{SECTIONS[name]}](#{_anchor(SECTIONS[name])})"
            if name in sections
            else f"`ledgerq bench {name}`"
        )
        if found is None:
            rows.append([goal, "not measured", "-", "-", "-", link])
            continue
        # The command, machine and date share one line (older sections: a line each).
        command = re.search(r"_Command:_ `([^`]*)`", body)
        machine_line = re.search(r"_Machine:_ ([^·\n]*?)\s*(?:·|$)", body, re.M)
        date = re.search(r"_Date:_ (\d{4}-\d{2}-\d{2})", body)
        rows.append(
            [
                goal,
                f"**{found['figure']}**",
                found["met"],
                date[1] if date else "-",
                _short_machine(machine_line[1]) if machine_line else "-",
                f"`{command[1]}` ({link})" if command else link,
            ]
        )
    return table(["target", "latest", "met", "date", "machine", "command"], rows)


def with_summary(text: str) -> str:
    """``text`` with its table at the top written again (added after the title if absent)."""
    block = f"<!-- bench:summary -->\n{summary(text)}\n<!-- /bench:summary -->"
    pattern = re.compile(r"<!-- bench:summary -->.*?<!-- /bench:summary -->", re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    first = re.search(r"^## ", text, re.M)
    at = first.start() if first else len(text)
    return text[:at].rstrip() + f"\n\n{_SUMMARY_HEADING}\n\n{block}\n\n" + text[at:].lstrip()


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
