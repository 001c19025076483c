"""The events of a Chrome-trace JSON file (PyTorch profiler, Kineto), streamed in chunks.

A Kineto trace is one JSON object, `{"schemaVersion": 1, ..., "traceEvents": [{...}, ...], ...}`
(or a bare `[{...}, ...]` array), gzip-compressed or not, often gigabytes. `TraceEvents` reads it
block by block and never builds the document: each `Batch` it yields holds chunks, each the text
of a run of whole events as the file writes them, ready to be wrapped in `[` `]` and parsed by
DuckDB's JSON reader in C++ (`ingest.kineto`). The keys outside the event array (device properties,
distributed info, ...) are small and come back parsed in `metadata`.

Finding where one event ends and the next begins, without parsing: Kineto separates events with
the same bytes throughout a file (`},\\n  {`), so the separator most common in the first block is
taken, and each block is cut at its last occurrence (`bytes.rfind`, in C, without copying the
block). The events are not counted (`bytes.count` alone would cost a second per GB): an error
message that names one counts them again. A separator holding a newline cannot occur inside a
JSON string (a newline there is written `\\n`), so in Kineto's own layout every cut falls
between two events.
In a compact layout (`}, {`) a cut could fall inside a string; the chunk is then not JSON, the
parser refuses it, and `TraceEvents.exact` re-reads those chunks with Python's `json` (slow,
exact) and carries on from the last whole event. The last events, the closing bracket and the
keys after it are read with `json` too.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from traceq.errors import TraceFormatError

BLOCK_BYTES = 16 << 20
"""Bytes of JSON text read per chunk: bounds the memory a load uses, whatever the file's size."""

BATCH_BYTES = 64 << 20
"""Bytes of chunks yielded together, for one parse on several threads."""

GZIP_MAGIC = b"\x1f\x8b"
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_HEADER_LIMIT = 64 << 20
_CARRY_LIMIT = 8 * BLOCK_BYTES  # text read exactly without one whole event in it: not JSON


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


@dataclass
class Batch:
    """Consecutive whole events, in `chunks`: each chunk is a list of pieces whose concatenation is
    the text of some events as the file writes them (separators included, no brackets).
    `number` counts the batches (0, 1, ...); `start` is where its first event begins in the JSON
    text; `exact` says its events were read one by one with `json`."""

    chunks: list[list[bytes | memoryview]]
    number: int
    start: int
    exact: bool = False

    @property
    def size(self) -> int:
        return sum(len(p) for chunk in self.chunks for p in chunk)

    def text(self, joint: bytes) -> bytes:
        """Its chunks' texts joined by `joint`."""
        return joint.join(b"".join(chunk) for chunk in self.chunks)


