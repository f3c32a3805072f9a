"""Client for a Sawtooth REST API (and anything speaking it: the ledgerq node).

* ``POST /batches`` with a ``BatchList`` of one batch per submission;
* ``GET /batch_statuses?id=a,b&wait=N`` for up to 15 ids, ``POST
  /batch_statuses?wait=N`` with a JSON array beyond (as the API advises);
* ``GET /events`` (server-sent events) where the ledger offers it — the
  ledgerq node does; a plain Sawtooth answers 404 and the stream ends;
* without ``/events`` (a Sawtooth validator's REST API), the
  ``/subscriptions`` websocket: every block message is a trigger for an
  early status poll (:meth:`SawtoothClient.triggers`). Without either, the
  monitor polls on its interval.

Sawtooth has no services: ``service_id`` is ignored on the wire.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp

from ledgerq.dlt._http import HttpTimeouts, error_message, new_session, post_batch
from ledgerq.dlt.base import CommitEvent, LedgerBatchStatus, SubmitResult, batch_list_bytes
from ledgerq.dlt.status import check_ids, sawtooth_status
from ledgerq.errors import LedgerError

log = logging.getLogger(__name__)

#: Above this many ids the query string gets long; Sawtooth advises POST.
_GET_LIMIT = 15


class SawtoothClient:
    """``use_events=False`` ignores ``/events`` and follows ``/subscriptions`` only."""

    def __init__(
        self, base_url: str, timeouts: HttpTimeouts | None = None, *, use_events: bool = True
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or HttpTimeouts()
        self.description = f"sawtooth {self.base_url}"
        self.use_events = use_events
        self._session: aiohttp.ClientSession | None = None
        # Whether /events exists, once its first answer says so.
        self._events_known = asyncio.Event()
        self._has_events = False

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created lazily so the client can be built outside a running loop.
        if self._session is None or self._session.closed:
            self._session = new_session(self.timeouts)
        return self._session

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        body = batch_list_bytes([serialized_batch])
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
        timeout = aiohttp.ClientTimeout(
            total=wait_s + self.timeouts.status_margin, connect=self.timeouts.connect
        )
        url = f"{self.base_url}/batch_statuses"
        try:
            if len(batch_ids) <= _GET_LIMIT:
                params["id"] = ",".join(batch_ids)
                request = self.session.get(url, params=params, timeout=timeout)
            else:
                request = self.session.post(
                    url,
                    params=params,
                    data=json.dumps(list(batch_ids)),
                    timeout=timeout,
                    headers={"Content-Type": "application/json"},
                )
            async with request as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise LedgerError(
                        f"{url} answered {resp.status}: {error_message(body, resp.status)}"
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise LedgerError(f"cannot read batch statuses from {url}: {exc!r}") from exc
        try:
            doc = json.loads(body)
            entries = doc["data"] if isinstance(doc, dict) else doc
            return check_ids([sawtooth_status(e) for e in entries], batch_ids)
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"{url} answered a body that is not a status list") from exc

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

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def sse_events(
    client: SawtoothClient,
    url: str,
    *,
    idle_timeout_s: float = 60.0,
    on_answer: Callable[[bool], None] | None = None,
) -> AsyncIterator[CommitEvent]:
    """Final-status events from an SSE stream, reconnecting with ``Last-Event-ID``.

    Ends when the server has no stream (404/405). Reconnects after errors with
    a capped backoff; a quiet stream is reopened after ``idle_timeout_s``.
    ``on_answer`` learns whether the stream exists, at its first answer.
    """
    last_id: str | None = None
    backoff = 0.1
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        timeout = aiohttp.ClientTimeout(
            total=None, connect=client.timeouts.connect, sock_read=idle_timeout_s
        )
        try:
            async with client.session.get(url, headers=headers, timeout=timeout) as resp:
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
                backoff = 0.1
                event_id: str | None = None
                data: list[str] = []
                async for raw in resp.content:
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    if line.startswith("id:"):
                        event_id = line[3:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip())
                    elif line == "" and data:
                        event = _parse_event("\n".join(data), event_id)
                        if event_id is not None:
                            last_id = event_id
                        data, event_id = [], None
                        if event is not None:
                            yield event
        except (aiohttp.ClientError, TimeoutError, LedgerError) as exc:
            log.debug("event stream %s interrupted: %r; reconnecting", url, exc)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 5.0)


async def block_triggers(
    client: SawtoothClient, url: str, *, heartbeat_s: float = 20.0
) -> AsyncIterator[None]:
    """One item per block the ledger commits, from its ``/subscriptions`` websocket.

    Also one item at each (re)connection, since blocks may have been missed
    while disconnected. Reconnects with a capped backoff when the socket
    drops or cannot connect; ends (logging once) when the ledger has no such
    endpoint (the handshake answered 404, 405, 501 or a plain 2xx).
    """
    # Only block announcements are needed, not state: a prefix no address has
    # (not hex) keeps ``state_changes`` empty. An empty list would mean all changes.
    subscribe = {"action": "subscribe", "address_prefixes": [_NO_ADDRESS]}
    backoff = 0.1
    while True:
        try:
            async with client.session.ws_connect(
                url,
                heartbeat=heartbeat_s,
                timeout=aiohttp.ClientWSTimeout(ws_close=client.timeouts.connect),
            ) as ws:
                await ws.send_str(json.dumps(subscribe))
                backoff = 0.1
                yield None
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        continue
                    if _is_block(msg.data, url):
                        yield None
            log.debug("subscription socket %s closed; reconnecting", url)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (404, 405, 501) or 200 <= exc.status < 300:
                log.info("%s has no subscription websocket (%s); polling only", url, exc.status)
                return
            log.debug("subscription socket %s refused (%s); retrying", url, exc.status)
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            log.debug("subscription socket %s interrupted: %r; reconnecting", url, exc)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 5.0)


_NO_ADDRESS = "ledgerq:blocks-only"


def _is_block(data: str, url: str) -> bool:
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "block_id" in doc:
        return True
    log.debug("subscription socket %s sent %.200s", url, data)
    return False


def _parse_event(data: str, event_id: str | None) -> CommitEvent | None:
    try:
        doc = json.loads(data)
        status = sawtooth_status(doc)
    except (ValueError, LedgerError):
        log.warning("ignoring an event that is not a batch status: %.200s", data)
        return None
    return CommitEvent(status.batch_id, status.status, event_id)
