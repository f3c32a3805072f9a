"""Every ``ledgerq`` command line the documentation shows names a real command
and real flags.

Collected from README.md, tests/README.md and docs/*.md: lines of fenced code
blocks and inline code spans that start with ``ledgerq`` (or
``.venv/bin/ledgerq``). Each is checked against the click commands
themselves: the subcommand path exists and every flag is one of that
command's options. Values and arguments are not checked (docs write
placeholders such as ``FILE`` or ``<batch id>``). Synopses in brackets
(``[--ephemeral]``) count as flags. ``tests/unit/test_docs_reference.py`` is
the other direction: every flag is documented.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from ledgerq.cli import cli

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "tests" / "README.md", *(REPO / "docs").glob("*.md")])
START = re.compile(r"^(?:\$ +)?(?:\.venv/bin/)?ledgerq(?:\s|$)")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_.]*|\.\.\.|<.*)$")


def command_lines(text: str) -> list[str]:
    """The ``ledgerq ...`` commands in ``text``'s code blocks and inline code spans."""
    found: list[str] = []
    for block in re.findall(r"^```[\w-]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        joined = re.sub(r" *\\\n\s*", " ", block)  # shell line continuations
        found += [line.strip() for line in joined.splitlines() if START.match(line.strip())]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    found += [span for span in re.findall(r"`([^`]+)`", prose) if START.match(span)]
    # The command alone: no comment, pipe, chained command or background `&`.
    return [re.split(r" #| \| | && | ; ", c)[0].rstrip(" &") for c in found]


def _options(command: click.Command) -> set[str]:
    opts = {"--help", "-h"}
    for param in command.params:
        if isinstance(param, click.Option):
            opts.update(param.opts, param.secondary_opts)
    return opts


def problem(line: str) -> str | None:
    """What is wrong with one documented command line (None: nothing)."""
    try:
        words = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
    except ValueError as exc:
        return f"{line!r} cannot be read as a shell command: {exc}"
    command: click.Command = cli
    path = ["ledgerq"]
    while words and isinstance(command, click.Group) and not words[0].startswith("-"):
        word = words[0]
        sub = command.get_command(click.Context(command), word)
        if sub is None:
            if PLACEHOLDER.match(word):
                return None  # `ledgerq COMMAND --help`, `ledgerq bench NAME`: nothing to check
            return f"{line!r}: `{' '.join(path)}` has no command {word!r}"
        command, path, words = sub, [*path, word], words[1:]
    known = _options(command)
    unknown = [
        w.split("=", 1)[0]
        for w in words
        if w.startswith("-") and w != "-" and not re.match(r"^-\d", w)
        if w.split("=", 1)[0] not in known
    ]
    if unknown:
        return f"{line!r}: `{' '.join(path)}` has no option {', '.join(unknown)}"
    return None


def test_the_check_finds_wrong_commands_and_flags() -> None:
    text = (
        "Run `ledgerq serve --bind 127.0.0.1:8090` then\n"
        "```sh\n.venv/bin/ledgerq submit --generate 10 \\\n  --services 2   # ten\n"
        "ledgerq status <batch id> --wait | head\nledgerq node [--ephemeral] [--no-such 1]\n"
        "ledgerq frobnicate\nledgerq COMMAND --help\necho ledgerq serve --nope\n```\n"
    )
    lines = command_lines(text)
    assert lines == [
        ".venv/bin/ledgerq submit --generate 10 --services 2",
        "ledgerq status <batch id> --wait",
        "ledgerq node [--ephemeral] [--no-such 1]",
        "ledgerq frobnicate",
        "ledgerq COMMAND --help",
        "ledgerq serve --bind 127.0.0.1:8090",
    ]
    assert [problem(line) for line in lines] == [
        None,
        None,
        "'ledgerq node [--ephemeral] [--no-such 1]': `ledgerq node` has no option --no-such",
        "'ledgerq frobnicate': `ledgerq` has no command 'frobnicate'",
        None,
        None,
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_documented_command_line_is_real(page: Path) -> None:
    problems = [p for line in command_lines(page.read_text()) if (p := problem(line))]
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_quickstart_commands_are_collected() -> None:
    # A broken collection must not pass vacuously.
    lines = command_lines((REPO / "docs" / "quickstart.md").read_text())
    assert ".venv/bin/ledgerq submit --generate 2000 --services 20" in lines
    assert "ledgerq status <batch id> --wait" in lines
