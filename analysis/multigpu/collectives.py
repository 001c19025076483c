"""Collective communication kernels (NCCL, RCCL) of a run's ranks: which collective each is, how
many bytes it moved where the trace says, and which kernels on different ranks are the same
collective.

A kernel is communication when its name's rules say so (`classify`: operation 'communication';
NCCL's and RCCL's kernels). Its collective (`KINDS`) is, first to answer: the `Collective name`
Kineto wrote on the kernel; that of the innermost collective operator or `nccl:*` annotation
around the call that launched it (Kineto's `record_param_comms` ops, PyTorch's `nccl:all_reduce`
ranges); the kernel's name (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`). Its bytes come from the
same arguments: the larger of the elements sent and received (nccl-tests' S: the whole array of
an all-gather or reduce-scatter) times the element size. nsys and nvprof traces carry no sizes
here (NCCL's NVTX payloads are not read), so their bytes are null.

The same collective on several ranks: each rank's kernels of one collective kind are numbered in
start order, and rank r's k-th is the reference rank's (k + d)-th, d chosen among -3..3 so that
the end times differ by the most constant amount (captures that start a collective apart); every
rank runs a job's collectives in the same order, so the numbers line up (`match_instances`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import duckdb
import polars as pl

from traceq.store import registered, sql_frame

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send_recv")
"""The collectives traceq names, as `traceq comm` lists them."""

_KIND_PATTERNS = (  # over the name with everything but letters removed, lower case
    ("all_reduce", r"allreduce"), ("reduce_scatter", r"reducescatter"), ("all_gather", r"allgather"),
    ("all_to_all", r"alltoall"), ("broadcast", r"broadcast"), ("send_recv", r"sendrecv|^send|^recv"),
    ("reduce", r"^reduce"),
)

BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0,
}
"""Bus bandwidth = algorithm bandwidth (bytes / time) x this factor of the ranks n, as nccl-tests
defines it (doc/PERFORMANCE.md: the traffic each rank's links carry, comparable with the link's
peak whatever n)."""

DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "unsigned int": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "long long": 8, "uint64": 8,
    "complexfloat": 8, "complexdouble": 16,
    "half": 2, "c10::half": 2, "float16": 2, "bfloat16": 2, "c10::bfloat16": 2, "short": 2, "short int": 2,
    "int16": 2, "byte": 1, "char": 1, "bool": 1, "unsigned char": 1, "signed char": 1, "int8": 1, "uint8": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}
"""Element sizes by the type names Kineto writes (`dtype`: 'Float', 'BFloat16'; `Input type`:
'float', 'c10::Half', 'long int'), lower-cased."""

MAX_OFFSET = 3
"""How far apart (in collectives of one kind) two ranks' captures may start and still be matched."""


def collective_kind(text: str | None) -> str | None:
    """The collective (one of KINDS) a collective name, annotation or kernel name stands for:
    'allreduce', '_allgather_base', 'nccl:all_to_all', 'ncclKernel_SendRecv_...'; None for
    anything else ('wait', 'barrier')."""
    if not text:
        return None
    letters = re.sub(r"[^a-z]", "", text.lower().removeprefix("nccl:").removeprefix("c10d::"))
    letters = letters.removeprefix("ncclkernel").removeprefix("nccldevkernel").removeprefix("nccl")
    for kind, pattern in _KIND_PATTERNS:
        if re.search(pattern, letters):
            return kind
    return None


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of a collective among `ranks` ranks."""
    return BUS_FACTORS[kind](ranks) if ranks > 0 else 0.0


def dtype_bytes(dtype: str | None) -> int | None:
    return DTYPE_BYTES.get(dtype.strip().lower()) if dtype else None


@dataclass(frozen=True)
class Rank:
    """Where one rank of a run lives: a trace, and in it a process and GPU (None: all of them),
    and what puts the trace's times on the run's clock (`on_run_clock`)."""

    rank: int
    trace_id: int
    pid: int | None
    device_id: int | None
    shift_ns: int
    drift_ppm: float = 0.0
    shift_at_ns: int = 0


def run_ranks(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Rank]:
    """The ranks of a run, by rank."""
    rows = con.execute("SELECT rank, trace_id, pid, device_id, shift_ns, drift_ppm, shift_at_ns FROM ranks "
                       "WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()
    return [Rank(int(r[0]), int(r[1]), r[2], r[3], int(r[4]), float(r[5] or 0.0), int(r[6] or 0)) for r in rows]


Progress = Callable[[int, int], None]
"""Called with (traces done, traces in all) as an analysis goes through a run's traces."""


