"""Claim timing: how fast a dead or paused instance's services move elsewhere.

All durations are integer milliseconds. The defaults aim at failover within
seconds on a LAN next to PostgreSQL:

* ``renew_interval_ms`` (1 s): one claim cycle (maintenance, renew, claim,
  hand over) per interval. Each cycle is four short transactions on a small
  table, so the database load is about four statements a second per instance.
* ``claim_ttl_ms`` (5 s), the first expiry: a holder that has not renewed for
  this long, and has nothing mid-submission on the service, loses the claim
  (fast path). Failover of an idle or between-batches service therefore takes
  at most ``claim_ttl_ms + renew_interval_ms``. Shorter means faster failover
  but less tolerance for a slow database or a garbage-collection pause: an
  instance that misses ``claim_ttl_ms / renew_interval_ms`` renewals in a row
  loses its idle services (safely — fencing stops its writes).
* ``slow_ttl_ms`` (30 s), the second expiry: after this long the claim is
  void whatever the holder was doing. It must exceed the longest a submission
  can take (the submitter's retry budget plus its HTTP timeout), or a slow but
  healthy POST loses its claim; the new holder then asks the ledger about the
  batch (the Unknown path) before resubmitting, so this costs time, never order.
* ``grace_ms`` (2 s): an unclaimed service is first left to instances below
  their fair share; after ``grace_ms`` any instance takes it, so no service
  waits for a claimant longer than ``grace_ms + renew_interval_ms``.
* ``liveness_ms`` (defaults to ``claim_ttl_ms``): an instance whose heartbeat
  is older than this no longer counts toward the fair share.
* ``forget_instance_ms`` (10 min): rows of instances silent this long are
  deleted from ``gateway_instances``.

Clocks: expiries are computed from each instance's clock (injected ``now``),
so the instances' clocks must agree to well within ``claim_ttl_ms`` (NTP).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from ledgerq.errors import ConfigError

MAX_INSTANCE_ID_LENGTH = 128


def generate_instance_id() -> str:
    """A unique id good for one process lifetime: host, pid and a random suffix."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host[:48]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class ClaimSettings:
    """Validated claim timing and identity of one gateway instance."""

    instance_id: str = field(default_factory=generate_instance_id)
    renew_interval_ms: int = 1_000
    claim_ttl_ms: int = 5_000
    slow_ttl_ms: int = 30_000
    grace_ms: int = 2_000
    liveness_ms: int | None = None
    forget_instance_ms: int = 600_000
    #: Attempts per step on serialization failure, deadlock or lost connection.
    max_attempts: int = 8
    #: Upper bound for one database round trip of the claim cycle.
    db_timeout_ms: int = 3_000

    def __post_init__(self) -> None:
        if not self.instance_id or len(self.instance_id) > MAX_INSTANCE_ID_LENGTH:
            raise ConfigError(
                f"instance_id must be 1 to {MAX_INSTANCE_ID_LENGTH} characters, "
                f"got {self.instance_id!r}"
            )
        for key in ("renew_interval_ms", "claim_ttl_ms", "slow_ttl_ms", "db_timeout_ms"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        if self.grace_ms < 0:
            raise ConfigError(f"grace_ms must not be negative, got {self.grace_ms}")
        if self.claim_ttl_ms <= self.renew_interval_ms:
            raise ConfigError(
                f"claim_ttl_ms ({self.claim_ttl_ms}) must exceed renew_interval_ms "
                f"({self.renew_interval_ms}), or claims expire between renewals; "
                "use at least three renewals per TTL"
            )
        if self.slow_ttl_ms < self.claim_ttl_ms:
            raise ConfigError(
                f"slow_ttl_ms ({self.slow_ttl_ms}) must be at least claim_ttl_ms "
                f"({self.claim_ttl_ms}): the second expiry comes after the first"
            )
        if self.liveness_ms is not None and self.liveness_ms <= self.renew_interval_ms:
            raise ConfigError(
                f"liveness_ms ({self.liveness_ms}) must exceed renew_interval_ms "
                f"({self.renew_interval_ms})"
            )
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, got {self.max_attempts}")

    @property
    def effective_liveness_ms(self) -> int:
        return self.claim_ttl_ms if self.liveness_ms is None else self.liveness_ms
