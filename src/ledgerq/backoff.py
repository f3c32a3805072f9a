"""Capped exponential backoff with jitter, for every retry the gateway makes.

``Backoff(initial_s, max_s).delay(n)`` is the wait before the ``n``-th retry
(``n`` ≥ 1): ``initial_s · 2^(n-1)``, capped at ``max_s``, then jittered.
The default jitter keeps between half and all of it ("equal jitter"), so
many callers failing together spread out without any of them retrying
sooner than half the nominal delay. Tests pass ``jitter=no_jitter``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

Jitter = Callable[[float], float]


def equal_jitter(delay: float) -> float:
    """A uniformly drawn delay between ``delay / 2`` and ``delay``."""
    return delay / 2 + random.uniform(0.0, delay / 2)


def no_jitter(delay: float) -> float:
    return delay


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float
    max_s: float
    jitter: Jitter = equal_jitter

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < self.initial_s:
            raise ValueError(f"backoff needs 0 <= initial ({self.initial_s}) <= max ({self.max_s})")

    def nominal(self, failures: int) -> float:
        """The delay before retry number ``failures``, before jitter."""
        if failures < 1:
            return 0.0
        return float(min(self.max_s, self.initial_s * 2.0 ** min(failures - 1, 60)))

    def delay(self, failures: int) -> float:
        return self.jitter(self.nominal(failures))
