"""Random generic workloads for the ordering machine, and a serial oracle."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ledgerq.node.ordering.machine import OrderingMachine
from ledgerq.node.ordering.messages import (
    ExecutionSummary,
    Program,
    ProgramResult,
    SendLog,
    TransactionAck,
    TransactionCandidate,
    TransactionLabel,
    TxFingerprint,
)


@dataclass(frozen=True)
class Spec:
    """One transaction: reads some keys, may abort, writes a function of what it read.

    Under each of its read prefixes ``rp`` it reads one or two keys, and under
    each of its write prefixes ``wp`` it may write one, each key picked from
    what it read so far among the ``universe`` keys under the prefix and one
    key under it that no other transaction names.
    """

    id: str
    eager: tuple[str, ...]
    lazy: tuple[str, ...]
    will: tuple[str, ...]
    may: tuple[str, ...]
    salt: int
    rp: tuple[str, ...] = ()
    wp: tuple[str, ...] = ()
    universe: tuple[str, ...] = ()


def _num(value: bytes | None) -> int:
    return 0 if value is None else int(value)


def _under(spec: Spec, prefix: str, n: int) -> str:
    keys = [k for k in spec.universe if k.startswith(prefix)]
    keys.append(f"{prefix}z{spec.id}")
    return keys[n % len(keys)]


def program(spec: Spec) -> Program:
    total = spec.salt
    for key in spec.eager:
        total += _num((yield key))
    for key in spec.lazy:
        if total % 2 == 0:  # lazy reads are data-dependent
            total += 3 * _num((yield key))
    for i, prefix in enumerate(spec.rp):
        for j in range(1 + (total + i) % 2):  # so are the keys read under a prefix
            total += 5 * _num((yield _under(spec, prefix, total + j)))
    if total % 5 == 4:
        return ProgramResult(success=False, log=("abort",))
    writes: dict[str, bytes | None] = {k: str(total + i).encode() for i, k in enumerate(spec.will)}
    for i, key in enumerate(spec.may):
        if (total + i) % 3:
            writes[key] = str(total * 7 + i).encode()
    for i, prefix in enumerate(spec.wp):
        if (total + i) % 4:
            writes[_under(spec, prefix, total * 3 + i)] = str(total * 11 + i).encode()
    return ProgramResult(writes=writes, log=(f"total={total}",))


def candidate(spec: Spec) -> TransactionCandidate:
    label = TransactionLabel(
        eager_read=frozenset(spec.eager),
        lazy_read=frozenset(spec.lazy),
        will_write=frozenset(spec.will),
        may_write=frozenset(spec.may),
        read_prefixes=frozenset(spec.rp),
        write_prefixes=frozenset(spec.wp),
    )
    return TransactionCandidate(spec.id, label, lambda: program(spec))


def universe(keys: int) -> tuple[str, ...]:
    """``keys`` names of three letters, in order: many share their first letters."""
    letters = "abcdefgh"
    return tuple(a + b + c for a in letters for b in letters for c in letters)[:keys]


def random_specs(rnd: random.Random, count: int, keys: int, prefixes: bool = False) -> list[Spec]:
    """Transactions over ``keys`` keys; with ``prefixes`` some also declare
    prefixes (of 0 to 3 letters: the empty one covers every key, three
    letters a single name and the keys under it)."""
    names = list(universe(keys)) if prefixes else [f"k{i}" for i in range(keys)]
    specs = []
    for n in range(count):
        touched = rnd.sample(names, rnd.randint(0, min(4, keys)))
        eager, lazy, will, may = [], [], [], []
        for key in touched:
            role = rnd.randrange(6)
            if role == 0:
                eager.append(key)
            elif role == 1:
                lazy.append(key)
            elif role == 2:
                will.append(key)
            elif role == 3:
                may.append(key)
            elif role == 4:
                eager.append(key)
                may.append(key)
            else:
                lazy.append(key)
                will.append(key)
        rp: tuple[str, ...] = ()
        wp: tuple[str, ...] = ()
        if prefixes:
            rp, wp = (
                tuple({rnd.choice(names)[: rnd.randint(0, 3)] for _ in range(rnd.randint(0, 2))})
                for _ in range(2)
            )
        specs.append(
            Spec(
                f"tx{n}",
                tuple(eager),
                tuple(lazy),
                tuple(will),
                tuple(may),
                rnd.randrange(100),
                rp,
                wp,
                tuple(names) if prefixes else (),
            )
        )
    return specs


@dataclass
class Issuer:
    acks: list[TransactionAck] = field(default_factory=list)
    summaries: dict[str, ExecutionSummary] = field(default_factory=dict)
    logs: list[SendLog] = field(default_factory=list)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, TransactionAck):
            self.acks.append(msg)
        elif isinstance(msg, ExecutionSummary):
            key = f"{msg.tx_id}@{msg.fingerprint}"
            assert key not in self.summaries  # one summary per ordering
            self.summaries[key] = msg
        elif isinstance(msg, SendLog):
            self.logs.append(msg)
        else:
            raise TypeError(msg)


def serial(
    specs_in_order: list[Spec],
) -> tuple[dict[str, bytes], dict[str, dict[str, bytes | None]], dict[str, bool]]:
    """The oracle: run each spec alone, in order, against a plain dict."""
    state: dict[str, bytes] = {}
    before: dict[str, dict[str, bytes | None]] = {}
    success: dict[str, bool] = {}
    for spec in specs_in_order:
        # Eager reads are sent whether the code needs them or not.
        seen = before[spec.id] = {k: state.get(k) for k in (*spec.eager, *spec.lazy)}
        gen = program(spec)
        try:
            key = next(gen)
            while True:
                seen[key] = state.get(key)
                key = gen.send(state.get(key))
        except StopIteration as stop:
            result: ProgramResult = stop.value
        success[spec.id] = result.success
        if result.success:
            for k, v in result.writes.items():
                if v is not None:
                    state[k] = v
    return state, before, success


def run_random(machine: OrderingMachine, rnd: random.Random, tick_p: float = 0.1) -> None:
    """Deliver pending messages in a random order, ticking the worker at random."""
    queue: deque[Any] = machine.pending
    while True:
        if queue and rnd.random() >= tick_p:
            i = rnd.randrange(len(queue))
            address, msg = queue[i]
            del queue[i]
            machine.deliver(address, msg)
        elif not machine.worker.tick() and not queue:
            return


def fingerprint_order(issuer: Issuer) -> list[tuple[TxFingerprint, str]]:
    return sorted((a.fingerprint, a.tx_hash) for a in issuer.acks if a.fingerprint is not None)
