"""Renderers turn analysis DataFrames into text; they never read the store.

`render(frame, fmt, title=...)` returns the text for one of FORMATS. Column names carry units
(`_ns`, `_bytes`, `pct`), which the table renderer turns into readable units; csv and json keep
the raw numbers (nanoseconds, bytes). A DuckDB relation (an analysis's `*_relation`) renders as
the frame its `.pl()` gives; the table format reads its rows without importing polars, which
would be half the run time of a quick command such as `traceq top`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    import polars as pl


class Format(str, Enum):
    """Output formats of the tabular commands."""

    table = "table"
    csv = "csv"
    json = "json"


def format_for(fmt: Format | None, out: Path | None) -> Format:
    """The format asked for, else the one the output file's suffix implies, else table."""
    if fmt is not None:
        return fmt
    if out is not None and out.suffix.lstrip(".").lower() in Format.__members__:
        return Format(out.suffix.lstrip(".").lower())
    return Format.table


def render(frame: pl.DataFrame | duckdb.DuckDBPyRelation, fmt: Format, *, title: str | None = None,
           width: int | None = None, keys: Collection[str] | None = None,
           priorities: Mapping[str, int] | None = None) -> str:
    """`frame` as `fmt`; `title`, `width`, `keys` and `priorities` shape a table
    (`render.table.render_table`), csv and json carry every column in full."""
    if fmt is Format.table:
        from traceq.render.table import render_table

        return render_table(frame, title=title, width=width, keys=keys, priorities=priorities)
    from traceq.render.tabular import render_csv, render_json

    if isinstance(frame, duckdb.DuckDBPyRelation):
        frame = frame.pl()
    return render_csv(frame) if fmt is Format.csv else render_json(frame)
