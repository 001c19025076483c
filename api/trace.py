"""`Trace`: one trace of a store, one method per `traceq` command on it."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceq.analysis.choices import CompareBy, GroupBy, IdleBy, MeasuredBy, MemoryBy, NameBy, StatsReport, TrafficBy
from traceq.errors import MissingDataError, TraceqError
from traceq.store import first_row, side_by_side

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from traceq.analysis.compare.gate import GateResult
    from traceq.analysis.efficiency.gpu_products import GpuProduct
    from traceq.analysis.timeline.idle import IdleTotals
    from traceq.api.store import Store
    from traceq.ingest import LoadResult

from traceq.api.measured_columns import with_measured, with_ncu_ce, with_ncu_ru
from traceq.api.options import _note, _path, _positive, _regex, _rules_key

AUTO_CONTEXT_MAX_KERNELS = 1_000_000
"""Above this many kernels `top` gives the library column alone unless asked for `context`."""

_ATTRIBUTION_ANALYSES = {"attributed": "attributed_kernels", "launch_groups": "launch_groups",
                         "stages": "stage_times"}
"""What `Trace` keeps of each launch's attribution: kind -> the function of `analysis.structure.layers` (con,
trace id, iteration regex) that makes it."""



class Trace:
    """One trace of a store, and one method per `traceq` command on it.

    Methods take the command's options as keywords (`by`, `k`, `spec`, `iteration_regex`, ...)
    and return a polars DataFrame with the columns csv and json give; `.to_pandas()` turns one
    into a pandas DataFrame where pandas is installed. Intermediate results (the NVTX attribution
    of every launch, the FLOPs of every kernel) are kept for the last options asked, so `layers()`
    then `libs()` attribute the launches once.
    """

    def __init__(self, store: Store, trace_id: int, name: str, con: duckdb.DuckDBPyConnection | None = None):
        """`con`: a connection of its own (a dataset's views over this trace's files), else the store's."""
        self.store = store
        self.id = trace_id
        self.name = name
        self.load_result: LoadResult | None = None
        self._con = con
        self._kept: dict[str, tuple[tuple, object]] = {}

    def __repr__(self) -> str:
        return f"<traceq.Trace {self.id} {self.name!r}>"

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.store.con if self._con is None else self._con

    def _kept_value(self, kind: str, key: tuple) -> Any:
        """What `_keep` kept for `kind` under `key`, or None."""
        kept = self._kept.get(kind)
        return kept[1] if kept is not None and kept[0] == key else None

    def _keep(self, kind: str, key: tuple, make: Callable[[], Any]) -> Any:
        """make(), kept for the next call with the same `kind` and `key` (one per kind)."""
        kept = self._kept_value(kind, key)
        if kept is not None:
            return kept
        value = make()
        self._kept[kind] = (key, value)
        return value

    # --- facts about the trace

    def info(self) -> dict[str, object]:
        """The trace's row of `traces()`."""
        columns = [d[0] for d in self.con.execute("SELECT * FROM traces LIMIT 0").description]
        row = first_row(self.con, "SELECT * FROM traces WHERE trace_id = ?", [self.id])
        return dict(zip(columns, row or ()))

    def kernel_time_ns(self) -> int:
        """All kernel time of the trace, ns."""
        from traceq.analysis.kernels.top import kernel_time_total

        return kernel_time_total(self.con, self.id)

    def iterations(self, *, iteration_regex: str | None = None) -> int:
        """How many iterations the trace's kernels ran in (0: it marks none)."""
        from traceq.analysis.compare.side_by_side import iteration_count

        return iteration_count(self._launch_groups(iteration_regex))

    def per_iteration(self, other: Trace, by: CompareBy | str = CompareBy.layer, *,
                      iteration_regex: str | None = None) -> bool:
        """Whether `compare(other, by)` gives times per iteration (both traces mark iterations)
        rather than totals."""
        if CompareBy(by) is CompareBy.stage:
            return all(s["iteration"].drop_nulls().len() > 0
                       for s in (self._stages(iteration_regex), other._stages(iteration_regex)))
        return self.iterations(iteration_regex=iteration_regex) > 0 < other.iterations(iteration_regex=iteration_regex)

    def gpu(self) -> dict[str, object]:
        """The GPU that ran the most kernel time: name, sm_count, clock_hz, peak_<precision>
        (FLOP/s, for fp64 ... int8), description."""
        from traceq.analysis.efficiency.ce import busiest_gpu

        return busiest_gpu(self.con, self.id)

    def _attributed(self, iteration_regex: str | None) -> pl.DataFrame:
        return self._attribution("attributed", iteration_regex)

    def _launch_groups(self, iteration_regex: str | None) -> pl.DataFrame:
        return self._attribution("launch_groups", iteration_regex)

    def _stages(self, iteration_regex: str | None) -> pl.DataFrame:
        return self._attribution("stages", iteration_regex)

    def _groups(self, iteration_regex: str | None) -> pl.DataFrame:
        from traceq.analysis.structure.layers import kernel_groups_of

        key = (_regex(iteration_regex), _rules_key())  # summed from the launch groups `compare` and `ru` read too
        return self._keep("groups", key, lambda: kernel_groups_of(self._launch_groups(iteration_regex)))

    def _attribution(self, kind: str, iteration_regex: str | None,
                     con: duckdb.DuckDBPyConnection | None = None) -> Any:
        """`_keep` of an analysis of the launches' NVTX attribution (`_ATTRIBUTION_ANALYSES`:
        kind -> the function of `analysis.structure.layers`), on `con` (a cursor of its own) or the trace's
        connection. Where a big trace's store keeps none that `traceq attribute` could keep, a
        note says so first."""
        regex = _regex(iteration_regex)

        def made() -> Any:
            from traceq.analysis.structure import layers
            from traceq.analysis.structure.conventions import ITERATION_REGEX
            from traceq.analysis.structure.stored import LOAD_MAX_KERNELS, fingerprint, is_kept

            on = con or self.con
            kernels = first_row(on, "SELECT kernel_count FROM traces WHERE trace_id = ?", [self.id])[0] or 0
            if (kernels > LOAD_MAX_KERNELS and self._con is None and regex == ITERATION_REGEX
                    and fingerprint() is not None and not is_kept(on, self.id, regex)):
                _note(f"{self.name}: attributing {kernels:,} kernels to their NVTX ranges, about a second a "
                      f"million; `traceq attribute {shlex.quote(self.name)}` keeps the attribution for the next "
                      "commands")
            return getattr(layers, _ATTRIBUTION_ANALYSES[kind])(on, self.id, regex)

        return self._keep(kind, (regex, _rules_key()), made)

    def _both(self, other: Trace, kind: str, iteration_regex: str | None) -> tuple[Any, Any]:
        """`_attribution(kind)` of this trace and of `other`, at once where neither has it at
        hand (`store.side_by_side`)."""
        key = (_regex(iteration_regex), _rules_key())
        if other is self or self._kept_value(kind, key) is not None or other._kept_value(kind, key) is not None:
            return self._attribution(kind, iteration_regex), other._attribution(kind, iteration_regex)
        return side_by_side(other.con, lambda _: self._attribution(kind, iteration_regex),
                            lambda cursor: other._attribution(kind, iteration_regex, cursor))

    # --- one method per command

    def top(self, k: int = 15, by: NameBy | str = NameBy.demangled, *, instances: bool = False,
            context: bool | None = None) -> pl.DataFrame:
        """`traceq top`: the k heaviest kernels by total time, as `nsys stats`' cuda_gpu_kern_sum
        (rank, instances, total_ns, pct, avg_ns, median_ns, min_ns, max_ns, stddev_ns, name), with
        layer, pass and library (`context`; default: up to 1M kernels, the library alone above);
        with `instances`, the k longest launches."""
        _positive("k", k)
        relation = self.top_relation(k, by, instances=instances, context=context)
        return relation.pl()

    def top_relation(self, k: int = 15, by: NameBy | str = NameBy.demangled, *, instances: bool = False,
                     context: bool | None = None) -> duckdb.DuckDBPyRelation:
        """`top` as a DuckDB relation: where no layer context is joined, the rows come straight
        from the store and nothing imports polars (how `traceq top` stays fast)."""
        from traceq.analysis.kernels.top import top_instances_relation, top_kernels_relation

        by = NameBy(by)
        attribute = context
        if context is None:  # NVTX attribution costs about a second per million kernels; names cost nothing
            kernels = first_row(self.con, "SELECT kernel_count FROM traces WHERE trace_id = ?", [self.id])[0] or 0
            attribute = kernels <= AUTO_CONTEXT_MAX_KERNELS
            if not attribute:
                _note(f"{kernels:,} kernels: layer and pass columns left out "
                      "(NVTX attribution takes a while at this size); --context adds them")
        if instances:
            launches = top_instances_relation(self.con, self.id, k)
            if attribute:
                return self._relation(_with_instance_context(launches.pl(), self._attributed(None)))
            return launches if context is False else _with_library(self.con, launches)
        ranking = top_kernels_relation(self.con, self.id, k, by)
        if context is False:
            return ranking
        if attribute:
            return self._relation(_with_kernel_context(ranking.pl(), self._groups(None), by))
        return _with_library(self.con, ranking)

    def _relation(self, frame: pl.DataFrame) -> duckdb.DuckDBPyRelation:
        return self.con.from_arrow(frame.to_arrow())

    def layers(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq layers`: GPU time per layer and pass (layer, pass, kernels, total_ns, pct,
        heaviest, libraries, attribution), heaviest first."""
        from traceq.analysis.structure.layers import layer_times

        return layer_times(self.con, self.id, groups=self._groups(iteration_regex))

    def attribution_shares(self, *, iteration_regex: str | None = None) -> dict[str, float]:
        """Share of all kernel time (%) by how the kernels got their layer: 'range' (inside a
        layer range), each other attribution ('module', 'op sequence', ...), 'rule' (placed by a
        rule) and 'none' (in no layer); largest first: the title of `traceq layers`."""
        from traceq.analysis.structure.layers import attribution_shares

        return attribution_shares(self._groups(iteration_regex))

    def libs(self, *, by_layer: bool = False, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq libs`: GPU time per library ([layer, pass,] library, kernels, total_ns, pct,
        operations, implementations), heaviest first."""
        from traceq.analysis.structure.layers import library_times

        return library_times(self.con, self.id, by_layer, groups=self._groups(iteration_regex))

    def stages(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq stages`: GPU time per iteration and device in each training stage, span, busy
        and idle time."""
        return self._stages(iteration_regex)

    def kernels(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """Every kernel launch, in kernel_id order, with its NVTX context, classification,
        precision and occupancy: kernel_id, device_id, stream_id, start_ns, dur_ns, name,
        short_name, layer, pass, iteration, stage, attribution, library, implementation,
        operation, precision, precision_from, tensor_cores, grid_blocks, block_threads,
        registers_per_thread, smem_static_bytes, smem_dynamic_bytes, blocks_per_sm, limiter,
        occupancy, waves, ru. RU columns are null (with a note) where the trace's GPU is not
        described or not NVIDIA's."""
        from traceq.analysis.efficiency.ce import kernel_launch_table

        return kernel_launch_table(self.con, self.id, self._attributed(iteration_regex), note=_note)

    def ru(self, by: GroupBy | str = GroupBy.kernel, *, k: int | None = None, cc: str | None = None,
           sms: int | None = None, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq ru`: occupancy and resource utilization per kernel name, layer or library,
        heaviest first (`k`: only the first k rows)."""
        from traceq.analysis.efficiency.ru import ru_table

        by = GroupBy(by)  # by layer the launches' attribution is needed (by kernel or library, rarely)
        groups = self._launch_groups(iteration_regex) if by is GroupBy.layer else None
        frame = ru_table(self.con, self.id, by, cc=cc, sms=sms, iteration_regex=_regex(iteration_regex),
                         groups=groups)
        frame = with_ncu_ru(self, frame, by, iteration_regex)
        frame = with_measured(self, frame, by, lambda: self._attributed(iteration_regex))
        return frame if k is None else frame.head(k)

    def gpu_metrics(self, by: MeasuredBy | str = MeasuredBy.iteration, *, k: int | None = None,
                    iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq gpumetrics`: SM active, SM issue, tensor active and DRAM bandwidth measured by
        nsys's GPU metrics over each iteration's, layer's, kernel name's or library's kernels
        (`analysis.efficiency.measured.measured_table`)."""
        from traceq.analysis.efficiency.measured import measured_table

        frame = measured_table(self.con, self.id, self._attributed(iteration_regex), MeasuredBy(by).value)
        return frame if k is None else frame.head(k)

    def _kernel_ce(self, spec: str | Path | None, batch: int | None, precision: str | None,
                   iteration_regex: str | None) -> pl.DataFrame:
        from traceq.analysis.efficiency.ce import kernel_ce

        precision = None if precision is None else getattr(precision, "value", precision)
        return self._keep("ce", (str(spec), batch, precision, _regex(iteration_regex), _rules_key()),
                          lambda: kernel_ce(self.con, self.id, spec=_path(spec), batch=batch, precision=precision,
                                            iteration_regex=_regex(iteration_regex),
                                            kernels=self._attributed(iteration_regex)))

    def ce(self, by: GroupBy | str = GroupBy.layer, *, spec: str | Path | None = None, batch: int | None = None,
           precision: str | None = None, k: int | None = None, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq ce`: compute efficiency per layer and pass, kernel name or library, most FLOPs
        first; FLOPs from the trace's recorded shapes or a model spec (`spec`). Notes (spec
        layers without kernels, assumed precisions) come as TraceqWarnings."""
        from traceq.analysis.efficiency.ce import ce_notes, ce_table

        per_kernel = self._kernel_ce(spec, batch, precision, iteration_regex)
        frame = ce_table(self.con, self.id, GroupBy(by), per_kernel=per_kernel)
        frame = with_ncu_ce(self, frame, GroupBy(by), per_kernel)
        frame = with_measured(self, frame, GroupBy(by), lambda: per_kernel.filter(per_kernel["kernel_id"].is_not_null()))
        for note in ce_notes(per_kernel):
            _note(note)
        return frame if k is None else frame.head(k)

    def roofline(self, by: GroupBy | str = GroupBy.layer, *, spec: str | Path | None = None, batch: int | None = None,
                 precision: str | None = None, k: int | None = None, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq roofline`: FLOPs, bytes, arithmetic intensity, achieved FLOP/s and bytes/s and
        the share of the roofline bound at that intensity, per layer, pass and operation, kernel
        name or library (`analysis.efficiency.roofline`; bytes from the DeLTA traffic model for
        convolutions, from the recorded shapes otherwise)."""
        from traceq.analysis.efficiency.roofline import trace_roofline

        per_kernel = self._kernel_ce(spec, batch, precision, iteration_regex)
        frame = trace_roofline(self.con, self.id, per_kernel, GroupBy(by), spec=_path(spec), batch=batch,
                               iteration_regex=_regex(iteration_regex), kernels=self._attributed(iteration_regex))
        return frame if k is None else frame.head(k)

    def mfu(self, *, model_flops: float | None = None, params: float | None = None, tokens: float | None = None,
            inference: bool = False, layers: int | None = None, d_model: int | None = None, seq: int | None = None,
            full_attention: bool = False, precision: str | None = None, spec: str | Path | None = None,
            iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq mfu`: model and hardware FLOPs utilization per steady iteration and over all
        of them (`model_flops` per iteration, or `params` x `tokens`: 6 P T for training, 2 P T
        with `inference`, plus attention's products with `layers`, `d_model` and `seq`, halved
        unless `full_attention`; or `spec`, a transformer spec file, alone)."""
        from traceq.analysis.efficiency.mfu import mfu_table, model_flops_per_iteration

        model = model_flops_per_iteration(model_flops, params, tokens, not inference, layers=layers,
                                          d_model=d_model, seq=seq, causal=not full_attention, spec=_path(spec))
        if precision is None and spec is not None:
            from traceq.analysis.efficiency.transformer_spec import load_transformer_spec

            precision = load_transformer_spec(spec).precision
        precision = None if precision is None else getattr(precision, "value", precision)
        try:
            per_kernel = self._kernel_ce(None, None, precision, iteration_regex)
        except MissingDataError:
            per_kernel = pl.DataFrame()
        return mfu_table(self.con, self.id, model_flops=model, precision=precision,
                         iteration_regex=_regex(iteration_regex), per_kernel=per_kernel)

    def traffic(self, by: TrafficBy | str = TrafficBy.layer, *, gpu: str | None = None,
                spec: str | Path | None = None, batch: int | None = None, k: int | None = None,
                iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq traffic`: DeLTA's traffic model of every convolution and GEMM launch beside
        its measured time, per layer and pass or per kernel name (`gpu`: predict on another GPU)."""
        from traceq.analysis.efficiency.traffic import traffic_table

        frame = traffic_table(self.con, self.id, TrafficBy(by), spec=_path(spec), batch=batch, gpu=gpu,
                              iteration_regex=_regex(iteration_regex), kernels=self._attributed(iteration_regex))
        return frame if k is None else frame.head(k)

    def traffic_gpu(self, gpu: str | None = None) -> GpuProduct:
        """The GPU `traffic` predicts on: the product `gpu` names, else the trace's own."""
        from traceq.analysis.efficiency.gpu_products import gpu_product, trace_gpu

        return gpu_product(gpu) if gpu else trace_gpu(self.con, self.id)

    def memory(self, by: MemoryBy | str = MemoryBy.layer, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq memory`: device memory allocated per device, layer and pass (`by='layer'`), or
        in use after each allocation and free (`by='time'`)."""
        from traceq.analysis.memory import memory_by_layer, memory_timeline

        analysis = memory_by_layer if MemoryBy(by) is MemoryBy.layer else memory_timeline
        return analysis(self.con, self.id, _regex(iteration_regex))

    def memory_peaks(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """Per device: its memory, the peak in use and when, allocations, what was allocated
        before the capture (the title of `traceq memory`)."""
        from traceq.analysis.memory import memory_summary

        return memory_summary(self.con, self.id, _regex(iteration_regex))

    def compare(self, other: Trace | str | int, by: CompareBy | str = CompareBy.layer, *,
                spec: str | Path | None = None, k: int | None = None,
                iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq compare`: this trace (a) and `other` (b) side by side per layer, kernel name,
        library or stage: GPU time (per iteration when both mark iterations), b - a, b / a, RU
        and, with FLOPs for both, TFLOP/s and CE."""
        from traceq.analysis.compare.side_by_side import compare_runs

        b = other if isinstance(other, Trace) else self.store.trace(other)
        if CompareBy(by) is CompareBy.stage:
            done = {"stages": self._both(b, "stages", iteration_regex)}
        else:
            key = (_regex(iteration_regex), _rules_key())  # CE reads attributed kernels: those in hand, else its own
            done = {"groups": self._both(b, "launch_groups", iteration_regex),
                    "kernels": (self._kept_value("attributed", key), b._kept_value("attributed", key))}
        frame, _ = compare_runs(self.store._over([self.id, b.id]), self.id, b.id, CompareBy(by), spec=_path(spec),
                                iteration_regex=_regex(iteration_regex), **done)
        return frame if k is None else frame.head(k)

    def gate(self, other: Trace | str | int, threshold: float = 0.05, *,
             iteration_regex: str | None = None) -> GateResult:
        """`traceq compare A B --gate`: whether `other`'s (b's) iterations are slower than this
        trace's (a's) by more than `threshold` (a fraction: 0.05 for 5%) and beyond their noise
        (a one-sided Mann-Whitney test over iterations). The result's `failed` is the verdict
        (the CLI exits 3 when it holds), `verdict` its one line; it never raises for a slower b."""
        from traceq.analysis.compare.gate import regression_gate

        b = other if isinstance(other, Trace) else self.store.trace(other)
        key = (_regex(iteration_regex), _rules_key())
        stages = [t._kept_value("stages", key) for t in (self, b)]  # else the spans alone (`gate.iteration_times`)
        return regression_gate(self.store._over([self.id, b.id]), self.id, b.id, threshold,
                               iteration_regex=_regex(iteration_regex),
                               stages=tuple(stages) if all(s is not None for s in stages) else None)

    def _gaps(self, iteration_regex: str | None) -> tuple[pl.DataFrame, dict[str, pl.Series]]:
        from traceq.analysis.timeline.gaps import gap_frame

        regex = _regex(iteration_regex)
        return self._keep("gaps", (regex,), lambda: gap_frame(self.con, self.id, regex))

    def _idle(self, iteration_regex: str | None) -> tuple[pl.DataFrame, IdleTotals]:
        from traceq.analysis.timeline.idle import idle_causes

        regex = _regex(iteration_regex)
        return self._keep("idle", (regex,), lambda: idle_causes(self.con, self.id, regex,
                                                                 self._gaps(iteration_regex)))

    def idle(self, by: IdleBy | str | None = None, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq idle`: GPU idle time per cause (cause, gaps, total_ns, pct, span_pct,
        per_iteration_ns, longest_ns, call_shares, work_shares); with `by` ('iteration', 'stream'
        or 'layer'), each cause's time split by that key of the work that waited."""
        if by is None:
            return self._idle(iteration_regex)[0]
        from traceq.analysis.timeline.idle import idle_split

        return idle_split(self.con, self.id, IdleBy(by), _regex(iteration_regex), self._gaps(iteration_regex))

    def critical(self, view: str = "segments", *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq critical`: each iteration's critical path through the dependency graph
        (`analysis.critical`). `view`: 'segments' (iteration, from_ns, to_ns, dur_ns, category,
        edge, kind, name, library), 'iterations' (per iteration its time and one `<category>_ns`
        column per category, adding up to it), 'composition' (category, library, total_ns,
        per_iteration_ns, pct), 'layers' (the path's kernel time by layer, where the store keeps the
        attribution) or 'longest' (the ten longest segments)."""
        from traceq.analysis.choices import CriticalView
        from traceq.analysis.critical.path import critical_paths

        graph = self._graph(iteration_regex)
        paths = self._keep("critical", (_regex(iteration_regex),), lambda: critical_paths(graph))
        return _critical_view(paths, CriticalView(view))

    def whatif(self, scale: list[str] | tuple[str, ...] = (), *, no_launch_overhead: bool = False,
               overlap_comm: bool = False, precision: str | None = None, gpu: str | None = None,
               view: str = "iterations", iteration_regex: str | None = None) -> tuple[pl.DataFrame, list[str]]:
        """`traceq whatif`: the dependency graph replayed with the changes: (per iteration
        measured_ns, replayed_ns, predicted_ns, gain_ns, gain_pct, or another `view` of the new
        critical path as `critical` gives; one assumption per change)."""
        return _whatif(self.con, self.id, self._graph(iteration_regex), scale, no_launch_overhead, overlap_comm,
                       precision, gpu, view)

    def _graph(self, iteration_regex: str | None):
        from traceq.analysis.critical.graph import build_graph

        regex = _regex(iteration_regex)
        return self._keep("graph", (regex,), lambda: build_graph(self.con, self.id, regex))

    def idle_totals(self, *, iteration_regex: str | None = None) -> IdleTotals:
        """The devices' span, all idle time, iterations and devices (the title of `traceq idle`
        and `traceq advise`)."""
        regex = _regex(iteration_regex)
        if (idle := self._kept_value("idle", (regex,))) is not None:  # idle() or advise() had them
            return idle[1]
        from traceq.analysis.timeline.idle import idle_totals

        return self._keep("idle_totals", (regex,), lambda: idle_totals(self.con, self.id, regex,
                                                                        self._gaps(iteration_regex)))

    def _launches(self) -> tuple[pl.DataFrame, dict[str, float]]:
        from traceq.analysis.timeline.launches import launch_table

        return self._keep("launches", (), lambda: launch_table(self.con, self.id))

    def launches(self, *, k: int | None = None) -> pl.DataFrame:
        """`traceq launches`: launch cost per kernel name, most launch-call time first (launches,
        api_ns, api_avg_ns, queue_avg_ns, kernel_ns, kernel_avg_ns, tiny, tiny_pct, name)."""
        frame = self._launches()[0]
        return frame if k is None else frame.head(k)

    def launch_totals(self) -> dict[str, float]:
        """All launches, their call and kernel time, the tiny ones (the title of `traceq launches`):
        launches, api_ns, kernel_ns, tiny, tiny_pct, tiny_kernel_ns, graph."""
        return self._launches()[1]

    def stats(self, report: StatsReport | str) -> pl.DataFrame:
        """`traceq stats --report REPORT`: the rows of that `nsys stats` report (docs/stats.md)."""
        from traceq.analysis.timeline.stats import stats_report

        return stats_report(self.con, self.id, getattr(report, "value", report))

    def advise(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq advise`: findings, most GPU time at stake first (rank, title, time_ns, pct,
        evidence, fix, rule); `idle_totals()` gives the span they are measured against."""
        from traceq.analysis.advise import advise

        return advise(self.con, self.id, _regex(iteration_regex), idle=lambda: self._idle(iteration_regex),
                      launches=self._kept_value("launches", ()))[0]  # else read beside the idle analysis

    def export(self, path: str | Path, *, format: str = "perfetto",  # noqa: A002 (the CLI's --format)
               progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
        """`traceq export`: write the trace as Chrome trace events (`format='perfetto'`: the JSON
        Perfetto and chrome://tracing open; gzip-compressed when `path` ends in .gz): kernels and
        memory operations per GPU and stream, CUDA API calls and NVTX ranges per thread, work
        that overlaps on one stream or thread on extra tracks of it, flows from each launch to
        its kernel, kernels' layer, pass, stage and library in their args (api/export.py says
        what is written). Written as it is read, a batch at a time. Returns the events written
        per kind."""
        from traceq.api.export import write_chrome_trace
        from traceq.api.export_tracks import trace_parts

        _export_format(format)
        return write_chrome_trace(self.con, trace_parts(self.con, self.id), Path(path),
                                  lambda _: self._export_attribution(), progress=progress)

    def _export_attribution(self) -> pl.DataFrame | None:
        """The kernels' attribution for an export: None where the store keeps it (joined in DuckDB)."""
        from traceq.analysis.structure.stored import is_kept

        return None if is_kept(self.con, self.id) else self._attributed(None)


def _export_format(format: str) -> None:
    if format != "perfetto":
        raise TraceqError(f"export: unknown format {format!r} (perfetto)")


def _with_library(con: duckdb.DuckDBPyConnection, ranking: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """The library column alone: the names in `ranking` (a few rows) classified, no attribution."""
    from traceq.analysis.kernels.classify import classify

    names = list(dict.fromkeys(name for (name,) in ranking.project("name").fetchall()))
    if not names:
        return ranking.project("*, NULL::VARCHAR AS library")
    values = ", ".join(["(?, ?)"] * len(names))  # joined in DuckDB: the ranking stays a relation
    libraries = con.sql(f"SELECT * FROM (VALUES {values}) AS l(name, library)",
                        params=[value for name in names for value in (name, classify(name).library)])
    return ranking.join(libraries, "name", how="left").order("rank")


def _with_kernel_context(frame: pl.DataFrame, groups: pl.DataFrame, by: NameBy) -> pl.DataFrame:
    from traceq.analysis.structure.layers import names_context

    column = {NameBy.demangled: "name", NameBy.short: "short_name"}.get(by)
    if column is None:  # mangled names: no layer context
        return frame
    return frame.join(names_context(groups, column), on="name", how="left", maintain_order="left")


def _with_instance_context(frame: pl.DataFrame, attributed: pl.DataFrame) -> pl.DataFrame:
    context = attributed.select("kernel_id", "layer", "pass", library="implementation")
    joined = frame.join(context, on="kernel_id", how="left", maintain_order="left")
    first = ["rank", "layer", "pass", "name", "dur_ns"]  # the paper's Table 3: layer, function, time
    return joined.select(*first, *[c for c in joined.columns if c not in first])


def _critical_view(paths: Any, view: Any) -> pl.DataFrame:
    """One view (`choices.CriticalView`) of `analysis.critical.path.Critical` paths."""
    from traceq.analysis.critical.path import composition, layer_composition, longest

    if view.value == "iterations":
        return paths.iterations
    if view.value == "composition":
        return composition(paths)
    if view.value == "layers":
        return layer_composition(paths)
    return longest(paths) if view.value == "longest" else paths.segments


def _whatif(con: Any, trace_id: int, graph: Any, scale: Any, no_launch_overhead: bool, overlap_comm: bool,
            precision: str | None, gpu: str | None, view: str) -> tuple[pl.DataFrame, list[str]]:
    """`Trace.whatif` and `Run.whatif` over `graph` (the GPU model reads `trace_id`'s GPU)."""
    from traceq.analysis.choices import CriticalView
    from traceq.analysis.critical.whatif import Changes, Scale, predict

    changes = Changes(scales=tuple(Scale.parse(s) for s in scale), no_launch_overhead=no_launch_overhead,
                      overlap_comm=overlap_comm, precision=precision, gpu=gpu)
    table, paths, notes = predict(con, trace_id, changes, graph)
    chosen = CriticalView(view)
    return (table if chosen is CriticalView.iterations else _critical_view(paths, chosen)), notes
