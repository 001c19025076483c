"""Terminal tables, drawn with rich, that a person can read at any width.

Numbers and units are never cut. A table's key columns (those that say what a row is: a kernel's
name, a layer, an iteration, a rank; `Column.key` in render/columns.py, or the keys a command
names) are always shown. When a table is wider than the terminal, the columns a reader needs
least are left out first (their priority in render/columns.py, or the command's own), while long
text is shortened (names cut in the middle, keeping the end that tells kernels apart; lists cut
between items, 'conv1, conv2 +3'; key labels, at the narrowest, cut as names), and one line under
the table names the columns left out. Never left out: a key column, or one without which two rows
would look the same. Rows whose names differ only past the cut show the part that differs, and
names still cut alike end in '~1', '~2'. csv and json always carry every column and every value
in full.
"""

from __future__ import annotations

import io
import textwrap
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import duckdb
from rich.console import Console
from rich.table import Table
from rich.text import Text

from traceq.render.columns import NUMERIC_KINDS, Column, column_spec, format_value
from traceq.text import visible
from traceq.units import wrap

if TYPE_CHECKING:
    import polars as pl

NAME_WIDTHS = (40, 24, 8)
"""A name column's width when the table is too wide: comfortable, least before columns a reader
needs are left out, least of all (a key column's, when the keys alone are too wide)."""
LIST_WIDTHS = (24, 12, 8)
ELLIPSIS = "…"
SAID_WHEN_NONE = frozenset({"layer", "pass", "iteration", "stage", "layer_path"})
"""Columns whose empty cell would read as a missing value: a row in no layer, pass or iteration
says `(none)` (csv and json keep their empty value)."""


@dataclass
class _Column:
    name: str
    spec: Column
    cells: list[str]
    key: bool = False  # says what a row is: never left out
    natural: int = 0  # everything on one line
    comfortable: int = 0
    minimum: int = 0
    width: int = 0

    def __post_init__(self) -> None:
        widest = max(map(len, self.cells), default=0)
        word = max(map(len, self.spec.header.split()), default=1)
        self.natural = max(widest, len(self.spec.header))
        if self.spec.kind in ("name", "list"):
            comfortable, least, _ = NAME_WIDTHS if self.spec.kind == "name" else LIST_WIDTHS
            self.comfortable = max(min(self.natural, comfortable), word)
            self.minimum = max(min(self.natural, least), word)
        else:  # numbers and labels are never cut; their header may wrap
            self.comfortable, self.minimum = self.natural, max(widest, word)

    @property
    def numeric(self) -> bool:
        return self.spec.kind in NUMERIC_KINDS

    @property
    def cuttable(self) -> bool:
        """Its text may be cut: a name or list, or a key column's label (at the narrowest)."""
        return self.spec.kind in ("name", "list") or (self.key and self.spec.kind == "label")


def _total(widths: list[int]) -> int:
    """Characters a table of columns this wide takes: 3 of border and padding per column, plus 1."""
    return sum(widths) + 3 * len(widths) + 1


def _distinct(columns: list[_Column]) -> int:
    return len(set(zip(*(c.cells for c in columns)))) if columns else 0


def _leave_out(kept: list[_Column], left_out: list[_Column], size: str, width: int, lowest: int) -> None:
    """Move columns of priority `lowest` or more (least needed, then text, then rightmost, first) from
    `kept` to `left_out` until the kept ones fit `width` at their `size`; never a key column, nor
    one without which two rows would look the same."""
    rows = _distinct(kept)
    while _total([getattr(c, size) for c in kept]) > width:
        candidates = [c for c in kept if not c.key and c.spec.priority >= lowest
                      and _distinct([k for k in kept if k is not c]) == rows]
        if not candidates:
            return
        # the least needed first; of equal need, text before numbers (a command exists for its
        # numbers, text not telling rows apart is their context), then the rightmost
        victim = max(candidates, key=lambda c: (c.spec.priority, not c.numeric, kept.index(c)))
        kept.remove(victim)
        left_out.append(victim)


def _least(column: _Column) -> int:
    """The narrowest a column gets: a number its widest cell, text `NAME_WIDTHS[2]`."""
    if not column.cuttable:
        return column.minimum
    return min(column.minimum, max(NAME_WIDTHS[2], max(map(len, column.spec.header.split()), default=1)))


