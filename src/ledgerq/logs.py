"""Logging set-up for the long-running commands: plain lines or one JSON object per line.

JSON lines carry ``ts``, ``level``, ``logger``, ``message`` and, when the
record names them, ``batch_id`` and ``service_id``: from ``extra=`` or from the
``batch=... service=...`` pairs the pipeline's messages use.

Secrets registered with :func:`add_secret` (the API token, a database
password) are replaced by ``***`` in every line the handler writes.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_SECRETS: set[str] = set()
_PAIRS = re.compile(r"\b(batch|service)=(\S+)")


def add_secret(value: str) -> None:
    """Never write ``value`` to the log (short values are ignored: too many false hits),
    as it is or as a JSON log line escapes it (a ``"`` or ``\\`` in it)."""
    if len(value) >= 4:
        _SECRETS.add(value)
        _SECRETS.add(json.dumps(value)[1:-1])


def redact(text: str) -> str:
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, "***")
    return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for key, value in _PAIRS.findall(message):
            doc.setdefault(f"{key}_id", value.rstrip(",;"))
        for key in ("batch_id", "service_id"):
            value = getattr(record, key, None)
            if value is not None:
                doc[key] = str(value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


class _Redacting(logging.Formatter):
    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


def configure_logging(level: str = "INFO", *, json_lines: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    inner = (
        JsonFormatter()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handler.setFormatter(_Redacting(inner))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Per-request access lines would drown the pipeline's own.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
