"""Client for Splinter's scabbard service.

Grid's ``service_id`` is ``circuit::service``; the scabbard routes are
``POST /scabbard/{circuit}/{service}/batches`` and
``GET /scabbard/{circuit}/{service}/batch_statuses?ids=a,b&wait=N``, whose
entries carry ``{"statusType": ..., "message": [...]}``. Scabbard has no
batch-level event stream; the follower parks a ``wait`` read per pending batch.
A ``Valid`` status (validated, not yet committed) is not final: the follower
follows it until ``Committed`` or ``Invalid``. A 400 is a batch-level
rejection only with scabbard's JSON ``{"message"}`` body; any other 4xx
leaves the batch unjudged.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Sequence

import aiohttp

from ledgerq import jsontext
from ledgerq.errors import LedgerError
from ledgerq.ledgers.base import (
    CommitEvent,
    LedgerBatchStatus,
    Rejected,
    SubmitResult,
    batch_list_bytes,
)
from ledgerq.ledgers.http import (
    HttpSessions,
    HttpTimeouts,
    post_batch,
    read_statuses,
    sawtooth_judged,
)
from ledgerq.ledgers.status import parse_status_list, scabbard_status

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def scabbard_path(service_id: str) -> str:
    """``circuit::service`` → ``/scabbard/circuit/service``; raises ``LedgerError``."""
    circuit, sep, service = service_id.partition("::")
    if not sep or not _PART.fullmatch(circuit) or not _PART.fullmatch(service):
        raise LedgerError(
            f"service id {service_id!r} is not a Splinter service id; use circuit::service"
        )
    return f"/scabbard/{circuit}/{service}"


def scabbard_judged(status: int, body: bytes) -> bool:
    """Scabbard's batch-level rejection: a 400 whose JSON body carries its
    ``message`` (or Sawtooth's rejection codes, as the ledgerq node's scabbard
    routes answer)."""
    if sawtooth_judged(status, body):
        return True
    if status != 400:
        return False
    try:
        doc = jsontext.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("message"), str)


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
        self._sessions = HttpSessions(self.timeouts, authorization)

    @property
    def session(self) -> aiohttp.ClientSession:
        """Submissions' connections."""
        return self._sessions.submit

    @property
    def status_session(self) -> aiohttp.ClientSession:
        """Status reads' connections (parked reads never take a POST's)."""
        return self._sessions.status

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        try:
            path = scabbard_path(service_id)
        except LedgerError as exc:
            return Rejected(400, str(exc))
        url = f"{self.base_url}{path}/batches"
        return await post_batch(
            self.session,
            url,
            batch_list_bytes([serialized_batch]),
            self.timeouts,
            judged=scabbard_judged,
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
        body = await read_statuses(
            self.status_session, "GET", url, wait_s, self.timeouts, params=params
        )
        return parse_status_list(body, url, scabbard_status, batch_ids)

    async def transaction_committed(self, transaction_id: str) -> bool:
        raise LedgerError(
            "a scabbard service cannot be asked about one transaction: a dependency on a "
            f"transaction ledgerq does not track ({transaction_id[:16]}) cannot be checked",
            cause="not supported",
        )

    def events(self) -> AsyncIterator[CommitEvent] | None:
        return None

    def triggers(self) -> AsyncIterator[None] | None:
        return None

    async def close(self) -> None:
        await self._sessions.close()
