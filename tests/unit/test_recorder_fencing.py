"""The recorder under high availability: every write carries the fence its
submission was taken under; nothing is written for a service not held."""

from __future__ import annotations

import pytest

from ledgerq.errors import FencedOffError
from ledgerq.ledgers.base import LedgerBatchStatus
from ledgerq.model import BatchStatusName, Committed, Fence
from ledgerq.record.recorder import Recorder
from tests.pipeline_fakes import MemoryPipelineStore, batch


async def test_without_claims_writes_carry_no_fence() -> None:
    store = MemoryPipelineStore()
    b = batch("s", 1)
    store.add(b)
    recorder = Recorder(store)
    await recorder.submitting(b)
    await recorder.accepted(b)
    assert store.fences == [None, None]


async def test_a_submission_writes_under_the_fence_it_was_taken_under() -> None:
    store = MemoryPipelineStore()
    b1, b2 = batch("s", 1), batch("s", 2)
    store.add(b1, b2)
    held = {"s": Fence("me", 1)}
    recorder = Recorder(store, fences=held.get)
    await recorder.submitting(b1)
    # Meanwhile the claim moved away and came back under a new epoch.
    held["s"] = Fence("me", 3)
    store.refused.add(Fence("me", 1))
    with pytest.raises(FencedOffError):
        await recorder.accepted(b1)
    assert store.fences == [Fence("me", 1), Fence("me", 1)]
    assert store.batches[b1.batch_id].status_name is None
    # A new submission acts under the new epoch.
    await recorder.submitting(b2)
    await recorder.delayed(b2, "busy")
    assert store.fences[-2:] == [Fence("me", 3), Fence("me", 3)]
    assert store.batches[b2.batch_id].status_name is BatchStatusName.DELAYED


async def test_nothing_is_written_for_a_service_not_held() -> None:
    store = MemoryPipelineStore()
    b = batch("s", 1)
    store.add(b)
    recorder = Recorder(store, fences=lambda _s: None)
    with pytest.raises(FencedOffError, match="holds no valid claim"):
        await recorder.submitting(b)
    # A status the monitor read for a service no longer held is dropped.
    await recorder.ledger_status("s", LedgerBatchStatus(b.batch_id, Committed()))
    assert store.writes == []
    assert store.fences == []
