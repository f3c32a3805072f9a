"""What the ledger has been answering: problems logged once per burst, shown per service.

The submitter and the follower report every answer to one
:class:`LedgerHealth`: :meth:`LedgerHealth.problem` when the ledger could not
be used (a POST busy, unreachable, refused without judging the batch, or
ambiguous; a status read that failed or came back malformed) and
:meth:`LedgerHealth.ok` when it answered. Per *kind* (``submit``,
``status``) a *burst* is the run of problems between two good answers: its
first problem is logged as a warning with its cause, a different cause within
the burst is logged again, and the first good answer after it logs how many
problems the burst held and how long it lasted. Nothing else is logged, so
a ledger answering 404 to a thousand services writes one line, not a
thousand.

:meth:`LedgerHealth.for_service` gives the open problem of a service (the
last one reported since its last good answer), for ``/services`` and the
dashboard; :meth:`LedgerHealth.snapshot` the bursts, for the dashboard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ledgerq.clock import Clock, now_ms

log = logging.getLogger("ledgerq.ledgers")

KINDS = ("submit", "status")


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str
    cause: str
    message: str
    since: int
    at: int
    count: int

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cause": self.cause,
            "message": self.message,
            "since": self.since,
            "at": self.at,
            "count": self.count,
        }


@dataclass(slots=True)
class _Burst:
    cause: str
    message: str
    since: int
    at: int
    count: int = 1


class LedgerHealth:
    def __init__(self, description: str = "the ledger", *, clock: Clock = now_ms) -> None:
        self.description = description
        self._clock = clock
        self._bursts: dict[str, _Burst] = {}
        self._services: dict[str, Problem] = {}
        self.problems_total: dict[str, int] = dict.fromkeys(KINDS, 0)

    def problem(self, kind: str, service_id: str | None, cause: str, message: str) -> None:
        """The ledger could not be used for ``service_id``; ``cause`` is short and stable
        (``HTTP 404``, ``malformed status body``), ``message`` the details."""
        now = self._clock()
        self.problems_total[kind] = self.problems_total.get(kind, 0) + 1
        burst = self._bursts.get(kind)
        if burst is None:
            self._bursts[kind] = _Burst(cause, message, now, now)
            log.warning("%s: %s (%s); retrying with backoff", self.description, message, kind)
        else:
            burst.count += 1
            burst.at = now
            if burst.cause != cause:
                burst.cause = cause
                log.warning(
                    "%s now: %s (%s); retrying with backoff", self.description, message, kind
                )
            burst.message = message
        if service_id is not None:
            previous = self._services.get(service_id)
            since = previous.since if previous is not None else now
            count = previous.count + 1 if previous is not None else 1
            self._services[service_id] = Problem(kind, cause, message, since, now, count)

    def ok(self, kind: str, service_id: str | None = None) -> None:
        """The ledger answered (whatever it said about the batch)."""
        if service_id is not None and self._services:
            problem = self._services.get(service_id)
            if problem is not None and problem.kind == kind:
                del self._services[service_id]
        burst = self._bursts.pop(kind, None)
        if burst is not None:
            log.info(
                "%s answers again (%s): %d problem%s over %.1f s, the last: %s",
                self.description,
                kind,
                burst.count,
                "" if burst.count == 1 else "s",
                (self._clock() - burst.since) / 1000,
                burst.cause,
            )

    def for_service(self, service_id: str) -> Problem | None:
        return self._services.get(service_id)

    def snapshot(self) -> dict[str, Any]:
        """The open bursts by kind, and how many services have an open problem."""
        return {
            "bursts": {
                kind: {
                    "cause": b.cause,
                    "message": b.message,
                    "since": b.since,
                    "at": b.at,
                    "count": b.count,
                }
                for kind, b in self._bursts.items()
            },
            "services_affected": len(self._services),
            "problems_total": dict(self.problems_total),
        }
