"""Fair shares of the gateway's bounded resources among tenants.

A tenant is the name of the token a request came with (``auth.token``, or
an ``auth.tokens`` entry's ``name``; without any token, every request is
one tenant). Two kinds of resource are bounded:

* **Places** (:class:`Shares`): parked long-polls (``max_waiters``) and
  status requests queued for a store read. With ``tenants`` tenants
  configured, each is guaranteed ``capacity // tenants`` places; beyond its
  guarantee a tenant borrows free places only while as many stay free as
  the other tenants' unused guarantees. Invariant: the places taken, each
  tenant counted at least at its guarantee, never exceed ``capacity``; so
  a tenant below its guarantee always finds a free place, whatever another
  has taken. With one tenant the whole capacity is its own, as without shares.
* **Turns** (:class:`FairTurns`): the slots that decode large BatchLists,
  a few at a time. A freed turn goes to the waiting tenant granted the
  fewest turns, among those the one served least recently (a tenant never
  served first), its oldest request first. A tenant posting many lists
  waits for its own; another tenant's list waits at most for the turns
  under way.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque


class Shares:
    """``capacity`` places shared among ``tenants`` tenants (module notes)."""

    def __init__(self, capacity: int, tenants: int = 1) -> None:
        self.capacity = capacity
        self.tenants = max(1, tenants)
        self._taken: dict[str, int] = {}
        self.total = 0

    @property
    def guarantee(self) -> int:
        """Places each tenant is sure to find."""
        return self.capacity // self.tenants

    def taken(self, tenant: str) -> int:
        return self._taken.get(tenant, 0)

    def has_room(self, tenant: str) -> bool:
        """Whether :meth:`take` would give ``tenant`` a place now."""
        if self.total >= self.capacity:
            return False
        g = self.guarantee
        if self.taken(tenant) < g:
            return True
        others = sum(min(h, g) for t, h in self._taken.items() if t != tenant)
        # At most tenants - 1 others (more would be tenants not configured).
        unused = max(0, (self.tenants - 1) * g - others)
        return self.total + unused < self.capacity

    def take(self, tenant: str) -> bool:
        """A place for ``tenant`` (True), or none (False, nothing taken)."""
        if not self.has_room(tenant):
            return False
        self._taken[tenant] = self.taken(tenant) + 1
        self.total += 1
        return True

    def give_back(self, tenant: str) -> None:
        left = self.taken(tenant) - 1
        if left > 0:
            self._taken[tenant] = left
        else:
            self._taken.pop(tenant, None)
        self.total -= 1


class FairTurns:
    """``slots`` turns handed to tenants fairly (module notes); an
    ``asyncio.Semaphore`` whose :meth:`acquire` names a tenant."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        #: Tenant → its requests waiting, oldest first (tenants in order of arrival).
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._granted: dict[str, int] = {}
        self._served: dict[str, int] = {}
        self._stamp = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def granted(self, tenant: str) -> int:
        return self._granted.get(tenant, 0)

    async def acquire(self, tenant: str = "") -> None:
        if self.free > 0 and not self._waiting:
            self.free -= 1
            self._grant(tenant)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.setdefault(tenant, deque())
        queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(tenant)  # granted as it was cancelled: pass the turn on
            elif future in queue:
                queue.remove(future)
                if not queue and self._waiting.get(tenant) is queue:
                    del self._waiting[tenant]
            raise

    def release(self, tenant: str = "") -> None:
        left = self.granted(tenant) - 1
        if left > 0:
            self._granted[tenant] = left
        else:
            self._granted.pop(tenant, None)
        while self._waiting:
            # The fewest turns granted, then the least recently served (never: first).
            nxt = min(self._waiting, key=lambda t: (self.granted(t), self._served.get(t, -1)))
            queue = self._waiting[nxt]
            future = queue.popleft()
            if not queue:
                del self._waiting[nxt]
            if not future.done():  # else cancelled, its task not yet told
                self._grant(nxt)
                future.set_result(None)
                return
        self.free += 1

    def _grant(self, tenant: str) -> None:
        self._granted[tenant] = self.granted(tenant) + 1
        self._served[tenant] = next(self._stamp)
