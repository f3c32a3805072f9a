"""The event loop a gateway process runs on: uvloop where it is installed, else asyncio's.

uvloop (libuv under asyncio's API) is an install dependency on CPython for
Linux and macOS. It cuts the gateway's CPU per committed batch: the loop's own
bookkeeping and the socket reads and writes of every ledger request and every
client request are done in C (measured in ``docs/gateway.md``, "CPU per
batch"). ``event_loop = "asyncio"`` (``LEDGERQ_EVENT_LOOP``) keeps the standard
loop, for a platform without uvloop or to rule it out while debugging.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``kind`` names (None: asyncio's default)."""
    if kind == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        log.warning("event_loop = %r, but uvloop is not installed: asyncio's loop runs", kind)
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], kind: str = "uvloop") -> T:
    """``asyncio.run(main)`` on the loop ``kind`` names."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main)
