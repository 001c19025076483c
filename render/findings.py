"""`traceq advise`'s findings as text: a numbered list wrapped to the terminal, each finding with
its time at stake, evidence and fix (a table would cut the sentences)."""

from __future__ import annotations

import polars as pl

from traceq.units import format_duration, wrap


def render_findings(frame: pl.DataFrame, *, title: str | None = None, width: int | None = None) -> str:
    """`advise.advise`'s frame (rank, title, time_ns, pct, evidence, fix, rule) as wrapped text."""
    width = max(width or 100, 60)
    lines = wrap(title, width) if title else []
    if frame.is_empty():
        lines.append("No finding reached its threshold (docs/advise.md).")
    for row in frame.iter_rows(named=True):
        lines.append("")
        head = f"{row['rank']}. {row['title']}: {format_duration(row['time_ns'])} at stake ({row['pct']:.1f} %)"
        lines += wrap(head, width, subsequent_indent="   ")
        for label in ("evidence", "fix"):
            lines += wrap(f"{label.capitalize()}: {row[label]}", width, initial_indent="   ",
                                   subsequent_indent="   ")
    return "\n".join(lines) + "\n"
