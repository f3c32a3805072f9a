"""JSON text from outside the process: every way it fails to parse is a ``ValueError``.

``json.loads`` raises ``RecursionError`` (not a ``ValueError``) for arrays or
objects nested deeper than the interpreter's recursion limit: a body of a
few hundred kilobytes of ``[`` from a client or a ledger would otherwise
escape every ``except ValueError`` that turns bad input into a 400 or a
retried ``LedgerError``.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``; a document nested too deeply is a ``ValueError`` too."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
