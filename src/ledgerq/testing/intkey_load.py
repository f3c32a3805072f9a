"""The ``intkey load`` shape: intkey batches with cross-batch dependencies, posted
out of dependency order by concurrent posters.

sawtooth-sdk-python's ``intkey create_batch -K keys -c count -B size`` writes
one batch that ``set``\\ s ``keys`` names, then ``count`` batches of 1 to
``size`` transactions, each an ``inc`` or ``dec`` of 1 to 10 on a random
name, depending on the transaction that ``set`` that name; ``intkey load``
posts them in lists of 100 from five threads. An :class:`IntkeyLoad` is that
per service, over ``services`` services with names of their own:

* ``shape="star"`` (``create_batch``): per service one ``set`` batch of
  ``keys`` names (values 9,000 to 100,000), then ``per_service - 1`` batches
  whose every transaction depends on its name's ``set``;
* ``shape="chain"``: per service one name, ``set`` to 0 by the first batch;
  batch *n* ``inc``\\ s it by 1 and depends on batch *n − 1*'s transaction.
  With ``invalid_at``, the first service's batch of that number is instead a
  ``dec`` its name cannot take: ``INVALID`` wherever it lands, and the batches
  after it, which depend on it, can never commit (:attr:`IntkeyLoad.invalid`,
  :attr:`IntkeyLoad.doomed`).

:meth:`IntkeyLoad.post` sends them in a seeded shuffle (each service's first
batch sent is never its ``set`` batch, so every service's batches arrive out
of dependency order), in lists of at most ``per_post`` batches of one service,
from ``posters`` concurrent posters; to a gateway (``?service_id=``) or
straight to a ledger. With ``in_order`` it sends each service's batches in
the order they were made instead, a service's lists one after the other (a
client that chains its batches as it makes them). Every batch of both shapes
is valid in any order that puts each after its dependencies:
:meth:`IntkeyLoad.judge` checks a run (every batch committed but the invalid
one and those after it, each after the batches it depends on) and
:attr:`IntkeyLoad.values` gives each name's final value.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from ledgerq.codec import ParsedBatch, Signer, encode_batch_list, make_batch
from ledgerq.codec.intkey import MAX_VALUE, make_intkey_transaction
from ledgerq.testing.intkey import parse_op

SHAPES = ("star", "chain")


@dataclass
class IntkeyLoad:
    services: int
    per_service: int
    shape: str = "star"
    #: Names per service (``create_batch -K``; a chain has one).
    keys: int = 5
    #: Most transactions in a batch (``create_batch -B``; a chain's have one).
    max_batch_size: int = 10
    seed: int = 0
    #: Chain only: the first service's batch of this number (1 or more) is a
    #: ``dec`` its name cannot take (module docstring); ``None``: none.
    invalid_at: int | None = None
    #: Names are ``f"{tag}{service}k{key}"``: a tag per load keeps runs on one
    #: ledger apart (at most 20 characters in all).
    tag: str = "d"
    signer: Signer = field(default_factory=Signer.generate)

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, not {self.shape!r}")
        if self.services < 1 or self.per_service < 2 or self.keys < 1 or self.max_batch_size < 1:
            raise ValueError("need services ≥ 1, per_service ≥ 2, keys ≥ 1, max_batch_size ≥ 1")
        if self.invalid_at is not None and (
            self.shape != "chain" or not 1 <= self.invalid_at < self.per_service
        ):
            raise ValueError("invalid_at needs the chain shape and 1 ≤ invalid_at < per_service")
        rng = random.Random(self.seed)
        #: Service id -> its batches, in the order they were made (dependencies first).
        self.batches: dict[str, list[ParsedBatch]] = {}
        #: Batch id -> the ids of the batches carrying the transactions it depends on.
        self.depends_on: dict[str, frozenset[str]] = {}
        #: Name -> its value once every batch has committed.
        self.values: dict[str, int] = {}
        #: The batch made INVALID (``invalid_at``), and the batches after it.
        self.invalid: frozenset[str] = frozenset()
        self.doomed: frozenset[str] = frozenset()
        for s in range(self.services):
            make = self._star if self.shape == "star" else self._chain
            self.batches[self.service_id(s)] = make(s, rng)
        self.service_of = {b.header_signature: s for s, bs in self.batches.items() for b in bs}

    @staticmethod
    def service_id(s: int) -> str:
        return f"load{s:04d}"

    def name(self, s: int, k: int) -> str:
        return f"{self.tag}{s}k{k}"

    @property
    def total(self) -> int:
        return self.services * self.per_service

    def all_ids(self) -> list[str]:
        return [b.header_signature for bs in self.batches.values() for b in bs]

    def _star(self, s: int, rng: random.Random) -> list[ParsedBatch]:
        names = [self.name(s, k) for k in range(self.keys)]
        sets = {
            n: make_intkey_transaction(self.signer, "set", n, rng.randint(9000, 100_000))
            for n in names
        }
        populate = make_batch(self.signer, list(sets.values()))
        self.depends_on[populate.header_signature] = frozenset()
        # Each name's lowest and highest value over every order: a dec or inc
        # that could leave intkey's range in some order is turned round, so
        # that every order putting the set first is valid.
        low, high = {}, {}
        for n in names:
            self.values[n] = low[n] = high[n] = parse_op(sets[n].payload).value
        out = [populate]
        for _ in range(self.per_service - 1):
            txs = []
            for _ in range(rng.randint(1, self.max_batch_size)):
                n = rng.choice(names)
                verb, value = rng.choice(("inc", "dec")), rng.randint(1, 10)
                if verb == "dec" and low[n] - value < 0:
                    verb = "inc"
                elif verb == "inc" and high[n] + value > MAX_VALUE:
                    verb = "dec"
                if verb == "inc":
                    high[n] += value
                else:
                    low[n] -= value
                self.values[n] += value if verb == "inc" else -value
                txs.append(
                    make_intkey_transaction(
                        self.signer, verb, n, value, dependencies=[sets[n].header_signature]
                    )
                )
            b = make_batch(self.signer, txs)
            self.depends_on[b.header_signature] = frozenset({populate.header_signature})
            out.append(b)
        return out

    def _chain(self, s: int, rng: random.Random) -> list[ParsedBatch]:
        n = self.name(s, 0)
        previous = make_batch(self.signer, [make_intkey_transaction(self.signer, "set", n, 0)])
        self.depends_on[previous.header_signature] = frozenset()
        out = [previous]
        bad = self.invalid_at if s == 0 else None
        for i in range(1, self.per_service):
            # A dec past the name's value: INVALID whatever was committed before.
            verb, value = ("dec", self.per_service + 1) if i == bad else ("inc", 1)
            tx = make_intkey_transaction(
                self.signer, verb, n, value, dependencies=list(previous.transaction_ids)
            )
            b = make_batch(self.signer, [tx])
            self.depends_on[b.header_signature] = frozenset({previous.header_signature})
            out.append(b)
            previous = b
        self.values[n] = (bad or self.per_service) - 1
        if bad is not None:
            self.invalid = frozenset({out[bad].header_signature})
            self.doomed = frozenset(b.header_signature for b in out[bad + 1 :])
        return out

    def expected(self) -> dict[str, str]:
        """Each batch's final status as a client reads it: ``COMMITTED``, or
        ``INVALID`` for the invalid batch and those after it (a gateway fails
        them: they depend on it)."""
        return {
            b: "INVALID" if b in self.invalid or b in self.doomed else "COMMITTED"
            for b in self.all_ids()
        }

    # -- sending -------------------------------------------------------------

    def posts(
        self, per_post: int = 100, *, in_order: bool = False
    ) -> list[tuple[str, list[ParsedBatch]]]:
        """The lists to post, in the order they are handed to the posters:
        ``(service id, batches)``, each service's batches in a seeded shuffle
        whose first is never the service's first batch (its ``set``), or
        ``in_order``: in the order they were made."""
        rng = random.Random(self.seed + 1)
        lists: list[tuple[str, list[ParsedBatch]]] = []
        for service, batches in self.batches.items():
            order = list(batches)
            if not in_order:
                rng.shuffle(order)
            if not in_order and order[0] is batches[0]:
                swap = rng.randrange(1, len(order))
                order[0], order[swap] = order[swap], order[0]
            lists += [(service, order[i : i + per_post]) for i in range(0, len(order), per_post)]
        # Services' lists interleaved, each service's kept in its shuffled order.
        by_service: dict[str, list[list[ParsedBatch]]] = {}
        for service, chunk in lists:
            by_service.setdefault(service, []).append(chunk)
        out: list[tuple[str, list[ParsedBatch]]] = []
        while by_service:
            for service in list(by_service):
                out.append((service, by_service[service].pop(0)))
                if not by_service[service]:
                    del by_service[service]
        return out

    async def post(
        self,
        session: aiohttp.ClientSession,
        url: str,
        *,
        posters: int = 5,
        per_post: int = 100,
        gateway: bool = True,
        in_order: bool = False,
    ) -> dict[str, float]:
        """POST every batch (module docstring); returns when each was accepted
        (``time.monotonic``). A 429 or 503 is retried after a backoff; any other
        answer but 202 raises. ``in_order``: each service's batches in the order
        made, its lists posted one after the other by one poster."""
        # What a poster takes at a time: one list, or (in order) a service's lists.
        todo: asyncio.Queue[list[tuple[str, list[ParsedBatch]]]] = asyncio.Queue()
        posts = self.posts(per_post, in_order=in_order)
        if in_order:
            by_service: dict[str, list[tuple[str, list[ParsedBatch]]]] = {}
            for service, chunk in posts:
                by_service.setdefault(service, []).append((service, chunk))
            for lists in by_service.values():
                todo.put_nowait(lists)
        else:
            for item in posts:
                todo.put_nowait([item])
        accepted: dict[str, float] = {}

        async def poster() -> None:
            while not todo.empty():
                for service, batches in todo.get_nowait():
                    params = {"service_id": service} if gateway else None
                    await _post_list(session, url, encode_batch_list(batches), params)
                    now = time.monotonic()
                    accepted.update((b.header_signature, now) for b in batches)

        await asyncio.gather(*(poster() for _ in range(posters)))
        return accepted

    # -- judging -------------------------------------------------------------

    def judge(self, statuses: Mapping[str, str], commit_order: Mapping[str, int]) -> list[str]:
        """What went wrong in a run, in words (empty: nothing): batches not
        COMMITTED (but the invalid one and those after it), the invalid one not
        judged INVALID, those after it committed, and batches committed before
        a batch they depend on. ``statuses``: batch id -> final status read;
        ``commit_order``: batch id -> its place in the ledger's commit order
        (any increasing numbers)."""
        problems = []
        fails = self.invalid | self.doomed
        not_committed = [
            b for b in self.all_ids() if b not in fails and statuses.get(b) != "COMMITTED"
        ]
        if not_committed:
            seen: dict[str, int] = {}
            for b in not_committed:
                status = statuses.get(b, "no status")
                seen[status] = seen.get(status, 0) + 1
            kinds = ", ".join(f"{n} {s}" for s, n in sorted(seen.items()))
            problems.append(
                f"{len(not_committed)} of {self.total - len(fails)} not COMMITTED ({kinds})"
            )
        if any(statuses.get(b) != "INVALID" for b in self.invalid):
            problems.append("the invalid batch not judged INVALID")
        after = sum(1 for b in self.doomed if statuses.get(b) == "COMMITTED")
        if after:
            problems.append(f"{after} committed after the INVALID batch they depend on")
        early = [
            b
            for b, deps in self.depends_on.items()
            if b in commit_order
            and any(d not in commit_order or commit_order[d] > commit_order[b] for d in deps)
        ]
        if early:
            problems.append(f"{len(early)} committed before a batch they depend on")
        return problems


async def _post_list(
    session: aiohttp.ClientSession, url: str, body: bytes, params: dict[str, str] | None
) -> None:
    backoff = 0.01
    while True:
        async with session.post(
            f"{url}/batches",
            params=params,
            data=body,
            headers={"Content-Type": "application/octet-stream"},
        ) as resp:
            text = await resp.text()
            if resp.status in (429, 503):
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            if resp.status != 202:
                raise RuntimeError(f"POST {url}/batches answered {resp.status}: {text[:300]}")
            return
