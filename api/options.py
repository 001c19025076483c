"""Small helpers the API's classes share: option values turned into what the analyses take."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from traceq.errors import OptionError, TraceqWarning

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
    """The iteration regex to use: `value` (checked: a regex DuckDB's RE2 compiles), else the default.

    Raises:
        OptionError: `value` is not a regular expression.
    """
    from traceq.analysis.structure.conventions import ITERATION_REGEX

    if value is None:
        return ITERATION_REGEX
    import duckdb

    from traceq.store import connect

    try:
        connect().execute("SELECT regexp_matches('', ?)", [value])
    except duckdb.Error as e:
        first = str(e).splitlines()[0] if str(e) else "not a regular expression"
        raise OptionError(f"iteration regex {value!r}: {first}") from None
    return value


def _positive(name: str, value: int | None) -> int | None:
    """`value` when it is None or at least 1; else OptionError naming the option."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise OptionError(f"{name} must be a whole number of at least 1 ({value!r} given)")
    return value


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def _note(message: str) -> None:
    warnings.warn(message, TraceqWarning, stacklevel=3)



def _rules_key() -> object:
    """What the kernel rules in force depend on (analyses keep results per rules file)."""
    from traceq.analysis.kernels.classify import default_rules

    return id(default_rules())
