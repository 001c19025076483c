"""CSV and JSON: raw values (times in ns, sizes in bytes), one record per row."""

from __future__ import annotations

import json

import polars as pl


def render_csv(frame: pl.DataFrame) -> str:
    """CSV; a nested column (a list or a struct, which CSV cannot hold: `traceq sql` can give
    one) is written as its JSON text in one cell."""
    nested = [c for c, t in frame.schema.items() if isinstance(t, (pl.List, pl.Array, pl.Struct))]
    if nested:
        frame = frame.with_columns(pl.col(c).map_elements(lambda v: json.dumps(_plain(v), default=str),
                                                          return_dtype=pl.String) for c in nested)
    return frame.write_csv()


def _plain(value: object) -> object:
    """A polars nested value as JSON data (a Series inside a list column becomes a list)."""
    if isinstance(value, pl.Series):
        return [_plain(v) for v in value.to_list()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def render_json(frame: pl.DataFrame) -> str:
    """A JSON array of objects, one per row; datetimes as ISO 8601 strings."""
    return json.dumps(frame.to_dicts(), default=str, indent=1) + "\n"
