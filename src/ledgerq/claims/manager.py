"""Service claims: which gateway instance works on which service (PostgreSQL).

Each instance runs one :class:`ClaimManager`. Every renewal period it runs a
*claim cycle* of four steps, each its own transaction at SERIALIZABLE
isolation, retried on serialization failure, deadlock or a lost connection:

1. **maintenance** — void other instances' expired claims with the two-phase
   rule: once ``expiry_1`` passed if the service has nothing mid-submission
   (a batch marked submitted and not yet acknowledged by the ledger: status
   None, Unknown or Delayed), once ``expiry_2`` passed whatever it was doing;
2. **renew** — the heartbeat row and every claim the *database* says this
   instance holds (never what it remembers);
3. **claim** — unclaimed services up to the fair share ``ceil(S/K)`` of S
   services among K live instances (heartbeat within ``liveness_ms``), plus
   every service left unclaimed past ``grace_ms`` whatever the share;
4. **hand over** — claims beyond the floor share ``floor(S/K)`` on services
   with nothing in flight, as many as instances below the floor share lack,
   so a newly started instance gets its share within a few periods; claims
   younger than ``liveness_ms`` stay, so nothing bounces between instances;
   then read back what this instance holds.

Claiming a service increments its **epoch**. Writes made for a service carry
the :class:`~ledgerq.model.Fence` (instance id, epoch) returned by
:meth:`ClaimManager.fence_for`; the store applies them only while the claim is
still held at that epoch, so an instance that was paused past its expiry
changes nothing once its claim moved on.

Time is injected: every step takes ``now`` (ms) from the manager's clock and
passes it to the SQL; the database's own clock is never used.

The tables (``gateway_instances``, ``service_id_claims``) come with the
store's PostgreSQL migrations; open the store (which migrates) first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.rows import dict_row

from ledgerq.claims.queries import claim_queries
from ledgerq.claims.settings import ClaimSettings
from ledgerq.clock import Clock, now_ms
from ledgerq.errors import ConfigError, StoreError, StoreUnavailableError
from ledgerq.failpoints import failpoint
from ledgerq.model import Fence

log = logging.getLogger(__name__)

T = TypeVar("T")
Row = dict[str, Any]
Conn = psycopg.AsyncConnection[Row]
#: Called after a cycle with the services gained and the services lost.
ChangeListener = Callable[[frozenset[str], frozenset[str]], None]

_RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)


@dataclass(frozen=True, slots=True)
class HeldClaim:
    service_id: str
    epoch: int
    #: First expiry as last renewed; past it, the claim is not to be acted on.
    expiry_1: int


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    instance_id: str
    started_at: int
    heartbeat_at: int
    address: str | None
    claims: int
    #: Heartbeat within the liveness window (counts toward the fair share).
    live: bool


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    service_id: str
    claimant: str | None
    epoch: int
    expiry_1: int | None
    expiry_2: int | None
    claimed_at: int | None
    unclaimed_since: int | None


@dataclass(frozen=True, slots=True)
class CycleReport:
    now: int
    voided: tuple[str, ...]
    claimed: tuple[str, ...]
    released: tuple[str, ...]
    held: int


class ClaimManager:
    """Claims of one gateway instance on a shared PostgreSQL database.

    Use as ``async with ClaimManager(url, settings) as claims:`` and either
    call :meth:`cycle` yourself (tests pass ``now``) or run :meth:`run` in a
    task group. Leaving the context releases every claim.
    """

    def __init__(
        self,
        url: str,
        settings: ClaimSettings | None = None,
        *,
        clock: Clock = now_ms,
        address: str | None = None,
        on_change: ChangeListener | None = None,
    ) -> None:
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                f"claims need a PostgreSQL database, got {url!r}; "
                "a SQLite store serves a single instance and takes no claims"
            )
        self.url = url
        self.settings = settings or ClaimSettings()
        self._clock = clock
        self._address = address
        self._listeners: list[ChangeListener] = [on_change] if on_change else []
        self._queries = claim_queries("postgresql")
        self._conn: Conn | None = None
        self._held: dict[str, HeldClaim] = {}
        self._wake = asyncio.Event()
        #: When the next foreign claim may expire (ms); run() wakes up for it.
        self.next_expiry: int | None = None
        # One connection, used by one transaction (or read) at a time.
        self._lock = asyncio.Lock()
        self._stopping = False
        #: Transactions retried after a serialization failure or deadlock.
        self.retries = 0

    @property
    def instance_id(self) -> str:
        return self.settings.instance_id

    # -- lifecycle --------------------------------------------------------

    async def __aenter__(self) -> ClaimManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release every claim (best effort) and close the connection."""
        self.stop()
        try:
            await self.release()
        except StoreError as exc:
            log.warning("could not release claims on shutdown: %s", exc)
        await self._drop_connection()

    def stop(self) -> None:
        """Make :meth:`run` return after the current cycle."""
        self._stopping = True
        self._wake.set()

    def wake(self) -> None:
        """Run the next cycle now (e.g. when a new service appeared)."""
        self._wake.set()

    def set_address(self, address: str | None) -> None:
        """Where this instance's API listens; written with the next heartbeat."""
        self._address = address

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    async def run(self) -> None:
        """Run a claim cycle every ``renew_interval_ms`` until :meth:`stop`."""
        while not self._stopping:
            try:
                await self.cycle()
            except StoreError as exc:
                log.warning("claim cycle of %s failed: %s", self.instance_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.pause_ms() / 1000)
            self._wake.clear()

    def pause_ms(self, now: int | None = None) -> int:
        """How long :meth:`run` waits before the next cycle.

        One renewal interval, or less when another instance's claim expires
        sooner: a dead instance's services are then voided as its claims
        expire, not up to an interval later.
        """
        now = self._clock() if now is None else now
        pause = self.settings.renew_interval_ms
        if self.next_expiry is not None:
            pause = min(pause, max(self.next_expiry - now, 0) + 1)
        return pause

    # -- what this instance holds ----------------------------------------

    def held(self, now: int | None = None) -> Mapping[str, HeldClaim]:
        """Claims believed valid at ``now``: held at the last cycle, not yet past expiry_1."""
        now = self._clock() if now is None else now
        return {s: c for s, c in self._held.items() if now < c.expiry_1}

    def claimed_services(self, now: int | None = None) -> frozenset[str]:
        return frozenset(self.held(now))

    def fence_for(self, service_id: str, now: int | None = None) -> Fence | None:
        """The fence to write under for ``service_id``, or None when not (validly) held."""
        claim = self.held(now).get(service_id)
        return None if claim is None else Fence(self.instance_id, claim.epoch)

    def may_post(self, service_id: str, fence: Fence, now: int | None = None) -> bool:
        """Whether a submission taken under ``fence`` may start another POST attempt.

        Only while the claim is still held at that epoch and, as last renewed,
        valid for at least ``post_margin_ms`` more: no attempt starts after
        ``expiry_1 - post_margin_ms``, so none starts once another instance
        may take the service (``docs/ha.md``, "Safety").
        """
        now = self._clock() if now is None else now
        claim = self._held.get(service_id)
        return (
            claim is not None
            and fence == Fence(self.instance_id, claim.epoch)
            and now + self.settings.post_margin_ms < claim.expiry_1
        )

    # -- the claim cycle --------------------------------------------------

    async def cycle(self, now: int | None = None) -> CycleReport:
        """Run maintenance, renew, claim and hand over once, at ``now``.

        Every step is attempted even when an earlier one failed (renewal
        matters most); the first failure is raised at the end.
        """
        failpoint("claim_cycle")
        now = self._clock() if now is None else now
        errors: list[StoreError] = []

        async def step(name: str, fn: Callable[[Conn], Awaitable[T]], default: T) -> T:
            try:
                return await self._transact(name, fn)
            except StoreError as exc:
                errors.append(exc)
                return default

        none: tuple[str, ...] = ()
        voided = await step("maintenance", lambda c: self._maintain(c, now), none)
        await step("renew", lambda c: self._renew(c, now), None)
        claimed = await step("claim", lambda c: self._claim(c, now), none)
        handed = await step("hand over", lambda c: self._hand_over(c, now), None)
        released: tuple[str, ...] = ()
        if handed is not None:
            released, held = handed
            self._set_held(held)
        if errors:
            raise errors[0]
        return CycleReport(now, voided, claimed, released, len(self._held))

    async def release(self, now: int | None = None) -> tuple[str, ...]:
        """Give back every claim and leave the live set (clean shutdown)."""
        now = self._clock() if now is None else now

        async def go(conn: Conn) -> tuple[str, ...]:
            rows = await self._fetch(conn, "release_all", now=now, grace_ms=self.settings.grace_ms)
            await self._exec(conn, "deregister")
            return tuple(sorted(r["service_id"] for r in rows))

        released = await self._transact("release", go)
        self._set_held({})
        return released

    async def register_services(self, service_ids: Iterable[str], now: int | None = None) -> None:
        """Create unclaimed rows for service ids not seen before."""
        now = self._clock() if now is None else now
        ids = sorted(set(service_ids))

        async def go(conn: Conn) -> None:
            await self._exec(conn, "register_services", now=now, service_ids=ids)

        await self._transact("register services", go)
        self.wake()

    # -- visibility --------------------------------------------------------

    async def list_instances(self, now: int | None = None) -> list[InstanceInfo]:
        """Every registered instance, oldest first, with its claim count."""
        now = self._clock() if now is None else now
        live_after = now - self.settings.effective_liveness_ms

        async def go(conn: Conn) -> list[Row]:
            return await self._fetch(conn, "list_instances")

        rows = await self._transact("list instances", go)
        return [
            InstanceInfo(
                r["instance_id"],
                r["started_at"],
                r["heartbeat_at"],
                r["address"],
                r["claims"],
                r["heartbeat_at"] > live_after,
            )
            for r in rows
        ]

    async def claims_for(self, service_ids: Iterable[str]) -> dict[str, ClaimInfo]:
        """The claim rows of ``service_ids`` (services without a row are absent)."""
        ids = sorted(set(service_ids))

        async def go(conn: Conn) -> list[Row]:
            return await self._fetch(conn, "claims_for", service_ids=ids)

        rows = await self._transact("read claims", go)
        return {r["service_id"]: ClaimInfo(**r) for r in rows}

    async def _maintain(self, conn: Conn, now: int) -> tuple[str, ...]:
        rows = await self._fetch(conn, "void_expired", now=now)
        (nxt,) = await self._fetch(conn, "next_foreign_expiry", now=now)
        self.next_expiry = nxt["at"]
        await self._exec(
            conn, "forget_instances", now=now, forget_ms=self.settings.forget_instance_ms
        )
        for r in rows:
            log.info(
                "voided claim on %s held by %s (%s path)",
                r["service_id"],
                r["previous_claimant"],
                "slow" if r["slow_path"] else "fast",
            )
        return tuple(sorted(r["service_id"] for r in rows))

    async def _renew(self, conn: Conn, now: int) -> None:
        await self._exec(conn, "heartbeat", now=now, address=self._address)
        await self._exec(conn, "renew", now=now, **self._ttls())

    async def _claim(self, conn: Conn, now: int) -> tuple[str, ...]:
        rows = await self._fetch(
            conn,
            "claim_share",
            now=now,
            liveness_ms=self.settings.effective_liveness_ms,
            grace_ms=self.settings.grace_ms,
            **self._ttls(),
        )
        return tuple(sorted(r["service_id"] for r in rows))

    async def _hand_over(
        self, conn: Conn, now: int
    ) -> tuple[tuple[str, ...], dict[str, HeldClaim]]:
        rows = await self._fetch(
            conn,
            "hand_over",
            now=now,
            liveness_ms=self.settings.effective_liveness_ms,
            # Keep what was just taken at least as long as a dead instance
            # still counts as live, or it would be handed back and forth.
            min_hold_ms=self.settings.effective_liveness_ms,
        )
        held = await self._fetch(conn, "held")
        claims = {
            r["service_id"]: HeldClaim(r["service_id"], r["epoch"], r["expiry_1"]) for r in held
        }
        return tuple(sorted(r["service_id"] for r in rows)), claims

    def _ttls(self) -> dict[str, int]:
        return {"ttl_ms": self.settings.claim_ttl_ms, "slow_ttl_ms": self.settings.slow_ttl_ms}

    def _set_held(self, held: dict[str, HeldClaim]) -> None:
        before, after = frozenset(self._held), frozenset(held)
        self._held = held
        gained, lost = after - before, before - after
        if gained or lost:
            for listener in self._listeners:
                listener(gained, lost)

    # -- database plumbing -------------------------------------------------

    async def _fetch(self, conn: Conn, name: str, **params: object) -> list[Row]:
        cur = await conn.execute(self._queries[name].encode(), {"me": self.instance_id, **params})
        return await cur.fetchall()

    async def _exec(self, conn: Conn, name: str, **params: object) -> None:
        await conn.execute(self._queries[name].encode(), {"me": self.instance_id, **params})

    async def _transact(self, name: str, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``fn`` in a SERIALIZABLE transaction, retrying what a retry can fix."""
        timeout = self.settings.db_timeout_ms / 1000
        last: Exception | None = None
        for attempt in range(self.settings.max_attempts):
            async with self._lock:
                try:
                    conn = await self._connection()
                    async with asyncio.timeout(timeout), conn.transaction():
                        return await fn(conn)
                except _RETRYABLE as exc:
                    last = exc
                    self.retries += 1
                except TimeoutError:
                    last = TimeoutError(
                        f"no answer within db_timeout_ms ({self.settings.db_timeout_ms} ms): "
                        "a claim row locked by another session, or a slow database"
                    )
                    await self._drop_connection()
                    continue
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    last = exc
                    await self._drop_connection()
                    continue
            # Jittered backoff so competing instances stop colliding.
            await asyncio.sleep(random.uniform(0, 0.005 * 2**attempt))
        raise StoreError(
            f"claim step {name!r} of instance {self.instance_id} failed after "
            f"{self.settings.max_attempts} attempts: {last}; the next cycle retries, "
            "check the database if this repeats"
        ) from last

    async def _connection(self) -> Conn:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        timeout = self.settings.db_timeout_ms / 1000
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    row_factory=dict_row,
                    connect_timeout=max(1, int(timeout)),
                ),
                timeout=timeout,
            )
        except (psycopg.OperationalError, TimeoutError) as exc:
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL for claims: {exc}; check the database URL"
            ) from exc
        await conn.set_isolation_level(psycopg.IsolationLevel.SERIALIZABLE)
        # A paused instance must not keep locks on claim rows past its TTL.
        await conn.execute(
            f"SET idle_in_transaction_session_timeout = {int(self.settings.claim_ttl_ms)}".encode()
        )
        await conn.execute(f"SET statement_timeout = {int(self.settings.db_timeout_ms)}".encode())
        self._conn = conn
        return conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error, TimeoutError):
                await asyncio.wait_for(conn.close(), timeout=self.settings.db_timeout_ms / 1000)
