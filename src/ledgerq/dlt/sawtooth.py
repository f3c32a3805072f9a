"""Client for a Sawtooth REST API (and anything speaking it: the ledgerq node).

* ``POST /batches`` with a ``BatchList`` of one batch per submission;
* ``GET /batch_statuses?id=a,b&wait=N`` for up to 15 ids, ``POST
  /batch_statuses?wait=N`` with a JSON array beyond (as the API advises);
* ``GET /events`` (server-sent events) where the ledger offers it — the
  ledgerq node does; a plain Sawtooth answers 404 and the stream ends, so the
  monitor falls back to polling.

Sawtooth has no services: ``service_id`` is ignored on the wire.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Sequence

import aiohttp

from ledgerq.dlt._http import HttpTimeouts, error_message, new_session, post_batch
from ledgerq.dlt.base import CommitEvent, LedgerBatchStatus, SubmitResult, batch_list_bytes
from ledgerq.dlt.status import check_ids, sawtooth_status
from ledgerq.errors import LedgerError

log = logging.getLogger(__name__)

#: Above this many ids the query string gets long; Sawtooth advises POST.
_GET_LIMIT = 15


class SawtoothClient:
    def __init__(self, base_url: str, timeouts: HttpTimeouts | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or HttpTimeouts()
        self.description = f"sawtooth {self.base_url}"
        self._session: aiohttp.ClientSession | None = None

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
        return sse_events(self, f"{self.base_url}/events")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def sse_events(
    client: SawtoothClient, url: str, *, idle_timeout_s: float = 60.0
) -> AsyncIterator[CommitEvent]:
    """Final-status events from an SSE stream, reconnecting with ``Last-Event-ID``.

    Ends when the server has no stream (404/405). Reconnects after errors with
    a capped backoff; a quiet stream is reopened after ``idle_timeout_s``.
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
                    log.info("%s has no event stream (%s); polling only", url, resp.status)
                    return
                if resp.status != 200:
                    raise LedgerError(f"{url} answered {resp.status}")
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


def _parse_event(data: str, event_id: str | None) -> CommitEvent | None:
    try:
        doc = json.loads(data)
        status = sawtooth_status(doc)
    except (ValueError, LedgerError):
        log.warning("ignoring an event that is not a batch status: %.200s", data)
        return None
    return CommitEvent(status.batch_id, status.status, event_id)