def by_trace(ranks: list[Rank]) -> dict[int, list[Rank]]:
    """The ranks grouped by the trace that holds them, traces in rank order."""
    traces: dict[int, list[Rank]] = {}
    for r in ranks:
        traces.setdefault(r.trace_id, []).append(r)
    return traces


def each_trace(con: duckdb.DuckDBPyConnection, ranks: list[Rank], progress: Progress | None = None
               ) -> Iterator[tuple[int, list[Rank], duckdb.DuckDBPyConnection]]:
    """`by_trace`'s (trace_id, ranks), with the connection to read that trace through (`con`; a
    dataset's: views over that trace's files, `dataset.trace_reader`), calling `progress` after
    each trace."""
    from traceq.dataset import trace_reader

    traces, read = by_trace(ranks), trace_reader(con)
    for done, (trace_id, in_trace) in enumerate(traces.items(), start=1):
        yield trace_id, in_trace, read(trace_id)
        if progress is not None:
            progress(done, len(traces))


def rank_expr(ranks: list[Rank], pid: str = "pid", device: str = "device_id") -> pl.Expr:
    """The rank of a row of one trace's events by its process and GPU columns (null: none of them)."""
    expr: pl.Expr = pl.lit(None, pl.Int32)
    for r in reversed(ranks):
        cond = pl.lit(True)
        if r.pid is not None:
            cond = cond & (pl.col(pid) == r.pid)
        if r.device_id is not None:
            cond = cond & (pl.col(device) == r.device_id)
        expr = pl.when(cond).then(pl.lit(r.rank, pl.Int32)).otherwise(expr)
    return expr