def _layout(columns: list[_Column], width: int) -> tuple[list[_Column], list[_Column]]:
    """(columns kept, each with its width; columns left out) for a table `width` wide: the least
    needed columns are left out while names would be cut below comfortable, then below least;
    then text goes to its least; then whatever is neither a key nor needed to tell rows apart."""
    kept, left_out = list(columns), []
    if _total([c.natural for c in kept]) > width:
        _leave_out(kept, left_out, "comfortable", width, lowest=4)
        _leave_out(kept, left_out, "minimum", width, lowest=2)
        for c in kept:
            c.width = _least(c)
        _leave_out(kept, left_out, "width", width, lowest=1)
    size = next((s for s in ("natural", "comfortable", "minimum") if _total([getattr(c, s) for c in kept]) <= width),
                None)
    if size is None:  # text goes below its least-before-leaving-out, the widest first, the key columns' last
        for c in kept:
            c.width = c.minimum
        for keys in (False, True):
            while _total([k.width for k in kept]) > width:
                shrinkable = [c for c in kept if c.cuttable and c.key is keys and c.width > _least(c)]
                if not shrinkable:
                    break
                max(shrinkable, key=lambda c: c.width).width -= 1
    else:
        for c in kept:
            c.width = getattr(c, size)
    spare = width - _total([c.width for c in kept])
    fixed = [c for c in kept if not c.cuttable]
    _widen(fixed, spare)  # headers on one line first, then longer names
    _widen(kept, width - _total([c.width for c in kept]))
    return kept, left_out


def _widen(columns: list[_Column], spare: int) -> None:
    """Share `spare` characters among the columns narrower than their natural width, in
    proportion to what each lacks."""
    while spare > 0:
        short = [c for c in columns if c.width < c.natural]
        lacking = sum(c.natural - c.width for c in short)
        if not short:
            return
        if lacking <= spare:
            for c in short:
                c.width = c.natural
            return
        given = 0
        for c in short:
            more = spare * (c.natural - c.width) // lacking
            c.width += more
            given += more
        if given == 0:  # less than one character each: the ones lacking most first
            for c in sorted(short, key=lambda c: c.width - c.natural)[:spare]:
                c.width += 1
            return
        spare -= given


