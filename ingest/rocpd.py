"""rocprofv3's rocpd SQLite database (`rocprofv3 --output-format rocpd`, `results.db`: the default
output since ROCm 7), schema version 3 of rocprofiler-sdk's `rocpd_tables.sql`.

Every table carries the run's uuid in its name (`rocpd_kernel_dispatch_<uuid>`) and a `guid`
column; rocprofiler-sdk adds views without the uuid (`rocpd_kernel_dispatch`, ...). The views are
read where they exist, else the tables of each name (several uuids, as `rocpd merge` leaves
them, read together). Rows join on id and guid.

Kernels: `rocpd_kernel_dispatch` with its two `rocpd_timestamp`s, its kernel symbol (name, arch
and accumulation VGPRs, SGPRs), its track (agent: the device, queue: the stream) and its event (correlation id). API
calls: the `rocpd_region`s whose event's category is not a marker's (HIP, HSA, RCCL...), named by
their `rocpd_string`; roctx ranges: the regions of category `MARKER_CORE_RANGE_API`. Copies:
`rocpd_memory_copy`. The rows are those the rocprofv3 JSON reader (`amd.RocprofJsonReader`) makes
of the same run; tests/test_rocpd.py checks it on a database built from rocprofiler-sdk's schema
and filled with the records of a real rocprofv3 JSON output (no real rocpd file was found).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, ClassVar

from traceq.errors import TraceFormatError
from traceq.ingest.amd import _COPY_KINDS, _int, _Rows, gpu_row, kernel_row, workgroups
from traceq.ingest.base import Sink, SourceInfo, SqliteReader
from traceq.ingest.xplane_tables import PID

TABLES = ("rocpd_metadata", "rocpd_string", "rocpd_info_agent", "rocpd_info_thread", "rocpd_info_kernel_symbol",
          "rocpd_track", "rocpd_timestamp", "rocpd_event", "rocpd_region", "rocpd_kernel_dispatch",
          "rocpd_memory_copy")
REQUIRED = ("rocpd_kernel_dispatch", "rocpd_timestamp", "rocpd_string")
MARKER_RANGES = "MARKER_CORE_RANGE_API"


def rocpd_sources(tables: set[str]) -> dict[str, str]:
    """The SQL source of each of TABLES present: its view, or its uuid tables (several: UNION ALL),
    quoted (the names come from the file)."""
    found = {}
    for base in TABLES:
        if base in tables:
            found[base] = _quoted(base)
            continue
        parts = sorted(t for t in tables if t.startswith(base + "_") and _is_uuid_suffix(base, t))
        if parts:
            found[base] = ("(" + " UNION ALL ".join(f"SELECT * FROM {_quoted(t)}" for t in parts) + ")"
                           if len(parts) > 1 else _quoted(parts[0]))
    return found


def _is_uuid_suffix(base: str, table: str) -> bool:
    """`table` is `base` + '_' + a uuid, not another table of a longer name (rocpd_info_agent is
    not rocpd_info's)."""
    rest = table[len(base) + 1:]
    return bool(rest) and all(c in "0123456789abcdefABCDEF_-" for c in rest)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class RocpdReader(SqliteReader):
    """rocprofv3's rocpd database: `rocpd_kernel_dispatch_<uuid>` and its companions."""

    name: ClassVar[str] = "rocpd"

    def sniff(self, tables: set[str]) -> bool:
        return "rocpd_op" not in tables and all(base in rocpd_sources(tables) for base in REQUIRED)

    def estimate_rows(self, src: sqlite3.Connection) -> int:
        sources = rocpd_sources(_tables(src))
        return sum(int(src.execute(f"SELECT count(*) FROM {sources[t]}").fetchone()[0])
                   for t in ("rocpd_kernel_dispatch", "rocpd_region", "rocpd_memory_copy") if t in sources)

    def read(self, src: sqlite3.Connection, sink: Sink) -> SourceInfo:
        s = rocpd_sources(_tables(src))
        missing = [t for t in ("rocpd_track", "rocpd_info_agent") if t not in s]
        if missing:
            raise TraceFormatError(f"a rocpd database without its {missing[0]} table")
        rows = _Rows()
        device_of = _gpus(src, s, rows)
        _kernels(src, s, rows, device_of)
        if "rocpd_region" in s and "rocpd_event" in s:
            _regions(src, s, rows)
        if "rocpd_memory_copy" in s:
            _copies(src, s, rows, device_of)
        rows.write(sink)
        meta = dict(src.execute(f"SELECT tag, value FROM {s['rocpd_metadata']}")) if "rocpd_metadata" in s else {}
        version = meta.get("schema_version")
        return SourceInfo(format="rocpd", tool="rocprofv3 (rocprofiler-sdk) rocpd database",
                          schema_version=str(version) if isinstance(version, (str, int)) else None)


def _tables(src: sqlite3.Connection) -> set[str]:
    return {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def _gpus(src: sqlite3.Connection, s: dict[str, str], rows: _Rows) -> dict[tuple[Any, Any], int]:
    """The GPU agents as the store's GPUs 0, 1, ... in their absolute (node) index's order, as the
    JSON reader numbers them; (agent id, guid) -> device."""
    device_of = {}
    agents = src.execute(f"SELECT id, guid, name, product_name, extdata FROM {s['rocpd_info_agent']} "
                         "WHERE type = 'GPU' ORDER BY absolute_index, id")
    for index, (agent, guid, name, product, extdata) in enumerate(agents):
        extra = _json(extdata)
        device_of[(agent, guid)] = index
        rows.tables.gpus.append(gpu_row(index, _text(product) or _text(name), extra.get("cu_count"),
                                        extra.get("max_engine_clk_fcompute"), extra.get("wave_front_size"), name,
                                        extra.get("max_waves_per_cu"), extra.get("lds_size_in_kb")))
    return device_of


def _times(s: dict[str, str], row: str) -> str:
    """The joins that give a row (alias `row`) its start and end times: DS.value and DE.value."""
    return "\n".join(f"LEFT JOIN {s['rocpd_timestamp']} {t} ON {t}.id = {row}.{end}_id AND {t}.guid = {row}.guid"
                     for t, end in (("DS", "start"), ("DE", "end")))


def _kernels(src: sqlite3.Connection, s: dict[str, str], rows: _Rows, device_of: dict[tuple[Any, Any], int]) -> None:
    symbol = s.get("rocpd_info_kernel_symbol")
    event = s.get("rocpd_event")
    sql = f"""
        SELECT DS.value, DE.value, {'S.display_name, S.kernel_name, S.extdata, S.arch_vgpr_count, S.accum_vgpr_count, S.sgpr_count'
                                    if symbol else 'NULL, NULL, NULL, NULL, NULL, NULL'},
               K.kernel_id, T.agent_id, K.guid, T.queue_id, {'E.correlation_id' if event else 'NULL'},
               K.grid_size_x, K.grid_size_y, K.grid_size_z, K.workgroup_size_x, K.workgroup_size_y,
               K.workgroup_size_z, K.group_segment_size, K.private_segment_size
        FROM {s['rocpd_kernel_dispatch']} K
        {_times(s, 'K')}
        LEFT JOIN {s['rocpd_track']} T ON T.id = K.track_id AND T.guid = K.guid
        {f'LEFT JOIN {symbol} S ON S.id = K.kernel_id AND S.guid = K.guid' if symbol else ''}
        {f'LEFT JOIN {event} E ON E.id = K.event_id AND E.guid = K.guid' if event else ''}
        ORDER BY K.guid, K.id"""
    for (start, end, display, mangled, extdata, vgprs, agprs, sgprs, kernel_id, agent, guid, queue, correlation,
         gx, gy, gz, wx, wy, wz, lds, scratch) in src.execute(sql):
        start, end = _int(start), _int(end)
        if start is None or end is None:
            rows.skipped += 1
            continue
        name = (_text(display) or _text(_json(extdata).get("demangled_kernel_name")) or _text(mangled)
                or f"kernel {_int(kernel_id)}")
        size = (_int(wx), _int(wy), _int(wz))
        rows.tables.kernels.append(kernel_row(
            name, start, end, device_of.get((agent, guid), 0), _int(queue), correlation=_int(correlation), pid=PID,
            grid=tuple(workgroups(_int(g), w) for g, w in zip((gx, gy, gz), size)),  # type: ignore[arg-type]
            block=size, registers=_int(vgprs), lds=_int(lds), scratch=_int(scratch), accum_vgprs=_int(agprs),
            sgprs=_int(sgprs)))


def _regions(src: sqlite3.Connection, s: dict[str, str], rows: _Rows) -> None:
    """Host regions: roctx ranges (category MARKER_CORE_RANGE_API), the other markers' regions
    (the roctx calls themselves) left out, and every other category's as API calls."""
    thread = s.get("rocpd_info_thread")
    sql = f"""
        SELECT DS.value, DE.value, N.string, C.string, {'TH.tid' if thread else 'T.tid'}, E.correlation_id
        FROM {s['rocpd_region']} R
        {_times(s, 'R')}
        LEFT JOIN {s['rocpd_string']} N ON N.id = R.name_id AND N.guid = R.guid
        LEFT JOIN {s['rocpd_event']} E ON E.id = R.event_id AND E.guid = R.guid
        LEFT JOIN {s['rocpd_string']} C ON C.id = E.category_id AND C.guid = E.guid
        LEFT JOIN {s['rocpd_track']} T ON T.id = R.track_id AND T.guid = R.guid
        {f'LEFT JOIN {thread} TH ON TH.id = T.tid AND TH.guid = T.guid' if thread else ''}
        ORDER BY R.guid, R.id"""
    for start, end, name, category, tid, correlation in src.execute(sql):
        start, end, category = _int(start), _int(end), _text(category) or ""
        if start is None or end is None:
            continue
        if category == MARKER_RANGES:  # a mark is a range of no length; its name, the message
            mark = end <= start
            rows.tables.ranges.append((start, None if mark else end, _text(name) or "roctx",
                                       "mark" if mark else "pushpop", "roctx", PID, _int(tid)))
        elif "MARKER" not in category:
            rows.tables.calls.append((start, end, _text(name) or "call", _int(tid) or 0, _int(correlation)))


def _copies(src: sqlite3.Connection, s: dict[str, str], rows: _Rows, device_of: dict[tuple[Any, Any], int]) -> None:
    event = s.get("rocpd_event")
    sql = f"""
        SELECT DS.value, DE.value, N.string, M.size, M.src_agent_id, M.dst_agent_id, M.guid,
               {'E.correlation_id' if event else 'NULL'}, T.queue_id
        FROM {s['rocpd_memory_copy']} M
        {_times(s, 'M')}
        LEFT JOIN {s['rocpd_string']} N ON N.id = M.name_id AND N.guid = M.guid
        LEFT JOIN {s['rocpd_track']} T ON T.id = M.track_id AND T.guid = M.guid
        {f'LEFT JOIN {event} E ON E.id = M.event_id AND E.guid = M.guid' if event else ''}
        ORDER BY M.guid, M.id"""
    for start, end, name, size, src_agent, dst_agent, guid, correlation, _queue in src.execute(sql):
        start, end = _int(start), _int(end)
        if start is None or end is None:
            continue
        kind = _COPY_KINDS.get(name if isinstance(name, str) else "", "Other")
        device = device_of.get((dst_agent if kind == "Host-to-Device" else src_agent, guid))
        rows.tables.memops.append({"start_ns": start, "end_ns": end, "dur_ns": end - start, "op": "memcpy",
                                   "copy_kind": kind, "bytes": _int(size),
                                   "device_id": device if device is not None else 0, "stream_id": None,
                                   "correlation_id": _int(correlation), "pid": PID})


def _json(text: Any) -> dict[str, Any]:
    """An `extdata` column's object (an empty one for anything else: damaged, absent)."""
    if not isinstance(text, (str, bytes)):
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
