"""Protobuf's wire format, as far as a model file needs it: fields walked without being
parsed, varints read and written (https://protobuf.dev/programming-guides/encoding/)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
_FIXED_SIZES = {FIXED64: 8, FIXED32: 4}


class Malformed(ValueError):
    """The bytes are not a protobuf message this module can walk (protobuf's own parser
    says what is wrong with them)."""


class Field(NamedTuple):
    number: int
    wire_type: int
    start: int  # of the tag: ``buffer[start:end]`` is the whole field
    payload: int  # of the value (a length-delimited field's bytes, after their length)
    end: int


def tag(number: int, wire_type: int) -> bytes:
    return varint((number << 3) | wire_type)


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def delimited_size(number: int, size: int) -> int:
    """Bytes of a length-delimited field ``number`` whose value is ``size`` bytes."""
    return len(tag(number, LENGTH_DELIMITED)) + len(varint(size)) + size


def read_varint(buffer: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise Malformed(f"a varint runs past its message at byte {pos}")
        byte = buffer[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(buffer: bytes | memoryview, start: int, end: int) -> Iterator[Field]:
    """The fields of the message in ``buffer[start:end]``, in the order they are written.
    Groups (wire types 3 and 4) are refused: ONNX has none."""
    pos = start
    while pos < end:
        key, payload = read_varint(buffer, pos, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            _, after = read_varint(buffer, payload, end)
        elif wire_type == LENGTH_DELIMITED:
            size, payload = read_varint(buffer, payload, end)
            after = payload + size
        elif wire_type in _FIXED_SIZES:
            after = payload + _FIXED_SIZES[wire_type]
        else:
            raise Malformed(f"field {number} has wire type {wire_type} at byte {pos}")
        if number == 0 or after > end:
            raise Malformed(f"field {number} at byte {pos} runs past its message")
        yield Field(number, wire_type, pos, payload, after)
        pos = after
