"""The events of a Chrome-trace JSON file (PyTorch profiler, Kineto), streamed in chunks.

A Kineto trace is one JSON object, `{"schemaVersion": 1, ..., "traceEvents": [{...}, ...], ...}`
(or a bare `[{...}, ...]` array), gzip-compressed or not, often gigabytes. `TraceEvents` reads it
block by block and never builds the document: each chunk it yields is the text of a run of whole
events, one per element of an Arrow string array, for DuckDB's JSON reader to parse in C++
(`ingest.kineto`). The keys outside the event array (device properties, distributed info, ...)
are small and come back parsed in `metadata`.

Finding where one event ends and the next begins, without parsing: Kineto separates events with
the same bytes throughout a file (`},\\n  {`), so the separator most common in the first block is
taken and each block is split at its occurrences with `bytes.replace`/Arrow's split, both in C.
A separator could also occur inside a string or between the objects of an array inside an event;
a split there leaves a piece that is not one JSON object, which the parser refuses, and
`TraceEvents.exact` then re-reads that chunk with Python's `json` (slow, exact). Blocks end at
the last separator, so every chunk holds whole events; the last event, the closing bracket and
the keys after it are read with `json` too.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc

from traceq.errors import TraceFormatError

BLOCK_BYTES = 16 << 20
"""Bytes of JSON text read per chunk: bounds the memory a load uses, whatever the file's size."""

GZIP_MAGIC = b"\x1f\x8b"
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_MARK = b"\x1e"  # never in JSON text outside a string, and never raw inside one
_HEADER_LIMIT = 64 << 20


def is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_text(path: Path) -> IO[bytes]:
    """The file's JSON bytes, decompressed when it is gzip."""
    return gzip.open(path, "rb") if is_gzip(path) else path.open("rb")


def uncompressed_size(path: Path) -> int:
    """The JSON text's size: the file's, or for gzip its trailer's (exact below 4 GiB; larger
    files are estimated from the compressed size)."""
    size = path.stat().st_size
    if not is_gzip(path) or size < 18:
        return size
    with path.open("rb") as f:
        f.seek(-4, 2)
        trailer = int.from_bytes(f.read(4), "little")
    return trailer if trailer >= size else max(trailer, 8 * size)


class TraceEvents:
    """Iterate over a trace file's events as chunks; `metadata` holds the other top-level keys
    (filled as they are read: complete once the iteration ends). `bytes_read` counts the JSON
    text consumed, for progress."""

    def __init__(self, path: Path):
        self.path = path
        self.metadata: dict[str, Any] = {}
        self.bytes_read = 0
        self._separator: bytes | None = None
        self._bare = False  # a bare array of events, with no keys around it

    def __iter__(self) -> Iterator[pa.Array]:
        try:
            with open_text(self.path) as f:
                yield from self._chunks(f)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise TraceFormatError(f"{self.path} is a truncated or damaged gzip file ({e}); copy it again") from None
        except UnicodeDecodeError as e:
            raise TraceFormatError(f"{self.path} is not UTF-8 text ({e})") from None

    def _read(self, f: IO[bytes]) -> bytes:
        block = f.read(BLOCK_BYTES)
        self.bytes_read += len(block)
        return block

    def _chunks(self, f: IO[bytes]) -> Iterator[pa.Array]:
        buffer = self._header(f)
        while True:
            block = self._read(f)
            if not block:
                break
            buffer += block
            if self._separator is None:
                self._separator = _common_separator(buffer)
            cut = buffer.rfind(self._separator) if self._separator else -1
            if cut <= 0:
                continue  # not one whole event yet: read on
            yield self._split(buffer[:cut + 1])
            buffer = buffer[cut + len(self._separator) - 1:]
        last = self._tail(buffer)
        if last:
            yield pa.array(last, pa.string())

    def _header(self, f: IO[bytes]) -> bytes:
        """Reads up to the first event; returns what was read after the array's '['."""
        head = b""
        while True:
            start = head.lstrip()[:1]
            if start == b"[":  # a bare array of events
                self._bare = True
                return head[head.index(b"[") + 1:]
            if start not in (b"", b"{"):
                raise TraceFormatError(f"{self.path} is not a JSON trace: it starts with {head.lstrip()[:20]!r}")
            found = _EVENTS_KEY.search(head)
            if found:
                self.metadata.update(self._object(head[:found.start()] + b'"traceEvents": null}', "header"))
                return head[found.end():]
            block = self._read(f)
            if not block or len(head) > _HEADER_LIMIT:
                raise TraceFormatError(f"{self.path} is JSON but not a PyTorch profiler trace: "
                                       "it has no traceEvents array")
            head += block

    def _split(self, text: bytes) -> pa.Array:
        """The events of `text` (events separated by the file's separator), one per string."""
        marked = text.replace(self._separator or b"", b"}" + _MARK + b"{")
        return pc.split_pattern(pa.scalar(marked, pa.large_binary()), _MARK).values.cast(pa.large_string())

    def _tail(self, text: bytes) -> list[str]:
        """The last events, the array's closing bracket and the keys after it, read with `json`."""
        body = text.decode("utf-8")
        events, pos = self._events_of(body, "]")
        if pos >= len(body):
            raise TraceFormatError(f"{self.path} is truncated: its traceEvents array never ends")
        rest = body[pos + 1:].strip()
        if rest.startswith(","):
            self.metadata.update(self._object(("{" + rest[1:]).encode(), "end"))
        elif rest != ("" if self._bare else "}"):
            raise TraceFormatError(f"{self.path} is truncated or not valid JSON after its events")
        return events

    def _events_of(self, body: str, end: str | None) -> tuple[list[str], int]:
        """The text of each event object in `body` (separated by commas), exactly as written,
        up to `end` (or the end of `body`); and where the reading stopped."""
        decoder = json.JSONDecoder()
        events, pos = [], _skip(body, 0)
        while pos < len(body) and body[pos] != end:
            try:
                event, stop = decoder.raw_decode(body, pos)
            except json.JSONDecodeError as e:
                raise TraceFormatError(f"{self.path} is truncated or not valid JSON in its traceEvents "
                                       f"({e.msg})") from None
            if not isinstance(event, dict):
                raise TraceFormatError(f"{self.path}: traceEvents holds something other than event objects")
            events.append(body[pos:stop])
            pos = _skip(body, stop)
            if pos < len(body) and body[pos] == ",":
                pos = _skip(body, pos + 1)
            elif pos < len(body) and body[pos] != end:
                raise TraceFormatError(f"{self.path} is not valid JSON in its traceEvents (at {body[pos:pos + 20]!r})")
        return events, pos

    def _object(self, text: bytes, where: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{self.path}: the keys at its {where} are not valid JSON ({e.msg})") from None
        if not isinstance(value, dict):
            raise TraceFormatError(f"{self.path} is not a JSON trace object")
        return value

    def exact(self, chunk: pa.Array) -> pa.Array:
        """`chunk` re-read with `json`: for a chunk the fast split cut inside an event. Each
        element becomes the events it holds, one per element, each as written."""
        text = ",".join(s for s in chunk.to_pylist() if s is not None)
        return pa.array(self._events_of(text, None)[0], pa.large_string())


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _common_separator(text: bytes) -> bytes | None:
    """The commonest `}` `,` `{` run (with its whitespace) in `text`; None when there is none yet."""
    found = Counter(m.group() for m in _SEPARATOR.finditer(text, 0, min(len(text), 1 << 20)))
    return found.most_common(1)[0][0] if found else None
