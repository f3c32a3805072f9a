"""Which queuer strategy serves which service.

A :class:`StrategyMap` gives every service id a :class:`Strategy`: the first
rule whose pattern matches the id (shell-style, :func:`fnmatch.fnmatchcase`:
``*``, ``?``, ``[...]``), else the default. ``serial`` is Grid's
one-round serial queuer (:mod:`ledgerq.queue.serial`), ``parallel`` the
per-key one (:mod:`ledgerq.queue.parallel`). See ``docs/queuer.md``,
"Choosing a strategy".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from fnmatch import fnmatchcase


class Strategy(enum.StrEnum):
    SERIAL = "serial"
    PARALLEL = "parallel"

    @classmethod
    def parse(cls, value: str) -> Strategy:
        text = value.strip().lower()
        for member in cls:
            if member.value == text:
                return member
        raise ValueError(f"{value!r} is not a strategy: use serial or parallel")


@dataclass(frozen=True)
class StrategyMap:
    """The strategy of each service id: the first matching rule, else ``default``."""

    default: Strategy = Strategy.SERIAL
    rules: tuple[tuple[str, Strategy], ...] = ()
    _cache: dict[str, Strategy] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, default: str, rules: str = "") -> StrategyMap:
        """``default``: ``serial`` or ``parallel``; ``rules``: ``PATTERN=STRATEGY``
        entries separated by commas (``"circuit-07::*=parallel,legacy-*=serial"``).
        Raises ``ValueError`` naming what is wrong."""
        parsed: list[tuple[str, Strategy]] = []
        for item in rules.split(","):
            if not item.strip():
                continue
            pattern, sep, strategy = item.rpartition("=")
            pattern = pattern.strip()
            if not sep or not pattern:
                raise ValueError(
                    f"{item.strip()!r} is not PATTERN=STRATEGY (e.g. 'circuit-07::*=parallel')"
                )
            parsed.append((pattern, Strategy.parse(strategy)))
        return cls(Strategy.parse(default), tuple(parsed))

    def of(self, service_id: str) -> Strategy:
        found = self._cache.get(service_id)
        if found is None:
            found = next(
                (s for pattern, s in self.rules if fnmatchcase(service_id, pattern)), self.default
            )
            if len(self._cache) < 100_000:
                self._cache[service_id] = found
        return found

    @property
    def uniform(self) -> Strategy | None:
        """The strategy of every service if there is one, else ``None``."""
        if all(s is self.default for _, s in self.rules):
            return self.default
        return None

    def describe(self) -> str:
        """``parallel`` or ``serial; circuit-07::*=parallel`` (for logs and /services)."""
        rules = ", ".join(f"{p}={s.value}" for p, s in self.rules)
        return self.default.value + (f"; {rules}" if rules else "")


#: Every service serial: Grid's one-round serial plan.
SERIAL_ONLY = StrategyMap()
