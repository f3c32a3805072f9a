"""The one-round serial rules, case by case (seed 001; see docs/queuer.md)."""

from __future__ import annotations

import pytest

from ledgerq.model import (
    BatchStatus,
    Committed,
    Delayed,
    Invalid,
    Pending,
    TrackingBatch,
    Unknown,
    Valid,
)
from ledgerq.queue.serial import (
    DEFAULT_DELAY_WINDOW_MS,
    ServiceState,
    decide_service,
    select_round,
)

NOW = 1_700_000_100_000
WINDOW = DEFAULT_DELAY_WINDOW_MS


def batch(
    service: str,
    header: str,
    seq: int | None,
    *,
    status: BatchStatus | None = None,
    submitted: bool = False,
    created_at: int = 1_700_000_000_000,
    last_attempt_at: int | None = None,
) -> TrackingBatch:
    return TrackingBatch(
        service_id=service,
        batch_header=header,
        data_change_id=None,
        signer_public_key="02" + "ab" * 32,
        trace=False,
        serialized_batch=b"",
        submitted=submitted,
        created_at=created_at,
        batch_status=status,
        seq=seq,
        last_attempt_at=last_attempt_at,
    )


def headers(round_: list[TrackingBatch]) -> list[str]:
    return [b.batch_header for b in round_]


def test_empty_population_gives_an_empty_round() -> None:
    assert select_round([], now=NOW, delay_window_ms=WINDOW) == []


def test_oldest_new_batch_of_each_service_is_queued() -> None:
    batches = [
        batch("a", "a2", 2),
        batch("a", "a1", 1),
        batch("b", "b3", 3),
        batch("a", "a4", 4),
    ]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["a1", "b3"]