def communication_names(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """The trace's kernel names that are communication: name, collective (from the name; may be null)."""
    from traceq.analysis.kernels.classify import default_rules

    names = con.execute("SELECT name, mangled_name FROM kernel_names WHERE trace_id = ?", [int(trace_id)]).fetchall()
    rules = id(default_rules())  # the ranks of a job share their names: each is classified once
    found = [(name, kind) for name, mangled in names for comm, kind in [_communication(rules, name, mangled)] if comm]
    return pl.DataFrame(found, schema={"name": pl.String, "collective": pl.String}, orient="row")


@lru_cache(maxsize=1 << 16)
def _communication(rules: int, name: str, mangled: str | None) -> tuple[bool, str | None]:
    """(whether the kernel is communication, its collective) by the rules in use (`rules`, their
    id, keys the cache: other rules, other answers)."""
    from traceq.analysis.kernels.classify import default_rules

    found = default_rules().classify(name, mangled)
    return found.operation == "communication", collective_kind(found.collective)


def comm_kernels(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Every communication kernel of one trace, in start order, its times as the trace has them.

    Columns: kernel_id, pid, device_id, start_ns, end_ns, collective (KINDS; null when nothing
    says), bytes (null where the trace does not say), group_size (ranks in its process group,
    where the trace says), group (its process group's name, else 'stream k': its rank's k-th
    stream of communication kernels, in order of first use), launch_tid,
    launch_ns (the launching call's thread and start, for attribution).
    """
    t = int(trace_id)
    names = communication_names(con, t)
    empty = {"kernel_id": pl.Int64, "pid": pl.Int64, "device_id": pl.Int32, "start_ns": pl.Int64,
             "end_ns": pl.Int64, "collective": pl.String, "bytes": pl.Int64, "group_size": pl.Int64,
             "group": pl.String, "launch_tid": pl.Int64, "launch_ns": pl.Int64}
    if names.is_empty():
        return pl.DataFrame(schema=empty)
    with registered(con, comm_names=names) as rel:
        frame = sql_frame(con, f"""
            WITH k AS (
                SELECT k.kernel_id, k.pid, k.device_id, k.stream_id, k.start_ns, k.end_ns, n.collective AS by_name,
                       k.launch_tid, k.launch_start_ns
                FROM kernel_launches k JOIN {rel['comm_names']} n USING (name)
                WHERE k.trace_id = {t}
            ),
            around AS (  -- the innermost collective op or annotation around the launching call
                SELECT k.kernel_id, c.collective, c.in_msg_nelems, c.out_msg_nelems, c.dtype, c.group_size, c.pg_name,
                       row_number() OVER (PARTITION BY k.kernel_id ORDER BY c.start_ns DESC, c.end_ns) AS inner_first
                FROM k JOIN collectives c ON c.trace_id = {t} AND c.event <> 'kernel' AND c.pid = k.pid
                     AND c.tid = k.launch_tid AND k.launch_start_ns BETWEEN c.start_ns AND c.end_ns
                WHERE c.collective NOT IN ('wait', 'barrier')
            )
            SELECT k.kernel_id, k.pid, k.device_id, k.stream_id, k.start_ns, k.end_ns, k.by_name,
                   coalesce(own.collective, a.collective) AS named,
                   greatest(coalesce(own.in_msg_nelems, a.in_msg_nelems), coalesce(own.out_msg_nelems, a.out_msg_nelems))
                       AS nelems,
                   coalesce(own.dtype, a.dtype) AS dtype, coalesce(own.group_size, a.group_size) AS group_size,
                   coalesce(own.pg_name, a.pg_name) AS "group",
                   k.launch_tid, k.launch_start_ns AS launch_ns
            FROM k
            LEFT JOIN collectives own ON own.trace_id = {t} AND own.event = 'kernel' AND own.kernel_id = k.kernel_id
            LEFT JOIN around a ON a.kernel_id = k.kernel_id AND a.inner_first = 1
            ORDER BY k.start_ns, k.kernel_id
        """)
    sizes = frame["dtype"].map_elements(dtype_bytes, return_dtype=pl.Int64)
    # without a process group, a communicator is told by its stream: the k-th stream a rank's
    # communication kernels used, in order of first use (NCCL gives each communicator its own)
    first_use = pl.col("start_ns").min().over("pid", "device_id", "stream_id")
    streams = first_use.rank("dense").over("pid", "device_id")
    return frame.select(
        "kernel_id", "pid", "device_id", "start_ns", "end_ns",
        collective=pl.coalesce(pl.col("named").map_elements(collective_kind, return_dtype=pl.String), "by_name"),
        bytes=(pl.col("nelems") * sizes).cast(pl.Int64), group_size="group_size",
        group=pl.coalesce("group", pl.format("stream {}", streams)), launch_tid="launch_tid",
        launch_ns="launch_ns").cast(empty)


def match_instances(kernels: pl.DataFrame, *, one_clock: bool = True) -> pl.DataFrame:
    """`kernels` (rank, collective, start_ns, end_ns, and group where known: the process group)
    with `instance`: the same number on every rank for the same collective of one process group
    (see the module docstring), null for a collective of unknown kind.

    The offset d of each rank and collective is the one whose end differences to the reference
    rank are smallest (`one_clock`: times on one clock, where the same collective ends at the
    same time) or most constant (clocks that differ by an unknown amount), among those matching
    two collectives or more; then the one matching most, then the smallest |d|."""
    if "group" not in kernels.columns:
        kernels = kernels.with_columns(group=pl.lit(None, pl.String))
    kind = ["collective", "group"]
    known = kernels.filter(pl.col("collective").is_not_null())
    seq = (known.sort("rank", *kind, "start_ns", nulls_last=True)
           .with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", *kind)))
    reference = seq.group_by(kind).agg(ref_rank=pl.col("rank").min())
    seq = seq.join(reference, on=kind, nulls_equal=True)
    ref = seq.filter(pl.col("rank") == pl.col("ref_rank")).select(*kind, "seq", ref_end=pl.col("end_ns"))
    others = seq.filter(pl.col("rank") != pl.col("ref_rank")).select("rank", *kind, "seq", "end_ns")
    offsets = pl.DataFrame({"d": list(range(-MAX_OFFSET, MAX_OFFSET + 1))}, schema={"d": pl.Int64})
    trials = (others.join(offsets, how="cross").with_columns(ref_seq=pl.col("seq") + pl.col("d"))
              .join(ref, left_on=[*kind, "ref_seq"], right_on=[*kind, "seq"], nulls_equal=True)
              .with_columns(diff=(pl.col("ref_end") - pl.col("end_ns")).cast(pl.Float64))
              .group_by("rank", *kind, "d")
              .agg(spread=(pl.col("diff") - pl.col("diff").median()).abs().median(),
                   level=pl.col("diff").median().abs(), matched=pl.len())
              .filter((pl.col("matched") >= 2) | (pl.col("matched") == pl.col("matched").max().over("rank", *kind)))
              .with_columns(score=pl.col("spread") + (pl.col("level") if one_clock else 0.0)))
    best = (trials.sort("rank", *kind, "score", pl.col("matched"), pl.col("d").abs(),
                        descending=[False, False, False, False, True, False], nulls_last=True)
            .group_by("rank", *kind, maintain_order=True).first().select("rank", *kind, "d"))
    seq = (seq.join(best, on=["rank", *kind], how="left", nulls_equal=True)
           .with_columns(instance=pl.col("seq") + pl.col("d").fill_null(0)).drop("seq", "ref_rank", "d"))
    unknown = kernels.filter(pl.col("collective").is_null()).with_columns(instance=pl.lit(None, pl.Int64))
    return pl.concat([seq, unknown], how="diagonal_relaxed").sort("rank", "start_ns")


DRIFT_MIN_SPAN_NS = 10**9
"""A rank's clock rate is fitted only when its matched collectives span this long: clocks of one
job drift by tens of parts per million, under a microsecond over shorter captures."""


def end_shifts(kernels: pl.DataFrame) -> pl.DataFrame:
    """Per rank, what to add to its times so that its collectives end when the lowest rank's do.

    `kernels`: rank, collective, group, instance, end_ns (from `match_instances`). The end
    differences d (lowest rank's end - this rank's) are fitted as d = shift_ns + drift_ppm x
    1e-6 x (t - shift_at_ns), t the rank's own end time and shift_at_ns its first matched one:
    least squares, once more without the differences further than 3 median deviations from the
    first fit; drift_ppm is 0 (d's median the shift) unless the matches span DRIFT_MIN_SPAN_NS.
    Columns: rank, shift_ns, drift_ppm, shift_at_ns, collectives (matched), residual_ns (median
    |d - fit|).
    """
    first = kernels["rank"].min()
    key = ["collective", "group", "instance"]
    ref = kernels.filter(pl.col("rank") == first).select(*key, ref_end="end_ns")
    diffs = (kernels.filter(pl.col("instance").is_not_null())
             .join(ref, on=key, nulls_equal=True)
             .select("rank", t="end_ns", d=pl.col("ref_end") - pl.col("end_ns")))
    rows = []
    for (rank,), group in diffs.partition_by("rank", as_dict=True, maintain_order=True).items():  # ranks, not kernels
        at = int(group["t"].min())
        x, y = (group["t"] - at).cast(pl.Float64), group["d"].cast(pl.Float64)
        slope, intercept = 0.0, float(y.median())
        if float(x.max()) >= DRIFT_MIN_SPAN_NS and group.height >= 3:
            slope, intercept = _line(x, y)
            residual = y - (intercept + slope * x)
            keep = (residual - residual.median()).abs() <= 3 * float((residual - residual.median()).abs().median()) + 1
            if int(keep.sum()) >= 3:
                slope, intercept = _line(x.filter(keep), y.filter(keep))
        residual = (y - (intercept + slope * x)).abs().median()
        rows.append((rank, round(intercept), slope * 1e6, at, group.height, round(float(residual))))
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "shift_ns": pl.Int64, "drift_ppm": pl.Float64,
                                      "shift_at_ns": pl.Int64, "collectives": pl.Int32, "residual_ns": pl.Int64},
                        orient="row").sort("rank")


def _line(x: pl.Series, y: pl.Series) -> tuple[float, float]:
    """Least-squares slope and intercept of y on x."""
    mx, my = float(x.mean()), float(y.mean())
    var = float(((x - mx) ** 2).sum())
    slope = float(((x - mx) * (y - my)).sum()) / var if var > 0 else 0.0
    return slope, my - slope * mx


def on_run_clock(ranks: list[Rank], *columns: str) -> list[pl.Expr]:
    """Expressions putting `columns` (a trace's times, in a frame with a `rank` column) on the
    run's clock: t + shift_ns + drift_ppm x 1e-6 x (t - shift_at_ns)."""
    def per_rank(values: dict[int, object], dtype: pl.DataType) -> pl.Expr:
        return pl.col("rank").replace_strict(values, return_dtype=dtype)

    shift = per_rank({r.rank: r.shift_ns for r in ranks}, pl.Int64)
    if all(r.drift_ppm == 0 for r in ranks):
        return [(pl.col(c) + shift).alias(c) for c in columns]
    drift = per_rank({r.rank: r.drift_ppm for r in ranks}, pl.Float64)
    at = per_rank({r.rank: r.shift_at_ns for r in ranks}, pl.Int64)
    return [(pl.col(c) + shift + ((pl.col(c) - at).cast(pl.Float64) * drift * 1e-6).round().cast(pl.Int64)).alias(c)
            for c in columns]
