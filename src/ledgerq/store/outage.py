"""Whether PostgreSQL answers, and how long a request waits for it when not.

A store's requests wait for a pooled connection up to the pool's timeout
(10 s): under load that is a busy pool, worth waiting for. With no primary
answering (the server killed, a standby not yet promoted) it is an outage,
and nothing comes of waiting: :class:`OutageWatch` tells the two apart by
connecting itself, never by a request's failure alone.

* A pooled connection that broke under a statement, or a request waiting
  longer than half the bound for a pooled connection, makes the watch
  *probe*: it opens a session of its own at the store's URL (every host of
  a multi-host URL, for the kind of session it asks for:
  ``target_session_attrs``) within half the bound.
* If no host gives one, the store is **down** (one warning per outage,
  naming every host tried and why each failed): every request waiting for a
  pooled connection fails at once with
  :class:`~ledgerq.errors.StoreOutageError` (the API answers ``503`` and
  logs nothing more: the outage is logged here, once), and so does every
  request made while the store is down. A request therefore waits for the
  store at most ``bound_s`` once no primary answers: half of it before it
  makes the watch probe, the other half for the probe's verdict.
* The probe goes on, ``PROBE_FIRST_PAUSE_S`` doubling to
  ``PROBE_MAX_PAUSE_S``, each pause jittered; its first session ends the
  outage (one line, with how long it lasted) and calls ``on_up``: the pool
  drops the sessions of the lost server and grows at once rather than after
  its own reconnection backoff.

A server that answers with a refusal of its own for too many connections is
up: the pool's sessions still work; only a store no host answers for is
down. The watch runs on one event loop (the store's).

At start-up there is no pool to keep answering: :func:`first_session`
either opens a session, or tries again for the time it was given
(``--wait-for-store``), or fails naming every host and what it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ledgerq.errors import StoreOutageError, StoreUnavailableError
from ledgerq.store.migrate import redact

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The probe's pauses between attempts while the store is down: the first,
#: doubling up to the last, each drawn from its upper half.
PROBE_FIRST_PAUSE_S = 0.1
PROBE_MAX_PAUSE_S = 1.0
#: PostgreSQL's refusal for too many connections: the server answers.
TOO_MANY_CONNECTIONS = "53300"
#: The pauses between attempts of :func:`first_session` (start-up).
START_FIRST_PAUSE_S = 0.25
START_MAX_PAUSE_S = 2.0

Connect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]


def hosts_of(url: str) -> list[tuple[str, str]]:
    """The ``(host, port)`` pairs a connection to ``url`` tries, in order.

    libpq's lists: ``host`` comma-separated, ``port`` one for all or one per
    host (empty: 5432)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return []
    hosts = str(params.get("host") or "localhost").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return [(h or "localhost", p or "5432") for h, p in zip(hosts, ports, strict=False)]


def _reason(exc: BaseException) -> str:
    """libpq's reason for one host, without its preamble."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    reason = first.rsplit("failed: ", 1)[-1]
    if "read-only" in reason or "hot standby" in reason:
        reason += " (a standby, not the primary)"
    return reason


async def host_report(
    url: str, *, timeout_s: float, connect: Connect = psycopg.AsyncConnection.connect
) -> str:
    """Each host of ``url`` tried alone (as the URL asks, read-write or not),
    and what it answered: ``h1:p1: Connection refused; h2:p2: session is
    read-only (a standby, not the primary)``."""
    parts = []
    for host, port in hosts_of(url):
        try:
            async with asyncio.timeout(timeout_s):
                conn = await connect(
                    url, host=host, port=port, connect_timeout=connect_timeout(timeout_s)
                )
            await conn.close()
            outcome = "answers"
        except (psycopg.Error, OSError, TimeoutError) as exc:
            outcome = _reason(exc)
        parts.append(f"{host}:{port}: {outcome}")
    return "; ".join(parts)


async def first_session(
    url: str,
    *,
    wait_s: float,
    timeout_s: float,
    connect: Connect = psycopg.AsyncConnection.connect,
) -> None:
    """Open and close one session at ``url`` (start-up), trying again with
    jittered backoff until ``wait_s`` has passed (``--wait-for-store``);
    then :class:`~ledgerq.errors.StoreUnavailableError` naming every host
    tried and what each answered. ``timeout_s`` bounds each host's attempt."""
    started = time.monotonic()
    pause = START_FIRST_PAUSE_S
    waiting = False
    while True:
        try:
            async with asyncio.timeout(timeout_s * max(1, len(hosts_of(url)))):
                conn = await connect(url, connect_timeout=connect_timeout(timeout_s))
        except (psycopg.Error, OSError, TimeoutError) as exc:
            left = wait_s - (time.monotonic() - started)
            if left <= 0 or not waiting:
                hosts = await host_report(url, timeout_s=timeout_s, connect=connect)
                why = hosts or _reason(exc)
                if left <= 0:
                    waited = f" (waited {wait_s:.0f} s)" if wait_s > 0 else ""
                    raise StoreUnavailableError(
                        f"cannot connect to PostgreSQL at {redact(url)}{waited}: {why}; check "
                        "that the server is up and the URL is right (--wait-for-store SECONDS "
                        "waits for a primary)"
                    ) from exc
                log.warning(
                    "waiting up to %.0f s for PostgreSQL at %s: %s", wait_s, redact(url), why
                )
                waiting = True
            await asyncio.sleep(min(pause * random.uniform(0.5, 1.0), max(left, 0.0)))
            pause = min(pause * 2, START_MAX_PAUSE_S)
            continue
        with contextlib.suppress(psycopg.Error):
            await conn.close()
        if waiting:
            log.info(
                "PostgreSQL at %s answers after %.1f s", redact(url), time.monotonic() - started
            )
        return


