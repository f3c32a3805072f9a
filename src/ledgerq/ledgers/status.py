"""Parsing of ledger batch-status documents into :mod:`ledgerq.model` statuses.

Sawtooth (and Grid, and the ledgerq node) answer
``{"id", "status": "COMMITTED"|"INVALID"|"PENDING"|"UNKNOWN",
"invalid_transactions": [{"id", "message", "extended_data"}]}``; Splinter's
scabbard answers ``{"id", "status": {"statusType": ..., "message": [...]}}``.

Every shape is checked: a document that is not what the ledger's API
specifies — an entry that is not an object, a missing or unknown status, an
``invalid_transactions`` entry that is not an object — raises
:class:`~ledgerq.errors.LedgerError` (cause ``malformed status body``) and
nothing of it is used. A malformed ``INVALID`` is never taken for a
judgement.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerq import jsontext
from ledgerq.errors import LedgerError
from ledgerq.ledgers.base import LedgerBatchStatus
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

MALFORMED = "malformed status body"


def _malformed(what: str) -> LedgerError:
    return LedgerError(f"the ledger answered a malformed batch status: {what}", cause=MALFORMED)


def _b64(value: object) -> bytes | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode()


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _objects(value: object, what: str) -> list[Mapping[str, Any]]:
    """A JSON array of objects (None or missing: empty)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise _malformed(f"{what} is not a list of objects: {str(value)[:200]}")
    return value


def _entry(entry: object) -> tuple[str, Mapping[str, Any]]:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str):
        raise _malformed(f"an entry is not an object with an id: {str(entry)[:200]}")
    return entry["id"], entry


def sawtooth_status(entry: object) -> LedgerBatchStatus:
    """One element of a Sawtooth ``/batch_statuses`` ``data`` array."""
    batch_id, doc = _entry(entry)
    name = doc.get("status")
    if not isinstance(name, str):
        raise _malformed(f"batch {batch_id} has no status")
    status: BatchStatus
    match name.upper():
        case "COMMITTED":
            status = Committed()
        case "INVALID":
            status = Invalid(
                tuple(
                    InvalidTransaction(
                        transaction_id=str(t.get("id", "")),
                        error_message=_text(t.get("message")),
                        error_data=_b64(t.get("extended_data")),
                    )
                    for t in _objects(doc.get("invalid_transactions"), "invalid_transactions")
                )
            )
        case "PENDING":
            status = Pending()
        case "UNKNOWN":
            status = Unknown()
        case _:
            raise _malformed(f"unknown batch status {name!r} for {batch_id}")
    return LedgerBatchStatus(batch_id, status)


def scabbard_status(entry: object) -> LedgerBatchStatus:
    """One element of a scabbard ``batch_statuses`` array (``statusType`` shape)."""
    batch_id, doc = _entry(entry)
    inner = doc.get("status")
    if not isinstance(inner, Mapping) or not isinstance(inner.get("statusType"), str):
        raise _malformed(f"batch {batch_id} has no statusType")
    kind = inner["statusType"].lower()
    message = _objects(inner.get("message"), "message")
    status: BatchStatus
    if kind in ("committed", "valid"):
        valid = tuple(ValidTransaction(str(t.get("transaction_id", ""))) for t in message)
        status = Committed(valid) if kind == "committed" else Valid(valid)
    elif kind == "invalid":
        status = Invalid(
            tuple(
                InvalidTransaction(
                    transaction_id=str(t.get("transaction_id", "")),
                    error_message=_text(t.get("error_message")),
                    error_data=_error_data(t.get("error_data")),
                )
                for t in message
            )
        )
    elif kind == "pending":
        status = Pending()
    elif kind == "unknown":
        status = Unknown()
    else:
        raise _malformed(f"unknown status type {kind!r} for {batch_id}")
    return LedgerBatchStatus(batch_id, status)


def _error_data(value: object) -> bytes | None:
    if not value:
        return None
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value)
    raise _malformed(f"error_data is not a list of bytes: {str(value)[:200]}")


def parse_status_list(
    body: bytes, url: str, entry_parser: Any, batch_ids: Sequence[str]
) -> tuple[LedgerBatchStatus, ...]:
    """A status read's body (``{"data": [...]}`` or a bare array) as statuses of ``batch_ids``."""
    try:
        doc = jsontext.loads(body)
    except ValueError as exc:
        raise LedgerError(f"{url} answered a body that is not JSON", cause=MALFORMED) from exc
    entries = doc.get("data") if isinstance(doc, Mapping) else doc
    if not isinstance(entries, list):
        raise LedgerError(f"{url} answered a body that is not a status list", cause=MALFORMED)
    return check_ids([entry_parser(e) for e in entries], batch_ids)


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
