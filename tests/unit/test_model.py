from __future__ import annotations

import dataclasses

import pytest

from ledgerq.model import (
    CANCELLED,
    BatchStatusName,
    Committed,
    Delayed,
    Invalid,
    InvalidTransaction,
    Pending,
    SubmissionError,
    TrackingBatch,
    Unknown,
    Valid,
    ValidTransaction,
    status_from_name,
)


def test_final_statuses_are_exactly_invalid_valid_committed() -> None:
    final = {name for name in BatchStatusName if name.is_final}
    assert final == {BatchStatusName.INVALID, BatchStatusName.VALID, BatchStatusName.COMMITTED}
    assert Committed().is_final and not Pending().is_final


@pytest.mark.parametrize("text", ["Committed", "committed", "COMMITTED", " committed "])
def test_status_name_parses_any_case(text: str) -> None:
    assert BatchStatusName.parse(text) is BatchStatusName.COMMITTED


def test_status_name_rejects_unknown_text_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="expected one of Unknown, Pending"):
        BatchStatusName.parse("done")


def test_status_from_name_round_trips_every_name() -> None:
    valid = (ValidTransaction("t1"),)
    invalid = (InvalidTransaction("t1", error_message="bad"),)
    for name in BatchStatusName:
        status = status_from_name(name, valid=valid, invalid=invalid)
        assert status.name is name
    assert status_from_name(BatchStatusName.INVALID, invalid=invalid) == Invalid(invalid)
    assert status_from_name(BatchStatusName.COMMITTED, valid=valid) == Committed(valid)
    assert status_from_name(BatchStatusName.VALID, valid=valid) == Valid(valid)
    assert status_from_name(BatchStatusName.UNKNOWN) == Unknown()
    assert status_from_name(BatchStatusName.DELAYED) == Delayed()


def test_tracking_batch_is_immutable() -> None:
    batch = TrackingBatch(
        service_id="s",
        batch_header="b" * 128,
        data_change_id=None,
        signer_public_key="02" + "a" * 64,
        trace=False,
        serialized_batch=b"x",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.submitted = True  # type: ignore[misc]
    assert batch.batch_id == batch.batch_header
    assert batch.status_name is None and not batch.is_final


def test_the_tracking_status_of_a_cancelled_batch_is_cancelled() -> None:
    batch = TrackingBatch("s", "b" * 128, None, "k", False, b"")
    assert batch.tracking_status is None
    assert dataclasses.replace(batch, batch_status=Pending()).tracking_status == "Pending"
    invalid = dataclasses.replace(batch, batch_status=Invalid(()))
    assert invalid.tracking_status == "Invalid" and not invalid.cancelled
    rejected = dataclasses.replace(invalid, submission_error=SubmissionError("rejected", "no"))
    assert rejected.tracking_status == "Invalid"
    cancelled = dataclasses.replace(invalid, submission_error=SubmissionError(CANCELLED, "by x"))
    assert cancelled.cancelled and cancelled.tracking_status == "Cancelled"
    # Only a final Invalid is a cancellation.
    waiting = dataclasses.replace(batch, submission_error=SubmissionError(CANCELLED, "by x"))
    assert not waiting.cancelled and waiting.tracking_status is None