class TraceEvents:
    """Iterate over a trace file's events as batches of chunks; `metadata` holds the other
    top-level keys (filled as they are read: complete once the iteration ends). `bytes_read`
    counts the JSON text consumed, for progress."""

    def __init__(self, path: Path):
        self.path = path
        self.metadata: dict[str, Any] = {}
        self.bytes_read = 0
        self._separator: bytes | None = None
        self._bare = False  # a bare array of events, with no keys around it
        self._rest = b""  # the text after the last cut: the start of an event
        self._starts: list[int] = []  # where each batch's first event begins in the JSON text

    def __iter__(self) -> Iterator[Batch]:
        """The batches from the file's start (again, after an iteration left before its end)."""
        self.metadata.clear()
        self.bytes_read, self._separator, self._bare, self._rest, self._starts = 0, None, False, b"", []
        try:
            with open_text(self.path) as f:
                yield from self._batches(f)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise TraceFormatError(f"{self.path} is a truncated or damaged gzip file ({e}); copy it again") from None
        except UnicodeDecodeError as e:
            raise TraceFormatError(f"{self.path} is not UTF-8 text ({e})") from None

    def _read(self, f: IO[bytes]) -> bytes:
        block = f.read(BLOCK_BYTES)
        self.bytes_read += len(block)
        return block

    def _batches(self, f: IO[bytes]) -> Iterator[Batch]:
        self._rest = self._header(f)
        batch = self._next_batch()
        while True:
            block = self._read(f)
            chunk = self._cut(block) if block else None
            if chunk is not None:
                batch.chunks.append(chunk)
            if batch.chunks and (not block or batch.size >= BATCH_BYTES):
                yield batch  # the caller may call `exact(batch)` before asking for the next
                batch = self._next_batch()
            if not block:
                break
        last = self._tail(self._rest)
        if last:
            yield Batch([[",".join(last).encode()]], batch.number, batch.start, exact=True)

    def _next_batch(self) -> Batch:
        self._starts.append(self.bytes_read - len(self._rest))
        return Batch([], len(self._starts) - 1, self._starts[-1])

    def _cut(self, block: bytes) -> list[bytes | memoryview] | None:
        """The whole events of the text left over and `block`, as pieces; None when they hold
        none yet. Cuts at the last separator, without copying the block."""
        if self._separator is None:
            self._rest += block
            self._separator = _common_separator(self._rest)
            block, self._rest = self._rest, b""
        sep = self._separator
        cut = block.rfind(sep) if sep else -1
        if cut < 0:  # none in the block: one may straddle the two, or the event goes on
            buffer = self._rest + block
            cut = buffer.rfind(sep) if sep else -1
            if cut <= 0:
                self._rest = buffer
                return None
            self._rest = buffer[cut + len(sep) - 1:]
            return [buffer[:cut + 1]]
        pieces = [self._rest, memoryview(block)[:cut + 1]]
        self._rest = block[cut + len(sep) - 1:]
        return pieces

    def exact(self, batch: Batch) -> Batch:
        """`batch`, the one just yielded, re-read with `json`: for chunks the fast cut left
        unreadable. Returns a batch of the whole events it and the text after it hold, each as
        written; the iteration goes on after its last event."""
        assert self._separator is not None
        joint = self._separator[1:-1]
        body = (batch.text(joint) + joint + self._rest).decode("utf-8")
        events, pos = self._events_of(body, "]", partial=True)
        if not events and len(body) > _CARRY_LIMIT:
            raise TraceFormatError(f"{self.path} is not valid JSON in its traceEvents "
                                   f"(after byte {batch.start})")
        self._rest = body[pos:].encode()
        return Batch([[",".join(events).encode()]], batch.number, batch.start, exact=True)

    def index(self, number: int, row: int) -> int:
        """The index in traceEvents of the `row`-th event (0, 1, ...) of batch `number`. The
        events of the batches before it are counted again, as the separators between them:
        slow, for error messages only."""
        sep = self._separator or b"},{"
        count, carry = 0, b""
        with open_text(self.path) as f:
            f.seek(self._starts[0])
            left = self._starts[number] + 1 - self._starts[0]  # up to the '{' ending the last separator
            while left > 0:
                block = f.read(min(BLOCK_BYTES, left))
                if not block:
                    break
                left -= len(block)
                block = carry + block
                count += block.count(sep)
                carry = block[1 - len(sep):]
        return count + row

    def _header(self, f: IO[bytes]) -> bytes:
        """Reads up to the first event; returns what was read after the array's '['."""
        head = b""
        while True:
            start = head.lstrip()[:1]
            if start == b"[":  # a bare array of events
                self._bare = True
                return head[head.index(b"[") + 1:].lstrip()
            if start not in (b"", b"{"):
                raise TraceFormatError(f"{self.path} is not a JSON trace: it starts with {head.lstrip()[:20]!r}")
            found = _EVENTS_KEY.search(head)
            if found:
                self.metadata.update(self._object(head[:found.start()] + b'"traceEvents": null}', "header"))
                return head[found.end():].lstrip()
            block = self._read(f)
            if not block or len(head) > _HEADER_LIMIT:
                raise TraceFormatError(f"{self.path} is JSON but not a PyTorch profiler trace: "
                                       "it has no traceEvents array")
            head += block

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

    def _events_of(self, body: str, end: str | None, partial: bool = False) -> tuple[list[str], int]:
        """The text of each event object in `body` (separated by commas), exactly as written,
        up to `end` (or the end of `body`); and where the reading stopped. `partial`: `body` is
        cut inside an event, which ends the reading there instead of being an error."""
        decoder = json.JSONDecoder()
        events, pos = [], _skip(body, 0)
        while pos < len(body) and body[pos] != end:
            try:
                event, stop = decoder.raw_decode(body, pos)
            except json.JSONDecodeError as e:
                if partial:
                    break
                raise TraceFormatError(f"{self.path} is truncated or not valid JSON in its traceEvents "
                                       f"({e.msg})") from None
            if not isinstance(event, dict):
                raise TraceFormatError(f"{self.path}: traceEvents holds something other than event objects")
            after = _skip(body, stop)
            if partial and after == len(body):
                break  # whether the array goes on after it is not read yet
            events.append(body[pos:stop])
            pos = after
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


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _common_separator(text: bytes) -> bytes | None:
    """The commonest `}` `,` `{` run (with its whitespace) in `text`; None when there is none yet."""
    found = Counter(m.group() for m in _SEPARATOR.finditer(text, 0, min(len(text), 1 << 20)))
    return found.most_common(1)[0][0] if found else None
