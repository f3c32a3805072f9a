"""The SQLite write gate: stores on one file take turns in the kernel, and a
store waiting for the gate leaves its event loop free."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ledgerq.store.sqlite_gate import WriteGate


async def test_a_second_writer_waits_without_blocking_the_loop_and_goes_on_release(
    tmp_path: Path,
) -> None:
    # Two gates on one file stand for two processes (flock locks belong to
    # the open file, so two opens in one process exclude each other too).
    first, second = WriteGate(str(tmp_path / "db")), WriteGate(str(tmp_path / "db"))
    first.open()
    second.open()
    try:
        release = asyncio.Event()
        order: list[str] = []

        async def hold() -> None:
            async with first.locked():
                order.append("first in")
                await release.wait()
                order.append("first out")

        async def wait_turn() -> None:
            async with second.locked():
                order.append("second in")

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)  # let it take the gate
        waiter = asyncio.create_task(wait_turn())
        # The loop still runs while the second waits: these turns happen.
        for _ in range(5):
            await asyncio.sleep(0)
        assert order == ["first in"] and not waiter.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(holder, waiter), 30)
        assert order == ["first in", "first out", "second in"]
    finally:
        first.close()
        second.close()


async def test_a_cancelled_wait_gives_the_gate_back(tmp_path: Path) -> None:
    first, second = WriteGate(str(tmp_path / "db")), WriteGate(str(tmp_path / "db"))
    first.open()
    second.open()
    try:
        release = asyncio.Event()

        async def hold() -> None:
            async with first.locked():
                await release.wait()

        async def wait_turn() -> None:
            async with second.locked():
                raise AssertionError("cancelled: never enters")

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(wait_turn())
        await asyncio.sleep(0)
        waiter.cancel()
        release.set()
        await asyncio.wait_for(holder, 30)
        await asyncio.gather(waiter, return_exceptions=True)
        # The cancelled waiter's thread got the gate, then gave it back.
        async with asyncio.timeout(30), first.locked():
            pass
    finally:
        first.close()
        second.close()
