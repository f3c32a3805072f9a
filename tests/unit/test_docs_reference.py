"""Every flag, setting and ``LEDGERQ_*`` variable is documented in docs/configuration.md.

Collected from the code itself: the click commands under ``ledgerq`` (every
long option of every command), the settings object (``ledgerq.config.KEYS``)
and every ``LEDGERQ_*`` name in the package, the benchmarks, the build
and the test fixtures. Each failure says what
is missing and where to write it; documented flags and keys that no longer
exist fail too. ``ledgerq bench NAME`` is left out: its commands live in the
checkout's ``bench/`` folder, are developer tools and document themselves in
``--help`` and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from ledgerq.cli import cli
from ledgerq.config import KEYS, env_name

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"
FLAGS_SECTION = "## Commands and their flags"
KEYS_SECTION = "## Every key"
NOT_DOCUMENTED_HERE = {("bench",)}


def _commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    if path in NOT_DOCUMENTED_HERE:
        return
    if any(isinstance(p, click.Option) for p in command.params) or not isinstance(
        command, click.Group
    ):
        yield path, command
    if isinstance(command, click.Group):
        for name in sorted(command.list_commands(click.Context(command))):
            sub = command.get_command(click.Context(command), name)
            assert sub is not None
            yield from _commands(sub, (*path, name))


def _long_flags(command: click.Command) -> list[str]:
    flags: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            flags += [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
    return flags


def _envvars(command: click.Command) -> list[str]:
    found: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar:
            envvar = param.envvar
            found += [envvar] if isinstance(envvar, str) else list(envvar)
    return found


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.find(heading + "\n")
    if start < 0:
        return ""
    rest = text[start + len(heading) + 1 :]
    stop = re.search(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)
    return rest[: stop.start()] if stop else rest


def _title(path: tuple[str, ...]) -> str:
    return "ledgerq " + " ".join(path) if path else "ledgerq"


COMMANDS = list(_commands(cli))


def flag_problems(text: str, path: tuple[str, ...], command: click.Command) -> list[str]:
    """What the doc ``text`` lacks or gets wrong about one command's flags."""
    flags_part = _section(text, FLAGS_SECTION)
    if not flags_part:
        return [f"docs/configuration.md has no {FLAGS_SECTION!r} section"]
    heading = f"### `{_title(path)}`"
    section = _section(flags_part, heading)
    flags = _long_flags(command)
    if not section:
        return [
            f"`{_title(path)}` has no section in docs/configuration.md: add {heading!r} under "
            f"{FLAGS_SECTION!r} with a table row per flag ({', '.join(flags) or 'none'})"
        ]
    problems = []
    missing = [f for f in flags if not re.search(rf"`{re.escape(f)}(?![\w-])", section)]
    if missing:
        problems.append(
            f"`{_title(path)}` flag(s) {', '.join(missing)} not documented: add a row for each "
            f"to the table under {heading!r} in docs/configuration.md ({FLAGS_SECTION!r})"
        )
    # First cells of the table rows name flags that exist.
    documented = re.findall(r"^\| *`(--[\w-]+)", section, re.MULTILINE)
    gone = [f for f in documented if f not in flags]
    if gone:
        problems.append(
            f"docs/configuration.md documents {', '.join(gone)} under {heading!r}, "
            f"but `{_title(path)}` has no such flag: remove or rename the row"
        )
    undocumented_env = [e for e in _envvars(command) if f"`{e}`" not in text]
    if undocumented_env:
        problems.append(
            f"`{_title(path)}` reads {', '.join(undocumented_env)}: name it in its section in "
            "docs/configuration.md"
        )
    return problems


