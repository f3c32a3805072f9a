"""Time, injected.

Everything time-dependent (delay windows, claim expiry, stale recovery) takes
a ``now`` in integer milliseconds since the Unix epoch, so tests move time by
passing a value instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def now_ms() -> int:
    """Wall-clock time in milliseconds since the Unix epoch (UTC)."""
    return time.time_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.value = start_ms

    def __call__(self) -> int:
        return self.value

    def advance(self, ms: int) -> int:
        self.value += ms
        return self.value
