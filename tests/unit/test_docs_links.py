"""The documentation's links lead somewhere: every relative link in README.md,
docs/ and tests/README.md names a file of the repository, and every ``#anchor``
a heading of its target (GitHub's anchor rules); every page of docs/ is linked
from the README or another page; every repository path named in inline code
(``bench/report.py``) is a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "tests" / "README.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _code_free(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(_code_free(path.read_text()))]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{_shown(path)}: link {target!r}"
        if not dest.exists():
            problems.append(f"{where} names a file that is not in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: {_shown(dest)} has no heading for #{anchor}")
    return problems


def test_the_anchor_rules_are_githubs(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# Settings and failover time\n## `ledgerq serve`\n## A/B: x, y\n## Notes\n## Notes\n"
        "```\n# not a heading\n```\n"
    )
    assert anchors(page) == {
        "settings-and-failover-time",
        "ledgerq-serve",
        "ab-x-y",
        "notes",
        "notes-1",
    }
    page.write_text(
        "# Notes\n[a](p.md#nowhere) [b](missing.md) `[c](inline.md)` [d](https://x.example)"
        " [e](#notes)\n"
    )
    assert broken_links(page) == [
        "p.md: link 'p.md#nowhere': p.md has no heading for #nowhere",
        "p.md: link 'missing.md' names a file that is not in the repository",
    ]


def test_every_relative_link_resolves() -> None:
    problems = [p for page in PAGES for p in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_every_page_of_docs_is_linked_from_somewhere() -> None:
    linked = {
        (page.parent / t.partition("#")[0]).resolve()
        for page in PAGES
        for t in links(page)
        if t.partition("#")[0] and not re.match(r"^[a-z][a-z0-9+.-]*:", t)
    }
    orphans = [
        str(p.relative_to(REPO)) for p in sorted((REPO / "docs").glob("*.md")) if p not in linked
    ]
    assert not orphans, f"pages no other page links to: {', '.join(orphans)}; link them"


SOURCE_PATH = re.compile(
    r"^[\w-][\w.-]*(?:/[\w.-]+)+\.(?:py|md|sql|proto|toml|sh|json|yaml|js|html|css)$"
)


def missing_paths(path: Path) -> list[str]:
    """Repository paths named in inline code (``src/ledgerq/x.py``, ``bench/y.py``,
    ``migrations/0001_z.sql``) that exist nowhere in the repository: relative to its
    root, ``src/``, ``src/ledgerq/``, the page's folder, or as the tail of a path."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    bases = [REPO, REPO / "src", REPO / "src" / "ledgerq", path.parent]
    problems = []
    for span in sorted(set(re.findall(r"`([^`\s]+)`", text))):
        if not SOURCE_PATH.match(span):
            continue
        if any((base / span).exists() for base in bases):
            continue
        if any(".venv" not in p.parts for p in REPO.glob(f"**/{span}")):
            continue
        problems.append(f"{_shown(path)}: `{span}` is not a file of the repository")
    return problems


def test_every_repository_path_named_in_code_exists() -> None:
    problems = [p for page in PAGES for p in missing_paths(page)]
    assert not problems, "\n".join(problems)


def test_a_missing_path_is_named(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("`bench/report.py` `store/sql/nowhere.sql` `/openapi.json` `./ledgerq.toml`\n")
    assert missing_paths(page) == ["p.md: `store/sql/nowhere.sql` is not a file of the repository"]
