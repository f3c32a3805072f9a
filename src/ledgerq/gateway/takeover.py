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
  REST API, the in-process node), the reads in parallel with the claim. On
  an HTTP ledger they run on the claim thread's loop with a client of their
  own (the gateway's loop is busy with the services just taken over: the
  reads took 0.3-0.75 s there in ``bench failover``);
* ``taken`` (the claims moved): the batches of the services now held are
  followed by the :class:`~ledgerq.follow.follower.Follower` (so its own
  scan does not ask again), and once the answers are in they are applied
  together — their writes form one group commit, one store transaction,
  flushed at once beside the groups under way
  (:func:`ledgerq.store.group.urgent`). A service not taken (another
  instance won it, or the take-over failed) has its answers dropped:
  nothing is recorded but under the new claim's fence.

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
from collections.abc import Callable, Mapping, Sequence

from ledgerq.config import Settings
from ledgerq.errors import LedgerError
from ledgerq.follow.follower import Followed, Follower
from ledgerq.ledgers import HttpTimeouts, http_ledger_client
from ledgerq.ledgers.base import LedgerClient
from ledgerq.ledgers.inprocess import NodeClient
from ledgerq.ledgers.sawtooth import SawtoothClient
from ledgerq.model import BatchStatus
from ledgerq.store.group import urgent

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


def ledger_reader(settings: Settings) -> Callable[[], LedgerClient] | None:
    """Makes a client of the gateway's ledger for the calling event loop
    (None for the in-process node, which lives on the gateway's loop)."""
    if settings.ledger == "node":
        return None

    def make() -> LedgerClient:
        timeouts = HttpTimeouts(
            connect=settings["ledger_timeout.connect_s"],
            submit=settings["ledger_timeout.submit_s"],
            lean=settings["ledger_client"] == "lean",
        )
        return http_ledger_client(settings.ledger, timeouts, token=settings["ledger_token"])

    return make


class TakeOverAsks:
    def __init__(
        self,
        ledger: LedgerClient,
        follower: Follower,
        *,
        max_ids: int = 100,
        reader: Callable[[], LedgerClient] | None = None,
    ) -> None:
        """``reader``: makes a client of the same ledger for another event
        loop (an HTTP ledger): the claim thread then reads on its own loop,
        not on the gateway's, busy with the services just taken over."""
        self._ledger = ledger
        self._follower = follower
        self._reader = reader
        self._span = statuses_span_services(ledger)
        self._max_ids = max(max_ids, 1)
        try:
            self._home: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._home = None
        #: Per service asked about and not yet decided (the gateway's loop
        #: only): its batch ids, the read that answers them, when it started.
        self._asked: dict[str, tuple[tuple[str, ...], asyncio.Future[_Answers], float]] = {}
        self._tasks: set[asyncio.Future[object]] = set()
        #: When the last read ended (time.monotonic(), whatever the thread).
        self._read_at = 0.0
        #: Batches asked about, and answers applied, so far.
        self.asked = 0
        self.applied = 0

    def asking(self, batches: Mapping[str, tuple[str, ...]]) -> None:
        """Called where the claim cycle runs (the claim thread): starts the reads."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        groups = self._groups(batches)
        home = self._home
        if home is None or loop is home:
            self._note(batches, self._read_here(groups), started)
        elif self._reader is not None:
            done = asyncio.run_coroutine_threadsafe(self._read_apart(groups), loop)
            home.call_soon_threadsafe(
                lambda: self._note(batches, asyncio.wrap_future(done), started)
            )
        else:
            home.call_soon_threadsafe(lambda: self._note(batches, self._read_here(groups), started))

    def taken(self, services: frozenset[str]) -> None:
        """Called on the gateway's loop once the take-over ended."""
        asked, self._asked = self._asked, {}
        reads: set[asyncio.Future[_Answers]] = set()
        pairs: list[tuple[str, str]] = []
        started = time.monotonic()
        for s, (ids, read, began) in asked.items():
            if s in services:
                reads.add(read)
                pairs += [(b, s) for b in ids]
                started = min(started, began)
        entries = self._follower.adopt(pairs)
        if entries:
            wanted = frozenset(b for b, _ in pairs)
            times = (started, time.monotonic())
            self._keep(asyncio.ensure_future(self._apply(entries, wanted, reads, times)))

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _groups(self, batches: Mapping[str, tuple[str, ...]]) -> list[list[tuple[str, str]]]:
        """(service, batch id) pairs per read: many services in one where the ledger allows."""
        step = self._max_ids
        if self._span:
            pairs = [(s, b) for s, ids in batches.items() for b in ids]
            return [pairs[i : i + step] for i in range(0, len(pairs), step)]
        return [
            [(s, b) for b in ids[i : i + step]]
            for s, ids in batches.items()
            for i in range(0, len(ids), step)
        ]

    def _note(
        self, batches: Mapping[str, tuple[str, ...]], read: asyncio.Future[_Answers], began: float
    ) -> None:
        self._keep(read)  # type: ignore[arg-type]
        self.asked += sum(len(ids) for ids in batches.values())
        for s, ids in batches.items():
            self._asked[s] = (ids, read, began)

    def _keep(self, task: asyncio.Future[object]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _read_here(self, groups: list[list[tuple[str, str]]]) -> asyncio.Future[_Answers]:
        return asyncio.ensure_future(self._read_all(self._ledger, groups))

    async def _read_apart(self, groups: list[list[tuple[str, str]]]) -> _Answers:
        """The reads on this (the claim thread's) loop, with a client of its own."""
        assert self._reader is not None
        client = self._reader()
        try:
            return await self._read_all(client, groups)
        finally:
            await client.close()

    async def _read_all(
        self, ledger: LedgerClient, groups: list[list[tuple[str, str]]]
    ) -> _Answers:
        answers: _Answers = {}
        for read in await asyncio.gather(*(self._read(ledger, g) for g in groups)):
            answers.update(read)
        self._read_at = time.monotonic()
        return answers

    async def _read(self, ledger: LedgerClient, group: Sequence[tuple[str, str]]) -> _Answers:
        ids = [b for _, b in group]
        try:
            statuses = await ledger.batch_statuses(group[0][0], ids)
        except LedgerError as exc:
            log.warning(
                "asking the ledger about %d batches left mid-submission failed: %s; "
                "the follower asks again",
                len(ids),
                exc,
            )
            return {}
        return {s.batch_id: s.status for s in statuses}

    async def _apply(
        self,
        entries: Sequence[Followed],
        ids: frozenset[str],
        reads: set[asyncio.Future[_Answers]],
        times: tuple[float, float],
    ) -> None:
        """``times``: when the take-over began, when this loop heard it ended."""
        began, heard = times
        answers: _Answers = {}
        for read in await asyncio.gather(*reads, return_exceptions=True):
            if isinstance(read, dict):
                answers.update((b, status) for b, status in read.items() if b in ids)
        answered = time.monotonic()
        # Recorded in a group of their own, not behind the writes under way.
        with urgent():
            await self._follower.answered(entries, answers)
        self.applied += len(answers)
        # Where the time goes between a take-over and the first write
        # (docs/ha.md, "Settings and failover time").
        log.info(
            "took over %d batches left mid-submission: after the take-over began, the ledger's "
            "answers were read in %.0f ms, the gateway's loop heard of the claims at %.0f ms "
            "and had the answers at %.0f ms; recorded %.0f ms after that",
            len(entries),
            (self._read_at - began) * 1000,
            (heard - began) * 1000,
            (answered - began) * 1000,
            (time.monotonic() - answered) * 1000,
        )
