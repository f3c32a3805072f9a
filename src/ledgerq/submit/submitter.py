"""The submitter (Grid's ``batch_submitter.md``): one batch's POSTs, to an outcome.

:meth:`Submitter.post` POSTs a batch through the
:class:`~ledgerq.ledgers.LedgerClient` (the client resolves the URL per
attempt) until the ledger accepts it, rejects it, answers ambiguously, or
the retries run out, and returns the :class:`Outcome`. It writes nothing
and decides nothing about other batches: the producer
(:mod:`ledgerq.pipeline.producer`) takes the batch before and records the
outcome after.

* ``Busy`` (503/429), ``Unreachable`` and ``Unjudged`` (a 4xx that says
  nothing of the batch: a wrong URL, credentials, a proxy) are retried with
  jittered exponential backoff (honouring ``Retry-After``, capped) up to
  ``max_retries`` times; the last such answer is the outcome.
* ``Accepted``, ``Rejected`` (the ledger judged the batch) and ``Ambiguous``
  (timeout, reset after sending, 5xx other than 503) end at once: an
  ambiguous batch is never resent here.
* Under high availability the submission carries the :class:`Lease` of the
  claim it was taken under. Before **every** attempt, the first included,
  the lease must allow a POST (the claim held, with ``post_margin_ms`` to
  spare); once it does not, no further POST is made and the outcome is
  ``Ambiguous``. Each POST lasts at most the time left on the claim, as
  last renewed: one without an answer by then is abandoned
  (:class:`~ledgerq.ledgers.base.Abandoned`, ambiguous, not a ledger
  problem). Whoever holds the service then asks the ledger before anything
  is resent (``docs/ha.md``, "Safety").

Every answer is reported to the :class:`~ledgerq.ledgers.health.LedgerHealth`,
which logs problems once per burst and shows them per service. After
:meth:`Submitter.stop` a retryable answer ends the submission at once (the
producer drains: the batch is recorded ``Delayed``, not retried).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ledgerq.backoff import Backoff, Jitter, equal_jitter
from ledgerq.errors import ConfigError
from ledgerq.failpoints import failpoint
from ledgerq.ledgers.base import (
    Abandoned,
    Accepted,
    Ambiguous,
    Busy,
    LedgerClient,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
)
from ledgerq.ledgers.health import LedgerHealth
from ledgerq.model import TrackingBatch

Sleep = Callable[[float], Awaitable[None]]


class Lease(Protocol):
    """The claim a submission was taken under (high availability)."""

    def may_post(self) -> bool:
        """Whether another POST attempt may start (held, with margin to spare)."""
        ...

    def left_ms(self) -> int:
        """How long the claim stays valid, as last renewed (0: lapsed or moved on)."""
        ...


@dataclass(frozen=True)
class SubmitterSettings:
    """The ``submitter.*`` keys, with their defaults (:mod:`ledgerq.config`
    checks each value; this class, how they fit together)."""

    #: Concurrent submissions (each its own task and HTTP request).
    slots: int = 256
    #: Retries of a Busy/Unreachable/Unjudged answer before recording Delayed.
    max_retries: int = 5
    backoff_initial_ms: int = 20
    backoff_max_ms: int = 2_000
    #: How long the producer waits for work before asking again (fallback
    #: only: a wake-up hands a service's next batch out at once).
    poll_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise ConfigError(
                f"submitter.backoff_max_ms ({self.backoff_max_ms}) must not be below "
                f"submitter.backoff_initial_ms ({self.backoff_initial_ms})"
            )


#: Answers after which nothing was queued at the ledger: sent again after a backoff.
_RETRIED = (Busy, Unreachable, Unjudged)

#: The outcome of a submission whose claim lapsed before its next attempt: an
#: earlier attempt may have reached the ledger, so it is asked first.
_CLAIM_LAPSING = Ambiguous(
    "this instance's claim on the service is about to lapse; no further attempt was made"
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a submission ended in, after retries."""

    result: SubmitResult
    attempts: int


class Submitter:
    def __init__(
        self,
        ledger: LedgerClient,
        settings: SubmitterSettings | None = None,
        *,
        sleep: Sleep = asyncio.sleep,
        health: LedgerHealth | None = None,
        jitter: Jitter = equal_jitter,
    ) -> None:
        self._ledger = ledger
        self.settings = settings or SubmitterSettings()
        self._sleep = sleep
        self.health = health or LedgerHealth(ledger.description)
        self._jitter = jitter
        self._stopping = False
        #: POSTs abandoned because their claim was about to lapse.
        self.abandoned = 0

    def stop(self) -> None:
        """Retry nothing more: a retryable answer ends its submission at once."""
        self._stopping = True

    async def post(self, batch: TrackingBatch, lease: Lease | None = None) -> Outcome:
        """POST ``batch`` until it is accepted, rejected, ambiguous or out of retries."""
        s = self.settings
        backoff = Backoff(s.backoff_initial_ms / 1000, s.backoff_max_ms / 1000, self._jitter)
        attempts = 0
        while True:
            if lease is not None and not lease.may_post():
                return Outcome(_CLAIM_LAPSING, attempts)
            attempts += 1
            failpoint("before_post")
            result = await self._submit(batch, lease)
            failpoint("after_response")
            self._report(batch.service_id, result)
            if not isinstance(result, _RETRIED) or attempts > s.max_retries or self._stopping:
                return Outcome(result, attempts)
            wait_s = backoff.delay(attempts)
            if isinstance(result, Busy) and result.retry_after_ms is not None:
                wait_s = max(wait_s, result.retry_after_ms / 1000)
            await self._sleep(min(wait_s, backoff.max_s))

    async def _submit(self, batch: TrackingBatch, lease: Lease | None) -> SubmitResult:
        submit = self._ledger.submit(batch.service_id, batch.batch_id, batch.serialized_batch)
        if lease is None:
            return await submit
        budget = lease.left_ms()
        if budget <= 0:
            submit.close()
            return Abandoned("this instance's claim on the service lapsed before the POST")
        try:
            async with asyncio.timeout(budget / 1000):
                return await submit
        except TimeoutError:
            self.abandoned += 1
            return Abandoned(
                f"no answer within the {budget} ms left on this instance's claim on the "
                "service; the POST was abandoned"
            )

    def _report(self, service_id: str, result: SubmitResult) -> None:
        match result:
            case Accepted() | Rejected():
                self.health.ok("submit", service_id)
            case Abandoned():
                # Ended by this instance (its claim lapsing), not the ledger:
                # no ledger problem on the dashboard or /services for it.
                pass
            case Busy(status=status, message=message) | Unjudged(status=status, message=message):
                self.health.problem("submit", service_id, f"HTTP {status}", message)
            case Unreachable(message=message):
                self.health.problem("submit", service_id, "unreachable", message)
            case Ambiguous(message=message, status=status):
                cause = "ambiguous" if status is None else f"HTTP {status}"
                self.health.problem("submit", service_id, cause, message)
