"""The recorder's writes of one batch land in the order they were made."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline_fakes import batch

from ledgerq.clock import ManualClock
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import Committed, Unknown
from ledgerq.record.recorder import Recorder


class SlowStore:
    """Status writes wait for ``release``; every write is logged as it lands."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.landed: list[str] = []

    async def update_batch_status(
        self, id: str, service_id: str, status: Any, *a: Any, **k: Any
    ) -> None:
        await self.release.wait()
        self.landed.append(f"status {status.name.value if status else None} {id}")

    async def change_batch_to_submitted(
        self, batch_id: str, service_id: str, *a: Any, **k: Any
    ) -> None:
        self.landed.append(f"attempt {batch_id}")


async def test_an_unknown_still_in_flight_lands_before_the_next_attempt() -> None:
    # The follower records the ledger's UNKNOWN; before that write lands, the
    # queue hands the batch out again and the submitter records its attempt.
    # Landing after the attempt, the UNKNOWN would clear `submitted` on a batch
    # the ledger is about to hold, and free it for a second, unasked resend.
    store = SlowStore()
    recorder = Recorder(store, clock=ManualClock())  # type: ignore[arg-type]
    a, b = batch("a", 1), batch("b", 1)
    unknown = asyncio.create_task(
        recorder.ledger_status("a", LedgerBatchStatus(a.batch_id, Unknown()))
    )
    await asyncio.sleep(0)
    attempt = asyncio.create_task(recorder.submitting(a))
    other = asyncio.create_task(recorder.submitting(b))  # another batch does not wait
    await asyncio.wait_for(other, 5)
    assert store.landed == [f"attempt {b.batch_id}"]
    await asyncio.sleep(0)
    assert not attempt.done()
    store.release.set()
    await asyncio.wait_for(asyncio.gather(unknown, attempt), 5)
    assert store.landed[1:] == [f"status Unknown {a.batch_id}", f"attempt {a.batch_id}"]
    assert recorder._order == {}  # nothing kept once the writes are done


async def test_a_batch_is_followed_before_its_pending_write_lands_and_answers_wait_for_it() -> None:
    # The status read goes out as the ledger accepts the batch, not once the
    # Pending write landed (a group or two later): on a ledger committing soon
    # after accepting, the read is there before the commit. An answer that
    # comes back first is recorded after that write, once the submission ended.
    store = SlowStore()
    recorder = Recorder(store, clock=ManualClock())  # type: ignore[arg-type]
    followed: list[str] = []
    recorder.add_accept_listener(lambda batch_id, _service: followed.append(batch_id))
    a = batch("a", 1)
    accepting = asyncio.create_task(recorder.accepted(a))
    await asyncio.sleep(0)
    assert followed == [a.batch_id] and store.landed == []
    answer = asyncio.create_task(
        recorder.ledger_status("a", LedgerBatchStatus(a.batch_id, Committed()))
    )
    for _ in range(5):
        await asyncio.sleep(0)
    assert not answer.done() and store.landed == []
    store.release.set()
    await asyncio.wait_for(answer, 5)
    assert accepting.done()
    assert store.landed == [f"status Pending {a.batch_id}", f"status Committed {a.batch_id}"]
    assert recorder._accepting == {}
