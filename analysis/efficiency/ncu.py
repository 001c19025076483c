"""Nsight Compute's measured launches joined to a trace's kernels (`traceq load --ncu REPORT
--into TRACE`), kept in the store's `ncu_metrics` and `ncu_reports`.

ncu numbers the launches it profiled in launch order (`ID`); the trace has every launch. A
profiled launch is joined to the kernel of the same name (the demangled, mangled or short name,
whichever ncu wrote), grid and block that comes at the same place in launch order among those
launches, counted within the NVTX push/pop stack of the launching thread where ncu recorded one
(`ncu --nvtx`) and the trace has it; launches whose stack the trace does not have are then
counted without it, from where the trace's launches repeat the profiled sequence
(`window_start`: ncu may have skipped launches, `--launch-skip`). ncu usually profiles a window (one iteration, `--launch-skip/--launch-count`):
the kernels outside it have no measurement, unless `extend`, where each takes the mean of the
profiled launches of its name, grid, block and innermost NVTX range (else of its name, grid and
block), marked 'extended'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

import duckdb
import polars as pl

from traceq.ingest.ncu import METRICS, NVTX_SEP, NcuReport
from traceq.store import ensure_tables, first_row, registered

NCU_TABLES = ("ncu_reports", "ncu_metrics")
_CONFIG = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


@dataclass(frozen=True)
class NcuJoin:
    """What `join_ncu` did: the report's launches, how many were joined (with_nvtx of them within
    their NVTX stack), the trace's kernels, how many kernels --ncu-extend gave values, and whether
    an earlier report of the trace was replaced."""

    trace_id: int
    launches: int
    matched: int
    with_nvtx: int
    kernels: int
    extended: int
    replaced: bool
    metrics: tuple[str, ...]

    @property
    def unmatched(self) -> int:
        return self.launches - self.matched


def join_ncu(con: duckdb.DuckDBPyConnection, trace_id: int, report: NcuReport, *, extend: bool = False) -> NcuJoin:
    """Join `report`'s launches to trace `trace_id`'s kernels and keep them in `ncu_metrics`
    (replacing the trace's earlier report), inside the caller's transaction."""
    ensure_tables(con, *NCU_TABLES)
    kernels = trace_kernels(con, trace_id, paths=report.has_nvtx or extend)
    pairs = match_launches(report.launches, kernels)
    measured = (pairs.join(report.launches.select("ncu_id", *METRICS), on="ncu_id")
                .with_columns(matched_by=pl.lit("launch")))
    extended = extend_measured(measured, kernels) if extend else measured.clear()
    rows = pl.concat([measured.select("kernel_id", "ncu_id", "matched_by", *METRICS),
                      extended.select("kernel_id", "ncu_id", "matched_by", *METRICS)], how="vertical_relaxed")
    replaced = first_row(con, "SELECT 1 FROM ncu_reports WHERE trace_id = ?", [trace_id]) is not None
    for table in NCU_TABLES:
        con.execute(f"DELETE FROM {table} WHERE trace_id = ?", [trace_id])
    columns = ", ".join(["kernel_id", "ncu_id", "matched_by", *METRICS])
    with registered(con, rows=rows) as view:
        con.execute(f"INSERT INTO ncu_metrics (trace_id, {columns}) SELECT ?, {columns} FROM {view['rows']} "
                    "ORDER BY kernel_id", [trace_id])
    con.execute("INSERT INTO ncu_reports VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [trace_id, str(report.path.resolve()), report.sha256, report.launches.height, pairs.height,
                 extended.height, ",".join(report.present), datetime.now(UTC).replace(tzinfo=None)])
    return NcuJoin(trace_id, report.launches.height, pairs.height, int(pairs["with_nvtx"].sum() or 0),
                   kernels.height, extended.height, replaced, report.present)


def trace_kernels(con: duckdb.DuckDBPyConnection, trace_id: int, *, paths: bool) -> pl.DataFrame:
    """The trace's kernels in launch order (ncu's: that of the calls, which streams may run out
    of order): kernel_id, order_ns (when the launch was called, as found at load; else when the
    kernel started), name, short_name, mangled_name, grid and block, and (`paths`) nvtx_path: the
    push/pop ranges open on the launching thread when the launch was called, outermost first,
    joined by NVTX_SEP (null: none, or no NVTX)."""
    t = int(trace_id)
    kernels = con.sql(f"SELECT kernel_id, coalesce(launch_start_ns, start_ns) AS order_ns, name, short_name, "
                      f"mangled_name, {', '.join(_CONFIG)} FROM kernel_rows WHERE trace_id = {t} "
                      "ORDER BY order_ns, kernel_id").pl()
    if not paths or first_row(con, f"SELECT 1 FROM nvtx_events e JOIN nvtx_attributes a ON a.trace_id = e.trace_id "
                                   f"AND a.attributes_id = e.attributes_id WHERE e.trace_id = {t} "
                                   "AND a.kind = 'pushpop' LIMIT 1") is None:
        return kernels.with_columns(nvtx_path=pl.lit(None, pl.String))
    stacks = con.sql(f"""
        WITH k AS (SELECT kernel_id, pid, launch_tid, launch_start_ns FROM kernel_launches
                   WHERE trace_id = {t} AND launch_start_ns IS NOT NULL),
             r AS (SELECT pid, tid, start_ns, end_ns, name FROM nvtx
                   WHERE trace_id = {t} AND kind = 'pushpop' AND end_ns IS NOT NULL)
        SELECT k.kernel_id, string_agg(coalesce(r.name, ''), chr(31) ORDER BY r.start_ns, r.end_ns DESC) AS nvtx_path
        FROM k JOIN r ON r.tid = k.launch_tid AND (r.pid IS NULL OR k.pid IS NULL OR r.pid = k.pid)
                     AND r.start_ns <= k.launch_start_ns AND k.launch_start_ns < r.end_ns
        GROUP BY k.kernel_id""").pl()
    return kernels.join(stacks, on="kernel_id", how="left").sort("order_ns", "kernel_id")


def match_launches(ncu: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """Pairs (ncu_id, kernel_id, with_nvtx) of `ncu`'s launches (`NcuReport.launches`) and the
    trace's `kernels` (`trace_kernels`): the k-th profiled launch of a name, grid, block (and NVTX
    stack) is the k-th such kernel of the trace."""
    kernels = kernels.with_columns(canon=canonical_names(kernels["name"]))
    full = set(kernels["name"].to_list())
    short = set(kernels["short_name"].to_list())
    canon = set(kernels["canon"].to_list())
    mangled = (kernels.filter(pl.col("mangled_name").is_not_null())
               .unique("mangled_name", keep="first").select("mangled_name", "name"))
    named = (ncu.join(mangled, left_on="name", right_on="mangled_name", how="left", suffix="_demangled")
             .with_columns(canon=canonical_names(ncu["name"]))
             .with_columns(key=pl.when(pl.col("name").is_in(full)).then(pl.format("n{}", "name"))
                           .when(pl.col("name_demangled").is_not_null()).then(pl.format("n{}", "name_demangled"))
                           .when(pl.col("canon").is_in(canon)).then(pl.format("c{}", "canon"))
                           .when(pl.col("name").is_in(short)).then(pl.format("s{}", "name")))
             .filter(pl.col("key").is_not_null()).sort("ncu_id"))
    pairs: list[pl.DataFrame] = []
    for with_path in (True, False):
        start = None if with_path else window_start(_untaken(named, pairs, "ncu_id"), _untaken(kernels, pairs, "kernel_id"))
        for kind, column in (("n", "name"), ("c", "canon"), ("s", "short_name")):
            left = _untaken(named.filter(pl.col("key").str.starts_with(kind)), pairs, "ncu_id")
            right = _untaken(kernels.with_columns(key=pl.lit(kind) + pl.col(column)), pairs, "kernel_id")
            if start is not None:
                right = right.filter(pl.col("order_ns") >= start)
            keys = ["key", *_CONFIG, *(["nvtx_path"] if with_path else [])]
            if with_path:
                left, right = left.filter(pl.col("nvtx_path").is_not_null()), right.filter(pl.col("nvtx_path").is_not_null())
            left = left.with_columns(nth=pl.int_range(pl.len()).over(keys))  # sorted by ncu_id
            right = right.with_columns(nth=pl.int_range(pl.len()).over(keys))  # in launch order
            found = left.join(right, on=[*keys, "nth"], how="inner").select(
                "ncu_id", "kernel_id", with_nvtx=pl.lit(with_path))
            if found.height:
                pairs.append(found)
    if not pairs:
        return pl.DataFrame(schema={"ncu_id": pl.Int64, "kernel_id": pl.Int64, "with_nvtx": pl.Boolean})
    return pl.concat(pairs).sort("ncu_id")


def _untaken(frame: pl.DataFrame, pairs: list[pl.DataFrame], column: str) -> pl.DataFrame:
    """`frame` less the rows whose `column` a pair has taken already (each launch and each kernel
    is joined once)."""
    for taken in pairs:
        frame = frame.join(taken.select(column), on=column, how="anti")
    return frame


WINDOW_PROBE = 64
"""Profiled launches compared at each place the window could start."""


def window_start(ncu: pl.DataFrame, kernels: pl.DataFrame) -> int | None:
    """Where in the trace the profiled launches begin, when ncu skipped some (`--launch-skip`, a
    later iteration) and no NVTX stack tells: the order_ns of the trace's launch from which the
    sequence of profiled (name, grid, block) best repeats the trace's own sequence of those
    kinds of launches, the earliest of the best; None when that is the first (or none fits).
    `ncu` in ID order and `kernels` in launch order, both with `canon` and the grid and block."""
    if ncu.is_empty() or kernels.is_empty():
        return None
    key = pl.concat_str([pl.col("canon"), *[pl.col(c).cast(pl.String) for c in _CONFIG]], separator="|")
    q = ncu.select(key.alias("k"))["k"].to_list()
    codes = {k: i for i, k in enumerate(dict.fromkeys(q))}
    trace = (kernels.select(key.alias("k"), "order_ns").filter(pl.col("k").is_in(list(codes)))
             .with_columns(pl.col("k").replace_strict(codes, return_dtype=pl.Int64)))
    probe = [codes[k] for k in q[:WINDOW_PROBE]]
    score = pl.sum_horizontal([(pl.col("k").shift(-j) == code).fill_null(False).cast(pl.Int32)
                               for j, code in enumerate(probe)])
    starts = (trace.with_columns(score=score).with_row_index("at")
              .filter(pl.col("k") == probe[0]))
    if starts.height < 2:
        return None
    best = starts.sort("score", "at", descending=[True, False]).row(0, named=True)
    first = starts.row(0, named=True)
    return None if best["at"] == first["at"] else int(best["order_ns"])


_QUALIFIER = re.compile(r"(?:[A-Za-z_]\w*::)+")
_CAST = re.compile(r"\((?:[A-Za-z_]\w*\s*)+\)(?=-?\d)")


def canonical_names(names: pl.Series) -> pl.Series:
    """Kernel names as both tools' demanglers agree on them: Nsight Compute drops some namespaces
    and the casts of template arguments ('cutlass__5x_cudnn::LinearCombination<float, 4, ...>'
    for nsys' 'cutlass__5x_cudnn::epilogue::thread::LinearCombination<float, (int)4, ...>'), so
    every qualifier, such cast and space goes. Nsight Compute 2025 also writes a template's
    parameters as T1, T2 in the argument list, lambdas as `[lambda()(instance3)]` (CUPTI's
    `{lambda()#3}`), `<unnamed>` for `(anonymous namespace)`, integers without their `u`/`ul`
    suffix, booleans as 0/1 and `void` before a function template argument: the argument list,
    the anonymous namespaces and `void` go, and the rest is written one way."""
    unique = names.unique()
    canon = {n: _canonical(n) for n in unique.to_list() if n is not None}
    return names.replace_strict(canon, default=None, return_dtype=pl.String)


_ANONYMOUS = re.compile(r"\(anonymous namespace\)::|<unnamed>::")
_LAMBDA = re.compile(r"\{lambda\s*\(([^(){}]*)\)\s*#\s*(\d+)\}|\[lambda\s*\(([^()\[\]]*)\)\s*\(instance\s*(\d+)\)\]")
_SUFFIX = re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b", re.IGNORECASE)
_BOOL = {"true": "1", "false": "0"}
_BOOLS = re.compile(r"\b(true|false)\b")
_VOID = re.compile(r"\bvoid\b")


def _canonical(name: str) -> str:
    name = _ANONYMOUS.sub("", name)
    name = _LAMBDA.sub(lambda m: f"lambda({m[1] if m[2] else m[3]})#{m[2] or m[4]}", name)
    name = _CAST.sub("", _QUALIFIER.sub("", name))
    name = _without_arguments(_without_specialised_arguments(name))
    name = _BOOLS.sub(lambda m: _BOOL[m[1]], _SUFFIX.sub(r"\1", name))
    return _VOID.sub("", name).replace(" ", "")


def _without_specialised_arguments(name: str) -> str:
    """Every argument list that follows a template's closing '>' dropped, at any depth (a
    function template named inside another's arguments: CUPTI writes its argument types, Nsight
    Compute T1, T2)."""
    out: list[str] = []
    skip = 0
    for c in name:
        if skip:
            skip += {"(": 1, ")": -1}.get(c, 0)
        elif c == "(" and out and out[-1] == ">":
            skip = 1
        else:
            out.append(c)
    return "".join(out)


def _without_arguments(name: str) -> str:
    """The name up to its argument list: the first '(' outside template brackets after the
    function's name ('void f<g(int)>(int, float)' -> 'void f<g(int)>')."""
    depth, seen_name = 0, False
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and seen_name:
            return name[:i]
        elif c.isalnum() or c == "_":
            seen_name = True
    return name


