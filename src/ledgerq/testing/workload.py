"""Keyed intkey workloads and the serial oracle they are judged against.

A :class:`KeyedWorkload` is ``services`` × ``per_service`` intkey batches,
each service spreading its batches over ``names`` names of its own (so only
batches of one service ever touch the same state, the scope the gateway
orders):

* ``mix="chains"``: batch *n* of a service touches one name — name
  ``n % names`` with ``spread="round-robin"``, else the first ``names``
  batches one name each and then a random one; the first batch on a name
  ``set``\\ s it to 0, every later one ``inc``\\ s it by 1. Valid only in
  order per name: a reorder makes an ``inc`` come before the ``set``
  (``INVALID``) or shows in the final value.
* ``mix="random"``: one or two operations per batch on random names of the
  service, ``set``, ``inc`` or ``dec`` with random values: some batches are
  invalid, and which ones depends on the order of everything that touched
  the same names.

:meth:`KeyedWorkload.serial` is the oracle: every service's batches applied
one at a time in acceptance order (what the serial queuer submits), giving
each batch's verdict, each name's final value and per name the order of the
committed batches. A run through the gateway with any strategy must end in
exactly that.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from ledgerq.codec import ParsedBatch, Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.testing.intkey import IntkeyState

COMMITTED, INVALID = "COMMITTED", "INVALID"


@dataclass(frozen=True, slots=True)
class Verdicts:
    """What a serial run ends in."""

    #: batch id -> COMMITTED or INVALID
    statuses: dict[str, str]
    #: name -> final value (names never set are absent)
    values: dict[str, int]
    #: name -> ids of the committed batches that touched it, in commit order
    order: dict[str, list[str]]


@dataclass
class KeyedWorkload:
    services: int
    per_service: int
    names: int = 8
    mix: str = "chains"
    seed: int = 0
    spread: str = "random"
    signer: Signer = field(default_factory=Signer.generate)

    def __post_init__(self) -> None:
        if self.mix not in ("chains", "random"):
            raise ValueError(f"mix must be chains or random, not {self.mix!r}")
        if self.spread not in ("random", "round-robin"):
            raise ValueError(f"spread must be random or round-robin, not {self.spread!r}")
        rng = random.Random(self.seed)
        self.batches: dict[str, list[ParsedBatch]] = {}
        for s in range(self.services):
            seen: set[str] = set()
            out = []
            for n in range(self.per_service):
                if self.mix == "chains":
                    k = n % self.names
                    if self.spread != "round-robin" and n >= self.names:
                        k = rng.randrange(self.names)
                    name = self.name(s, k)
                    op = ("inc", name, 1) if name in seen else ("set", name, 0)
                    seen.add(name)
                    ops = [op]
                else:
                    ops = [
                        (
                            rng.choice(("set", "inc", "inc", "dec")),
                            self.name(s, k),
                            rng.randint(0, 3),
                        )
                        for k in rng.sample(range(self.names), rng.choice((1, 1, 1, 2)))
                    ]
                out.append(make_intkey_batch(self.signer, ops))
            self.batches[self.service_id(s)] = out

    @staticmethod
    def service_id(s: int) -> str:
        return f"circ{s:04d}::svc{s % 97:02d}"

    @staticmethod
    def name(s: int, k: int) -> str:
        return f"s{s:04d}k{k}"

    def all_ids(self) -> list[str]:
        return [b.header_signature for bs in self.batches.values() for b in bs]

    def serial(self) -> Verdicts:
        """The oracle: each service's batches applied one at a time, in order."""
        state = IntkeyState()
        statuses = {}
        for batches in self.batches.values():
            for b in batches:
                statuses[b.header_signature] = INVALID if state.apply(b) else COMMITTED
        return Verdicts(statuses, dict(state.values), {k: list(v) for k, v in state.order.items()})

    async def post(self, session: aiohttp.ClientSession, gateway: str, waves: int = 2) -> None:
        """POST each service's batches in ``waves`` BatchLists, services interleaved."""
        per_wave = -(-self.per_service // waves)
        for w in range(waves):
            sends = []
            for service, bs in self.batches.items():
                chunk = bs[w * per_wave : (w + 1) * per_wave]
                if chunk:
                    sends.append(post_batches(session, gateway, service, chunk))
            await asyncio.gather(*sends)


async def post_batches(
    session: aiohttp.ClientSession, gateway: str, service: str, batches: Sequence[ParsedBatch]
) -> None:
    async with session.post(
        f"{gateway}/batches",
        params={"service_id": service},
        data=encode_batch_list(batches),
        headers={"Content-Type": "application/octet-stream"},
    ) as resp:
        body = await resp.text()
        if resp.status != 202:
            raise AssertionError(f"POST /batches answered {resp.status}: {body}")
