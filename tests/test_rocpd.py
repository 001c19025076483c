"""rocprofv3's rocpd database (ingest/rocpd.py). No real one was found (CATALOG-more.md), so the
database is built here: the schema restated from rocprofiler-sdk (tests/data/rocpd_schema_v3.sql),
filled with the records of a real rocprofv3 JSON output of one run (TraceLens's 908 sample: the
same tool's other output format), and the store loaded from it must equal the store loaded from
the JSON by the JSON reader: kernels, times, names, devices, launch configurations, counts.
Host regions (HIP calls, a roctx range, a roctx call) and a copy, which the JSON sample lacks,
are added and checked against the rows inserted."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest
from conftest import shared

from traceq import TraceFormatError

SAMPLE = ("realtraces", "rocpd", "AMD-AGI__TraceLens__rocprof__908_results.json.gz")
SCHEMA = Path(__file__).parent / "data" / "rocpd_schema_v3.sql"
UUID, GUID = "_00000000_1111_2222_3333_444444444444", "00000000-1111-2222-3333-444444444444"
KERNEL_COLUMNS = ("name, start_ns, end_ns, device_id, correlation_id, grid_x, grid_y, grid_z, block_x, block_y, "
                  "block_z, registers_per_thread, smem_static_bytes, local_memory_per_thread_bytes")


def _tool(path: Path) -> dict:
    data = json.loads(gzip.decompress(path.read_bytes()))["rocprofiler-sdk-tool"]
    return data[0] if isinstance(data, list) else data


def build_rocpd(json_path: Path, target: Path, extra_regions: bool = True) -> dict:
    """A rocpd database holding the JSON output's agents, kernel symbols and dispatches; what
    else was added (regions, a copy) is returned for the checks."""
    tool = _tool(json_path)
    con = sqlite3.connect(target)
    con.executescript(SCHEMA.read_text().replace("{{uuid}}", UUID).replace("{{guid}}", GUID))

    def insert(table: str, **row) -> int:
        row.setdefault("guid", GUID)
        for key in ("extdata", "environment", "call_stack", "line_info"):
            if table not in columns:
                columns[table] = _columns(con, table)
            if key in columns[table]:
                row.setdefault(key, "{}")
        cur = con.execute(f'INSERT INTO "{table}{UUID}" ({", ".join(row)}) VALUES ({", ".join("?" * len(row))})',
                          list(row.values()))
        return cur.lastrowid

    strings: dict[str, int] = {}
    columns: dict[str, set[str]] = {}

    def string(text: str) -> int:
        if text not in strings:
            strings[text] = insert("rocpd_string", string=text)
        return strings[text]

    pid = tool["metadata"]["pid"]
    nid = insert("rocpd_info_node", hash=1, machine_id="m", hostname=tool["metadata"]["node"].get("hostname"))
    process = insert("rocpd_info_process", nid=nid, pid=pid, command="python train.py")
    thread = insert("rocpd_info_thread", nid=nid, pid=process, tid=pid)
    agents = {}
    for agent in tool["agents"]:
        agents[agent["id"]["handle"]] = insert(
            "rocpd_info_agent", nid=nid, pid=process, type="GPU" if agent["type"] == 2 else "CPU",
            absolute_index=agent["node_id"], logical_index=agent["logical_node_id"],
            type_index=agent["logical_node_type_id"], name=agent["name"], product_name=agent["product_name"],
            extdata=json.dumps(agent))
    code_object = insert("rocpd_info_code_object", nid=nid, pid=process)
    for symbol in tool["kernel_symbols"]:
        insert("rocpd_info_kernel_symbol", id=symbol["kernel_id"], nid=nid, pid=process, code_object_id=code_object,
               kernel_name=symbol["kernel_name"], display_name=symbol["demangled_kernel_name"],
               group_segment_size=symbol["group_segment_size"], private_segment_size=symbol["private_segment_size"],
               sgpr_count=symbol["sgpr_count"], arch_vgpr_count=symbol["arch_vgpr_count"],
               accum_vgpr_count=symbol["accum_vgpr_count"], extdata=json.dumps(symbol))
    tracks: dict[tuple, int] = {}
    dispatch = string("KERNEL_DISPATCH")
    records = tool["buffer_records"]["kernel_dispatch"]
    for record in records:
        key = (record["dispatch_info"]["agent_id"]["handle"], record["dispatch_info"]["queue_id"]["handle"])
        if key not in tracks:
            queue = insert("rocpd_info_queue", nid=nid, pid=process, name=f"queue {key[1]}")
            tracks[key] = insert("rocpd_track", nid=nid, pid=process, tid=thread, agent_id=agents[key[0]],
                                 queue_id=queue)
    # ids given here, rows inserted in bulk: dispatch i has timestamps 2i + 1 and 2i + 2, event i + 1
    stamps, events, dispatches = [], [], []
    for i, record in enumerate(records):
        info = record["dispatch_info"]
        track = tracks[(info["agent_id"]["handle"], info["queue_id"]["handle"])]
        stamps += [(2 * i + 1, GUID, record["start_timestamp"], 1, track),
                   (2 * i + 2, GUID, record["end_timestamp"], 2, track)]
        events.append((i + 1, GUID, dispatch, record["correlation_id"]["internal"], "{}", "{}", "{}"))
        size, grid = info["workgroup_size"], info["grid_size"]
        dispatches.append((i + 1, GUID, track, info["kernel_id"], info["dispatch_id"], 2 * i + 1, 2 * i + 2,
                           info["private_segment_size"], info["group_segment_size"], size["x"], size["y"], size["z"],
                           grid["x"], grid["y"], grid["z"], i + 1, "{}"))
    con.executemany(f'INSERT INTO "rocpd_timestamp{UUID}" (id, guid, value, phase, track_id) VALUES (?, ?, ?, ?, ?)',
                    stamps)
    con.executemany(f'INSERT INTO "rocpd_event{UUID}" (id, guid, category_id, correlation_id, call_stack, line_info, '
                    "extdata) VALUES (?, ?, ?, ?, ?, ?, ?)", events)
    con.executemany(f'INSERT INTO "rocpd_kernel_dispatch{UUID}" (id, guid, track_id, kernel_id, dispatch_id, '
                    "start_id, end_id, private_segment_size, group_segment_size, workgroup_size_x, workgroup_size_y, "
                    "workgroup_size_z, grid_size_x, grid_size_y, grid_size_z, event_id, extdata) "
                    f"VALUES ({', '.join('?' * 17)})", dispatches)
    added: dict = {"calls": [], "ranges": [], "copies": []}
    if extra_regions:
        host = insert("rocpd_track", nid=nid, pid=process, tid=thread)
        first = min(r["start_timestamp"] for r in records)
        for i, (category, name, length) in enumerate([
                ("HIP_RUNTIME_API_EXT", "hipLaunchKernel", 2_000), ("HIP_RUNTIME_API_EXT", "hipMemcpyAsync", 5_000),
                ("MARKER_CORE_RANGE_API", "forward", 90_000), ("MARKER_CORE_API", "roctxRangePushA", 300)]):
            t0 = first + 10_000 * i
            start = insert("rocpd_timestamp", value=t0, phase=1, track_id=host)
            end = insert("rocpd_timestamp", value=t0 + length, phase=2, track_id=host)
            event = insert("rocpd_event", category_id=string(category), correlation_id=900_000 + i)
            insert("rocpd_region", track_id=host, name_id=string(name), start_id=start, end_id=end, event_id=event)
            if category.startswith("HIP"):
                added["calls"].append((name, t0, t0 + length, 900_000 + i))
            elif category == "MARKER_CORE_RANGE_API":
                added["ranges"].append((name, t0, t0 + length))
        gpu = next(a for a in tool["agents"] if a["type"] == 2)
        cpu = next(a for a in tool["agents"] if a["type"] != 2)
        start = insert("rocpd_timestamp", value=first + 50_000, phase=1, track_id=host)
        end = insert("rocpd_timestamp", value=first + 58_000, phase=2, track_id=host)
        event = insert("rocpd_event", category_id=string("MEMORY_COPY"), correlation_id=900_001)
        insert("rocpd_memory_copy", track_id=host, start_id=start, end_id=end,
               name_id=string("MEMORY_COPY_HOST_TO_DEVICE"), dst_agent_id=agents[gpu["id"]["handle"]],
               src_agent_id=agents[cpu["id"]["handle"]], size=1 << 20, event_id=event)
        added["copies"].append((first + 50_000, first + 58_000, 1 << 20))
    con.commit()
    con.close()
    return added


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}{UUID}")')}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):
    import traceq

    json_path = shared(*SAMPLE)
    folder = tmp_path_factory.mktemp("rocpd")
    db = folder / "results.db"
    added = build_rocpd(json_path, db)
    from_json = traceq.load(json_path, folder / "json.duckdb", attribute=False)
    from_db = traceq.load(db, folder / "db.duckdb", attribute=False)
    return from_json, from_db, added, db


def test_the_rocpd_store_equals_the_json_store_of_the_same_run(loaded) -> None:
    from_json, from_db, _, _ = loaded
    tool = _tool(shared(*SAMPLE))
    records = tool["buffer_records"]["kernel_dispatch"]

    def kernels(t) -> list[tuple]:
        return t.con.execute(f"SELECT {KERNEL_COLUMNS} FROM kernels WHERE trace_id = ? ORDER BY ALL",
                             [t.id]).fetchall()

    reference = kernels(from_json)
    assert len(reference) == len(records) == 43_915
    assert kernels(from_db) == reference
    gpus = "SELECT * EXCLUDE (trace_id) FROM gpus WHERE trace_id = ? ORDER BY device_id"
    assert from_db.con.execute(gpus, [from_db.id]).fetchall() == from_json.con.execute(gpus, [from_json.id]).fetchall()
    streams = "SELECT count(DISTINCT (device_id, stream_id)) FROM kernels WHERE trace_id = ?"
    assert from_db.con.execute(streams, [from_db.id]).fetchone() == from_json.con.execute(
        streams, [from_json.id]).fetchone()
    # the raw records, read here: total time and the heaviest kernel symbol's count
    total = sum(r["end_timestamp"] - r["start_timestamp"] for r in records)
    assert from_db.con.execute("SELECT sum(end_ns - start_ns) FROM kernels WHERE trace_id = ?",
                               [from_db.id]).fetchone()[0] == total
    row = from_db.con.execute("SELECT format, source_schema_version FROM traces WHERE trace_id = ?",
                              [from_db.id]).fetchone()
    assert row == ("rocpd", "3")


def test_regions_become_calls_and_ranges_and_copies_memops(loaded) -> None:
    _, from_db, added, _ = loaded
    con, tid = from_db.con, from_db.id
    calls = con.execute("SELECT name, start_ns, end_ns, correlation_id FROM api_calls WHERE trace_id = ? "
                        "ORDER BY start_ns", [tid]).fetchall()
    assert calls == added["calls"]
    ranges = con.execute("SELECT name, start_ns, end_ns FROM nvtx WHERE trace_id = ?", [tid]).fetchall()
    assert ranges == added["ranges"]  # the roctx call itself (MARKER_CORE_API) is not a range
    copies = con.execute("SELECT start_ns, end_ns, bytes FROM memops WHERE trace_id = ? AND copy_kind = "
                         "'Host-to-Device'", [tid]).fetchall()
    assert copies == added["copies"]


def test_rocpd_is_told_from_rpd_and_rocprof_v1(tmp_path: Path) -> None:
    from traceq.ingest import READERS
    from traceq.ingest.detect import reader_for

    assert reader_for(shared("realtraces", "rocpd", "ROCm__rocmProfileData__matmul_result.rpd"), READERS).name == "rpd"
    assert reader_for(shared("realtraces", "rocpd", "amd__HPCTrainingExamples__finite-difference__results.db"),
                      READERS).name == "rocprof-db"
    db = tmp_path / "results.db"
    con = sqlite3.connect(db)
    con.executescript(SCHEMA.read_text().replace("{{uuid}}", UUID).replace("{{guid}}", GUID))
    con.close()
    assert reader_for(db, READERS).name == "rocpd"
    # without the views (as a merged database may be): the uuid tables are read
    con = sqlite3.connect(db)
    for (view,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        con.execute(f'DROP VIEW "{view}"')
    con.commit()
    con.close()
    assert reader_for(db, READERS).name == "rocpd"


def test_an_empty_rocpd_database_is_refused_in_one_line(tmp_path: Path) -> None:
    import traceq

    db = tmp_path / "results.db"
    con = sqlite3.connect(db)
    con.executescript(SCHEMA.read_text().replace("{{uuid}}", UUID).replace("{{guid}}", GUID))
    con.close()
    store = tmp_path / "s.duckdb"
    with pytest.raises(TraceFormatError) as e:
        traceq.load(db, store)
    assert "\n" not in str(e.value) and "results.db" in str(e.value)
