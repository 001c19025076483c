"""`Run`: a run of several ranks, one method per multi-GPU command (`comm`, `overlap`, `ranks`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from traceq.analysis.choices import CommBy, CompareBy, RanksBy
from traceq.store import first_row

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from traceq.api.store import Store
    from traceq.ingest import LoadResult

from traceq.api.options import _regex, _run_traces
from traceq.api.trace import Trace


class Run:
    """One run of a store: the ranks of one job (one trace per rank or node, or one trace's
    processes and GPUs) on one clock, and one method per multi-GPU command on it (docs/multigpu.md).
    Use `Store.run` or `Store.load_run`.

    `world_size` is its number of ranks, `clock` how their times were put on one clock ('one
    trace', or 'collective ends': each rank file shifted so the collectives it shares with rank
    0's end when rank 0's do), `max_shift_ns` the largest shift applied. Methods take the
    command's options as keywords and return polars DataFrames with the columns csv and json
    give; `progress`, where taken, is called with (steps done, steps) over the run's traces.
    """

    def __init__(self, store: Store, run_id: int, name: str, *, con: duckdb.DuckDBPyConnection | None = None):
        """`con`: a connection of its own (a dataset's views over the run's traces' files), else the store's."""
        self.store = store
        self.id = run_id
        self.name = name
        self.load_results: list[LoadResult] | None = None
        self._con = con
        self._kept: dict[tuple, object] = {}
        world, clock, shift = first_row(self.con, "SELECT world_size, clock, max(abs(k.shift_ns)) FROM runs "
                                        "JOIN ranks k USING (run_id) WHERE run_id = ? GROUP BY ALL", [run_id])
        self.world_size, self.clock, self.max_shift_ns = int(world), str(clock), int(shift)

    def __repr__(self) -> str:
        return f"<traceq.Run {self.id} {self.name!r} ({self.world_size} ranks)>"

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.store.con if self._con is None else self._con

    def critical(self, view: str = "segments", *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq critical --run`: `Trace.critical` over the run's ranks on one clock, coupled
        by their collectives (`analysis.critical.ranks`); an iteration ends with its last rank."""
        from traceq.analysis.choices import CriticalView
        from traceq.analysis.critical.path import critical_paths
        from traceq.api.trace import _critical_view

        key = ("critical", _regex(iteration_regex))
        if key not in self._kept:
            self._kept[key] = critical_paths(self._graph(iteration_regex))
        return _critical_view(self._kept[key], CriticalView(view))

    def whatif(self, scale: list[str] | tuple[str, ...] = (), *, no_launch_overhead: bool = False,
               overlap_comm: bool = False, precision: str | None = None, gpu: str | None = None,
               view: str = "iterations", iteration_regex: str | None = None) -> tuple[pl.DataFrame, list[str]]:
        """`traceq whatif --run`: `Trace.whatif` over the run's coupled graph (the GPU model reads
        the first rank's GPU)."""
        from traceq.api.trace import _whatif

        first = self.traces()[0]
        return _whatif(self.con, first.id, self._graph(iteration_regex), scale, no_launch_overhead, overlap_comm,
                       precision, gpu, view)

    def _graph(self, iteration_regex: str | None):
        from traceq.analysis.critical.ranks import run_graph

        key = ("graph", _regex(iteration_regex))
        if key not in self._kept:
            self._kept[key] = run_graph(self.con, self.id, _regex(iteration_regex))
        return self._kept[key]

    def traces(self) -> list[Trace]:
        """The run's traces, by their first rank."""
        rows = self.con.execute("SELECT k.trace_id, any_value(t.name) FROM ranks k JOIN traces t USING (trace_id) "
                                "WHERE k.run_id = ? GROUP BY 1 ORDER BY min(k.rank)", [self.id]).fetchall()
        over = (lambda t: None) if self.store.dataset is None else (lambda t: self.store._over([t]))
        return [Trace(self.store, int(t), str(n), con=over(int(t))) for t, n in rows]

    def export(self, path: str | Path, *, format: str = "perfetto",
               progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
        """`traceq export RUN`: `Trace.export` for every rank of the run in one file, each rank's
        GPUs and host processes its own processes (named with the rank), the ranks' times put on
        the run's clock (the shift and drift measured at load). Returns the events written per kind."""
        from traceq.api.export import write_chrome_trace
        from traceq.api.export_tracks import run_parts
        from traceq.api.trace import _export_format

        _export_format(format)
        traces = {t.id: t for t in self.traces()}
        return write_chrome_trace(self.con, run_parts(self.con, self.id), Path(path),
                                  lambda t: traces[t]._export_attribution(), progress=progress)

    def comm(self, by: CommBy | str = CommBy.rank, *, iteration_regex: str | None = None,
             progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
        """`traceq comm`: collective communication per collective, iteration and rank (`by='rank'`),
        or per collective instance across ranks (`by='instance'`): time, bytes, algorithm and
        bus bandwidth, skew (`analysis.multigpu.comm.comm_table`)."""
        from traceq.analysis.multigpu.comm import comm_table

        return comm_table(self.con, self.id, CommBy(by).value, _regex(iteration_regex), progress)

    def overlap(self, *, iteration_regex: str | None = None,
                progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
        """`traceq overlap`: per rank and iteration, computation, communication, the share of it
        hidden under computation, exposed communication and idle time (`analysis.multigpu.overlap`)."""
        from traceq.analysis.multigpu.overlap import overlap_table

        return overlap_table(self.con, self.id, _regex(iteration_regex), progress)

    def ranks(self, by: RanksBy | str = RanksBy.iteration, *, k: int = 10, iteration_regex: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
        """`traceq ranks`: iteration time, wait, work and shift per iteration and rank
        (`by='iteration'`), or the `k` collectives that started latest on their last rank and
        what delayed them (`by='collective'`) (`analysis.multigpu.ranks`)."""
        from traceq.analysis.multigpu.ranks import late_collectives, rank_iterations

        if RanksBy(by) is RanksBy.collective:
            return late_collectives(self.con, self.id, k, _regex(iteration_regex), progress)
        return rank_iterations(self.con, self.id, _regex(iteration_regex), progress)

    def mfu(self, *, model_flops: float | None = None, params: float | None = None, tokens: float | None = None,
            inference: bool = False, layers: int | None = None, d_model: int | None = None, seq: int | None = None,
            full_attention: bool = False, precision: str | None = None, spec: str | Path | None = None,
            iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq mfu --run`: `Trace.mfu` for each rank (model FLOPs and tokens per GPU), then per
        iteration the ranks together (`analysis.efficiency.mfu.run_mfu_table`)."""
        from traceq.analysis.efficiency.mfu import run_mfu_table

        ranks = dict(self.con.execute("SELECT trace_id, min(rank) FROM ranks WHERE run_id = ? GROUP BY 1",
                                      [self.id]).fetchall())
        return run_mfu_table([(int(ranks[t.id]), t.mfu(
            model_flops=model_flops, params=params, tokens=tokens, inference=inference, layers=layers,
            d_model=d_model, seq=seq, full_attention=full_attention, precision=precision, spec=spec,
            iteration_regex=iteration_regex)) for t in self.traces()])

    def compare(self, other: Run | str | int, by: CompareBy | str = CompareBy.layer, *, k: int | None = None,
                iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq compare A B` on runs of different GPU counts: GPU time per GPU and iteration
        side by side, with weak-scaling efficiency (`analysis.compare.scaling.compare_scaling`)."""
        from traceq.analysis.compare.scaling import compare_scaling

        other = other if isinstance(other, Run) else self.store.run(other)
        both = self.store._over([t for r in (self, other) for t in _run_traces(r.con, r.id)])  # a dataset: their files
        frame = compare_scaling(both, self.id, other.id, by, _regex(iteration_regex))
        return frame if k is None else frame.head(k)