def key_problems(text: str) -> list[str]:
    """What the doc ``text``'s table of keys lacks or lists wrongly."""
    table = _section(text, KEYS_SECTION)
    if not table:
        return [f"docs/configuration.md has no {KEYS_SECTION!r} section"]
    problems = []
    missing = [
        f"{k.name} ({env_name(k.name)})"
        for k in KEYS
        if not re.search(
            rf"^\| *`{re.escape(k.name)}` *\| *`{env_name(k.name)}` *\|", table, re.MULTILINE
        )
    ]
    if missing:
        problems.append(
            f"setting(s) {', '.join(missing)} not documented: add a row "
            "| `key` | `LEDGERQ_KEY` | default | meaning | for each to the table under "
            f"{KEYS_SECTION!r} in docs/configuration.md"
        )
    names = {k.name for k in KEYS}
    gone = [r for r in re.findall(r"^\| *`([\w.]+)` *\|", table, re.MULTILINE) if r not in names]
    if gone:
        problems.append(
            f"docs/configuration.md ({KEYS_SECTION!r}) lists {', '.join(gone)}, "
            "which ledgerq.config.KEYS does not have: remove or rename the row"
        )
    return problems


def test_the_commands_are_collected() -> None:
    # The walk reaches nested commands; a broken walk must not pass vacuously.
    titles = {_title(p) for p, _ in COMMANDS}
    assert {"ledgerq serve", "ledgerq node", "ledgerq store clean", "ledgerq submit"} <= titles
    assert "--node-data-dir" in _long_flags(dict(COMMANDS)[("serve",)])


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[_title(p) for p, _ in COMMANDS])
def test_every_flag_of_every_command_is_documented(
    path: tuple[str, ...], command: click.Command
) -> None:
    problems = flag_problems(DOC.read_text(), path, command)
    assert not problems, "\n".join(problems)


def test_every_setting_has_a_row_in_the_table_of_keys() -> None:
    problems = key_problems(DOC.read_text())
    assert not problems, "\n".join(problems)


def test_a_missing_or_stale_row_is_named_with_where_to_write_it() -> None:
    text = DOC.read_text()
    serve = dict(COMMANDS)[("serve",)]
    without = re.sub(r"^\| `--log-json`.*\n", "", text, flags=re.MULTILINE)
    assert without != text
    assert flag_problems(without, ("serve",), serve) == [
        "`ledgerq serve` flag(s) --log-json, --no-log-json not documented: add a row for each "
        "to the table under '### `ledgerq serve`' in docs/configuration.md "
        "('## Commands and their flags')"
    ]
    stale = text.replace("| `--delay-window-ms MS` |", "| `--delay-ms MS` |")
    assert any(
        "--delay-ms" in p and "no such flag" in p for p in flag_problems(stale, ("serve",), serve)
    )
    no_key = re.sub(r"^\| `claims.grace_ms` .*\n", "", text, flags=re.MULTILINE)
    assert key_problems(no_key) == [
        "setting(s) claims.grace_ms (LEDGERQ_CLAIMS_GRACE_MS) not documented: add a row "
        "| `key` | `LEDGERQ_KEY` | default | meaning | for each to the table under "
        "'## Every key' in docs/configuration.md"
    ]


def test_every_environment_variable_in_the_source_is_documented() -> None:
    text = DOC.read_text()
    names: dict[str, str] = {}
    # The package, the benchmarks, the build and the test suite's own fixtures.
    sources = [
        *(REPO / "src" / "ledgerq").rglob("*.py"),
        *(REPO / "bench").rglob("*.py"),
        *(REPO / "scripts").iterdir(),
        REPO / "Makefile",
        REPO / "tests" / "conftest.py",
        REPO / "tests" / "pg_server.py",
    ]
    for path in sorted(p for p in sources if p.is_file()):
        for name in re.findall(r"\bLEDGERQ_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            names.setdefault(name, str(path.relative_to(REPO)))
    names.update({env_name(k.name): "ledgerq/config.py" for k in KEYS})
    assert {"LEDGERQ_CONFIG", "LEDGERQ_URL", "LEDGERQ_BENCH_PG", "LEDGERQ_TEST_PG"} <= set(names)
    missing = [
        f"{n} (read in {where})" for n, where in sorted(names.items()) if f"`{n}`" not in text
    ]
    assert not missing, (
        f"environment variable(s) {', '.join(missing)} not documented: name each in "
        "docs/configuration.md (settings in the table of keys, others under "
        "'## Environment variables')"
    )
