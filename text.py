"""Strings from a trace made safe to print: a trace is someone else's file, and its kernel names,
NVTX texts, GPU and process names can hold terminal control sequences (ESC[2J clears the screen,
OSC 8 makes hyperlinks, OSC 0 retitles the window). Every layer that writes such a string to a
terminal or a log passes it through `visible` first; json output escapes them by itself."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 controls (tab and newline kept out: see `visible`), DEL, line/paragraph separators and
the bidirectional overrides and isolates, which can make text read differently from what it is."""

_LINE_BREAKS = re.compile(r"[\t\n\r]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(s: str, *, keep_newlines: bool = False) -> str:
    """`s` with every control character shown as an escape (`\\x1b`, `\\u202e`), so it prints as
    the characters it holds and never acts on the terminal. Tabs and line breaks are escaped too
    unless `keep_newlines` (for multi-line text of traceq's own that embeds a trace string, pass
    the trace string through `visible` alone)."""
    if not isinstance(s, str):
        s = str(s)
    out = _CONTROL.sub(_escape, s)
    if not keep_newlines:
        out = _LINE_BREAKS.sub(_escape, out)
    return out


_UNSAFE_IN_NAMES = re.compile(r"[^A-Za-z0-9._+=@,-]+")


def file_name(name: str, suffix: str = "", *, limit: int = 120) -> str:
    """A file name made from `name` (a trace's, say) that stays in the folder it is joined to:
    no path separator, no leading dot (no '..' or hidden file), no control or shell-special
    character (each run of them becomes '_'), at most `limit` characters before `suffix`;
    'trace' when nothing is left."""
    base = _UNSAFE_IN_NAMES.sub("_", name).strip("._-")[:limit] or "trace"
    return base + suffix
