"""A JSON document read as a stream of values, for files too large to parse whole (rocprofv3's
JSON, `ingest/amd_json.py`): the caller walks the objects and arrays it expects one member at a
time, and parses each member it wants (a record, a small table) with Python's `json`, from a
window of the text that holds a few megabytes, whatever the file's size.

`Walk.members()` yields an object's keys (the caller reads or skips each value before asking for
the next); `Walk.items()` steps through an array; `Walk.value()` parses one whole value; `skip()`
steps over one without keeping it (a large array one element at a time). The text is decoded
as UTF-8 (lone surrogates let through, as `json.loads` of bytes does); the file may be gzip.
Anything that is not JSON raises `json.JSONDecodeError` (a ValueError), a cut gzip stream
`EOFError`, a bad one `OSError`: as `json.loads` of the whole file would.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

BLOCK_CHARS = 4 << 20
"""Characters read at a time: the window a walk holds, besides the one value being parsed."""

_WS = re.compile(r"[ \t\n\r]*")
_MARGIN = 1 << 20
"""An error this far before the window's end is the file's; nearer, it may be the window's cut."""
_TAIL = 64
"""A value parsed must end this far before the window's end (or the file's): else read on."""


class Walk:
    """The JSON text of `path` (plain or gzip), read forward a window at a time."""

    def __init__(self, path: Path):
        self.raw: IO[bytes] = path.open("rb")
        try:
            gz = self.raw.read(2) == b"\x1f\x8b"
            self.raw.seek(0)
            self.file: IO[bytes] = gzip.GzipFile(fileobj=self.raw, mode="rb") if gz else self.raw
        except BaseException:
            self.raw.close()
            raise
        self.text = codecs.getincrementaldecoder("utf-8")("surrogatepass")
        self.buf, self.pos, self.eof = "", 0, False
        self._decode = json.JSONDecoder().raw_decode
        self._fill(BLOCK_CHARS)
        if self.buf.startswith("\ufeff"):  # a byte-order mark, as json.loads of bytes drops it
            self.pos = 1

    def close(self) -> None:
        self.file.close()
        self.raw.close()

    @property
    def bytes_read(self) -> int:
        """Bytes of the file (compressed, for gzip) read so far."""
        return self.raw.tell()

    def _fill(self, want: int) -> None:
        """At least `want` characters after `pos` in the window, or the rest of the file."""
        if len(self.buf) - self.pos >= want or self.eof:
            return
        parts = [self.buf[self.pos:]]
        have = len(parts[0])
        while have < want:
            block = self.file.read(max(want - have, BLOCK_CHARS))
            if not block:
                parts.append(self.text.decode(b"", final=True))
                self.eof = True
                break
            chunk = self.text.decode(block)
            parts.append(chunk)
            have += len(chunk)
        self.buf, self.pos = "".join(parts), 0

    def peek(self) -> str:
        """The next character that is not white space ('' at the end of the text)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or self.eof:
                return self.buf[self.pos:self.pos + 1]
            self._fill(BLOCK_CHARS)

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self._error(f"Expecting '{char}'")
        self.pos += 1

    def _error(self, message: str) -> json.JSONDecodeError:
        return json.JSONDecodeError(message, self.buf, self.pos)

    def value(self) -> Any:
        """The next whole value, parsed."""
        self.peek()
        want = BLOCK_CHARS
        while True:
            self._fill(want)
            try:
                value, end = self._decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                near_end = e.pos >= len(self.buf) - _MARGIN or e.msg.startswith("Unterminated string")
                if self.eof or not near_end:
                    raise
                want = 4 * max(want, len(self.buf) - self.pos)
                continue
            if end > len(self.buf) - _TAIL and not self.eof:  # a number cut by the window ('1e' of '1e5') parses
                want = 4 * max(want, len(self.buf) - self.pos)
                continue
            self.pos = end
            return value

    def members(self) -> Iterator[str]:
        """The keys of the object that comes next; the caller reads or skips each one's value."""
        if not self._opened("{", "}"):
            return
        while True:
            if self.peek() != '"':
                raise self._error("Expecting property name enclosed in double quotes")
            key = self.value()
            self.expect(":")
            yield key
            if self._closed("}"):
                return

    def items(self) -> Iterator[None]:
        """Steps through the array that comes next: the caller reads or skips one element each."""
        if not self._opened("[", "]"):
            return
        while True:
            yield None
            if self._closed("]"):
                return

    def slabs(self) -> Iterator[list[Any]]:
        """The elements of the array that comes next, parsed: many at once where the file writes
        them compactly (`},{` between objects), else one at a time. A run of elements up to the
        window's last `},{` is parsed as one array; a `},{` inside a string or a nested array
        leaves that text unbalanced, so the parse fails and those elements are read one by one."""
        if not self._opened("[", "]"):
            return
        slow_until = -1
        while True:
            self._fill(BLOCK_CHARS)
            if self.pos > slow_until:
                cut = self.buf.rfind("},{", self.pos, len(self.buf) - _TAIL)
                if cut > self.pos:
                    try:
                        items = json.loads("[" + self.buf[self.pos:cut + 1] + "]")
                    except ValueError:
                        slow_until = cut
                    else:
                        self.pos = cut + 2
                        yield items
                        continue
            yield [self.value()]
            if self._closed("]"):
                return

    def _opened(self, opening: str, closing: str) -> bool:
        """Steps over `opening`; False, with `closing` stepped over too, when nothing is inside."""
        self.expect(opening)
        if self.peek() == closing:
            self.pos += 1
            return False
        return True

    def _closed(self, closing: str) -> bool:
        """After an element: True at `closing`, False at ',' (either stepped over); else the
        error json.loads gives, at that character."""
        char = self.peek()
        if char == closing:
            self.pos += 1
            return True
        if char != ",":
            raise self._error("Expecting ',' delimiter")
        self.pos += 1
        return False

    def skip(self, depth: int = 3) -> None:
        """Steps over the next value; arrays and objects `depth` levels deep a member at a time."""
        char = self.peek()
        if depth and char == "[":
            for _ in self.items():
                self.skip(depth - 1)
        elif depth and char == "{":
            for _ in self.members():
                self.skip(depth - 1)
        else:
            self.value()

    def end(self) -> None:
        """Only white space is left."""
        if self.peek() != "":
            raise self._error("Extra data")
