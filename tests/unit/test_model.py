from __future__ import annotations

import dataclasses

import pytest

from ledgerq.model import (
    BatchStatusName,
    Committed,
    Delayed,
    Invalid,
    InvalidTransaction,
    Pending,
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
