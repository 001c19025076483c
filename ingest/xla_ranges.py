"""XLA's op and module ranges of an XPlane profile, made from its kernels' and calls' Arrow
columns (the streaming XPlane reader's; `xplane_tables.xla_ranges` makes the same ranges from
rows kept as Python values, for the readers that still keep them).

The ranges and their order are `xplane_tables.xla_ranges`'s: first the module executions of the
launching calls (a thread at a time, threads in the order they first launch), then a
`Thunk:#...#` range around each launching call whose kernels ran one op (calls in the order
their first kernel was read), then, for the kernels without a launching call, a device at a
time, the op ranges and the module executions over the kernels' own times. A Python step is
taken only per launching call with a module (to find where an execution starts), a slice of
them at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from traceq.ingest.base import key_rows, row_numbers
from traceq.ingest.columns import RANGE_SCHEMA, last_index
from traceq.ingest.xplane_tables import _XLA_MODULES, _XLA_OPS, PID, _module_name, _thunk_name

SLICE_ROWS = 65_536
"""Launches walked per Python step when finding module executions."""


def xla_range_tables(kernels: pa.Table, calls: pa.Table, op_names: dict[tuple[str, str], str]) -> Iterator[pa.Table]:
    """XLA's ranges as tables of RANGE_SCHEMA. `kernels`: start_ns, end_ns, correlation_id,
    device_id, hlo_op, hlo_module, program_id in the order read; `calls`: start_ns, end_ns, tid,
    correlation_id in the order read."""
    if not kernels.num_rows:
        return
    linked = calls.filter(pc.is_valid(calls["correlation_id"]))
    call = last_index(linked["correlation_id"], kernels["correlation_id"])
    launched = pc.is_valid(call)
    rows = pa.table({"row": row_numbers(kernels.num_rows), "call": call, "op": kernels["hlo_op"]}).filter(launched)
    if rows.num_rows:
        groups = rows.group_by("call", use_threads=False).aggregate([("row", "min"), ("op", "count_distinct"),
                                                                       ("op", "min")])
        groups = groups.take(pc.sort_indices(groups["row_min"]))
        first = groups["row_min"]
        op = pc.if_else(pc.equal(groups["op_count_distinct"], 1), groups["op_min"], pa.scalar(None, pa.string()))
        module, program = kernels["hlo_module"].take(first), kernels["program_id"].take(first)
        at = groups["call"]
        start, end, tid = (linked[c].take(at) for c in ("start_ns", "end_ns", "tid"))
        modules = pa.table({"start": start, "end": end, "op": op, "module": module, "program": program, "tid": tid})
        yield from _launch_executions(modules.filter(pc.is_valid(module)))
        ops = pc.is_valid(op)
        yield _ranges(start.filter(ops), end.filter(ops), _thunks(op.filter(ops), module.filter(ops), op_names),
                      "pushpop", _XLA_OPS, tid.filter(ops))
    loose = pa.table({c: kernels[c] for c in ("start_ns", "end_ns", "device_id", "hlo_op", "hlo_module",
                                              "program_id")}).filter(pc.invert(launched))
    for device in pc.unique(loose["device_id"]).to_pylist():
        mine = loose.filter(pc.equal(loose["device_id"], device) if device is not None else pc.is_null(loose["device_id"]))
        mine = mine.take(pc.sort_indices(mine, sort_keys=[("start_ns", "ascending"), ("end_ns", "ascending")]))
        ops = mine.filter(pc.is_valid(mine["hlo_op"]))
        yield _ranges(ops["start_ns"], ops["end_ns"], _thunks(ops["hlo_op"], ops["hlo_module"], op_names),
                      "startend", _XLA_OPS, None)
        with_module = mine.filter(pc.is_valid(mine["hlo_module"]))
        runs = _Executions()
        for part in _slices(with_module, ("start_ns", "end_ns", "hlo_op", "hlo_module", "program_id")):
            runs.walk(part)
        yield _run_table(runs.finish(), "startend", None, 0)


def _slices(table: pa.Table, columns: tuple[str, ...]) -> Iterator[zip[tuple[Any, ...]]]:
    for first in range(0, table.num_rows, SLICE_ROWS):
        part = table.slice(first, SLICE_ROWS)
        yield zip(*(part[c].to_pylist() for c in columns))


def _launch_executions(modules: pa.Table) -> Iterator[pa.Table]:
    """The executions of each thread's launching calls, threads in the order they first come,
    a thread's calls in (start, end) order (a stable sort: ties in the order of their kernels)."""
    if not modules.num_rows:
        return
    threads = pc.unique(modules["tid"])
    modules = modules.append_column("thread", pc.index_in(modules["tid"], value_set=threads, skip_nulls=False))
    modules = modules.take(pc.sort_indices(modules, sort_keys=[("thread", "ascending"), ("start", "ascending"),
                                                               ("end", "ascending")]))
    runs, tid = _Executions(), None
    out: list[tuple[int, int, str, int | None]] = []
    for part in _slices(modules, ("tid", "start", "end", "op", "module", "program")):
        for row in part:
            if runs.run is not None and row[0] != tid:
                out.extend((run[2], run[3], name, tid) for name, run in runs.finish())
                runs = _Executions()
            tid = row[0]
            runs.add(*row[1:])
        if len(out) >= SLICE_ROWS:
            yield _run_table(out, "pushpop", PID, 1)
            out = []
    out.extend((run[2], run[3], name, tid) for name, run in runs.finish())
    yield _run_table(out, "pushpop", PID, 1)


