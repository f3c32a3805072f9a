"""Client for a Sawtooth REST API (and anything speaking it: the ledgerq node).

* ``POST /batches`` with a ``BatchList`` of one batch per submission;
* ``GET /batch_statuses?id=a,b&wait=N`` for up to 15 ids, ``POST
  /batch_statuses?wait=N`` with a JSON array beyond (as the API advises);
* ``GET /events`` (server-sent events) where the ledger offers it — the
  ledgerq node does; a plain Sawtooth answers 404 and the stream ends;
* without ``/events`` (a Sawtooth validator's REST API), the
  ``/subscriptions`` websocket: every block message is a trigger for an
  early ask about followed batches not parked right now
  (:meth:`SawtoothClient.triggers`). Neither is needed: the follower parks a
  ``wait`` read per pending batch.

Sawtooth has no services: ``service_id`` is ignored on the wire.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web

from ledgerq import jsontext
from ledgerq.backoff import Backoff
from ledgerq.errors import LedgerError
from ledgerq.ledgers.base import CommitEvent, LedgerBatchStatus, SubmitResult, batch_list_bytes
from ledgerq.ledgers.chain import SAWTOOTH_READS, ChainHandler, forward_read
from ledgerq.ledgers.http import (
    HttpSessions,
    HttpTimeouts,
    post_batch,
    post_batch_lean,
    read_statuses,
    read_statuses_lean,
)
from ledgerq.ledgers.status import parse_status_list, sawtooth_status

log = logging.getLogger(__name__)

#: Above this many ids the query string gets long; Sawtooth advises POST.
_GET_LIMIT = 15
#: What a query value may hold unquoted (batch ids are hex; the list's commas).
_PLAIN = re.compile(r"[0-9A-Za-z_.~,-]*")


def _query(params: dict[str, str]) -> str:
    """``urlencode(params, safe=",")``, without its per-character quoting
    when every value is plain already (hex ids: one regex match per read)."""
    if all(_PLAIN.fullmatch(v) for v in params.values()):
        return "&".join(f"{k}={v}" for k, v in params.items())
    return urllib.parse.urlencode(params, safe=",")


#: Reconnections of the event stream and the websocket: 0.1 s doubling to 5 s, jittered.
_RECONNECT = Backoff(0.1, 5.0)
#: An event line longer than this is dropped (events are a few hundred bytes).
MAX_EVENT_LINE = 1 << 20


class SawtoothClient:
    """``use_events=False`` ignores ``/events`` and follows ``/subscriptions`` only."""

    def __init__(
        self,
        base_url: str,
        timeouts: HttpTimeouts | None = None,
        *,
        use_events: bool = True,
        authorization: str | None = None,
    ) -> None:
        """``authorization``: an ``Authorization`` header value sent on every
        request, event stream and websocket (a ``ledgerq node`` with a token
        takes ``Bearer <token>``)."""
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or HttpTimeouts()
        self.description = f"sawtooth {self.base_url}"
        self.use_events = use_events
        self._sessions = HttpSessions(self.timeouts, authorization)
        # Whether /events exists, once its first answer says so.
        self._events_known = asyncio.Event()
        self._has_events = False

    @property
    def session(self) -> aiohttp.ClientSession:
        """Submissions' connections. Created lazily so the client can be built outside a loop."""
        return self._sessions.submit

    @property
    def status_session(self) -> aiohttp.ClientSession:
        """Status reads', event streams' and websockets' connections (parked reads)."""
        return self._sessions.status

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        body = batch_list_bytes([serialized_batch])
        if self.timeouts.lean:
            origin = self._sessions.lean(self.base_url, submit=True)
            return await post_batch_lean(origin, "/batches", body, self.timeouts)
        return await post_batch(self.session, f"{self.base_url}/batches", body, self.timeouts)

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        if not batch_ids:
            return ()
        params: dict[str, str] = {}
        if wait_s > 0:
            # A bare ``wait`` means the server maximum; always send a number.
            params["wait"] = str(max(1, math.ceil(wait_s)))
        url = f"{self.base_url}/batch_statuses"
        few = len(batch_ids) <= _GET_LIMIT
        if few:
            params["id"] = ",".join(batch_ids)
        if self.timeouts.lean:
            origin = self._sessions.lean(self.base_url, submit=False)
            target = "/batch_statuses"
            if params:
                target += "?" + _query(params)
            if few:
                body = await read_statuses_lean(origin, "GET", target, wait_s, self.timeouts)
            else:
                body = await read_statuses_lean(
                    origin,
                    "POST",
                    target,
                    wait_s,
                    self.timeouts,
                    body=json.dumps(list(batch_ids)).encode(),
                    content_type="application/json",
                )
        elif few:
            body = await read_statuses(
                self.status_session, "GET", url, wait_s, self.timeouts, params=params
            )
        else:
            body = await read_statuses(
                self.status_session,
                "POST",
                url,
                wait_s,
                self.timeouts,
                params=params,
                data=json.dumps(list(batch_ids)),
                headers={"Content-Type": "application/json"},
            )
        return parse_status_list(body, url, sawtooth_status, batch_ids)

    async def transaction_committed(self, transaction_id: str) -> bool:
        url = f"{self.base_url}/transactions/{urllib.parse.quote(transaction_id, safe='')}"
        try:
            async with self.status_session.get(
                url, timeout=aiohttp.ClientTimeout(total=self.timeouts.submit)
            ) as response:
                if response.status == 200:
                    return True
                if response.status == 404:
                    return False
                raise LedgerError(
                    f"GET {url} answered {response.status}", cause=f"HTTP {response.status}"
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise LedgerError(f"GET {url} failed: {exc!r}", cause="connection failed") from exc

    def events(self) -> AsyncIterator[CommitEvent] | None:
        if not self.use_events:
            return None
        return sse_events(self, f"{self.base_url}/events", on_answer=self._events_answered)

    def _events_answered(self, available: bool) -> None:
        self._has_events = available
        self._events_known.set()

    def triggers(self) -> AsyncIterator[None] | None:
        return self._triggers()

    async def _triggers(self) -> AsyncIterator[None]:
        if self.use_events:
            # /events carries the statuses themselves: no triggers needed when it exists.
            await self._events_known.wait()
            if self._has_events:
                return
        url = "ws" + self.base_url.removeprefix("http") + "/subscriptions"
        async for _ in block_triggers(self, url):
            yield None

    def chain_handler(self, method: str, route: str) -> ChainHandler | None:
        """Every Sawtooth read route, forwarded (:mod:`ledgerq.ledgers.chain`)."""
        return self._forward if (method, route) in SAWTOOTH_READS else None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        return await forward_read(
            self.status_session,
            self.base_url,
            request,
            ledger=self.description,
            timeout_s=self.timeouts.submit,
            connect_s=self.timeouts.connect,
        )

    async def close(self) -> None:
        await self._sessions.close()


async def sse_events(
    client: SawtoothClient,
    url: str,
    *,
    idle_timeout_s: float = 60.0,
    on_answer: Callable[[bool], None] | None = None,
    max_line: int = MAX_EVENT_LINE,
) -> AsyncIterator[CommitEvent]:
    """Final-status events from an SSE stream, reconnecting with ``Last-Event-ID``.

    Ends when the server has no stream (404/405). Reconnects after errors with
    a capped, jittered backoff; a quiet stream is reopened after
    ``idle_timeout_s``. ``on_answer`` learns whether the stream exists, at its
    first answer. A line of any size is read without failing: one over
    ``max_line`` bytes drops its event; an event that is not a batch status is
    skipped.
    """
    last_id: str | None = None
    failures = 0
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        timeout = aiohttp.ClientTimeout(
            total=None, connect=client.timeouts.connect, sock_read=idle_timeout_s
        )
        try:
            async with client.status_session.get(url, headers=headers, timeout=timeout) as resp:
                if resp.status in (404, 405, 501):
                    log.info("%s has no event stream (%s)", url, resp.status)
                    if on_answer is not None:
                        on_answer(False)
                    return
                if resp.status != 200:
                    raise LedgerError(f"{url} answered {resp.status}")
                if on_answer is not None:
                    on_answer(True)
                    on_answer = None
                failures = 0
                event_id: str | None = None
                data: list[str] = []
                broken = False  # the event had a line too long: dropped whole
                async for line in sse_lines(resp.content, max_line):
                    if line is None:
                        log.warning("%s sent a line over %d bytes; event dropped", url, max_line)
                        broken = True
                    elif line.startswith("id:"):
                        event_id = line[3:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip())
                    elif line == "":
                        event = (
                            None if broken or not data else _parse_event("\n".join(data), event_id)
                        )
                        if event_id is not None:
                            last_id = event_id
                        data, event_id, broken = [], None, False
                        if event is not None:
                            yield event
        except (aiohttp.ClientError, TimeoutError, LedgerError) as exc:
            log.debug("event stream %s interrupted: %r; reconnecting", url, exc)
        failures += 1
        await asyncio.sleep(_RECONNECT.delay(failures))


async def sse_lines(content: aiohttp.StreamReader, max_line: int) -> AsyncIterator[str | None]:
    """The lines of a stream, without their ends; ``None`` for a line over ``max_line``
    bytes, which is skipped without being held in memory."""
    line = bytearray()
    skipping = False
    async for chunk in content.iter_any():
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not skipping:
                line += piece
                if len(line) > max_line:
                    skipping = True
                    line.clear()
            if end < 0:
                break
            if skipping:
                skipping = False
                yield None
            else:
                yield line.decode("utf-8", "replace").rstrip("\r")
                line.clear()
            start = end + 1


async def block_triggers(
    client: SawtoothClient, url: str, *, heartbeat_s: float = 20.0
) -> AsyncIterator[None]:
    """One item per block the ledger commits, from its ``/subscriptions`` websocket.

    Also one item at each (re)connection, since blocks may have been missed
    while disconnected. Reconnects with a capped, jittered backoff when the socket
    drops or cannot connect; ends (logging once) when the ledger has no such
    endpoint (the handshake answered 404, 405, 501 or a plain 2xx).
    """
    # Only block announcements are needed, not state: a prefix no address has
    # (not hex) keeps ``state_changes`` empty. An empty list would mean all changes.
    subscribe = {"action": "subscribe", "address_prefixes": [_NO_ADDRESS]}
    failures = 0
    while True:
        try:
            async with client.status_session.ws_connect(
                url,
                heartbeat=heartbeat_s,
                timeout=aiohttp.ClientWSTimeout(ws_close=client.timeouts.connect),
            ) as ws:
                await ws.send_str(json.dumps(subscribe))
                failures = 0
                yield None
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        continue
                    if _is_block(msg.data, url):
                        yield None
            log.debug("subscription socket %s closed; reconnecting", url)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (404, 405, 501) or 200 <= exc.status < 300:
                log.info(
                    "%s has no subscription websocket (%s); parked reads only", url, exc.status
                )
                return
            log.debug("subscription socket %s refused (%s); retrying", url, exc.status)
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            log.debug("subscription socket %s interrupted: %r; reconnecting", url, exc)
        failures += 1
        await asyncio.sleep(_RECONNECT.delay(failures))


_NO_ADDRESS = "ledgerq:blocks-only"


def _is_block(data: str, url: str) -> bool:
    try:
        doc = jsontext.loads(data)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "block_id" in doc:
        return True
    log.debug("subscription socket %s sent %.200s", url, data)
    return False


def _parse_event(data: str, event_id: str | None) -> CommitEvent | None:
    try:
        doc = jsontext.loads(data)
        status = sawtooth_status(doc)
    except (ValueError, LedgerError):
        log.warning("ignoring an event that is not a batch status: %.200s", data)
        return None
    return CommitEvent(status.batch_id, status.status, event_id)
