"""Runs: which loaded traces, and which processes and GPUs in them, are the ranks of one job, and
how their clocks line up. Written by the load, inside its transaction (tables `runs`, `ranks`).

A rank's number comes from the trace, never from a file name:
- a Kineto trace's `distributedInfo.rank` (the whole trace is that rank);
- otherwise the GPUs, then processes, that ran communication (NCCL/RCCL) kernels, else any
  kernels, in that order: one nsys or nvprof file of a 2-process DDP job is a run of two ranks
  (GPU 0's process rank 0), and so is a pair of nvprof files of one process each on GPUs 0 and 1.
NCCL's own NVTX payloads (ncclCommInitRank's rank) are not read: our nsys exports carry their
schemas but not their values.

Several files make one run only when they agree: one world size and backend where they say,
each rank once, every rank of the world size present, and times that overlap (files recorded on
different days are different runs). Their clocks may differ: each file is shifted so that the
collectives it shares with rank 0's file end when rank 0's do (the same collective ends within
microseconds on every rank; it may start far apart, as ranks wait for the late one), and over a
capture of seconds its clock's rate is fitted too (`collectives.end_shifts`), with the number of
collectives used and the spread left after the fit stored beside the shift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import duckdb
import polars as pl

from traceq.analysis.multigpu.collectives import comm_kernels, end_shifts, match_instances
from traceq.errors import TraceqError
from traceq.store import delete_trace, first_row, resolve_trace

SAME_RUN_GAP_NS = 3_600 * 10**9
"""Files whose wall-clock spans are further apart than this are not one run (clocks of one job's
hosts differ by milliseconds, not hours)."""


MIN_COLLECTIVES = 3
"""Clocks are aligned on collectives other than send/recv when every rank has this many: a send
and its receive may end apart, a collective ends within microseconds on every rank."""


class RunError(TraceqError):
    """The files given as one run are not one job's ranks."""


@dataclass(frozen=True)
class _Trace:
    trace_id: int
    name: str
    rank: int | None
    world_size: int | None
    backend: str | None
    wall: tuple[int, int] | None  # first and last GPU activity, ns since the epoch, where known


@dataclass(frozen=True)
class _Unit:
    trace_id: int
    pid: int | None        # the rank's process and GPU; None: the whole trace
    device_id: int | None
    rank: int | None
    rank_from: str
    gpu: int | None = None  # the GPU it ran on (one GPU's trace included), for numbering
    comm: int = 0         # its communication kernels, and those of a known collective but send/recv
    collectives: int = 0  # (counted here: `_shifts` reads a rank's kernels only where it needs them)


def register_run(con: duckdb.DuckDBPyConnection, name: str, trace_ids: list[int]) -> int:
    """Record `trace_ids` as the ranks of a new run `name` (inside the caller's transaction).
    One trace is read at a time (`dataset.trace_reader`: for a dataset's connection, through
    views over that trace's files alone), and two ranks' communication kernels at most are
    held at once: the work grows with the ranks, the memory does not.

    Raises:
        RunError: the traces are not one job's ranks (mixed jobs, a rank twice, a rank missing,
            ranks that cannot be told apart), or the name is taken.
    """
    _check_name(con, name)
    from traceq.dataset import trace_reader

    read = trace_reader(con)
    traces, units = [], []
    for t in trace_ids:
        on = read(t)
        traces.append(_trace(on, t))
        units += _units(on, traces[-1], counted=len(trace_ids) > 1)
    return _register(con, name, traces, units, lambda trace_id: comm_kernels(read(trace_id), trace_id))


@dataclass(frozen=True)
class RankSummary:
    """What making a run needs of one trace, computed where the trace was loaded (a Dask worker
    of `traceq load --dataset`): the trace's rank facts, its ranks (processes and GPUs, their
    communication counted) and its communication kernels (pid, device_id, collective, group,
    start_ns, end_ns). The coordinator makes the run from these alone (`register_summaries`),
    reading none of the traces' files."""

    trace: _Trace
    units: list[_Unit]
    comm: pl.DataFrame

    def to_json(self) -> dict[str, object]:
        from dataclasses import asdict

        return {"trace": asdict(self.trace), "units": [asdict(u) for u in self.units]}

    @staticmethod
    def from_json(data: dict[str, Any], comm: pl.DataFrame) -> RankSummary:
        t = dict(data["trace"])
        t["wall"] = tuple(t["wall"]) if t.get("wall") is not None else None
        return RankSummary(_Trace(**t), [_Unit(**u) for u in data["units"]], comm)