def connect_timeout(timeout_s: float) -> int:
    """libpq's ``connect_timeout`` (whole seconds, at least 2)."""
    return max(2, int(-(-timeout_s // 1)))


class OutageWatch:
    """The outage state of one PostgreSQL store (see the module docs)."""

    def __init__(
        self,
        url: str,
        bound_s: float,
        *,
        on_up: Callable[[], Awaitable[None]] | None = None,
        connect: Connect = psycopg.AsyncConnection.connect,
        describe: Callable[[str], str] = redact,
    ) -> None:
        """``describe``: the URL as messages show it (without its password)."""
        self.url = url
        self.bound_s = bound_s
        self._on_up = on_up
        self._connect = connect
        self._describe = describe
        #: time.monotonic() when the current outage was found; None while up.
        self.down_since: float | None = None
        #: Outages found (for tests and diagnostics).
        self.outages = 0
        self._waiting: set[asyncio.Timeout] = set()
        self._probe: asyncio.Task[None] | None = None
        #: When the last probe that found the store up ended (time.monotonic()).
        self._last_up = -float("inf")

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def unavailable(self) -> StoreOutageError:
        return StoreOutageError(
            f"no PostgreSQL primary answers at {self._describe(self.url)} (down for "
            f"{time.monotonic() - (self.down_since or time.monotonic()):.1f} s); retry later"
        )

    async def bounded(self, get: Callable[[], Awaitable[T]]) -> T:
        """``await get()`` (a pooled connection), ended by :meth:`unavailable`
        as soon as the store is found down; :meth:`unavailable` at once if it is."""
        if self.down:
            raise self.unavailable()
        suspect = asyncio.get_running_loop().call_later(self.bound_s / 2, self.suspect)
        try:
            async with asyncio.timeout(None) as timeout:
                self._waiting.add(timeout)
                try:
                    return await get()
                finally:
                    self._waiting.discard(timeout)
        except TimeoutError:
            raise self.unavailable() from None
        finally:
            suspect.cancel()

    def suspect(self) -> None:
        """A connection broke, or a request waited long: probe, unless a
        probe runs or found the store up within the last half bound."""
        if self._probe is not None and not self._probe.done():
            return
        if not self.down and time.monotonic() - self._last_up < self.bound_s / 2:
            return
        self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        pause = PROBE_FIRST_PAUSE_S
        while True:
            failure = await self._try()
            if failure is None:
                self._last_up = time.monotonic()
                if self.down:
                    await self._up()
                return
            if not self.down:
                await self._down(failure)
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, PROBE_MAX_PAUSE_S)

    async def _try(self) -> BaseException | None:
        """None if a session could be opened (or the server answered that it
        has too many), else why not."""
        timeout = self.bound_s / 2
        try:
            async with asyncio.timeout(timeout):
                conn = await self._connect(self.url, connect_timeout=connect_timeout(timeout))
        except psycopg.OperationalError as exc:
            return None if exc.sqlstate == TOO_MANY_CONNECTIONS else exc
        except (psycopg.Error, OSError, TimeoutError) as exc:
            return exc
        with contextlib.suppress(psycopg.Error):
            await conn.close()
        return None

    async def _down(self, failure: BaseException) -> None:
        self.down_since = time.monotonic()
        self.outages += 1
        # Nothing comes of waiting any longer: every request waiting for a
        # pooled connection is answered now.
        now = asyncio.get_running_loop().time()
        for timeout in list(self._waiting):
            timeout.reschedule(now)
        hosts = await host_report(self.url, timeout_s=self.bound_s / 2, connect=self._connect)
        log.warning(
            "PostgreSQL outage: no primary answers at %s (%s); requests answer 503 within "
            "%.1f s until one does",
            self._describe(self.url),
            hosts or _reason(failure),
            self.bound_s,
        )

    async def _up(self) -> None:
        since = self.down_since or time.monotonic()
        self.down_since = None
        log.info(
            "PostgreSQL outage over: a primary answers at %s again after %.1f s",
            self._describe(self.url),
            time.monotonic() - since,
        )
        if self._on_up is not None:
            try:
                async with asyncio.timeout(self.bound_s):
                    await self._on_up()
            except (psycopg.Error, TimeoutError) as exc:
                log.info("refreshing the pool after the outage: %s", exc)

    async def close(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None and not probe.done():
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
