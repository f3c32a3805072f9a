"""The slow path of a take-over: asking the ledger while the claim is taken.

A service taken over from a dead instance past its second expiry may have a
batch that instance left mid-submission (marked ``submitted``, the ledger's
answer never recorded). Nothing of that service moves before the ledger was
asked about it (``docs/ha.md``, "Safety"). :class:`TakeOverAsks` is the
claim manager's take-over listener (:class:`~ledgerq.claims.TakeOverListener`):

* ``asking`` (the take-over's first statement found those batches; its
  second, which moves the claims, is under way): the ledger is asked at
  once, many ids per ``batch_statuses`` read (all services in one read where
  the ledger's status route does not depend on the service: Sawtooth's
  REST API, the in-process node), the reads in parallel with the claim;
* ``taken`` (the claims moved): the batches of the services now held are
  followed by the :class:`~ledgerq.follow.follower.Follower` (so its own
  scan does not ask again), and once the answers are in they are applied
  together — their writes form one group commit, one store transaction. A
  service not taken (another instance won it, or the take-over failed) has
  its answers dropped: nothing is recorded but under the new claim's fence.

A read that fails, or leaves an id out, leaves that batch to the follower's
own asks (with their backoff). An answer read before the claim committed is
as good as one read after: the reads start once the candidates' second
expiry passed, when no POST of the old holder can be under way any more
(rule 2 of "Safety"), and the follower drops an answer for a batch a
submission of this process took meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

from ledgerq.errors import LedgerError
from ledgerq.follow.follower import Followed, Follower
from ledgerq.ledgers.base import LedgerClient
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.model import BatchStatus

log = logging.getLogger(__name__)

_Answers = dict[str, BatchStatus]


def statuses_span_services(ledger: object) -> bool:
    """Whether one ``batch_statuses`` read may carry the ids of several services.

    Sawtooth's REST API and the in-process node have one status route for
    every batch; Splinter's is per scabbard service, and a client not known
    here is asked per service.
    """
    while True:
        if isinstance(ledger, (SawtoothClient, NodeClient)):
            return True
        inner = getattr(ledger, "inner", None)
        if inner is None:
            return False
        ledger = inner


class TakeOverAsks:
    def __init__(self, ledger: LedgerClient, follower: Follower, *, max_ids: int = 100) -> None:
        self._ledger = ledger
        self._follower = follower
        self._span = statuses_span_services(ledger)
        self._max_ids = max(max_ids, 1)
        #: Per service asked about and not yet decided: its batch ids and the read.
        self._asked: dict[str, tuple[tuple[str, ...], asyncio.Task[_Answers]]] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self._started = 0.0
        #: Batches asked about, and answers applied, so far.
        self.asked = 0
        self.applied = 0

    def asking(self, batches: Mapping[str, tuple[str, ...]]) -> None:
        loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        groups: list[list[tuple[str, str]]] = []
        pairs = [(s, b) for s, ids in batches.items() for b in ids]
        if self._span:
            groups = [pairs[i : i + self._max_ids] for i in range(0, len(pairs), self._max_ids)]
        else:
            for s, ids in batches.items():
                groups += [
                    [(s, b) for b in ids[i : i + self._max_ids]]
                    for i in range(0, len(ids), self._max_ids)
                ]
        self.asked += len(pairs)
        for group in groups:
            task = loop.create_task(self._read(group))
            self._keep(task)
            for s in {s for s, _ in group}:
                self._asked[s] = (batches[s], task)

    def taken(self, services: frozenset[str]) -> None:
        asked, self._asked = self._asked, {}
        reads: set[asyncio.Task[_Answers]] = set()
        pairs: list[tuple[str, str]] = []
        for s, (ids, task) in asked.items():
            if s in services:
                reads.add(task)
                pairs += [(b, s) for b in ids]
        entries = self._follower.adopt(pairs)
        if entries:
            self._keep(asyncio.get_running_loop().create_task(self._apply(entries, reads)))

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _keep(self, task: asyncio.Task[object]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, group: Sequence[tuple[str, str]]) -> _Answers:
        ids = [b for _, b in group]
        try:
            statuses = await self._ledger.batch_statuses(group[0][0], ids)
        except LedgerError as exc:
            log.warning(
                "asking the ledger about %d batches left mid-submission failed: %s; "
                "the follower asks again",
                len(ids),
                exc,
            )
            return {}
        return {s.batch_id: s.status for s in statuses}

    async def _apply(self, entries: Sequence[Followed], reads: set[asyncio.Task[_Answers]]) -> None:
        answers: _Answers = {}
        for read in await asyncio.gather(*reads):
            answers.update(read)
        asked_s = time.monotonic() - self._started
        await self._follower.answered(entries, answers)
        self.applied += len(answers)
        log.info(
            "took over %d batches left mid-submission: the ledger answered in %.0f ms, "
            "recorded %.0f ms later",
            len(entries),
            asked_s * 1000,
            (time.monotonic() - self._started - asked_s) * 1000,
        )