SUMMARY_COMM_COLUMNS = ("pid", "device_id", "collective", "group", "start_ns", "end_ns")


def rank_summary(con: duckdb.DuckDBPyConnection, trace_id: int, as_trace_id: int | None = None) -> RankSummary:
    """The RankSummary of trace `trace_id` of `con`, named `as_trace_id` (its id in the dataset
    it is written into) where given."""
    t = _trace(con, trace_id)
    comm = comm_kernels(con, trace_id)
    units = _units(con, t, counted=True, comm=comm)
    if as_trace_id is not None:
        t = replace(t, trace_id=as_trace_id)
        units = [replace(u, trace_id=as_trace_id) for u in units]
    return RankSummary(t, units, comm.select(*SUMMARY_COMM_COLUMNS))


def register_summaries(con: duckdb.DuckDBPyConnection, name: str, summaries: list[RankSummary]) -> int:
    """`register_run` from the traces' RankSummaries: the same run, rank numbers, shifts and
    drifts, with no trace's rows read here."""
    _check_name(con, name)
    comm = {s.trace.trace_id: s.comm for s in summaries}
    units = [u for s in summaries for u in s.units]
    if len(summaries) == 1:  # a trace alone is a run whose ranks' communication is not counted
        units = [replace(u, comm=0, collectives=0) if u.rank_from == "distributedInfo" else u for u in units]
    return _register(con, name, [s.trace for s in summaries], units, comm.__getitem__, at_once=True)


def _check_name(con: duckdb.DuckDBPyConnection, name: str) -> None:
    if first_row(con, "SELECT 1 FROM runs WHERE name = ?", [name]):
        raise RunError(f"a run named {name!r} is already loaded: choose another name (--run NAME, or --name NAME "
                       "for a file loaded alone), or --replace")


def _register(con: duckdb.DuckDBPyConnection, name: str, traces: list[_Trace], units: list[_Unit],
              comm_of: Callable[[int], pl.DataFrame], *, at_once: bool = False) -> int:
    if len(traces) > 1:
        _check_one_job(traces)
    ranked = _number(units, traces)
    run_id = int(first_row(con, "SELECT nextval('run_ids')")[0])
    clock = "one trace" if len(traces) == 1 else "collective ends"
    con.execute("INSERT INTO runs VALUES (?, ?, ?, ?)", [run_id, name, len(ranked), clock])
    shifts = _shifts(comm_of, ranked, at_once=at_once) if len(traces) > 1 else {}
    unshifted = (0, 0.0, 0, None, None)
    rows = [[run_id, rank, u.trace_id, u.pid, u.device_id, u.rank_from, *shifts.get(u.trace_id, unshifted)]
            for rank, u in sorted(ranked.items())]
    for first in range(0, len(rows), 256):  # a statement per 256 ranks: one per rank took 0.7 ms each
        part = rows[first:first + 256]
        con.execute("INSERT INTO ranks VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(part)),
                    [v for row in part for v in row])
    return run_id


def _trace(con: duckdb.DuckDBPyConnection, trace_id: int) -> _Trace:
    row = first_row(con, "SELECT name, rank, world_size, distributed_backend, start_ns, end_ns, "
                         "session_start_utc_ns FROM traces WHERE trace_id = ?", [trace_id])
    name, rank, world, backend, start, end, base = row
    epoch = start is not None and (base is not None or start > 10**18)  # Kineto without base: epoch times
    wall = (start + (base or 0), end + (base or 0)) if epoch else None
    return _Trace(trace_id, name, rank, world, backend, wall)


