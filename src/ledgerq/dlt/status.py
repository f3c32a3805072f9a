"""Parsing of ledger batch-status documents into :mod:`ledgerq.model` statuses.

Sawtooth (and Grid, and the ledgerq node) answer
``{"id", "status": "COMMITTED"|"INVALID"|"PENDING"|"UNKNOWN",
"invalid_transactions": [{"id", "message", "extended_data"}]}``; Splinter's
scabbard answers ``{"id", "status": {"statusType": ..., "message": [...]}}``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerq.dlt.base import LedgerBatchStatus
from ledgerq.errors import LedgerError
from ledgerq.model import (
    BatchStatus,
    Committed,
    Invalid,
    InvalidTransaction,
    Pending,
    Unknown,
    Valid,
    ValidTransaction,
)


def _b64(value: object) -> bytes | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode()


def sawtooth_status(entry: Mapping[str, Any]) -> LedgerBatchStatus:
    """One element of a Sawtooth ``/batch_statuses`` ``data`` array."""
    try:
        batch_id = str(entry["id"])
        name = str(entry["status"]).upper()
    except (KeyError, TypeError) as exc:
        raise LedgerError(f"malformed batch status from the ledger: {entry!r}") from exc
    status: BatchStatus
    if name == "COMMITTED":
        status = Committed()
    elif name == "INVALID":
        txs = tuple(
            InvalidTransaction(
                transaction_id=str(t.get("id", "")),
                error_message=t.get("message"),
                error_data=_b64(t.get("extended_data")),
            )
            for t in entry.get("invalid_transactions") or ()
        )
        status = Invalid(txs)
    elif name == "PENDING":
        status = Pending()
    elif name == "UNKNOWN":
        status = Unknown()
    else:
        raise LedgerError(f"the ledger reported an unknown batch status {name!r} for {batch_id}")
    return LedgerBatchStatus(batch_id, status)


def scabbard_status(entry: Mapping[str, Any]) -> LedgerBatchStatus:
    """One element of a scabbard ``batch_statuses`` array (``statusType`` shape)."""
    try:
        batch_id = str(entry["id"])
        inner = entry["status"]
        kind = str(inner["statusType"]).lower()
        message = inner.get("message") or []
    except (KeyError, TypeError, AttributeError) as exc:
        raise LedgerError(f"malformed scabbard batch status: {entry!r}") from exc
    status: BatchStatus
    if kind in ("committed", "valid"):
        valid = tuple(ValidTransaction(str(t.get("transaction_id", ""))) for t in message)
        status = Committed(valid) if kind == "committed" else Valid(valid)
    elif kind == "invalid":
        status = Invalid(
            tuple(
                InvalidTransaction(
                    transaction_id=str(t.get("transaction_id", "")),
                    error_message=t.get("error_message"),
                    error_data=bytes(t["error_data"]) if t.get("error_data") else None,
                )
                for t in message
            )
        )
    elif kind == "pending":
        status = Pending()
    elif kind == "unknown":
        status = Unknown()
    else:
        raise LedgerError(f"scabbard reported an unknown status type {kind!r} for {batch_id}")
    return LedgerBatchStatus(batch_id, status)


def check_ids(
    statuses: Sequence[LedgerBatchStatus], requested: Sequence[str]
) -> tuple[LedgerBatchStatus, ...]:
    """Keep only answers about ids we asked for, in the order asked.

    Grid's monitor validates the list against the ids sent: an answer about a
    batch we did not ask for is dropped rather than applied to the wrong row,
    and an id the ledger left out stays as it is, to be asked again.
    """
    by_id = {s.batch_id: s for s in statuses}
    return tuple(by_id[i] for i in requested if i in by_id)
