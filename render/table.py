"""Terminal tables with readable units, drawn with rich."""

from __future__ import annotations

import io
from datetime import datetime
from typing import TYPE_CHECKING

import duckdb
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    import polars as pl

_HEADERS = {
    "pct": "Time %",
    "avg_ns": "Avg",
    "median_ns": "Median",
    "min_ns": "Min",
    "max_ns": "Max",
    "stddev_ns": "StdDev",
    "total_ns": "Total",
    "dur_ns": "Duration",
    "start_ns": "Start",
    "span_ns": "Span",
    "trace_id": "ID",
    "kernel_count": "Kernels",
    "load_seconds": "Load s",
    "source_schema_version": "Schema",
    "device_id": "Device",
    "stream_id": "Stream",
    "grid_blocks": "Grid",
    "block_threads": "Block",
    "kernel_id": "Kernel #",
    "gpus": "GPUs",
    "ru": "RU %",
    "paper_ru": "Paper RU %",
    "occupancy": "Occupancy %",
    "kineto_occupancy": "Kineto occ. %",
    "ce_fp32": "CE FP32 %",
    "ce_tensor": "CE tensor %",
    "tflops": "TFLOP/s",
    "flops": "FLOP",
    "tensor_core_pct": "Tensor core %",
    "share_of_device_pct": "Device %",
    "blocks_per_sm": "Blocks/SM",
    "registers_per_thread": "Regs",
    "smem_bytes": "Smem",
    "l1_bytes": "L1",
    "l2_bytes": "L2",
    "dram_bytes": "DRAM",
    "achieved_pct": "Of bound %",
}

FRACTIONS = frozenset({"ru", "paper_ru", "occupancy", "kineto_occupancy", "ce_fp32", "ce_tensor"})
"""Columns holding fractions (0..1) in frames; tables show them as percentages."""


def _side(column: str) -> str | None:
    """'a_ru' -> 'ru': the columns `traceq compare` prefixes with its runs' letters."""
    return column[2:] if column[:2] in ("a_", "b_") else None


def header(column: str) -> str:
    if column in _HEADERS:
        return _HEADERS[column]
    side = _side(column)
    if side in FRACTIONS or side in {"ce"}:
        return f"{column[0].upper()} " + ("CE FP32 %" if side == "ce" else _HEADERS[side])
    base = column.removesuffix("_ns").removesuffix("_bytes")
    return base.replace("_", " ").capitalize()


def format_duration(ns: float | int | None) -> str:
    """1234 -> '1.234 µs'; picks ns, µs, ms or s so the number stays short."""
    if ns is None:
        return ""
    value = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3f} {unit}"
    return f"{value:.0f} ns"


def format_bytes(n: float | int | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def format_count(n: float | int | None) -> str:
    """917290000000 -> '917.29 G': SI prefixes for large counts such as FLOPs."""
    if n is None:
        return ""
    value = float(n)
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f}"


def format_cell(column: str, value: object) -> str:
    if value is None:
        return ""
    if column == "flops" or column.endswith("_flops"):
        return format_count(value)  # type: ignore[arg-type]
    if column.endswith("_ns"):
        return format_duration(value)  # type: ignore[arg-type]
    if column.endswith("_bytes"):
        return format_bytes(value)  # type: ignore[arg-type]
    if column in FRACTIONS or _side(column) in FRACTIONS | {"ce"}:
        return f"{100 * float(value):.1f}"  # type: ignore[arg-type]
    if column == "pct" or column.endswith("_pct"):
        return f"{float(value):.1f}"  # type: ignore[arg-type]
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not column.endswith("_id") and column not in {"rank"}:
        return f"{value:,}"
    return str(value)


def render_table(frame: pl.DataFrame | duckdb.DuckDBPyRelation, *, title: str | None = None,
                 width: int | None = None) -> str:
    """A boxed table; numbers right-aligned and never cut; long text (names, paths, tools) cut
    with an ellipsis so the table fits `width`."""
    columns, numeric, rows = _columns_and_rows(frame)
    cells = {c: [format_cell(c, row[i]) for row in rows] for i, c in enumerate(columns)}
    table = Table(title=title, title_justify="left", header_style="bold")
    fits = {c: max([len(header(c)), *(len(v) for v in cells[c])]) for c in columns}
    # Text columns longer than 24 characters (names, paths, splits) share the width that the
    # numbers leave, in proportion to their length; numbers are never cut.
    wide = [c for c in columns if not numeric[c] and fits[c] > 24]
    narrow = sum(fits[c] for c in columns if c not in wide)
    room = max((width or 160) - narrow - 3 * len(columns) - 1, 12 * len(wide))  # 3 cells of border a column
    wanted = sum(fits[c] for c in wide)
    floor = 12  # every long text column keeps this much; the rest of the room goes by length
    spare, extra = room - floor * len(wide), sum(fits[c] - floor for c in wide)
    for column in columns:
        fit = fits[column]
        if column in wide and wanted > room:
            fit = floor + max(spare, 0) * (fit - floor) // max(extra, 1)
        table.add_column(
            header(column),
            justify="right" if numeric[column] else "left",
            overflow="ellipsis",
            no_wrap=True,
            width=fit,
        )
    for i in range(len(rows)):
        table.add_row(*(cells[c][i] for c in columns))
    buffer = io.StringIO()
    console = Console(file=buffer, width=width or 160, force_terminal=False, color_system=None,
                      soft_wrap=False)
    console.print(table)
    if not rows:
        console.print("(no rows)")
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
