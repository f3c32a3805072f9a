"""Decoding and verifying large posted BatchLists in worker processes.

A 10 MiB BatchList costs seconds of CPU to decode and verify (tens of
thousands of secp256k1 signatures). On the event loop that stalls every
request and claim renewal; on threads it still competes with the loop for
the GIL (protobuf parsing holds it), and a few hostile posts at once slow
the whole gateway. So bodies of at least ``pool_bytes`` go to ``slots``
worker **processes** (:class:`ledgerq.procpool.WorkerPool`: started on first
use, dying with the gateway) at a lower scheduling priority
(``decode_priority``, by default ``idle``: ``SCHED_IDLE``): under load the pipeline's own
processes get the CPU first, the decoding waits. More posts than slots wait
their turn, handed round the tenants waiting
(:class:`~ledgerq.ingest.fairness.FairTurns`: one tenant's many posts never
keep another's waiting behind all of them), without blocking anything else; a
post whose client goes away while it waits is dropped when its turn comes
(nothing decoded, nothing stored: the client got no ``202``, so it posts
again if it still means to).
Refusals are the codec's :class:`~ledgerq.errors.InvalidBatchError` either
way, raised in the caller.

A list decoded inline blocks the loop for its whole decode, one on a
thread stalls it less, one in a process least (figures in
docs/BENCHMARKS.md, "Hostile clients").

**Large posts yield to the pipeline** (:class:`Yielding`). ``SCHED_IDLE``
alone does not keep a large post's verification (a second or more of CPU)
from taking the pipeline's time on a small shared machine: the pipeline is a
chain of short wake-ups (event loops, PostgreSQL backends, the ledger) and
each finds a core busy. So a body of at least ``Yielding.bytes`` is verified
in chunks of :data:`CHUNK` batches, and between chunks its worker looks at
a shared value the gateway keeps up to date (every :data:`SAMPLE_S` while
such a post is under way): while the pipeline has work in flight (``busy``:
submissions, batches followed, posts being taken in — and for
:data:`LINGER_S` after), the large posts together take at most
``Yielding.share`` of one core (the worker sleeps after each chunk for as
long as the chunk took, scaled by the share); with a share of 0 they pause
until the pipeline is idle. Never starved: a post paused for
``Yielding.max_wait_s`` in all runs unthrottled to its end. Its client gets
the same answer either way (``202`` or the codec's precise ``400``): nothing
is stored before every signature is verified, nothing is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ledgerq.codec import parse_batch_list
from ledgerq.codec.signing import SignatureCheck, signatures_valid
from ledgerq.errors import InvalidBatchError
from ledgerq.ingest.fairness import FairTurns
from ledgerq.model import TrackingBatch
from ledgerq.procpool import Priority, WorkerPool
from ledgerq.turns import OnePerPass

#: Bodies at least this large are decoded in a worker process (about 100
#: single-transaction batches; below, the round trip costs more than it saves).
POOL_BYTES = 64 * 1024
#: The workers' default scheduling priority (``decode_priority``).
DEFAULT_PRIORITY = Priority.parse("idle")
#: Batches verified between two looks at the pipeline's state: few enough
#: that a pause comes within a few milliseconds of CPU.
CHUNK = 16
#: How often the gateway samples the pipeline's state while a large post is
#: verified (s).
SAMPLE_S = 0.05
#: The pipeline counts as busy this long after it was last seen busy (s): a
#: serial service's next submission follows its commit by a few milliseconds.
LINGER_S = 0.25
#: How often a paused worker (share 0) looks again (s).
POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Yielding:
    """How large posts yield to the pipeline (``decode_yield_*`` settings)."""

    #: Bodies at least this large yield (``decode_yield_bytes``).
    bytes: int = 1024 * 1024
    #: Share of one core the large posts' verification takes in all while
    #: the pipeline is busy; 0 pauses it (``decode_yield_share``).
    share: float = 0.1
    #: The longest a post is paused in all, then it runs unthrottled (s)
    #: (``decode_yield_max_wait_s``).
    max_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.share <= 1:
            raise ValueError(f"a share of one core is 0-1, not {self.share}")
        if self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must not be negative, not {self.max_wait_s}")


class ClientGone(Exception):
    """The client of a waiting post went away: nothing was decoded, nothing is stored."""


class BatchListDecoder:
    def __init__(
        self,
        *,
        max_bytes: int,
        slots: int = 2,
        pool_bytes: int = POOL_BYTES,
        priority: Priority = DEFAULT_PRIORITY,
        yielding: Yielding | None = None,
        busy: Callable[[], bool] = lambda: False,
        verify_thread: bool = False,
    ) -> None:
        """``busy``: whether the pipeline has work in flight now (sampled
        while a large post is verified, see :class:`Yielding`).
        ``verify_thread``: small bodies are parsed and checked on the event
        loop as before, and their signatures verified on a thread of their
        own (:meth:`_decode_small`)."""
        self.max_bytes = max_bytes
        self.slots = slots
        self.pool_bytes = pool_bytes
        self.yielding = yielding or Yielding()
        self.busy = busy
        # Handed fairly among tenants (ledgerq.ingest.fairness).
        self._turns = FairTurns(slots)
        # Large posts take at most slots - 1 of the slots at once (one if there
        # is one): one paused never keeps a smaller pooled post waiting.
        self._large_turns = FairTurns(max(1, slots - 1))
        context = multiprocessing.get_context("spawn")
        # Read by the workers between chunks: the share of a core each may
        # take now (1: no limit); written here only.
        self._share: Any = context.RawValue("d", 1.0)
        # Workers paused right now, and pauses so far (for tests and metrics).
        self._pausing: Any = context.Value("i", 0)
        self._pauses: Any = context.Value("i", 0)
        self.pool = WorkerPool(
            slots,
            priority=priority,
            setup=_setup_worker,
            setup_args=(self._share, self._pausing, self._pauses),
        )
        #: Large posts under verification now.
        self.large = 0
        #: Large posts paused at least once, and those that ran past ``max_wait_s``.
        self.paused_posts = 0
        self.overdue_posts = 0
        self._busy_at = -LINGER_S
        self._sampler: asyncio.Task[None] | None = None
        #: Bodies decoded in the pool (for tests and metrics).
        self.pooled = 0
        #: Bodies dropped because their client left while they waited their turn.
        self.abandoned = 0
        #: Bodies waiting for their turn now.
        self.waiting = 0
        # Small bodies are decoded on the event loop one per pass, in order
        # of arrival: decoded all in one pass, posts arriving together would
        # keep the answers that came meanwhile waiting for all of them, and
        # the first post's insert waiting for the last one's decoding.
        self._inline = OnePerPass()
        self._verifier = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledgerq-verify")
            if verify_thread
            else None
        )
        #: Small bodies whose signatures the thread verified (for tests and metrics).
        self.thread_verified = 0

    @property
    def inline_waits(self) -> int:
        """Small bodies that waited for another's decoding on the loop (for tests)."""
        return self._inline.waits

    async def decode(
        self,
        body: bytes,
        service_id: str | None,
        *,
        gone: Callable[[], bool] = lambda: False,
        tenant: str = "",
    ) -> Sequence[TrackingBatch]:
        """The list's verified batches for ``service_id`` (raises ``InvalidBatchError``).

        ``gone``: whether the client has gone away; checked when the body's
        turn comes, so that a post abandoned while it waited costs no
        decoding (raises :class:`ClientGone`). ``tenant``: whose post it is;
        turns go round the tenants waiting (:class:`~ledgerq.ingest.fairness.FairTurns`)."""
        if len(body) < self.pool_bytes:
            return await self._decode_small(body, service_id)
        large = len(body) >= self.yielding.bytes
        self.waiting += 1
        try:
            if large:
                await self._large_turns.acquire(tenant)
            try:
                await self._turns.acquire(tenant)
            except BaseException:
                if large:
                    self._large_turns.release(tenant)
                raise
        finally:
            self.waiting -= 1
        try:
            if gone():
                self.abandoned += 1
                raise ClientGone("the client went away before its BatchList's turn to be verified")
            self.pooled += 1
            if not large:
                return await self.pool.run(
                    parse_batch_list_in_worker, body, service_id, self.max_bytes
                )
            return await self._decode_yielding(body, service_id)
        finally:
            self._turns.release(tenant)
            if large:
                self._large_turns.release(tenant)

    async def _decode_yielding(
        self, body: bytes, service_id: str | None
    ) -> Sequence[TrackingBatch]:
        self.large += 1
        self.sample()
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.create_task(self._sample_while_large())
        try:
            outcome, paused_s, overdue = await self.pool.run(
                parse_yielding_in_worker, body, service_id, self.max_bytes, self.yielding.max_wait_s
            )
        finally:
            self.large -= 1
        self.paused_posts += paused_s > 0
        self.overdue_posts += overdue
        if isinstance(outcome, InvalidBatchError):
            raise outcome
        return outcome

    def sample(self) -> None:
        """Look at the pipeline now and tell the workers what share they may take."""
        now = time.monotonic()
        if self.busy():
            self._busy_at = now
        if now - self._busy_at < LINGER_S:
            # Shared among the large posts being verified.
            self._share.value = self.yielding.share / max(1, min(self.large, self.slots))
        else:
            self._share.value = 1.0

    async def _sample_while_large(self) -> None:
        while self.large:
            self.sample()
            await asyncio.sleep(SAMPLE_S)
        self._share.value = 1.0

    @property
    def pausing(self) -> int:
        """Workers pausing a large post right now."""
        return int(self._pausing.value)

    @property
    def pauses(self) -> int:
        """Pauses the workers took so far."""
        return int(self._pauses.value)

    async def _decode_small(self, body: bytes, service_id: str | None) -> Sequence[TrackingBatch]:
        """A small body on the event loop, in its turn; with the verifying
        thread, its signatures there.

        About two thirds of a small list's decoding is secp256k1 verification
        (two signatures for a one-transaction batch), which libsecp256k1 does
        without the GIL: on the thread it runs beside the loop, on another
        core. The loop parses and checks everything else first; a list that
        fails anything (a check on the loop, a signature on the thread) is
        decoded again on the loop with every check in the codec's order, so
        its client gets exactly the error a decode in one piece gives. A
        thread rather than a process: nothing to copy, and the GIL is not
        held while it verifies (a thread decoding whole lists, parsing
        included, held it against the loop: docs/BENCHMARKS.md).
        """
        if self._verifier is not None:
            checks: list[SignatureCheck] = []
            with contextlib.suppress(InvalidBatchError):
                batches = await self._inline.run(
                    parse_batch_list, body, service_id, max_bytes=self.max_bytes, verify=checks
                )
                if await self._signatures_valid(self._verifier, checks):
                    self.thread_verified += 1
                    return batches
        return await self._inline.run(parse_batch_list, body, service_id, max_bytes=self.max_bytes)

    @staticmethod
    async def _signatures_valid(verifier: ThreadPoolExecutor, checks: list[SignatureCheck]) -> bool:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                verifier, signatures_valid, checks
            )
        except RuntimeError:  # the decoder closed (the gateway stopping): on the loop
            return signatures_valid(checks)

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        self.pool.close()
        if self._verifier is not None:
            self._verifier.shutdown(wait=False, cancel_futures=True)