def test_seq_orders_even_when_created_at_and_header_disagree() -> None:
    # Accepted in this order within one second; the headers sort the other way.
    batches = [batch("a", "zz", 1, created_at=5), batch("a", "aa", 2, created_at=5)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["zz"]


def test_seq_wins_over_created_at_when_the_clock_stepped_back() -> None:
    batches = [batch("a", "x", 1, created_at=2_000), batch("a", "y", 2, created_at=1_000)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["x"]


def test_without_seq_the_seed_key_orders_created_at_then_header() -> None:
    batches = [
        batch("a", "c", None, created_at=2),
        batch("a", "b", None, created_at=1),
        batch("a", "a", None, created_at=2),
    ]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["b"]
    tied = [batch("a", "c", None, created_at=1), batch("a", "a", None, created_at=1)]
    assert headers(select_round(tied, now=NOW, delay_window_ms=WINDOW)) == ["a"]


def test_one_batch_without_seq_makes_its_service_fall_back_to_the_seed_key() -> None:
    batches = [batch("a", "b", 1, created_at=2), batch("a", "a", None, created_at=1)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["a"]


def test_equal_seq_is_broken_by_created_at_then_header() -> None:
    batches = [batch("a", "b", 1, created_at=1), batch("a", "a", 1, created_at=1)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["a"]


@pytest.mark.parametrize(
    "status", [Committed(), Valid(), Invalid()], ids=["committed", "valid", "invalid"]
)
@pytest.mark.parametrize("submitted", [True, False])
def test_final_batches_are_never_queued_and_never_lock(
    status: BatchStatus, submitted: bool
) -> None:
    batches = [batch("a", "a1", 1, status=status, submitted=submitted), batch("a", "a2", 2)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["a2"]
    assert select_round(batches[:1], now=NOW, delay_window_ms=WINDOW) == []


@pytest.mark.parametrize(
    ("status", "submitted"),
    [
        (None, True),  # being submitted
        (Pending(), True),  # submitted, ledger has not decided
        (Pending(), False),  # not a state our transitions make; the ledger holds it
        (Unknown(), True),  # being resubmitted
        (Delayed(), True),  # being resubmitted
    ],
    ids=[
        "submitted-none",
        "submitted-pending",
        "pending",
        "submitted-unknown",
        "submitted-delayed",
    ],
)
def test_a_batch_in_flight_locks_its_service_and_is_not_queued(
    status: BatchStatus | None, submitted: bool
) -> None:
    blocker = batch("a", "a1", 1, status=status, submitted=submitted, last_attempt_at=0)
    batches = [blocker, batch("a", "a2", 2), batch("b", "b3", 3)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["b3"]
    decision = decide_service(batches[:2], now=NOW, delay_window_ms=WINDOW)
    assert decision.state is ServiceState.IN_FLIGHT
    assert decision.blocker == blocker


def test_unknown_is_queued_before_anything_else_of_its_service() -> None:
    batches = [batch("a", "a1", 1, status=Unknown()), batch("a", "a2", 2)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["a1"]


def test_delayed_waits_for_the_window_and_locks_its_service_meanwhile() -> None:
    window_start = NOW - WINDOW + 1  # one ms too recent
    batches = [
        batch("a", "a1", 1, status=Delayed(), last_attempt_at=window_start),
        batch("a", "a2", 2),
    ]
    assert select_round(batches, now=NOW, delay_window_ms=WINDOW) == []
    decision = decide_service(batches, now=NOW, delay_window_ms=WINDOW)
    assert decision.state is ServiceState.DELAY_WINDOW
    # Exactly at the window's end (the seed's `<= now - 15 s`) it is due.
    assert headers(select_round(batches, now=NOW + 1, delay_window_ms=WINDOW)) == ["a1"]


def test_delay_window_is_configurable() -> None:
    batches = [batch("a", "a1", 1, status=Delayed(), last_attempt_at=NOW - 1_000)]
    assert select_round(batches, now=NOW, delay_window_ms=WINDOW) == []
    assert headers(select_round(batches, now=NOW, delay_window_ms=1_000)) == ["a1"]
    assert headers(select_round(batches, now=NOW - 1_000, delay_window_ms=0)) == ["a1"]


def test_delayed_without_a_recorded_attempt_is_due() -> None:
    batches = [batch("a", "a1", 1, status=Delayed(), last_attempt_at=None)]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["a1"]


def test_only_one_stalled_batch_per_service_the_first_in_order() -> None:
    batches = [
        batch("a", "a2", 2, status=Unknown()),
        batch("a", "a1", 1, status=Delayed(), last_attempt_at=0),
        batch("a", "a3", 3, status=Unknown()),
    ]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == ["a1"]


def test_an_earlier_delayed_in_its_window_holds_back_a_later_unknown() -> None:
    batches = [
        batch("a", "a1", 1, status=Delayed(), last_attempt_at=NOW),
        batch("a", "a2", 2, status=Unknown()),
    ]
    assert select_round(batches, now=NOW, delay_window_ms=WINDOW) == []


def test_in_flight_is_checked_before_resubmission() -> None:
    batches = [
        batch("a", "a1", 1, status=Pending(), submitted=True),
        batch("a", "a2", 2, status=Unknown()),
    ]
    assert select_round(batches, now=NOW, delay_window_ms=WINDOW) == []


def test_round_order_unknown_then_delayed_then_new_each_by_seq() -> None:
    batches = [
        batch("n1", "n1", 1),
        batch("d2", "d2", 2, status=Delayed(), last_attempt_at=0),
        batch("u3", "u3", 3, status=Unknown()),
        batch("n0", "n0", 0),
        batch("u9", "u9", 9, status=Unknown()),
        batch("d5", "d5", 5, status=Delayed(), last_attempt_at=0),
    ]
    assert headers(select_round(batches, now=NOW, delay_window_ms=WINDOW)) == [
        "u3",
        "u9",
        "d2",
        "d5",
        "n0",
        "n1",
    ]


def test_services_restricts_the_round() -> None:
    batches = [batch("a", "a1", 1), batch("b", "b2", 2), batch("c", "c3", 3)]
    chosen = select_round(batches, now=NOW, delay_window_ms=WINDOW, services={"a", "c", "zz"})
    assert headers(chosen) == ["a1", "c3"]
    assert select_round(batches, now=NOW, delay_window_ms=WINDOW, services=[]) == []


def test_negative_delay_window_is_refused() -> None:
    with pytest.raises(ValueError, match="delay_window_ms"):
        select_round([], now=NOW, delay_window_ms=-1)


def test_decide_service_reports_idle_for_only_final_batches() -> None:
    decision = decide_service([batch("a", "a1", 1, status=Committed())], now=NOW, delay_window_ms=0)
    assert decision.state is ServiceState.IDLE
    assert decision.pick is None