def extend_measured(measured: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """The kernels no profiled launch was joined to, each with the mean of the measured launches
    of its name, grid, block and innermost NVTX range, else of its name, grid and block (kernels
    of a name and configuration never profiled are left out), matched_by 'extended'."""
    leaf = pl.col("nvtx_path").str.split(NVTX_SEP).list.last()
    k = kernels.with_columns(leaf=leaf).select("kernel_id", "name", *_CONFIG, "leaf")
    m = measured.join(k, on="kernel_id")
    by_leaf = m.group_by("name", *_CONFIG, "leaf").agg(pl.col(list(METRICS)).mean())
    by_config = m.group_by("name", *_CONFIG).agg(pl.col(list(METRICS)).mean())
    rest = k.filter(~pl.col("kernel_id").is_in(measured["kernel_id"].implode()))
    near = rest.join(by_leaf, on=["name", *_CONFIG, "leaf"], how="inner", nulls_equal=True)
    far = (rest.filter(~pl.col("kernel_id").is_in(near["kernel_id"].implode()))
           .join(by_config, on=["name", *_CONFIG], how="inner"))
    return (pl.concat([near.drop("leaf"), far.drop("leaf")], how="vertical_relaxed")
            .with_columns(ncu_id=pl.lit(None, pl.Int64), matched_by=pl.lit("extended")).sort("kernel_id"))


def has_ncu(con: duckdb.DuckDBPyConnection, trace_id: int) -> bool:
    """Whether the trace has Nsight Compute metrics in the store (`traceq load --ncu`)."""
    from traceq.store import has_table

    return has_table(con, "ncu_metrics") and first_row(
        con, "SELECT 1 FROM ncu_metrics WHERE trace_id = ? LIMIT 1", [int(trace_id)]) is not None


__all__ = ["NCU_TABLES", "NcuJoin", "extend_measured", "has_ncu", "join_ncu", "match_launches",
           "trace_kernels"]
