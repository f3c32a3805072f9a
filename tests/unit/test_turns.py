"""OnePerPass: pieces of work on the event loop run one per pass, in order."""

from __future__ import annotations

import asyncio

from ledgerq.turns import OnePerPass


async def test_pieces_run_one_per_pass_in_order_of_arrival_and_others_run_between() -> None:
    turns = OnePerPass()
    ran: list[str] = []

    async def other() -> None:
        # Woken by the loop's I/O: it must get in between two pieces.
        for _ in range(3):
            ran.append("other")
            await asyncio.sleep(0)

    pieces = [asyncio.create_task(turns.run(ran.append, f"piece {i}")) for i in range(3)]
    side = asyncio.create_task(other())
    await asyncio.gather(*pieces, side)
    assert [r for r in ran if r.startswith("piece")] == ["piece 0", "piece 1", "piece 2"]
    # Never two pieces back to back while other work is ready.
    assert ran.index("other") < ran.index("piece 1") < ran.index("piece 2")
    first_gap = ran[ran.index("piece 0") + 1 : ran.index("piece 1")]
    assert "other" in first_gap
    assert turns.waits == 2


async def test_a_failing_piece_gives_its_turn_up() -> None:
    turns = OnePerPass()

    def boom() -> None:
        raise ValueError("bad body")

    results = await asyncio.gather(turns.run(boom), turns.run(int, "7"), return_exceptions=True)
    assert isinstance(results[0], ValueError) and results[1] == 7
