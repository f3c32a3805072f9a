"""What a gateway token lets its holder do: which services, read, write, operate.

A :class:`Scope` is attached to every authenticated request. ``auth.token``
gives :data:`FULL` (every service, read, write and operate); each entry of
``auth.tokens`` gives the scope it was configured with: shell-style patterns
on the service id (``fnmatch``, case-sensitive: ``tenant-a-*``,
``circuit-07::*``) and an access, one of :data:`ACCESS_MODES`:

* ``read``, ``write``, ``read-write``: read and/or post batches;
* ``operate``: pause, resume, skip and cancel (``ledgerq.ingest.control``)
  and read — an operator acts on what it sees (the service's state, its
  batches, its history) — but post nothing.

Without any token configured every request has :data:`FULL`.

Reads of a scoped token see only the services its patterns match; routes
that are not about one service (``/metrics``, the instance-wide counts of
the dashboard) need a scope that :attr:`Scope.sees_everything`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

ACCESS_MODES = ("read", "write", "read-write", "operate")


@dataclass(frozen=True, slots=True)
class Scope:
    name: str = "token"
    services: tuple[str, ...] = ("*",)
    read: bool = True
    write: bool = True
    #: May pause, resume, skip and cancel (operator control of a service).
    operate: bool = True

    def covers(self, service_id: str) -> bool:
        """Whether ``service_id`` is one of this scope's services."""
        return any(fnmatchcase(service_id, p) for p in self.services)

    @property
    def sees_everything(self) -> bool:
        return self.read and "*" in self.services

    @classmethod
    def of(cls, name: str, services: tuple[str, ...], access: str) -> Scope:
        if access not in ACCESS_MODES:
            raise ValueError(f"access {access!r}: use {', '.join(ACCESS_MODES)}")
        return cls(
            name,
            services,
            read=access != "write",
            write=access in ("write", "read-write"),
            operate=access == "operate",
        )


#: The scope of ``auth.token``, and of every request when no token is set.
FULL = Scope("auth.token")
