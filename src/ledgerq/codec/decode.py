"""Decode and verify Sawtooth ``BatchList``, ``Batch`` and ``Transaction`` messages.

Every rule below is checked for every batch; the first one broken raises
:class:`~ledgerq.errors.InvalidBatchError` whose ``rule`` is the name given
here and whose message names the batch (and transaction) by index and id.
Nothing is returned unless the whole list is valid.

List: ``too_large`` (body over ``max_bytes``, checked before parsing),
``malformed_protobuf`` (not a protobuf ``BatchList``/``Batch``),
``empty_batch_list``, ``duplicate_batch_id`` (one id twice in the list).

Batch: ``malformed_signature`` (``header_signature`` not 128 lowercase hex),
``malformed_batch_header``, ``malformed_public_key`` (``signer_public_key``
not a 33-byte compressed secp256k1 key in lowercase hex), ``empty_batch``
(no transactions), ``transaction_ids_mismatch`` (the header's
``transaction_ids`` are not the transactions' header signatures, in order),
``duplicate_transaction_id``, ``bad_batch_signature``.

Transaction: ``malformed_signature``, ``malformed_transaction_header``,
``malformed_public_key``, ``batcher_public_key_mismatch`` (not the batch
signer), ``payload_sha512_mismatch``, ``bad_transaction_signature``.

For the gateway's store, :func:`parse_batch_list` also checks what the store
keeps of each transaction header (:func:`check_storable`):
``invalid_family_name`` (empty or over 128 characters),
``invalid_family_version`` (empty or over 16 characters),
``malformed_dependency`` (not a transaction id: 128 lowercase hex) and
``invalid_header_text`` (a NUL character in a family, input or output, which
PostgreSQL cannot hold). A list that passes is never refused by the store for
its contents. The node (:func:`decode_batch_list`) does not apply these:
like Sawtooth it takes such a batch and judges it ``INVALID``.

Within a batch the checks run in the order listed, cheap string checks
before any signature, so a malformed batch costs no curve arithmetic.
With ``verify=False`` only the signature checks (``bad_*_signature``) are
skipped, for bytes that were verified before (e.g. read back from the store).
With ``verify=checks`` (a list) they are collected into it instead, each a
:data:`~ledgerq.codec.signing.SignatureCheck`, for the caller to verify
elsewhere (:func:`~ledgerq.codec.signing.signatures_valid`: libsecp256k1 runs
without the GIL, so a thread can) and, should one fail, decode again with
``verify=True`` for the error this module would have raised.

Unknown protobuf fields are accepted and kept: signatures are checked over
the header bytes as sent, and ``ParsedBatch.serialized`` is the batch's own
slice of the input, so nothing a client sent is dropped or re-encoded.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from ledgerq.codec import batch_pb2, transaction_pb2
from ledgerq.codec.parsed import ParsedBatch, ParsedTransaction, TransactionHeader
from ledgerq.codec.signing import (
    SIGNATURE_HEX_LENGTH,
    SignatureCheck,
    is_lower_hex,
    load_public_key,
    verify_checked,
)
from ledgerq.codec.wire import BATCH_LIST_BATCHES_FIELD, WireError, iter_repeated_field
from ledgerq.errors import InvalidBatchError
from ledgerq.model import (
    MAX_FAMILY_NAME_LENGTH,
    MAX_FAMILY_VERSION_LENGTH,
    MAX_SERVICE_ID_LENGTH,
    NO_SERVICE,
    TrackingBatch,
    TrackingTransaction,
)

if TYPE_CHECKING:
    import coincurve

#: What a decode does with the signatures: check them (``True``), skip them
#: (``False``), or collect them into the list for the caller (module notes).
Verify = bool | list[SignatureCheck]


def _signed(verify: Verify, key: coincurve.PublicKey, message: bytes, signature: str) -> bool:
    """False only when ``verify`` asks for the check here and it fails."""
    if verify is True:
        return verify_checked(key, message, signature)
    if verify is not False:
        verify.append((key, message, signature))
    return True


#: Largest accepted BatchList body, in bytes (the REST API's default limit).
DEFAULT_MAX_BYTES = 10 * 1024 * 1024


def _short(value: str) -> str:
    """``value`` for a message: whole if it could be an id or key, else its start."""
    return value if len(value) <= SIGNATURE_HEX_LENGTH else value[:16] + "…"


def _first_repeated(values: tuple[str, ...]) -> str | None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            return value
        seen.add(value)
    return None


def decode_batch_list(
    data: bytes,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    verify: Verify = True,
    pace: Callable[[], None] | None = None,
) -> tuple[ParsedBatch, ...]:
    """Decode a serialized ``BatchList`` and verify every batch in it.

    ``pace``: called before each batch is decoded (the gateway's decoding
    worker pauses there to yield the CPU, :mod:`ledgerq.ingest.decoding`)."""
    if len(data) > max_bytes:
        raise InvalidBatchError(
            f"the BatchList is {len(data)} bytes, over the limit of {max_bytes}; "
            "split it into several requests",
            rule="too_large",
        )
    data = bytes(data)
    # Split one entry at a time: the first bad entry fails the list, before
    # anything past it is split (a list of millions of empty entries costs
    # one entry's work, not a list of millions built first).
    parts = iter_repeated_field(data, BATCH_LIST_BATCHES_FIELD)
    batches: list[ParsedBatch] = []
    seen: dict[str, int] = {}
    for index in itertools.count():
        try:
            part = next(parts, None)
        except WireError as exc:
            raise InvalidBatchError(
                f"the body is not a protobuf BatchList ({exc}); send a serialized BatchList",
                rule="malformed_protobuf",
            ) from exc
        if part is None:
            break
        if pace is not None:
            pace()
        batch = _decode_batch(part, index, verify)
        first = seen.setdefault(batch.header_signature, index)
        if first != index:
            raise InvalidBatchError(
                f"batch #{index} ({batch.header_signature}) repeats batch #{first}; "
                "send each batch once",
                rule="duplicate_batch_id",
                batch_id=batch.header_signature,
            )
        batches.append(batch)
    if not batches:
        raise InvalidBatchError(
            "the BatchList holds no batches; send at least one", rule="empty_batch_list"
        )
    return tuple(batches)


def decode_batch(serialized: bytes, *, verify: bool = True) -> ParsedBatch:
    """Decode one serialized ``Batch`` message and verify it."""
    return _decode_batch(bytes(serialized), None, verify)


def _decode_batch(serialized: bytes, index: int | None, verify: Verify) -> ParsedBatch:
    where = "the batch" if index is None else f"batch #{index}"
    try:
        message = batch_pb2.Batch.FromString(serialized)
    except DecodeError as exc:
        raise InvalidBatchError(
            f"{where} is not a protobuf Batch ({exc})", rule="malformed_protobuf"
        ) from exc
    batch_id = message.header_signature
    if not is_lower_hex(batch_id, SIGNATURE_HEX_LENGTH):
        raise InvalidBatchError(
            f"{where} has header_signature {_short(batch_id)!r}, not "
            f"{SIGNATURE_HEX_LENGTH} lowercase hex characters (a compact secp256k1 signature)",
            rule="malformed_signature",
            batch_id=batch_id or None,
        )
    where = f"{where} ({batch_id})"
    header_bytes = message.header
    try:
        header = batch_pb2.BatchHeader.FromString(header_bytes)
    except DecodeError as exc:
        raise InvalidBatchError(
            f"the header of {where} is not a protobuf BatchHeader ({exc})",
            rule="malformed_batch_header",
            batch_id=batch_id,
        ) from exc
    signer = header.signer_public_key
    signer_key = load_public_key(signer)
    if signer_key is None:
        raise InvalidBatchError(
            f"{where} has signer_public_key {_short(signer)!r}, not a compressed secp256k1 "
            "public key (66 lowercase hex characters)",
            rule="malformed_public_key",
            batch_id=batch_id,
        )
    if not message.transactions:
        raise InvalidBatchError(
            f"{where} holds no transactions; a batch needs at least one",
            rule="empty_batch",
            batch_id=batch_id,
        )
    # String comparisons first: a batch that fails them costs no signature checks.
    actual_ids = tuple(tx.header_signature for tx in message.transactions)
    declared_ids = tuple(header.transaction_ids)
    if declared_ids != actual_ids:
        raise InvalidBatchError(
            f"the transaction_ids in the header of {where} ({len(declared_ids)} ids) are not "
            f"the header signatures of its {len(actual_ids)} transactions in order; "
            f"{_first_difference(declared_ids, actual_ids)}",
            rule="transaction_ids_mismatch",
            batch_id=batch_id,
        )
    duplicate = _first_repeated(actual_ids)
    if duplicate is not None:
        raise InvalidBatchError(
            f"{where} holds transaction {_short(duplicate)} more than once",
            rule="duplicate_transaction_id",
            batch_id=batch_id,
            transaction_id=duplicate,
        )
    if not _signed(verify, signer_key, header_bytes, batch_id):
        raise InvalidBatchError(
            f"the header_signature of {where} is not a signature of its header by "
            f"{signer}; sign the serialized BatchHeader with the signer's key",
            rule="bad_batch_signature",
            batch_id=batch_id,
        )
    transactions = tuple(
        _decode_transaction(tx, number, where, batch_id, signer, verify)
        for number, tx in enumerate(message.transactions)
    )
    return ParsedBatch(
        header_signature=batch_id,
        signer_public_key=signer,
        transaction_ids=actual_ids,
        transactions=transactions,
        trace=message.trace,
        header_bytes=header_bytes,
        serialized=serialized,
    )


def _first_difference(declared: tuple[str, ...], actual: tuple[str, ...]) -> str:
    for position, (want, got) in enumerate(zip(declared, actual, strict=False)):
        if want != got:
            return f"position {position} declares {_short(want)!r} but holds {_short(got)!r}"
    return "the counts differ"


def _decode_transaction(
    message: transaction_pb2.Transaction,
    number: int,
    batch_where: str,
    batch_id: str,
    batch_signer: str,
    verify: Verify,
) -> ParsedTransaction:
    tx_id = message.header_signature
    if not is_lower_hex(tx_id, SIGNATURE_HEX_LENGTH):
        raise InvalidBatchError(
            f"transaction #{number} of {batch_where} has header_signature {_short(tx_id)!r}, "
            f"not {SIGNATURE_HEX_LENGTH} lowercase hex characters (a compact secp256k1 "
            "signature)",
            rule="malformed_signature",
            batch_id=batch_id,
            transaction_id=tx_id or None,
        )
    header_bytes = message.header
    try:
        raw = transaction_pb2.TransactionHeader.FromString(header_bytes)
    except DecodeError as exc:
        raise InvalidBatchError(
            f"the header of {_tx_where(number, tx_id, batch_where)} is not a protobuf "
            f"TransactionHeader ({exc})",
            rule="malformed_transaction_header",
            batch_id=batch_id,
            transaction_id=tx_id,
        ) from exc
    signer = raw.signer_public_key
    key = load_public_key(signer)
    if key is None:
        raise InvalidBatchError(
            f"{_tx_where(number, tx_id, batch_where)} has signer_public_key "
            f"{_short(signer)!r}, not a compressed secp256k1 public key (66 lowercase hex "
            "characters)",
            rule="malformed_public_key",
            batch_id=batch_id,
            transaction_id=tx_id,
        )
    batcher = raw.batcher_public_key
    if batcher != batch_signer:
        raise InvalidBatchError(
            f"{_tx_where(number, tx_id, batch_where)} names batcher_public_key "
            f"{_short(batcher)!r} but the batch is signed by {batch_signer}; a transaction "
            "must name its batch's signer",
            rule="batcher_public_key_mismatch",
            batch_id=batch_id,
            transaction_id=tx_id,
        )
    payload = message.payload
    payload_sha512 = raw.payload_sha512
    if hashlib.sha512(payload).hexdigest() != payload_sha512:
        raise InvalidBatchError(
            f"the payload of {_tx_where(number, tx_id, batch_where)} does not match the "
            f"header's payload_sha512 {_short(payload_sha512)!r}; the payload was altered or "
            "the hash is wrong",
            rule="payload_sha512_mismatch",
            batch_id=batch_id,
            transaction_id=tx_id,
        )
    if not _signed(verify, key, header_bytes, tx_id):
        raise InvalidBatchError(
            f"the header_signature of {_tx_where(number, tx_id, batch_where)} is not a "
            f"signature of its header by {signer}; sign the serialized TransactionHeader "
            "with that key",
            rule="bad_transaction_signature",
            batch_id=batch_id,
            transaction_id=tx_id,
        )
    header = TransactionHeader(
        batcher_public_key=batcher,
        dependencies=tuple(raw.dependencies),
        family_name=raw.family_name,
        family_version=raw.family_version,
        inputs=tuple(raw.inputs),
        nonce=raw.nonce,
        outputs=tuple(raw.outputs),
        payload_sha512=payload_sha512,
        signer_public_key=signer,
    )
    return ParsedTransaction(
        header_signature=tx_id, header=header, header_bytes=header_bytes, payload=payload
    )


def _tx_where(number: int, tx_id: str, batch_where: str) -> str:
    """How a message names a transaction (built only when there is one to write)."""
    return f"transaction #{number} ({tx_id}) of {batch_where}"


def check_storable(batch: ParsedBatch, index: int | None = None) -> None:
    """The fields of ``batch``'s transaction headers that the store keeps fit its
    columns (module notes); else ``InvalidBatchError`` naming the field."""
    batch_where = "the batch" if index is None else f"batch #{index}"
    batch_where += f" ({batch.header_signature})"
    for number, tx in enumerate(batch.transactions):
        where = f"transaction #{number} ({tx.header_signature}) of {batch_where}"
        problem = _storable_problem(tx.header)
        if problem is not None:
            message, rule = problem
            raise InvalidBatchError(
                f"{where}: {message}",
                rule=rule,
                batch_id=batch.header_signature,
                transaction_id=tx.header_signature,
            )


def _storable_problem(header: TransactionHeader) -> tuple[str, str] | None:
    for field, value, limit, rule in (
        ("family_name", header.family_name, MAX_FAMILY_NAME_LENGTH, "invalid_family_name"),
        (
            "family_version",
            header.family_version,
            MAX_FAMILY_VERSION_LENGTH,
            "invalid_family_version",
        ),
    ):
        if not 1 <= len(value) <= limit:
            return (
                f"{field} {_short(value)!r} has {len(value)} characters; it needs 1 to {limit}",
                rule,
            )
    for field, values in (
        ("family_name", (header.family_name,)),
        ("family_version", (header.family_version,)),
        ("inputs", header.inputs),
        ("outputs", header.outputs),
    ):
        for value in values:
            if "\x00" in value:
                return (
                    f"{field} holds a NUL character ({_short(value)!r}); remove it",
                    "invalid_header_text",
                )
    for dependency in header.dependencies:
        if not is_lower_hex(dependency, SIGNATURE_HEX_LENGTH):
            return (
                f"dependencies holds {_short(dependency)!r}, not a transaction id "
                f"({SIGNATURE_HEX_LENGTH} lowercase hex characters)",
                "malformed_dependency",
            )
    return None


def check_service_id(service_id: str) -> str:
    """``service_id`` if the store can hold it, else ``InvalidBatchError``."""
    if not service_id or len(service_id) > MAX_SERVICE_ID_LENGTH:
        raise InvalidBatchError(
            f"service_id {_short(service_id)!r} has {len(service_id)} characters; "
            f"it needs 1 to {MAX_SERVICE_ID_LENGTH}",
            rule="invalid_service_id",
        )
    return service_id


def to_tracking_batch(batch: ParsedBatch, service_id: str, created_at: int = 0) -> TrackingBatch:
    """The store's view of a decoded batch (not yet submitted, no status)."""
    return TrackingBatch(
        service_id=service_id,
        batch_header=batch.header_signature,
        data_change_id=None,
        signer_public_key=batch.signer_public_key,
        trace=batch.trace,
        serialized_batch=batch.serialized,
        created_at=created_at,
        transactions=tuple(
            TrackingTransaction(
                family_name=tx.header.family_name,
                family_version=tx.header.family_version,
                transaction_header=tx.header_signature,
                payload=tx.payload,
                signer_public_key=tx.header.signer_public_key,
                service_id=service_id,
                inputs=tx.header.inputs,
                outputs=tx.header.outputs,
                dependencies=tx.header.dependencies,
            )
            for tx in batch.transactions
        ),
    )


def parse_batch_list(
    data: bytes,
    service_id: str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    created_at: int = 0,
    pace: Callable[[], None] | None = None,
    verify: Verify = True,
) -> tuple[TrackingBatch, ...]:
    """Decode and verify a ``BatchList`` into tracking batches for ``service_id``.

    ``service_id=None`` means a ledger without services (:data:`NO_SERVICE`);
    ``pace`` and ``verify`` as for :func:`decode_batch_list`.
    """
    service = NO_SERVICE if service_id is None else check_service_id(service_id)
    batches = decode_batch_list(data, max_bytes=max_bytes, pace=pace, verify=verify)
    for index, batch in enumerate(batches):
        check_storable(batch, index)
    return tuple(to_tracking_batch(batch, service, created_at) for batch in batches)
