"""Every TOML example in the documentation is a settings file ``ledgerq`` accepts.

Each ```` ```toml ```` block of README.md and docs/*.md (indented ones too, as in
a list) is written to a file and loaded by :func:`ledgerq.config.load_settings`
with an empty environment: an unknown key, a key in the wrong table, a bad
value or settings that contradict one another fail here as they would fail
``ledgerq serve --config``.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from ledgerq.config import load_settings
from ledgerq.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
BLOCK = re.compile(r"^( *)```toml\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def toml_examples() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for n, (_indent, body) in enumerate(BLOCK.findall(page.read_text()), 1):
            found.append((f"{page.relative_to(REPO)}#{n}", textwrap.dedent(body)))
    return found


EXAMPLES = toml_examples()


def test_the_examples_are_collected() -> None:
    assert {"docs/configuration.md#1", "docs/operations.md#1"} <= {name for name, _ in EXAMPLES}


@pytest.mark.parametrize(("name", "text"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_every_toml_example_is_accepted(name: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "ledgerq.toml"
    path.write_text(text)
    try:
        load_settings(environ={}, config_file=path, cwd=tmp_path)
    except ConfigError as exc:
        pytest.fail(f"the TOML example {name} is refused: {exc}")


def test_a_key_in_the_wrong_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledgerq.toml"
    path.write_text('[claims]\nttl_ms = 5000\npublic_url = "https://gateway.example.com"\n')
    with pytest.raises(ConfigError, match=r"claims\.public_url"):
        load_settings(environ={}, config_file=path, cwd=tmp_path)