def _check_one_job(traces: list[_Trace]) -> None:
    for what, value in (("world size", lambda t: t.world_size), ("backend", lambda t: t.backend)):
        said = [(t.name, value(t)) for t in traces if value(t) is not None]
        if len({v for _, v in said}) > 1:
            (a, va), (b, vb) = said[0], next(s for s in said if s[1] != said[0][1])
            raise RunError(f"ranks of different runs mixed: {a} says {what} {va}, {b} says {vb}")
    timed = [t for t in traces if t.wall is not None]
    for t in timed[1:]:
        a = timed[0]
        gap = max(t.wall[0] - a.wall[1], a.wall[0] - t.wall[1])
        if gap > SAME_RUN_GAP_NS:
            raise RunError(f"ranks of different runs mixed: {t.name} was recorded {gap / 3.6e12:.1f} h "
                           f"apart from {a.name}")
    known = [t.rank is not None for t in traces]
    if any(known) and not all(known):
        with_rank = next(t for t in traces if t.rank is not None)
        without = next(t for t in traces if t.rank is None)
        raise RunError(f"{with_rank.name} records its rank (distributedInfo) but {without.name} does not: "
                       "they are not ranks of one job")


def _units(con: duckdb.DuckDBPyConnection, t: _Trace, *, counted: bool,
           comm: pl.DataFrame | None = None) -> list[_Unit]:
    """The ranks one trace holds, unnumbered unless the trace says its rank (`comm`: its
    communication kernels, where the caller has them)."""
    if t.rank is not None:  # its communication counted for a run of several files only (`_shifts`)
        counts = _counts(comm if comm is not None else comm_kernels(con, t.trace_id)) if counted else (0, 0)
        return [_Unit(t.trace_id, None, None, t.rank, "distributedInfo", None, *counts)]
    if comm is None:
        comm = comm_kernels(con, t.trace_id)
    if comm.height:
        pairs = comm.select("device_id", "pid").unique().sort("device_id", "pid", nulls_last=True).rows()
    else:
        pairs = con.execute(  # the queues its kernels use: the kernels' own columns, not the `kernels` view's joins
            "SELECT DISTINCT q.device_id, q.pid FROM kernel_queues q "
            "JOIN (SELECT DISTINCT queue_id FROM kernel_events WHERE trace_id = $t) USING (queue_id) "
            "WHERE q.trace_id = $t ORDER BY q.device_id NULLS LAST, q.pid NULLS LAST", {"t": t.trace_id}).fetchall()
    if len(pairs) <= 1:
        return [_Unit(t.trace_id, None, None, None, "one GPU", pairs[0][0] if pairs else None, *_counts(comm))]
    return [_Unit(t.trace_id, pid, device, None, "device and process ids", device,
                  *_counts(_own(comm, pid, device))) for device, pid in pairs]


def _own(comm: pl.DataFrame, pid: int | None, device_id: int | None) -> pl.DataFrame:
    """A trace's communication kernels of one rank's process and GPU (None: any)."""
    if pid is not None:
        comm = comm.filter(pl.col("pid") == pid)
    return comm if device_id is None else comm.filter(pl.col("device_id") == device_id)


def _counts(comm: pl.DataFrame) -> tuple[int, int]:
    """A rank's communication kernels, and those of a collective other than send/recv."""
    return comm.height, comm.filter(pl.col("collective") != "send_recv").height


def _number(units: list[_Unit], traces: list[_Trace]) -> dict[int, _Unit]:
    names = {t.trace_id: t.name for t in traces}
    ranked: dict[int, _Unit] = {}
    if all(u.rank is not None for u in units):
        for u in units:
            if u.rank in ranked:
                raise RunError(f"rank {u.rank} twice: {names[ranked[u.rank].trace_id]} and {names[u.trace_id]}")
            ranked[u.rank] = u
        world = next((t.world_size for t in traces if t.world_size), None)
        if len(traces) > 1 and world is not None:
            missing = sorted(set(range(world)) - set(ranked))
            if missing:
                shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
                raise RunError(f"rank{'s' if len(missing) > 1 else ''} {shown} of {world} missing: "
                               f"load every rank's file together, or load the files one by one without --run")
        return ranked
    if len(traces) > 1:  # no rank recorded: GPUs tell the files' ranks apart, or nothing does
        seen: dict[int | None, _Unit] = {}
        for u in units:
            if u.gpu in seen and seen[u.gpu].trace_id != u.trace_id:
                raise RunError(f"cannot tell the ranks of {names[seen[u.gpu].trace_id]} and {names[u.trace_id]} "
                               f"apart: both ran on GPU {u.gpu} and neither records its rank; load them as "
                               "separate runs")
            seen[u.gpu] = u
        units = [u if u.pid is not None else replace(u, rank_from="device and process ids") for u in units]
    order = sorted(units, key=lambda u: (u.gpu is None, u.gpu or 0, u.pid or 0))
    return {i: u for i, u in enumerate(order)}


