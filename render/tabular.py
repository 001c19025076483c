"""CSV and JSON: raw values (times in ns, sizes in bytes), one record per row."""

from __future__ import annotations

import json

import polars as pl


def render_csv(frame: pl.DataFrame) -> str:
    return frame.write_csv()


def render_json(frame: pl.DataFrame) -> str:
    """A JSON array of objects, one per row; datetimes as ISO 8601 strings."""
    return json.dumps(frame.to_dicts(), default=str, indent=1) + "\n"
