"""Client for Splinter's scabbard service.

Grid's ``service_id`` is ``circuit::service``; the scabbard routes are
``POST /scabbard/{circuit}/{service}/batches`` and
``GET /scabbard/{circuit}/{service}/batch_statuses?ids=a,b&wait=N``, whose
entries carry ``{"statusType": ..., "message": [...]}``. Scabbard has no
batch-level event stream, so the monitor polls.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Sequence

import aiohttp

from ledgerq.dlt._http import HttpTimeouts, error_message, new_session, post_batch
from ledgerq.dlt.base import (
    CommitEvent,
    LedgerBatchStatus,
    Rejected,
    SubmitResult,
    batch_list_bytes,
)
from ledgerq.dlt.status import check_ids, scabbard_status
from ledgerq.errors import LedgerError

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def scabbard_path(service_id: str) -> str:
    """``circuit::service`` → ``/scabbard/circuit/service``; raises ``LedgerError``."""
    circuit, sep, service = service_id.partition("::")
    if not sep or not _PART.fullmatch(circuit) or not _PART.fullmatch(service):
        raise LedgerError(
            f"service id {service_id!r} is not a Splinter service id; use circuit::service"
        )
    return f"/scabbard/{circuit}/{service}"


class SplinterClient:
    def __init__(
        self,
        base_url: str,
        timeouts: HttpTimeouts | None = None,
        *,
        authorization: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or HttpTimeouts()
        self.description = f"splinter {self.base_url}"
        self._headers = {"Authorization": authorization} if authorization else {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session(self.timeouts)
            self._session.headers.update(self._headers)
        return self._session

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        try:
            path = scabbard_path(service_id)
        except LedgerError as exc:
            return Rejected(400, str(exc))
        url = f"{self.base_url}{path}/batches"
        return await post_batch(
            self.session, url, batch_list_bytes([serialized_batch]), self.timeouts
        )

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        if not batch_ids:
            return ()
        url = f"{self.base_url}{scabbard_path(service_id)}/batch_statuses"
        params = {"ids": ",".join(batch_ids)}
        if wait_s > 0:
            params["wait"] = str(max(1, math.ceil(wait_s)))
        timeout = aiohttp.ClientTimeout(
            total=wait_s + self.timeouts.status_margin, connect=self.timeouts.connect
        )
        try:
            async with self.session.get(url, params=params, timeout=timeout) as resp:
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
            return check_ids([scabbard_status(e) for e in entries], batch_ids)
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"{url} answered a body that is not a status list") from exc

    def events(self) -> AsyncIterator[CommitEvent] | None:
        return None

    def triggers(self) -> AsyncIterator[None] | None:
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
