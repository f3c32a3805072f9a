"""The docs describe the system as it is, and BENCHMARKS.md holds today's figures.

* No page under ``docs/`` but ``BENCHMARKS.md`` carries a date: history is in
  git, figures in BENCHMARKS.md with the date of their run.
* Every ``## `` section of BENCHMARKS.md but the table at its top is one a
  ``ledgerq bench`` command writes (``bench/report.py``'s ``SECTIONS``, each
  name written by a benchmark's code), under its fixed heading, between its
  markers; the table at the top is the one written from the sections.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench import report

DOCS = Path(__file__).resolve().parents[2] / "docs"
BENCH = Path(__file__).resolve().parents[2] / "bench"
_MONTH = "(?:January|February|March|April|May|June|July|August|September|October|November|December)"
DATE = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b"
    rf"|\b\d{{1,2}} {_MONTH},? \d{{4}}\b|\b{_MONTH},? \d{{4}}\b"
)


def dated_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if DATE.search(line)]


def test_the_date_pattern() -> None:
    for dated in ("run 2026-11-23 08:01", "on 24 November 2026", "November 24, 2026", "May 2025"):
        assert dated_lines(dated), dated
    for plain in ("load 2.3–4.7", "RFC 7230", "`12:30:00`", "in May the", "0.70 × at 50 × 20"):
        assert not dated_lines(plain), plain


def test_no_page_but_benchmarks_carries_a_date() -> None:
    found = [
        f"{page.name}: {line.strip()[:100]}"
        for page in sorted(DOCS.rglob("*.md"))
        if page.name != "BENCHMARKS.md"
        for line in dated_lines(page.read_text())
    ]
    assert not found, "dates belong in git and BENCHMARKS.md:\n" + "\n".join(found)


def _written_by_a_benchmark(name: str) -> bool:
    sources = (p.read_text() for p in BENCH.glob("*.py") if p.name != "report.py")
    return any(f'"{name}"' in source for source in sources)


def test_every_section_name_is_written_by_a_benchmark() -> None:
    unwritten = [name for name in report.SECTIONS if not _written_by_a_benchmark(name)]
    assert not unwritten, f"sections no benchmark writes: {unwritten}"
    for key, (_, section) in report.TARGETS.items():
        assert section in report.SECTIONS, key


def test_every_benchmarks_section_is_one_a_bench_command_writes() -> None:
    text = (DOCS / "BENCHMARKS.md").read_text()
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    assert parts, "BENCHMARKS.md has no sections"
    headings = {heading: name for name, heading in report.SECTIONS.items()}
    wrong = []
    for i, part in enumerate(parts):
        heading, _, body = part.partition("\n")
        markers = re.findall(r"<!-- bench:([\w-]+) -->", body)
        if i == 0:
            expected = "summary"
            if heading != "At a glance":
                wrong.append(f"the first section is {heading!r}, not the table of targets")
        else:
            expected = headings.get(heading, "")
            if not expected:
                wrong.append(f"{heading!r}: no benchmark writes a section with this heading")
                continue
        if markers != [expected] or not body.strip().endswith(f"<!-- /bench:{expected} -->"):
            wrong.append(f"{heading!r}: holds {markers}, expected only bench:{expected}")
    assert not wrong, "\n".join(wrong)
    assert report.with_summary(text) == text, "the table at the top is not the written one"