def _shifts(comm_of: Callable[[int], pl.DataFrame],
            ranked: dict[int, _Unit], *, at_once: bool = False) -> dict[int, tuple[int, float, int, int | None, int | None]]:
    """trace_id -> (shift_ns, drift_ppm, shift_at_ns, collectives matched, residual_ns) for a run
    of several files (`collectives.end_shifts`): each trace's first rank matched against the
    lowest rank with communication, one pair of ranks at a time (what matching every rank at
    once gives: a rank's instances and fit depend on its own and the reference's kernels alone),
    or `at_once` where every rank's kernels are in memory already (RankSummaries)."""
    collectives = all(u.collectives >= MIN_COLLECTIVES for u in ranked.values())  # else send/recv too
    counted = {rank: u.collectives if collectives else u.comm for rank, u in ranked.items()}
    reference = min((rank for rank, n in counted.items() if n), default=None)
    if reference is None:
        return {}

    def kernels(rank: int) -> pl.DataFrame:
        u = ranked[rank]
        k = _own(comm_of(u.trace_id), u.pid, u.device_id)
        if collectives:  # point to point: its ends need not meet
            k = k.filter(pl.col("collective") != "send_recv")
        return k.select("collective", "group", "start_ns", "end_ns", rank=pl.lit(rank, pl.Int32))

    ref = kernels(reference)
    out: dict[int, tuple[int, float, int, int | None, int | None]] = {}
    if at_once:  # every rank against the reference in one pass: the same fits (see above), one polars plan
        firsts = {u.trace_id: rank for rank, u in sorted(ranked.items(), reverse=True) if rank >= reference}
        frames = [ref, *(kernels(rank) for rank in sorted(firsts.values()) if rank != reference)]
        every = pl.concat(frames)
        if every.filter(pl.col("collective").is_not_null()).is_empty():
            return out
        for r, shift, drift, at, matched, residual in end_shifts(match_instances(every, one_clock=False)).iter_rows():
            u = ranked[r]
            if firsts.get(u.trace_id) == r:
                out[u.trace_id] = (int(shift), float(drift), int(at), int(matched), int(residual))
        return out
    for rank, u in sorted(ranked.items()):
        if u.trace_id in out or rank < reference:
            continue
        pair = ref if rank == reference else pl.concat([ref, kernels(rank)])
        if pair.filter(pl.col("collective").is_not_null()).is_empty():
            continue
        for r, shift, drift, at, matched, residual in end_shifts(match_instances(pair, one_clock=False)).iter_rows():
            if r == rank:
                out[u.trace_id] = (int(shift), float(drift), int(at), int(matched), int(residual))
    return out


def check_runs_whole(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse (before a commit) a change that left a run without one of its ranks: a rank's
    trace replaced or removed on its own.

    Raises:
        RunError: naming the run, the rank lost and what to do instead.
    """
    row = first_row(con, """
        SELECT r.name, r.world_size, list(k.rank ORDER BY k.rank) FROM runs r LEFT JOIN ranks k USING (run_id)
        GROUP BY r.run_id, r.name, r.world_size HAVING count(k.rank) <> r.world_size LIMIT 1""")
    if row is not None:
        name, world, present = row
        lost = sorted(set(range(world)) - set(present or []))
        which = f"rank {lost[0]}" if lost else "a rank"
        raise RunError(f"this would leave run {name!r} without {which}: replace or remove the whole run "
                       f"(`traceq load FILE... --run {name} --replace`, `traceq rm {name}`)")


def remove(con: duckdb.DuckDBPyConnection, ref: str) -> list[tuple[int, str]]:
    """Delete what `traceq rm REF` removes, inside the caller's transaction: every trace of the
    run named `ref`, else the trace `ref` names (a rank of a run of several files goes with its
    run only: RunError). Returns the (trace_id, name) removed."""
    removed = [(int(t), str(n)) for t, n in con.execute(
        "SELECT DISTINCT k.trace_id, t.name FROM runs r JOIN ranks k USING (run_id) JOIN traces t USING (trace_id) "
        "WHERE r.name = ? ORDER BY 1", [ref]).fetchall()]
    if not removed:
        removed = [resolve_trace(con, ref)]
    for trace_id, _ in removed:
        delete_trace(con, trace_id)
    check_runs_whole(con)
    return removed
