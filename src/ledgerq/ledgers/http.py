"""The HTTP plumbing the ledger clients share: sessions, explicit timeouts,
and the mapping of responses and transport failures onto :data:`SubmitResult`.

Why aiohttp: see ``docs/ledger-clients.md``. A client keeps two
sessions (:class:`aiohttp.ClientSession`), so connections stay alive across requests
and parked status reads never take a connection a POST needs: one for
submissions (``pool_size`` connections) and one for status reads, event
streams and websockets (unbounded here: the follower bounds its parked reads
with ``monitor.max_parked``). Every request carries its own ``ClientTimeout``
so no await can hang (the same immutable ``ClientTimeout`` is shared by
every request with the same limits).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import functools
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from ledgerq import jsontext
from ledgerq.errors import LedgerError
from ledgerq.ledgers.base import (
    Accepted,
    Ambiguous,
    Busy,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
)
from ledgerq.ledgers.lean import ConnectFailed, LeanOrigin

#: Whether a 4xx answer to a POST is the ledger's judgement of the batch:
#: ``judged(status, body)``.
Judge = Callable[[int, bytes], bool]

#: Sawtooth's batch-rejection error codes: 30 Submitted Batches Invalid,
#: 34 No Batches Submitted, 35 Protobuf Not Decodable.
SAWTOOTH_REJECTIONS = frozenset({30, 34, 35})


@dataclass(frozen=True, slots=True)
class HttpTimeouts:
    """Seconds. ``submit`` bounds a whole POST; status reads get ``wait`` + ``status_margin``."""

    connect: float = 3.0
    submit: float = 10.0
    status_margin: float = 5.0
    pool_size: int = 256
    #: Submissions and status reads of a Sawtooth ledger on the lean client
    #: (:mod:`ledgerq.ledgers.lean`); False: on aiohttp's.
    lean: bool = True


@functools.lru_cache(maxsize=64)
def client_timeout(total: float, connect: float) -> aiohttp.ClientTimeout:
    """One (immutable) timeout object per distinct value, not one per request."""
    return aiohttp.ClientTimeout(total=total, connect=connect)


def new_session(timeouts: HttpTimeouts, *, limit: int | None = None) -> aiohttp.ClientSession:
    """A session of ``limit`` connections (default ``pool_size``; 0: no limit)."""
    connector = aiohttp.TCPConnector(
        limit=timeouts.pool_size if limit is None else limit, enable_cleanup_closed=True
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeouts.submit, connect=timeouts.connect),
        raise_for_status=False,
    )


class HttpSessions:
    """A ledger client's two connection pools, created lazily (so a client can
    be built outside a loop) and made again once closed: ``submit`` for POSTs
    (``pool_size`` connections), ``status`` for status reads, event streams
    and websockets (unbounded: parked reads never take a POST's connection).
    ``authorization`` is sent on every request of both."""

    def __init__(self, timeouts: HttpTimeouts, authorization: str | None = None) -> None:
        self._timeouts = timeouts
        self._headers = {"Authorization": authorization} if authorization else {}
        self._submit: aiohttp.ClientSession | None = None
        self._status: aiohttp.ClientSession | None = None
        self._lean: dict[tuple[str, bool], LeanOrigin] = {}

    @property
    def submit(self) -> aiohttp.ClientSession:
        if self._submit is None or self._submit.closed:
            self._submit = new_session(self._timeouts)
            self._submit.headers.update(self._headers)
        return self._submit

    @property
    def status(self) -> aiohttp.ClientSession:
        if self._status is None or self._status.closed:
            self._status = new_session(self._timeouts, limit=0)
            self._status.headers.update(self._headers)
        return self._status

    def lean(self, base_url: str, *, submit: bool) -> LeanOrigin:
        """The lean client's connections to ``base_url``: the submissions'
        (``pool_size`` connections) or the status reads' (unbounded)."""
        key = (base_url, submit)
        origin = self._lean.get(key)
        if origin is None or origin.closed:
            origin = self._lean[key] = LeanOrigin(
                base_url,
                connect_timeout_s=self._timeouts.connect,
                limit=self._timeouts.pool_size if submit else 0,
                headers=self._headers,
            )
        return origin

    async def close(self) -> None:
        for session in (self._submit, self._status):
            if session is not None:
                await session.close()
        self._submit = self._status = None
        for origin in self._lean.values():
            await origin.close()
        self._lean.clear()


def url_credentials(url: str) -> tuple[str, str | None]:
    """``url`` without its ``user:password@``, and the ``Authorization``
    header value those name (HTTP Basic, RFC 7617), or None when it names
    none. The client sends that header on every request; the URL it keeps,
    and with it every message, log line and answer naming the ledger, holds
    no password."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    bare = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return urllib.parse.urlunsplit(bare), f"Basic {basic}"


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
        doc = jsontext.loads(text)
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


def error_code(body: bytes) -> int | None:
    """The ``error.code`` of a Sawtooth/Grid JSON error body, if it has one."""
    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
        doc = jsontext.loads(body)
        code = doc["error"]["code"]
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    return None


def sawtooth_judged(status: int, body: bytes) -> bool:
    """A 400 whose JSON error code is one of Sawtooth's batch rejections."""
    return status == 400 and error_code(body) in SAWTOOTH_REJECTIONS


async def post_batch(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    timeouts: HttpTimeouts,
    judged: Judge = sawtooth_judged,
) -> SubmitResult:
    """POST a BatchList and classify the outcome; never raises for transport errors.

    A 4xx other than 429 is :class:`Rejected` only when ``judged`` says the
    body is the ledger's judgement of the batch; otherwise it is
    :class:`Unjudged` (a wrong URL, credentials, a proxy).
    """
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/octet-stream"},
            timeout=client_timeout(timeouts.submit, timeouts.connect),
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
    return classify_post(url, status, payload, retry_after, judged)


def classify_post(
    url: str, status: int, payload: bytes, retry_after: str | None, judged: Judge
) -> SubmitResult:
    """What the ledger's answer to a POST of a batch says (see :func:`post_batch`)."""
    if 200 <= status < 300:
        return Accepted(status)
    if status in (429, 503):
        return Busy(
            status, error_message(payload, status), retry_after_ms(retry_after, time.time())
        )
    if 400 <= status < 500:
        if judged(status, payload):
            return Rejected(status, error_message(payload, status))
        return Unjudged(status, f"{url} answered {status}: {error_message(payload, status)}")
    return Ambiguous(f"{url} answered {status}: {error_message(payload, status)}", status)


async def post_batch_lean(
    origin: LeanOrigin,
    target: str,
    body: bytes,
    timeouts: HttpTimeouts,
    judged: Judge = sawtooth_judged,
) -> SubmitResult:
    """:func:`post_batch` on the lean client (:mod:`ledgerq.ledgers.lean`):
    the same outcomes for the same answers and failures."""
    url = origin.url(target)
    try:
        answer = await origin.request(
            "POST",
            target,
            body=body,
            content_type="application/octet-stream",
            total_s=timeouts.submit,
        )
    except ConnectFailed as exc:
        # Connecting failed: the request was never sent.
        return Unreachable(f"cannot connect to {url}: {exc}")
    except TimeoutError:
        return Ambiguous(f"no answer from {url} within {timeouts.submit:g}s")
    except OSError as exc:
        # Reset, disconnected or answered garbage once the request may have been written.
        return Ambiguous(f"connection to {url} failed mid-request: {exc!r}")
    return classify_post(url, answer.status, answer.body, answer.headers.get("retry-after"), judged)


async def read_statuses_lean(
    origin: LeanOrigin,
    method: str,
    target: str,
    wait_s: float,
    timeouts: HttpTimeouts,
    *,
    body: bytes | None = None,
    content_type: str | None = None,
) -> bytes:
    """:func:`read_statuses` on the lean client: the same errors and causes."""
    url = origin.url(target)
    total = wait_s + timeouts.status_margin
    try:
        answer = await origin.request(
            method, target, body=body, content_type=content_type, total_s=total
        )
    except TimeoutError as exc:
        raise LedgerError(f"no answer from {url} within {total:g} s", cause="timeout") from exc
    except OSError as exc:
        raise LedgerError(
            f"cannot read batch statuses from {url}: {exc!r}", cause="connection failed"
        ) from exc
    if answer.status != 200:
        raise LedgerError(
            f"{url} answered {answer.status}: {error_message(answer.body, answer.status)}",
            cause=f"HTTP {answer.status}",
        )
    return answer.body


async def read_statuses(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    wait_s: float,
    timeouts: HttpTimeouts,
    **request: Any,
) -> bytes:
    """A status read's body; :class:`~ledgerq.errors.LedgerError` for anything but a 200.

    The error's ``cause`` names the kind of failure (``HTTP 404``, ``timeout``,
    ``connection failed``), so that a burst of the same failure is one problem.
    """
    timeout = client_timeout(wait_s + timeouts.status_margin, timeouts.connect)
    try:
        async with session.request(method, url, timeout=timeout, **request) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise LedgerError(
                    f"{url} answered {resp.status}: {error_message(body, resp.status)}",
                    cause=f"HTTP {resp.status}",
                )
            return body
    except TimeoutError as exc:
        raise LedgerError(
            f"no answer from {url} within {timeout.total:g} s", cause="timeout"
        ) from exc
    except aiohttp.ClientError as exc:
        raise LedgerError(
            f"cannot read batch statuses from {url}: {exc!r}", cause="connection failed"
        ) from exc
