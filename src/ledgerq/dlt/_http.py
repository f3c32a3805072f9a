"""The HTTP plumbing the ledger clients share: one session, explicit timeouts,
and the mapping of responses and transport failures onto :data:`SubmitResult`.

Why aiohttp: see ``docs/ledger-clients.md``. One :class:`aiohttp.ClientSession`
per client keeps connections alive across submissions; every request carries
its own ``ClientTimeout`` so no await can hang.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import time
from dataclasses import dataclass

import aiohttp

from ledgerq.dlt.base import Accepted, Ambiguous, Busy, Rejected, SubmitResult, Unreachable


@dataclass(frozen=True, slots=True)
class HttpTimeouts:
    """Seconds. ``submit`` bounds a whole POST; status reads get ``wait`` + ``status_margin``."""

    connect: float = 3.0
    submit: float = 10.0
    status_margin: float = 5.0
    pool_size: int = 256


def new_session(timeouts: HttpTimeouts) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=timeouts.pool_size, enable_cleanup_closed=True)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeouts.submit, connect=timeouts.connect),
        raise_for_status=False,
    )


def retry_after_ms(value: str | None, now_s: float) -> int | None:
    """``Retry-After`` as milliseconds: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value) * 1000
    with contextlib.suppress(TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0, int((when.timestamp() - now_s) * 1000))
    return None


def error_message(body: bytes, status: int) -> str:
    """The ledger's explanation from a Sawtooth/Grid JSON error body, else the text."""
    text = body.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        doc = json.loads(text)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        if isinstance(err, dict):
            title = str(err.get("title") or "").strip()
            message = str(err.get("message") or "").strip()
            joined = ": ".join(p for p in (title, message) if p)
            if joined:
                return joined
        if isinstance(doc, dict) and doc.get("message"):
            return str(doc["message"])
    return text[:500] or f"HTTP {status}"


async def post_batch(
    session: aiohttp.ClientSession, url: str, body: bytes, timeouts: HttpTimeouts
) -> SubmitResult:
    """POST a BatchList and classify the outcome; never raises for transport errors."""
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/octet-stream"},
            timeout=aiohttp.ClientTimeout(total=timeouts.submit, connect=timeouts.connect),
        ) as resp:
            payload = await resp.read()
            status = resp.status
            retry_after = resp.headers.get("Retry-After")
    except aiohttp.ClientConnectorError as exc:
        # Connecting failed: the request was never sent.
        return Unreachable(f"cannot connect to {url}: {exc}")
    except TimeoutError:
        return Ambiguous(f"no answer from {url} within {timeouts.submit:g}s")
    except aiohttp.ClientError as exc:
        # Reset or disconnected once the request may have been written.
        return Ambiguous(f"connection to {url} failed mid-request: {exc!r}")
    if 200 <= status < 300:
        return Accepted(status)
    if status in (429, 503):
        return Busy(
            status, error_message(payload, status), retry_after_ms(retry_after, time.time())
        )
    if 400 <= status < 500:
        return Rejected(status, error_message(payload, status))
    return Ambiguous(f"{url} answered {status}: {error_message(payload, status)}", status)
