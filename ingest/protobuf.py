"""Protocol Buffers' wire format, read without generated code or a dependency: the XPlane reader
(and any later protobuf format) walks messages as (field number, wire type, value) triples and
interprets the numbers it knows from the format's .proto file.

Values come as: an int for a varint (wire type 0), a (start, end) span of the buffer for a
length-delimited field (2: a string, bytes or a nested message, decoded by the caller), 8 or 4
raw bytes for the fixed types (1, 5). Anything that is not well-formed wire format (a varint past
10 bytes, a length past the message's end, a deprecated group or unknown wire type) raises
WireError naming the byte offset; the caller turns it into one line about the file."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from traceq.errors import TraceFormatError

Span = tuple[int, int]


class WireError(ValueError):
    """The bytes are not well-formed protobuf wire format."""


class MappedFile:
    """A protobuf file mapped read-only (`buf`), for readers that walk it in place; an empty file
    (which cannot be mapped) is refused in one line."""

    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("rb")
        try:
            self.buf: Any = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            self._file.close()
            raise TraceFormatError(f"{path} is empty (0 bytes), not a trace") from None

    def release(self, start: int, end: int) -> None:
        """Drop the mapped pages of bytes `start` to `end` from the process's memory, for a reader
        whose walk is past them (read again, they come back from the file): a walk of the whole
        file then keeps a few megabytes of it resident, not the file (madvise MADV_DONTNEED;
        nothing where the platform lacks it)."""
        first, upto = start - start % mmap.PAGESIZE, end - end % mmap.PAGESIZE
        if upto <= first or _DONTNEED is None:
            return
        try:
            self.buf.madvise(_DONTNEED, first, upto - first)
        except (OSError, ValueError):  # the pages stay: only the memory figure changes
            pass

    def close(self) -> None:
        self.buf.close()
        self._file.close()


_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


def varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    result = shift = 0
    try:
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift >= 70:
                raise WireError(f"a varint longer than 10 bytes at byte {pos}")
    except IndexError:
        raise WireError(f"the data ends inside a varint at byte {pos}") from None


def fields(buf: bytes | memoryview, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, object]]:
    """The fields of the message in buf[start:end], in file order. A one-byte varint (a key, a
    small number, a short length: most of them) is read here; longer ones by `varint`."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        key = buf[pos]  # pos < end <= len(buf): the enclosing message was checked to fit
        if key < 0x80:
            pos += 1
        else:
            key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            if pos < end and buf[pos] < 0x80:
                value: object = buf[pos]
                pos += 1
            else:
                value, pos = varint(buf, pos)
        elif wire == 2:
            if pos < end and buf[pos] < 0x80:
                n = buf[pos]
                pos += 1
            else:
                n, pos = varint(buf, pos)
            value = (pos, pos + n)
            pos += n
        elif wire == 1:
            value = bytes(buf[pos:pos + 8])
            pos += 8
        elif wire == 5:
            value = bytes(buf[pos:pos + 4])
            pos += 4
        else:
            raise WireError(f"wire type {wire} (field {number}) at byte {pos}: not a message")
        if pos > end or number == 0:
            raise WireError(f"field {number} runs past the end of its message at byte {pos}")
        yield number, wire, value


def text(buf: bytes | memoryview, span: object) -> str:
    """A string field's text (UTF-8; undecodable bytes replaced)."""
    start, end = span  # type: ignore[misc]
    return bytes(buf[start:end]).decode("utf-8", "replace")


def signed(value: int) -> int:
    """An int64 field's value (a negative int64 travels as a 10-byte varint of its two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def double(raw: object) -> float:
    return struct.unpack("<d", raw)[0]  # type: ignore[arg-type]
