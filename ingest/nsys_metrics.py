"""GPU metrics of an Nsight Systems export (`nsys profile --gpu-metrics-devices=...`).

nsys samples hardware counters per GPU at a fixed frequency and exports them as
GPU_METRICS (timestamp, typeId, metricId, value) with the metric names in
TARGET_INFO_GPU_METRICS (typeId, metricId, metricName): one typeId per GPU sampled, metric
ids not stable across typeIds, so a sample's name is looked up by both. Only the percentage
metrics ('... [Throughput %]': GR/SMs/Tensor Active, SM Issue, DRAM Read/Write Bandwidth,
PCIe, NVLink, warps in flight) are kept: they are what traceq integrates over kernels; clock
frequencies and warp counts are left in the file. The GPU of a typeId is the trace's one GPU,
or, on a trace of several, the typeId's low byte (the CUDA device index nsys puts there).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from traceq.ingest.base import Sink
from traceq.ingest.sqlite_source import column_names, fetch_batches
from traceq.ingest.validate import valid_times
from traceq.store import schema_sql

SAMPLES = "GPU_METRICS"
NAMES = "TARGET_INFO_GPU_METRICS"
KEPT = "[Throughput %]"
"""The suffix of the metric names kept."""

_SCHEMA = pa.schema([("type_id", pa.int64()), ("ts_ns", pa.int64()), ("metric", pa.string()),
                     ("value", pa.float64())])


def read_gpu_metrics(src: sqlite3.Connection, tables: set[str], sink: Sink) -> None:
    """Append the export's percentage GPU metrics to `gpu_metrics` (nothing when it has none)."""
    if SAMPLES not in tables or NAMES not in tables:
        return
    have, named = column_names(src, SAMPLES), column_names(src, NAMES)
    if not {"timestamp", "metricId", "value"} <= have or not {"metricId", "metricName"} <= named:
        return
    by_type = "typeId" in have and "typeId" in named
    _ensure_table(sink)
    sink.append_all("gpu_metrics", _samples(src, tables, sink, by_type))


def _ensure_table(sink: Sink) -> None:
    """Create `gpu_metrics` (schema.sql's) in a store made before it existed: nothing reads it
    unasked, so such a store keeps its schema version and gets the table at its first load of a
    trace with metrics (inside the load's transaction)."""
    found = re.search(r"^CREATE TABLE gpu_metrics \(.*?^\);", schema_sql(), re.MULTILINE | re.DOTALL)
    if found is None:  # schema.sql always has it
        raise ValueError("schema.sql has no table gpu_metrics")
    sink.con.execute(found.group(0).replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))


def _samples(src: sqlite3.Connection, tables: set[str], sink: Sink, by_type: bool) -> Iterator[pa.Table]:
    type_id = "g.typeId" if by_type else "0"
    join = "n.typeId = g.typeId AND n.metricId = g.metricId" if by_type else "n.metricId = g.metricId"
    names = f"SELECT DISTINCT {'typeId, ' if by_type else ''}metricId, metricName FROM {NAMES} " \
            "WHERE instr(metricName, ?) > 0"
    sql = (f"SELECT {type_id}, g.timestamp, n.metricName, CAST(g.value AS REAL) FROM {SAMPLES} g "
           f"JOIN ({names}) n ON {join}")
    only = _only_device(src, tables)
    for batch in fetch_batches(src, sql, _SCHEMA, [KEPT], source=SAMPLES):
        batch = valid_times(batch, "gpu_metrics", sink.damage)
        device = (pa.array([only] * batch.num_rows, pa.int64()) if only is not None
                  else pc.bit_wise_and(batch["type_id"], 0xFF))
        yield pa.table({"device_id": device, "ts_ns": batch["ts_ns"], "metric": batch["metric"],
                        "value": batch["value"]})


def _only_device(src: sqlite3.Connection, tables: set[str]) -> int | None:
    """The device id of the trace's only GPU (its GPU table's), or None."""
    for table, column in (("TARGET_INFO_GPU", "id"), ("TARGET_INFO_CUDA_GPU", "deviceId")):
        if table in tables and column in column_names(src, table):
            ids = [r[0] for r in src.execute(f'SELECT DISTINCT "{column}" FROM "{table}" LIMIT 2')]
            if ids:
                return ids[0] if len(ids) == 1 and isinstance(ids[0], int) else None
    return None
