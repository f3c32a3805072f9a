"""The few bits of protobuf wire format the codec handles itself.

A ``BatchList`` is split into its ``Batch`` messages by hand, so each batch
keeps the exact bytes the client sent (re-serializing a parsed message is not
guaranteed to reproduce them) and so an oversized or malformed list is
rejected before any message object is built. Everything else is parsed by the
protobuf runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

_WIRE_VARINT = 0
_WIRE_FIXED64 = 1
_WIRE_LEN = 2
_WIRE_FIXED32 = 5
_MAX_VARINT_BYTES = 10

#: ``BatchList.batches`` is field 1.
BATCH_LIST_BATCHES_FIELD = 1


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    result = 0
    shift = 0
    end = min(len(data), pos + _MAX_VARINT_BYTES)
    while pos < end:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise WireError("truncated or over-long varint")


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("varints here are unsigned")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def split_repeated_field(data: bytes, field_number: int) -> list[bytes]:
    """The payloads of every length-delimited ``field_number`` entry, in order.

    Other fields are skipped, as protobuf skips unknown fields; a known field
    with another wire type, a group, a bad tag or a length past the end is a
    :class:`WireError`.
    """
    return [data[start:end] for start, end in repeated_field_spans(data, field_number)]


def repeated_field_spans(data: bytes, field_number: int) -> list[tuple[int, int]]:
    """Where the payloads of :func:`split_repeated_field` lie in ``data``:
    ``(start, end)`` of each, in order (the same checks, the same errors)."""
    return list(iter_repeated_field_spans(data, field_number))


def iter_repeated_field(data: bytes, field_number: int) -> Iterator[bytes]:
    """:func:`split_repeated_field` one payload at a time: a caller that
    refuses an entry stops there, having split nothing past it (the
    :class:`WireError` of a malformed tail comes when the split reaches it)."""
    for start, end in iter_repeated_field_spans(data, field_number):
        yield data[start:end]


def iter_repeated_field_spans(data: bytes, field_number: int) -> Iterator[tuple[int, int]]:
    """:func:`repeated_field_spans` one span at a time."""
    pos = 0
    size = len(data)
    while pos < size:
        key, pos = read_varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire_type == _WIRE_LEN:
            length, pos = read_varint(data, pos)
            end = pos + length
            if end > size:
                raise WireError(f"field {field} runs {end - size} bytes past the end")
            if field == field_number:
                yield pos, end
            pos = end
        elif field == field_number:
            raise WireError(f"field {field} has wire type {wire_type}, expected length-delimited")
        elif wire_type == _WIRE_VARINT:
            _, pos = read_varint(data, pos)
        elif wire_type == _WIRE_FIXED64:
            pos += 8
        elif wire_type == _WIRE_FIXED32:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type} for field {field}")
        if pos > size:
            raise WireError(f"field {field} is truncated")


def join_repeated_field(messages: Iterable[bytes], field_number: int) -> bytes:
    """Encode each message as a length-delimited ``field_number`` entry."""
    tag = encode_varint(field_number << 3 | _WIRE_LEN)
    parts: list[bytes] = []
    for message in messages:
        parts += (tag, encode_varint(len(message)), message)
    return b"".join(parts)
