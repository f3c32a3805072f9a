"""Per-service choices: which queuer strategy serves a service, and what an
``Invalid`` batch does to it.

A :class:`PatternMap` gives every service id a value: the first rule whose
pattern matches the id (shell-style, :func:`fnmatch.fnmatchcase`: ``*``,
``?``, ``[...]``), else the default.

* :class:`StrategyMap`: ``serial`` is Grid's one-round serial queuer
  (:mod:`ledgerq.queue.serial`), ``parallel`` the per-key one
  (:mod:`ledgerq.queue.parallel`), ``pipelined`` the serial one whose
  batches that declare their predecessors go out while those are in flight
  (for ledgers that enforce declared dependencies). See ``docs/queuer.md``,
  "Choosing a strategy".
* :class:`OnInvalidMap`: ``continue`` (the seed's rule: the next batch goes
  after an ``Invalid`` one) or ``halt`` (Grid's implicit dependencies on
  order: the service stops at the ``Invalid`` batch until an operator
  resumes it past it). See ``docs/queuer.md``, "Halting on an invalid batch".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, ClassVar, Generic, Self, TypeVar


class _Choice(enum.StrEnum):
    @classmethod
    def parse(cls, value: str) -> Self:
        text = value.strip().lower()
        for member in cls:
            if member.value == text:
                return member
        names = " or ".join(m.value for m in cls)
        raise ValueError(f"{value!r} is not a {cls.__name__.lower()}: use {names}")


class Strategy(_Choice):
    SERIAL = "serial"
    PARALLEL = "parallel"
    PIPELINED = "pipelined"

    @property
    def rounds(self) -> Strategy:
        """The queuer rounds it takes picks from: a pipelined service is
        queued as a serial one (it sends more only from its lane)."""
        return Strategy.PARALLEL if self is Strategy.PARALLEL else Strategy.SERIAL


class OnInvalid(_Choice):
    CONTINUE = "continue"
    HALT = "halt"


E = TypeVar("E", bound=_Choice)


@dataclass(frozen=True)
class PatternMap(Generic[E]):
    """The value of each service id: the first matching rule, else ``default``."""

    #: The enum of the values, and the default's default (its first member).
    kind: ClassVar[type[_Choice]]

    default: E | None = None
    rules: tuple[tuple[str, E], ...] = ()
    _cache: dict[str, E] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.default is None:
            object.__setattr__(self, "default", next(iter(self.kind)))

    @classmethod
    def parse(cls, default: str, rules: str = "") -> Self:
        """``default``: one of the values; ``rules``: ``PATTERN=VALUE`` entries
        separated by commas (``"circuit-07::*=parallel,legacy-*=serial"``).
        Raises ``ValueError`` naming what is wrong."""
        # Values of cls.kind, which is E for a concrete map.
        parsed: list[tuple[str, Any]] = []
        for item in rules.split(","):
            if not item.strip():
                continue
            pattern, sep, value = item.rpartition("=")
            pattern = pattern.strip()
            example = next(iter(cls.kind)).value
            if not sep or not pattern:
                raise ValueError(
                    f"{item.strip()!r} is not PATTERN={cls.kind.__name__.upper()} "
                    f"(e.g. 'circuit-07::*={example}')"
                )
            parsed.append((pattern, cls.kind.parse(value)))
        chosen: Any = cls.kind.parse(default)
        return cls(chosen, tuple(parsed))

    def of(self, service_id: str) -> E:
        found = self._cache.get(service_id)
        if found is None:
            found = next(
                (v for pattern, v in self.rules if fnmatchcase(service_id, pattern)),
                self._default,
            )
            if len(self._cache) < 100_000:
                self._cache[service_id] = found
        return found

    @property
    def _default(self) -> E:
        assert self.default is not None
        return self.default

    def kinds(self) -> frozenset[E]:
        """Every value some service may get."""
        return frozenset([self._default, *(v for _, v in self.rules)])

    @property
    def uniform(self) -> E | None:
        """The value of every service if there is one, else ``None``."""
        if all(v is self.default for _, v in self.rules):
            return self._default
        return None

    def describe(self) -> str:
        """``parallel`` or ``serial; circuit-07::*=parallel`` (for logs and /services)."""
        rules = ", ".join(f"{p}={v.value}" for p, v in self.rules)
        return self._default.value + (f"; {rules}" if rules else "")


@dataclass(frozen=True)
class StrategyMap(PatternMap[Strategy]):
    kind = Strategy


@dataclass(frozen=True)
class OnInvalidMap(PatternMap[OnInvalid]):
    kind = OnInvalid


#: Every service serial: Grid's one-round serial plan.
SERIAL_ONLY = StrategyMap()
#: Every service goes on after an ``Invalid`` batch: the seed's rule.
CONTINUE_ALWAYS = OnInvalidMap()
