"""High availability: gateway instances share services through claims.

* :class:`ClaimManager` — claims, two-phase expiry, fair share and hand-over
  on a shared PostgreSQL database (see :mod:`ledgerq.claims.manager`);
* :class:`ClaimSettings` — their timing, with the trade-offs of each default;
* :class:`SingleInstanceLock` — refuses a second gateway on one SQLite file.

May import: the foundation only; the claims speak SQL to PostgreSQL themselves.
"""

from ledgerq.claims.lock import SingleInstanceLock
from ledgerq.claims.manager import (
    ClaimChange,
    ClaimInfo,
    ClaimManager,
    CycleReport,
    InstanceInfo,
    TakeOverListener,
)
from ledgerq.claims.settings import ClaimSettings, generate_instance_id

__all__ = [
    "ClaimChange",
    "ClaimInfo",
    "ClaimManager",
    "ClaimSettings",
    "CycleReport",
    "InstanceInfo",
    "SingleInstanceLock",
    "TakeOverListener",
    "generate_instance_id",
]