def verify_thread_wanted(mode: str, processes: int) -> bool:
    """Whether ``decode_verify_thread = mode`` puts a verifying thread beside
    the loop of a gateway running ``processes`` processes: ``auto`` does when
    the gateway is one process and this process may run on another core
    (with several, each worker already has a core of its own)."""
    if mode != "auto":
        return mode == "on"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return processes == 1 and cores > 1


def parse_batch_list_in_worker(
    body: bytes, service_id: str | None, max_bytes: int
) -> Sequence[TrackingBatch]:
    return parse_batch_list(body, service_id, max_bytes=max_bytes)


# -- in the workers --------------------------------------------------------------

_shared: tuple[Any, Any, Any] | None = None


def _setup_worker(share: Any, pausing: Any, pauses: Any) -> None:
    global _shared
    _shared = (share, pausing, pauses)


def parse_yielding_in_worker(
    body: bytes, service_id: str | None, max_bytes: int, max_wait_s: float
) -> tuple[Sequence[TrackingBatch] | InvalidBatchError, float, bool]:
    """The list's batches (or the codec's refusal), verified in chunks that
    yield (:class:`Pacer`); with the time paused (s) and whether it ran
    past ``max_wait_s``."""
    assert _shared is not None, "a worker of BatchListDecoder's pool"
    share, pausing, pauses = _shared
    pacer = Pacer(lambda: float(share.value), max_wait_s, on_pause=_counter(pausing, pauses))
    outcome: Sequence[TrackingBatch] | InvalidBatchError
    try:
        outcome = parse_batch_list(body, service_id, max_bytes=max_bytes, pace=pacer)
    except InvalidBatchError as exc:
        outcome = exc
    return outcome, pacer.paused_s, pacer.overdue


