"""Claim timing: how fast a dead or paused instance's services move elsewhere.

All durations are integer milliseconds, set by the ``claims.*`` keys
(:mod:`ledgerq.config` checks each value; this class checks how they fit
together). The defaults aim at failover within seconds on a LAN next to
PostgreSQL:

* ``renew_interval_ms``: one claim cycle (take-over, maintenance, renew,
  claim, hand over) per interval, each cycle five short transactions on
  small tables.
* ``ttl_ms``, the first expiry: a holder that has not renewed for this long,
  and has nothing mid-submission on the service, loses the claim (fast
  path). Failover of an idle or between-batches service therefore takes at
  most ``ttl_ms + renew_interval_ms``. Shorter means faster failover but
  less tolerance for a slow database or a garbage-collection pause: an
  instance that misses ``ttl_ms / renew_interval_ms`` renewals in a row
  loses its idle services (safely — fencing stops its writes).
* ``slow_ttl_ms`` (0: ``ttl_ms`` + 10 %), the second expiry: a service its
  holder was *mid-submission* on (a batch marked submitted, not yet
  acknowledged by the ledger) is void after this long, whatever the holder
  was doing. It need not cover a whole submission: the holder checks its
  claim before **every** POST attempt (``post_margin_ms`` below), the new
  holder asks the ledger before it resubmits anything (the Unknown path),
  and ledgers de-duplicate batch ids, so a POST still under way when the
  claim moves is the same batch the new holder asks about, executed at most
  once (``docs/ha.md``, "Safety"). The time beyond ``ttl_ms`` lets a POST
  the holder started just before its cut-off reach the ledger before the
  new holder asks about it.
* ``post_margin_ms`` (0: ``ttl_ms`` / 5), the submitter starts a POST
  attempt only while its claim, as last renewed, is valid for at least this
  long: no attempt starts later than ``expiry_1 - post_margin_ms`` on the
  holder's clock, which is ``post_margin_ms + slow_ttl_ms - ttl_ms`` before
  any other instance may take a service mid-submission. Each attempt also
  ends when the claim, as last renewed, lapses (the gateway bounds the POST
  by the time left): no request is under way past ``expiry_1``. It must
  stay below ``ttl_ms - renew_interval_ms`` so a healthy instance, renewing
  every interval, always passes the check.

``slow_ttl_ms`` and ``post_margin_ms`` left at 0 are derived from ``ttl_ms``
as above (so shortening the TTL shortens them too).

* ``grace_ms``: an unclaimed service is first left to instances below their
  fair share; after ``grace_ms`` any instance takes it, so no service waits
  for a claimant longer than ``grace_ms + renew_interval_ms``.
* ``liveness_ms`` (defaults to ``ttl_ms``): an instance whose heartbeat is
  older than this no longer counts toward the fair share.
* ``forget_instance_ms``: rows of instances silent this long, and holding no
  claim, are deleted from ``gateway_instances``.
* ``forget_service_ms``: the claim row of a service with no open batch and
  no batch accepted for this long is deleted (if it is unclaimed or held by
  the instance cleaning up), so idle services stop counting toward the fair
  share and the table does not grow with every service ever seen. Its next
  batch creates the row again. Clean-up runs every ``forget_service_ms /
  10``.

Clocks: expiries are computed from each instance's clock (injected ``now``),
so the instances' clocks must agree to well within ``ttl_ms`` (NTP).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from ledgerq.errors import ConfigError

MAX_INSTANCE_ID_LENGTH = 128


def generate_instance_id() -> str:
    """A unique id good for one process lifetime: host, pid and a random suffix."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host[:48]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ClaimSettings:
    """Validated claim timing and identity of one gateway instance.

    The fields named as a ``claims.*`` key hold that key's default (its
    value range is checked where keys are read); the others are not
    settings a user writes.
    """

    #: Empty: a generated one (:func:`generate_instance_id`).
    instance_id: str = ""
    renew_interval_ms: int = 1_000
    ttl_ms: int = 5_000
    #: 0: ttl_ms + 10 %.
    slow_ttl_ms: int = 0
    #: 0: ttl_ms / 5, at most half of ttl_ms - renew_interval_ms.
    post_margin_ms: int = 0
    grace_ms: int = 2_000
    forget_service_ms: int = 600_000
    liveness_ms: int | None = None
    forget_instance_ms: int = 600_000
    #: Attempts per step on serialization failure, deadlock or lost connection.
    max_attempts: int = 8
    #: Upper bound for one database round trip of the claim cycle.
    db_timeout_ms: int = 3_000

    def __post_init__(self) -> None:
        if not self.instance_id:
            object.__setattr__(self, "instance_id", generate_instance_id())
        if self.slow_ttl_ms == 0:
            object.__setattr__(self, "slow_ttl_ms", self.ttl_ms + self.ttl_ms // 10)
        if self.post_margin_ms == 0:
            spare = max(self.ttl_ms - self.renew_interval_ms, 0)
            object.__setattr__(self, "post_margin_ms", min(self.ttl_ms // 5, spare // 2))
        for key in ("db_timeout_ms", "forget_instance_ms"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        if self.ttl_ms <= self.renew_interval_ms:
            raise ConfigError(
                f"claims.ttl_ms ({self.ttl_ms}) must exceed claims.renew_interval_ms "
                f"({self.renew_interval_ms}), or claims expire between renewals; "
                "use at least three renewals per TTL"
            )
        if self.slow_ttl_ms < self.ttl_ms:
            raise ConfigError(
                f"claims.slow_ttl_ms ({self.slow_ttl_ms}) must be at least claims.ttl_ms "
                f"({self.ttl_ms}): the second expiry comes after the first"
            )
        if self.post_margin_ms >= self.ttl_ms - self.renew_interval_ms:
            raise ConfigError(
                f"claims.post_margin_ms ({self.post_margin_ms}) must be below claims.ttl_ms - "
                f"claims.renew_interval_ms ({self.ttl_ms - self.renew_interval_ms}), or a "
                "healthy instance would refuse to submit between two renewals"
            )
        if self.liveness_ms is not None and self.liveness_ms <= self.renew_interval_ms:
            raise ConfigError(
                f"liveness_ms ({self.liveness_ms}) must exceed claims.renew_interval_ms "
                f"({self.renew_interval_ms})"
            )
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, got {self.max_attempts}")

    @property
    def cleanup_interval_ms(self) -> int:
        """How often the claim rows of idle services are looked for."""
        return max(self.forget_service_ms // 10, self.renew_interval_ms)

    @property
    def effective_liveness_ms(self) -> int:
        return self.ttl_ms if self.liveness_ms is None else self.liveness_ms
