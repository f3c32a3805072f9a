"""Short pieces of CPU work on the event loop, one per pass of the loop.

Requests that arrive together each bring a piece of work done on the loop
itself (decoding a small body, where a round trip to a worker process would
cost more than it saves). Run as they come, a pass of the loop runs all of
them, and every answer that arrived meanwhile (a database's, a status read
from a client) waits for the whole pass. :class:`OnePerPass` runs them in
turn, first come first served, and holds the turn until the loop's next pass,
so the loop reads its sockets and runs what they woke between two pieces.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class OnePerPass:
    """Work that takes turns on the event loop (module doc)."""

    def __init__(self) -> None:
        self._turn = asyncio.Lock()
        #: Pieces that waited for another's turn (for tests).
        self.waits = 0

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in its turn; the next turn comes a pass later."""
        if self._turn.locked():
            self.waits += 1
        async with self._turn:
            result = fn(*args, **kwargs)
            await asyncio.sleep(0)  # the next pass of the loop: its I/O first
            return result