class _Executions:
    """`xplane_tables._executions`, a row at a time: a new execution where the module changes or
    its first op comes again. A run is [module, first op, start, end]."""

    def __init__(self) -> None:
        self.run: list[Any] | None = None
        self.runs: list[tuple[str, list[Any]]] = []

    def add(self, start: int, end: int, op: str | None, module: str, program: int | None) -> None:
        key = (module, program)
        run = self.run
        if run is not None and (run[0] != key or op == run[1]):
            self.runs.append((_module_name(run[0]), run))
            run = None
        if run is None:
            run = self.run = [key, op, start, end]
        run[3] = max(run[3], end)

    def walk(self, rows: Any) -> None:
        for row in rows:
            self.add(*row)

    def finish(self) -> list[Any]:
        """(name, run) of every execution, for the rows walked; `finish` of a per-device walker
        gives (start, end, name, None) rows."""
        if self.run is not None:
            self.runs.append((_module_name(self.run[0]), self.run))
            self.run = None
        runs, self.runs = self.runs, []
        return runs


def _run_table(runs: list[Any], kind: str, pid: int | None, past_end: int) -> pa.Table:
    """Module executions as ranges: `runs` of (start, end, name, tid) or (name, run)."""
    if runs and len(runs[0]) == 2:
        runs = [(run[2], run[3], name, None) for name, run in runs]
    return _ranges(pa.array([r[0] for r in runs], pa.int64()), pa.array([r[1] + past_end for r in runs], pa.int64()),
                   pa.array([r[2] for r in runs], pa.string()), kind, _XLA_MODULES,
                   pa.array([r[3] for r in runs], pa.int64()), pid)


def _thunks(op: Any, module: Any, op_names: dict[tuple[str, str], str]) -> pa.Array:
    """Each op range's name, made once per distinct (op, module)."""
    if not len(op):
        return pa.array([], pa.string())
    keys = key_rows(op, module)
    names = [_thunk_name(k["k0"], op_names.get((k["k1"] or "", k["k0"]))) for k in keys.dictionary.to_pylist()]
    return pa.array(names, pa.string()).take(keys.indices)


def _ranges(start: Any, end: Any, name: Any, kind: str, domain: str, tid: Any, pid: int | None = PID) -> pa.Table:
    n = len(start)
    return pa.table({"start_ns": start, "end_ns": end, "name": name,
                     "kind": pa.repeat(pa.scalar(kind, pa.string()), n),
                     "domain": pa.repeat(pa.scalar(domain, pa.string()), n),
                     "pid": pa.repeat(pa.scalar(pid if tid is not None else None, pa.int64()), n),
                     "tid": tid if tid is not None else pa.nulls(n, pa.int64())}, schema=RANGE_SCHEMA)
