"""Small helpers the API's classes share: option values turned into what the analyses take."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from traceq.errors import TraceqWarning

if TYPE_CHECKING:
    import duckdb


def _run_traces(con: duckdb.DuckDBPyConnection, run_id: int) -> list[int]:
    return [int(t) for (t,) in con.execute("SELECT DISTINCT trace_id FROM ranks WHERE run_id = ?", [run_id]).fetchall()]


def _remove_store(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass



def _regex(value: str | None) -> str:
    from traceq.analysis.structure.conventions import ITERATION_REGEX

    return ITERATION_REGEX if value is None else value


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def _note(message: str) -> None:
    warnings.warn(message, TraceqWarning, stacklevel=3)



def _rules_key() -> object:
    """What the kernel rules in force depend on (analyses keep results per rules file)."""
    from traceq.analysis.kernels.classify import default_rules

    return id(default_rules())
