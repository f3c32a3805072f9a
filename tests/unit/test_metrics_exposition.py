"""The gateway's event metrics: what ``/metrics`` exposes for a known sequence of events.

The exposition is compared with the text the metrics gave when every event
went through ``prometheus_client``'s own ``Counter`` and ``Histogram``
(``tests/data/metrics_*.txt``: names, help, types, labels, order, values,
``_created``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics

from ledgerq.ledgers.base import (
    Accepted,
    Ambiguous,
    Busy,
    LedgerBatchStatus,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
)
from ledgerq.model import BatchStatus, Committed, Invalid, Pending, TrackingBatch, Unknown
from ledgerq.operator.metrics import _LATENCY_BUCKETS, GatewayMetrics

CREATED = 1_700_000_000.0
DATA = Path(__file__).parent.parent / "data"


class _Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


class _Ledger:
    description = "fake"

    def __init__(self) -> None:
        self.answers: list[tuple[LedgerBatchStatus, ...] | Exception] = []

    async def batch_statuses(
        self, service_id: str, batch_ids: Sequence[str], *, wait_s: float = 0.0
    ) -> tuple[LedgerBatchStatus, ...]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _batch(batch_id: str, created_at: int = 0) -> TrackingBatch:
    return TrackingBatch("svc", batch_id, None, "key", False, b"", created_at=created_at)


def _status(batch_id: str, status: BatchStatus) -> tuple[LedgerBatchStatus, ...]:
    return (LedgerBatchStatus(batch_id, status),)


def _post(metrics: GatewayMetrics, batch_id: str, result: SubmitResult, seconds: float) -> None:
    """One POST, as :class:`InstrumentedLedger` reports it: its start, then its answer."""
    metrics.posting(batch_id)
    metrics.posted(batch_id, result, seconds)


async def _events(metrics: GatewayMetrics, clock: _Clock) -> None:
    ledger = _Ledger()
    instrumented = metrics.instrument(ledger)  # type: ignore[arg-type]
    metrics.batches_accepted([_batch("b1", 999_000), _batch("b2", 999_990), _batch("b3")])
    metrics.batches_accepted([])
    clock.ms += 3
    _post(metrics, "b1", Busy(503), 0.005)  # on a bucket's bound
    _post(metrics, "b1", Accepted(), 0.0004)
    clock.ms += 20
    _post(metrics, "b2", Busy(429), 0.02)
    _post(metrics, "b3", Unreachable("down"), 400.0)  # above every bound
    _post(metrics, "b3", Rejected(400, "no"), 0.0)
    _post(metrics, "b3", Rejected(500, "no"), 1.5)
    _post(metrics, "b3", Unjudged(404, "?"), 0.3)
    _post(metrics, "b3", Ambiguous("reset"), 0.07)
    _post(metrics, "b3", Busy(500), 0.07)
    _post(metrics, "adopted", Accepted(), 0.001)  # accepted by another instance
    ledger.answers = [
        _status("b1", Pending()),
        RuntimeError("connection reset"),
        _status("b1", Committed()),
        (*_status("b2", Invalid()), *_status("b3", Unknown())),
        _status("adopted", Committed()),
        (),
    ]
    for n in range(len(ledger.answers)):
        clock.ms += 1_000 * n + 7
        with contextlib.suppress(RuntimeError):
            await instrumented.batch_statuses("svc", ["b1"], wait_s=1.0)
    metrics.status_reported("b3", Committed())  # from an event stream
    metrics.batches_accepted([_batch("b4", clock.ms - 2)])


async def test_exposition_after_known_events_is_what_prometheus_client_gave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "time", lambda: CREATED)
    clock = _Clock()
    metrics = GatewayMetrics(clock=clock)
    fresh = metrics.exposition().decode()
    assert fresh == (DATA / "metrics_fresh.txt").read_text()
    await _events(metrics, clock)
    assert metrics.exposition().decode() == (DATA / "metrics_after_events.txt").read_text()
    assert metrics.accepted_total == 4


def _histogram_lines(text: str, stage: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith("ledgerq_stage_latency_seconds") and f'stage="{stage}"' in line
    ]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([*_LATENCY_BUCKETS, 0.0]),
            st.floats(min_value=0.0, max_value=1_000.0, allow_nan=False),
        ),
        max_size=40,
    )
)
def test_histogram_buckets_sum_and_count_match_prometheus_client(seconds: list[float]) -> None:
    metrics = GatewayMetrics()
    reference = Histogram(
        "ledgerq_stage_latency_seconds",
        "reference",
        ["stage"],
        buckets=_LATENCY_BUCKETS,
        registry=(registry := CollectorRegistry()),
    ).labels("submit")
    for s in seconds:
        metrics.posted("b", Accepted(), s)
        reference.observe(s)
    ours = _histogram_lines(metrics.exposition().decode(), "submit")
    theirs = _histogram_lines(generate_latest(registry).decode(), "submit")
    created = [line for line in theirs if "_created" in line]
    assert [line for line in ours if "_created" not in line] == [
        line for line in theirs if "_created" not in line
    ]
    assert len(created) == 1 and len([line for line in ours if "_created" in line]) == 1


async def test_created_series_follow_prometheus_clients_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "time", lambda: CREATED)
    clock = _Clock()
    metrics = GatewayMetrics(clock=clock)
    await _events(metrics, clock)
    monkeypatch.setattr(prometheus_metrics, "_use_created", False)
    expected = (DATA / "metrics_after_events.txt").read_text().splitlines()
    without = [line for line in expected if "_created" not in line]
    assert metrics.exposition().decode().splitlines() == without


class _Store:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    async def status_counts(self) -> dict[str, int]:
        return self.counts

    async def list_services(self, *, limit: int = 1000, after: str | None = None) -> list[object]:
        return []


def _status_series(metrics: GatewayMetrics) -> dict[str, float]:
    prefix = 'ledgerq_batches{status="'
    return {
        line[len(prefix) :].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.exposition().decode().splitlines()
        if line.startswith(prefix)
    }


async def test_batches_by_status_drop_to_zero_instead_of_vanishing() -> None:
    metrics = GatewayMetrics()
    store = _Store()
    store.counts = {"none": 3, "Delayed": 2, "Committed": 5}
    await metrics.refresh(store)
    assert _status_series(metrics) == {
        "none": 3,
        "Unknown": 0,
        "Pending": 0,
        "Delayed": 2,
        "Invalid": 0,
        "Valid": 0,
        "Committed": 5,
    }
    store.counts = {"Committed": 10}
    await metrics.refresh(store)
    series = _status_series(metrics)
    assert series["none"] == series["Delayed"] == series["Pending"] == 0
    assert series["Committed"] == 10


def test_a_batch_accepted_by_another_process_is_timed_from_its_acceptance() -> None:
    clock = _Clock()
    metrics = GatewayMetrics(clock=clock)
    # Accepted by another worker or instance 250 ms ago; taken and posted here.
    metrics.batch_taken(_batch("elsewhere", clock.ms - 250))
    _post(metrics, "elsewhere", Accepted(), 0.002)
    clock.ms += 100
    metrics.status_reported("elsewhere", Committed())
    # Attempted before (a resubmission): its first POST was not this one.
    again = replace(_batch("again", clock.ms - 5_000), attempts=1)
    metrics.batch_taken(again)
    _post(metrics, "again", Accepted(), 0.002)
    metrics.status_reported("again", Committed())
    text = metrics.exposition().decode()
    assert 'ledgerq_stage_latency_seconds_count{stage="queued"} 1.0' in text
    assert 'ledgerq_stage_latency_seconds_sum{stage="queued"} 0.25' in text
    assert "ledgerq_end_to_end_latency_seconds_count 1.0" in text
    assert "ledgerq_end_to_end_latency_seconds_sum 0.35" in text


class _FastLedger:
    """A ledger whose commit event comes in before the answer to the POST."""

    description = "fast"

    def __init__(self, metrics: GatewayMetrics, clock: _Clock) -> None:
        self.metrics = metrics
        self.clock = clock

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> Accepted:
        self.clock.ms += 3
        self.metrics.status_reported(batch_id, Committed())  # from the event stream
        self.clock.ms += 2
        return Accepted()


async def test_a_final_status_before_the_posts_answer_still_times_every_stage() -> None:
    clock = _Clock()
    metrics = GatewayMetrics(clock=clock)
    ledger = metrics.instrument(_FastLedger(metrics, clock))  # type: ignore[arg-type]
    metrics.batches_accepted([_batch("fast", clock.ms)])
    clock.ms += 10
    assert await ledger.submit("svc", "fast", b"") == Accepted()
    text = metrics.exposition().decode()
    assert 'ledgerq_stage_latency_seconds_sum{stage="queued"} 0.01' in text
    assert 'ledgerq_stage_latency_seconds_count{stage="ledger"} 1.0' in text
    assert 'ledgerq_stage_latency_seconds_sum{stage="ledger"} 0.003' in text
    assert "ledgerq_end_to_end_latency_seconds_sum 0.013" in text
    assert not metrics._posted  # nothing left behind for a batch already final