@contextlib.contextmanager
def _paused(pausing: Any, pauses: Any) -> Any:
    with pausing.get_lock():
        pausing.value += 1
    with pauses.get_lock():
        pauses.value += 1
    try:
        yield
    finally:
        with pausing.get_lock():
            pausing.value -= 1


def _counter(pausing: Any, pauses: Any) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    return lambda: _paused(pausing, pauses)


class Pacer:
    """Called before each batch is verified; every :data:`CHUNK` batches it
    pauses as ``share()`` asks: at a share ``s`` below 1, it sleeps
    ``(1 - s) / s`` times the CPU the chunk took; at 0 it waits until the
    share rises. Once paused ``max_wait_s`` in all it pauses no more
    (``overdue``)."""

    def __init__(
        self,
        share: Callable[[], float],
        max_wait_s: float,
        *,
        on_pause: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        sleep: Callable[[float], None] = time.sleep,
        cpu: Callable[[], float] = time.thread_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.share = share
        self.max_wait_s = max_wait_s
        self.on_pause = on_pause
        self.sleep = sleep
        self.cpu = cpu
        self.clock = clock
        self.paused_s = 0.0
        self.overdue = False
        self._count = 0
        self._mark = cpu()

    def __call__(self) -> None:
        count = self._count
        self._count = count + 1
        if count % CHUNK or self.overdue:
            return
        share = self.share()
        if share < 1:
            used = self.cpu() - self._mark
            with self.on_pause():
                self._pause(share, used)
        self._mark = self.cpu()

    def _pause(self, share: float, used: float) -> None:
        began = self.clock()
        try:
            if share > 0:
                self.sleep(min(used * (1 - share) / share, self.max_wait_s - self.paused_s))
                return
            while share <= 0 and self.paused_s + self.clock() - began < self.max_wait_s:
                self.sleep(min(POLL_S, self.max_wait_s - self.paused_s - (self.clock() - began)))
                share = self.share()
        finally:
            self.paused_s += self.clock() - began
            if self.paused_s >= self.max_wait_s:
                self.overdue = True