def cut_middle(text: str, width: int) -> str:
    """`text` in `width` characters: its start, '…', and its end (a little more end than start:
    kernel names differ most at the end, in tile sizes and suffixes)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    head = (width - 1) * 2 // 5
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def _cut_showing(text: str, width: int, at: int) -> str:
    """`text` in `width` characters with the part from position `at` on kept in view: start,
    '…', the window around `at`, '…', end."""
    edge = max(1, width // 5)
    window = width - 2 * edge - 2
    if window < 3 or len(text) <= width:
        return cut_middle(text, width)
    start = min(max(edge, at - window // 3), len(text) - edge - window)
    end = start + window
    head = text[:edge] + ELLIPSIS if start > edge else text[:start]
    tail = ELLIPSIS + text[-edge:] if end < len(text) - edge else text[end:]
    return head + text[start:end] + tail


def cut_names(values: list[str], width: int) -> list[str]:
    """Each value cut in the middle to `width`; values whose cuts collide show, instead of their
    middle, the part where they differ."""
    distinct = list(dict.fromkeys(values))
    short = {v: cut_middle(_essential(v), width) for v in distinct}
    groups: dict[str, list[str]] = defaultdict(list)
    for v in distinct:
        groups[short[v]].append(v)
    for members in groups.values():
        if len(members) > 1:  # their essential parts where those differ (no 'void ', no argument list)
            texts = {v: _essential(v) for v in members}
            if len(set(texts.values())) < len(members):
                texts = {v: v for v in members}
            for v in members:
                differs = max(_common_prefix(texts[v], texts[o]) for o in members if o is not v)
                short[v] = _cut_showing(texts[v], width, differs)
    return [short[v] for v in values] if len(set(short.values())) == len(short) else \
        [_numbered(short, width)[v] for v in values]


def _numbered(short: dict[str, str], width: int) -> dict[str, str]:
    """`short` (full name -> cut name) with every cut shared by different names made unique: each
    of them ends in '~1', '~2', ... (numbered across the table, in the order the names first
    came), its cut made that much shorter, so that two different kernels never print alike."""
    groups: dict[str, list[str]] = defaultdict(list)
    for full, cut in short.items():
        groups[cut].append(full)
    out = dict(short)
    number = 0
    for cut, members in groups.items():
        if len(members) < 2:
            continue
        for full in members:
            number += 1
            mark = f"~{number}"
            room = max(width - len(mark), 1)
            out[full] = (cut[:room - 1] + ELLIPSIS if len(cut) > room else cut) + mark
    return out


def _essential(name: str) -> str:
    """A demangled C++ name without its return type and argument list when it has them
    ('void f<int, 2>(float *, int)' -> 'f<int, 2>'): what tells kernels apart is the name and its
    template arguments."""
    name = name.removeprefix("void ")
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, 0, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i] if name[i - 1] not in " ,(" else name
    return name


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cut_list(text: str, width: int) -> str:
    """'conv1, conv2, conv3, conv4' in `width` characters: the first items that fit, then '+N'
    for the N left out ('conv1, conv2 +2'); items are never cut unless the first alone is too wide."""
    if len(text) <= width:
        return text
    items = text.split(", ")
    for k in range(len(items) - 1, 0, -1):
        shown = ", ".join(items[:k]) + f" +{len(items) - k}"
        if len(shown) <= width:
            return shown
    more = f" +{len(items) - 1}" if len(items) > 1 else ""
    return cut_middle(items[0], max(width - len(more), 1)) + more


def _shortened(column: _Column) -> list[str]:
    if column.spec.kind == "name" or (column.spec.kind == "label" and column.width < max(map(len, column.cells), default=0)):
        return cut_names(column.cells, column.width)
    if column.spec.kind == "list":  # single items (a layer as a key) are names that must stay apart
        singles = list(dict.fromkeys(v for v in column.cells if ", " not in v))
        cut = dict(zip(singles, cut_names(singles, column.width)))
        return [cut[v] if v in cut else cut_list(v, column.width) for v in column.cells]
    return column.cells


def render_table(frame: pl.DataFrame | duckdb.DuckDBPyRelation, *, title: str | None = None,
                 width: int | None = None, keys: Collection[str] | None = None,
                 priorities: Mapping[str, int] | None = None) -> str:
    """A boxed table at most `width` (default 160) characters wide, unless its key columns alone
    are wider; numbers right-aligned and never cut (see the module docstring). `keys`: the
    columns that say what a row is in this table [default: those render/columns.py marks as
    keys]; `priorities`: this table's own priority for some columns (1 to 5: 5 left out first)."""
    width = width or 160
    names, numeric, rows = _columns_and_rows(frame)
    columns = []
    for i, name in enumerate(names):
        spec = column_spec(name, numeric[name])
        if priorities and name in priorities:
            spec = replace(spec, priority=priorities[name])
        # a trace's names can hold terminal sequences: shown as escapes before any cutting
        cells = [visible(format_value(spec.kind, row[i])) for row in rows]
        if name in SAID_WHEN_NONE:
            cells = [c or "(none)" for c in cells]
        columns.append(_Column(name, spec, cells, key=spec.key if keys is None else name in keys))
    kept, left_out = _layout(columns, width)
    table = Table(header_style="bold")
    for c in kept:
        table.add_column(Text("\n".join(textwrap.wrap(c.spec.header, c.width))), no_wrap=True,
                         justify="right" if c.numeric else "left", width=c.width, min_width=c.width,
                         max_width=c.width)
    cells = [_shortened(c) for c in kept]
    for i in range(len(rows)):
        table.add_row(*(Text(column[i]) for column in cells))  # Text: no rich markup in names
    buffer = io.StringIO()
    console = Console(file=buffer, width=max(width, _total([c.width for c in kept])), force_terminal=False,
                      color_system=None, soft_wrap=False)
    if title:  # wrapped here: never between a number and its unit
        shown = [visible(part) for part in title.split("\n")]
        console.print(Text("\n".join(line for part in shown for line in (wrap(part, width) or [""]))), width=width)
    console.print(table)
    if not rows:
        console.print("(no rows)")
    if left_out:
        console.print(Text(f"Left out to fit {width} columns: {', '.join(c.spec.header for c in left_out)} "
                           "(a wider terminal shows them; --format csv or json has every column)"), width=width)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


_NUMERIC_TYPES = frozenset({"tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint",
                            "uinteger", "ubigint", "uhugeint", "float", "double", "decimal"})


def _columns_and_rows(
    frame: pl.DataFrame | duckdb.DuckDBPyRelation,
) -> tuple[list[str], dict[str, bool], list[tuple]]:
    """Column names, whether each is numeric, and the rows; a DuckDB relation needs no polars."""
    if isinstance(frame, duckdb.DuckDBPyRelation):
        rows = frame.fetchall()
        return frame.columns, {c: t.id in _NUMERIC_TYPES for c, t in zip(frame.columns, frame.types)}, rows
    return frame.columns, {c: frame.schema[c].is_numeric() for c in frame.columns}, frame.rows()
