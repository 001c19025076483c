"""The Perfetto (`.pftrace`) reader, on traces laid out as rocprofv3 writes them
(tools/make_pftrace.py, from rocprofiler-sdk's writer) and filled from the real rocprofv3 JSON
of ../shared (TraceLens's 908 run, MI350X): kernel counts, per-name GPU time and API calls equal
both an independent decoding of the same file with Perfetto's own `perfetto_trace_pb2` and the
source JSON; damaged files are refused in one line with the store unchanged; every command runs
on the loaded trace; a trace of another layout loads its slices as ranges.

The traces are built here at test time (the JSON's licence lets it be used as a test input, not
copied into the project): the tests skip without ../shared or without the `perfetto` package."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import shared

from traceq import TraceFormatError

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import make_pftrace  # tools/ is not a package

SOURCE = ("realtraces", "rocpd", "AMD-AGI__TraceLens__rocprof__908_results.json.gz")
LIMIT = 1500


@pytest.fixture(scope="module")
def tool() -> dict:
    """The source JSON's `rocprofiler-sdk-tool` entry, parsed once."""
    return make_pftrace.tool_entry(shared(*SOURCE))


@pytest.fixture(scope="module")
def traces(tool: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    source = tool
    out = tmp_path_factory.mktemp("pftrace")
    paths = {"stream": out / "run.pftrace", "queue": out / "queues.pftrace"}
    make_pftrace.build(source, paths["stream"], limit=LIMIT, synthetic_api=True, clear_every=401)
    make_pftrace.build(source, paths["queue"], limit=300, group_by_queue=True, synthetic_api=True)
    return paths


def pb2_reading(path: Path) -> dict[str, Counter]:
    """Kernels per name (count, total ns) and API calls per name, decoded with
    perfetto_trace_pb2: interning per sequence, cleared where a packet says; timestamps on the
    incremental clock accumulated from the sequence's clock snapshot; slices paired per track."""
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    seqs: dict[int, dict] = {}
    open_: dict[int, list] = {}
    kernels, kernel_ns, calls = Counter(), Counter(), Counter()
    for p in trace.packet:
        s = seqs.setdefault(p.trusted_packet_sequence_id, {"names": {}, "cats": {}, "clock": None, "last": 0})
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            s.update(names={}, cats={}, clock=None, last=0)
        if p.HasField("trace_packet_defaults"):
            s["clock"] = p.trace_packet_defaults.timestamp_clock_id
        for c in p.clock_snapshot.clocks:
            if c.is_incremental:
                s["last"] = c.timestamp
        for n in p.interned_data.event_names:
            s["names"][n.iid] = n.name
        for n in p.interned_data.event_categories:
            s["cats"][n.iid] = n.name
        if not p.HasField("track_event"):
            continue
        clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else s["clock"]
        if clock == 64:
            s["last"] += p.timestamp
            ts = s["last"]
        else:
            ts = p.timestamp
        e = p.track_event
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            cats = [s["cats"][i] for i in e.category_iids]
            open_.setdefault(e.track_uuid, []).append((ts, s["names"][e.name_iid], cats))
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            start, name, cats = open_[e.track_uuid].pop()
            if "kernel_dispatch" in cats:
                kernels[base_name(name)] += 1
                kernel_ns[base_name(name)] += ts - start
            elif "hip_api" in cats:
                calls[name] += 1
    return {"kernels": kernels, "kernel_ns": kernel_ns, "calls": calls}


def base_name(name: str) -> str:
    """A kernel's name less AMD's code-object suffix ('.kd', ' [clone .kd]')."""
    return re.sub(r"( \[clone \.kd\]|\.kd)$", "", name)


def json_reading(tool: dict, limit: int) -> dict[str, Counter]:
    """Kernels per name (count, total ns) of the first `limit` dispatches (by correlation id) of
    the source JSON, named by their symbols' demangled names less AMD's '.kd'."""
    symbols = {s["kernel_id"]: s["demangled_kernel_name"] for s in tool["kernel_symbols"]}
    records = sorted(tool["buffer_records"]["kernel_dispatch"], key=lambda r: r["correlation_id"]["internal"])[:limit]
    kernels, kernel_ns = Counter(), Counter()
    for r in records:
        name = base_name(symbols[r["dispatch_info"]["kernel_id"]])
        kernels[name] += 1
        kernel_ns[name] += r["end_timestamp"] - r["start_timestamp"]
    return {"kernels": kernels, "kernel_ns": kernel_ns}


def _stored(t) -> tuple[dict, dict, dict]:
    con = t.con
    counts = dict(con.execute("SELECT name, count(*) FROM kernels WHERE trace_id = ? GROUP BY 1", [t.id]).fetchall())
    ns = dict(con.execute("SELECT name, sum(dur_ns) FROM kernels WHERE trace_id = ? GROUP BY 1", [t.id]).fetchall())
    calls = dict(con.execute("SELECT name, count(*) FROM api_calls WHERE trace_id = ? GROUP BY 1", [t.id]).fetchall())
    return counts, ns, calls


def test_kernels_and_calls_equal_the_pb2_decoding_and_the_json(tool: dict, traces: dict[str, Path],
                                                               tmp_path: Path) -> None:
    import traceq

    path = traces["stream"]
    truth, source = pb2_reading(path), json_reading(tool, LIMIT)
    assert sum(truth["kernels"].values()) == LIMIT and truth["kernels"] == source["kernels"]
    assert truth["kernel_ns"] == source["kernel_ns"]
    t = traceq.load(path, tmp_path / "s.duckdb")
    counts, ns, calls = _stored(t)
    assert counts == dict(truth["kernels"])
    assert ns == dict(truth["kernel_ns"])
    assert calls == dict(truth["calls"]) == {"hipLaunchKernel": LIMIT}
    con = t.con
    unlinked = con.execute("""SELECT count(*) FROM kernels k WHERE trace_id = ? AND NOT EXISTS (
        SELECT 1 FROM api_calls a WHERE a.trace_id = k.trace_id AND a.correlation_id = k.correlation_id)""",
                           [t.id]).fetchone()[0]
    assert unlinked == 0
    # one GPU (the JSON's dispatches are all on one agent), rocprofv3's pid, the HIP streams
    assert con.execute("SELECT DISTINCT device_id, pid FROM kernels WHERE trace_id = ?",
                       [t.id]).fetchall() == [(0, 908)]
    records = tool["buffer_records"]["kernel_dispatch"]
    first = sorted(records, key=lambda r: r["correlation_id"]["internal"])[:LIMIT]
    streams = Counter((r["correlation_id"]["internal"], r["stream_id"]["handle"]) for r in first)
    assert Counter(con.execute("SELECT correlation_id, stream_id FROM kernels WHERE trace_id = ?",
                               [t.id]).fetchall()) == streams
    row = con.execute("SELECT format, tool FROM traces WHERE trace_id = ?", [t.id]).fetchone()
    assert row[0] == "pftrace" and row[1].startswith("rocprofv3")


def test_grid_block_and_lds_from_the_annotations(tool: dict, traces: dict[str, Path], tmp_path: Path) -> None:
    """grid_size and workgroup_size are products of the three dimensions (work-items): stored as
    grid_x in workgroups and block_x; group_segment_size as static shared memory (LDS); the
    queue tracks (`--group-by-queue`) give the stream ids."""
    import traceq

    records = sorted(tool["buffer_records"]["kernel_dispatch"], key=lambda r: r["correlation_id"]["internal"])[:300]
    want = Counter()
    for r in records:
        info = r["dispatch_info"]
        wg = info["workgroup_size"]["x"] * info["workgroup_size"]["y"] * info["workgroup_size"]["z"]
        grid = info["grid_size"]["x"] * info["grid_size"]["y"] * info["grid_size"]["z"]
        want[(r["correlation_id"]["internal"], -(-grid // wg), wg, info["group_segment_size"])] += 1
    t = traceq.load(traces["queue"], tmp_path / "s.duckdb")
    got = Counter(t.con.execute("""SELECT correlation_id, grid_x, block_x, smem_static_bytes FROM kernels
                                   WHERE trace_id = ?""", [t.id]).fetchall())
    assert got == want
    queues = {r["dispatch_info"]["queue_id"]["handle"] for r in records}
    streams = {s for (s,) in t.con.execute("SELECT DISTINCT stream_id FROM kernels WHERE trace_id = ?",
                                           [t.id]).fetchall()}
    assert streams == set(range(len(queues)))


def test_every_command_runs_on_the_loaded_trace(traces: dict[str, Path], tmp_path: Path) -> None:
    import fuzz

    harness = fuzz.Harness([], "pftrace", tmp_path / "h")
    outcome = harness.check_file(traces["queue"])
    assert outcome.result == "loaded" and outcome.problems == [], outcome


def _packet(**fields) -> bytes:
    p = pb.TracePacket(**fields)
    t = pb.Trace()
    t.packet.append(p)
    return t.SerializeToString()


def _nested(depth: int) -> bytes:
    out = [_packet(trusted_packet_sequence_id=1, sequence_flags=1)]
    for i in range(depth):
        out.append(_packet(trusted_packet_sequence_id=1, timestamp=1000 + i,
                           track_event=pb.TrackEvent(type=1, track_uuid=7, name=f"level {i}")))
    return b"".join(out)


@pytest.mark.parametrize("damage", ["cut 9", "cut middle", "cut end", "varint", "wire type", "length", "nesting"])
def test_damaged_pftrace_is_one_line_and_the_store_unchanged(damage: str, traces: dict[str, Path],
                                                             tmp_path: Path) -> None:
    import traceq

    store = tmp_path / "s.duckdb"
    traceq.load(traces["queue"], store)
    before = store.read_bytes()
    data = traces["queue"].read_bytes()
    if damage.startswith("cut"):
        at = {"cut 9": 9, "cut middle": len(data) // 2, "cut end": len(data) - 3}[damage]
        data = data[:at]
    elif damage == "varint":  # a packet whose first key is a varint of 11 bytes
        data = b"\x0a\x0c" + b"\xff" * 11 + b"\x01" + data
    elif damage == "wire type":  # a packet whose timestamp (field 8) is length-delimited
        data = data + b"\x0a\x04\x42\x02\x00\x00"
    elif damage == "length":  # a packet longer than the file
        data = data + b"\x0a\xff\xff\x03\x08\x01"
    else:
        data = _nested(300)
    broken = tmp_path / "broken.pftrace"
    broken.write_bytes(data)
    with pytest.raises(TraceFormatError) as e:
        traceq.load(broken, store)
    assert "\n" not in str(e.value) and "broken.pftrace" in str(e.value)
    assert store.read_bytes() == before


def test_another_layout_loads_as_ranges_per_track(tmp_path: Path) -> None:
    """A trace not of rocprofv3's layout (categories it does not write): each slice a range of
    its track's thread, named inline or interned, and one note saying what was not recognised."""
    import traceq

    cpu = pb.TrackDescriptor(uuid=11, thread=pb.ThreadDescriptor(pid=42, tid=43))
    gpu = pb.TrackDescriptor(uuid=12, name="GPU stream 7")
    packets = [_packet(trusted_packet_sequence_id=3, sequence_flags=1, track_descriptor=cpu),
               _packet(trusted_packet_sequence_id=3, track_descriptor=gpu),
               _packet(trusted_packet_sequence_id=3, timestamp=100, sequence_flags=2,
                       interned_data=pb.InternedData(event_names=[pb.EventName(iid=1, name="aten::mm")]),
                       track_event=pb.TrackEvent(type=1, track_uuid=11, name_iid=1, categories=["cpu_op"])),
               _packet(trusted_packet_sequence_id=3, timestamp=200, sequence_flags=2,
                       track_event=pb.TrackEvent(type=1, track_uuid=12, name="gemm", categories=["kernel"])),
               _packet(trusted_packet_sequence_id=3, timestamp=250, sequence_flags=2,
                       track_event=pb.TrackEvent(type=2, track_uuid=12)),
               _packet(trusted_packet_sequence_id=3, timestamp=300, sequence_flags=2,
                       track_event=pb.TrackEvent(type=2, track_uuid=11))]
    path = tmp_path / "other.perfetto-trace"
    path.write_bytes(b"".join(packets))
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(tmp_path / "s.duckdb", create=True)
    result = load_trace(con, path)
    rows = con.execute("SELECT name, start_ns, end_ns, domain, tid FROM nvtx ORDER BY start_ns").fetchall()
    assert rows == [("aten::mm", 100, 300, "cpu_op", 43), ("gemm", 200, 250, "kernel", None)]
    assert any("2 slices of a layout traceq does not recognise (categories" in n for n in result.notes), result.notes
    del traceq


def test_fuzzing_the_pftrace_a_small_budget(traces: dict[str, Path], tmp_path: Path) -> None:
    """6 mutants of the built trace (bytes changed, cut short, a length past the end): each
    refused in one line with the store unchanged, or loaded and every command working."""
    import fuzz

    with fuzz.scratch() as work:
        outcomes = fuzz.run(fuzz.Harness([traces["queue"]], "ci-pftrace", work, commands=fuzz.FIRST_COMMANDS),
                            range(6))
    assert [o.problems for o in outcomes if o.problems] == []


def test_state_clears_instants_and_counters(tmp_path: Path) -> None:
    """A packet needing incremental state on a sequence that never set it (a ring buffer's start)
    is skipped; after a clear, names interned before it are forgotten (the same iid names
    another event); instants are marks, counters left out; detected by content, whatever the
    file's name."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    def names(*pairs: tuple[int, str]) -> pb.InternedData:
        return pb.InternedData(event_names=[pb.EventName(iid=i, name=n) for i, n in pairs])

    track = pb.TrackDescriptor(uuid=5, thread=pb.ThreadDescriptor(pid=1, tid=2))
    packets = [_packet(trusted_packet_sequence_id=9, timestamp=50, sequence_flags=2,  # before any clear: skipped
                       track_event=pb.TrackEvent(type=3, track_uuid=5, name="lost")),
               _packet(trusted_packet_sequence_id=9, sequence_flags=1, track_descriptor=track, interned_data=names((1, "old"))),
               _packet(trusted_packet_sequence_id=9, timestamp=100, sequence_flags=2,
                       track_event=pb.TrackEvent(type=3, track_uuid=5, name_iid=1)),
               _packet(trusted_packet_sequence_id=9, sequence_flags=1, interned_data=names((1, "new"))),
               _packet(trusted_packet_sequence_id=9, timestamp=200, sequence_flags=2,
                       track_event=pb.TrackEvent(type=3, track_uuid=5, name_iid=1)),
               _packet(trusted_packet_sequence_id=9, timestamp=300, sequence_flags=2,
                       track_event=pb.TrackEvent(type=4, track_uuid=5, counter_value=7))]
    path = tmp_path / "trace.bin"
    path.write_bytes(b"".join(packets))
    con = open_store(tmp_path / "s.duckdb", create=True)
    result = load_trace(con, path)
    assert con.execute("SELECT name, start_ns, end_ns, tid FROM nvtx ORDER BY start_ns").fetchall() == [
        ("old", 100, None, 2), ("new", 200, None, 2)]
    notes = " | ".join(result.notes)
    assert "1 packet before its sequence's state was set skipped" in notes
    assert "1 counter value (Perfetto counter tracks) left out" in notes


@pytest.mark.parametrize("base", [1, 300])
def test_annotations_read_whatever_their_iids_and_value_fields(base: int, tmp_path: Path) -> None:
    """A kernel's annotations named by one- or two-byte iids (read without a scan), by an inline
    name, with uint, int (negative) and string values, and names no row reads (left undecoded):
    the kernel's correlation id, grid, workgroup, LDS and scratch as written."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    names = ["agent", "corr_id", "grid_size", "workgroup_size", "begin_ns", "private_segment_size", "kind"]
    iids = {n: base + i for i, n in enumerate(names)}
    interned = pb.InternedData(
        event_categories=[pb.EventCategory(iid=1, name="kernel_dispatch")], event_names=[pb.EventName(iid=1, name="k")],
        debug_annotation_names=[pb.DebugAnnotationName(iid=i, name=n) for n, i in iids.items()])
    a = pb.DebugAnnotation
    args = [a(name_iid=iids["agent"], string_value="GPU-0"), a(name_iid=iids["corr_id"], uint_value=2**40 + 7),
            a(name_iid=iids["grid_size"], uint_value=4096), a(name_iid=iids["workgroup_size"], int_value=256),
            a(name_iid=iids["begin_ns"], uint_value=123), a(name="group_segment_size", uint_value=512),
            a(name_iid=iids["private_segment_size"], int_value=-3), a(name_iid=iids["kind"], int_value=-1)]
    track = pb.TrackDescriptor(uuid=5, name='STREAM [" 3 "] ')
    packets = [_packet(trusted_packet_sequence_id=2, sequence_flags=1, track_descriptor=track, interned_data=interned),
               _packet(trusted_packet_sequence_id=2, timestamp=100, sequence_flags=2,
                       track_event=pb.TrackEvent(type=1, track_uuid=5, name_iid=1, category_iids=[1],
                                                 debug_annotations=args)),
               _packet(trusted_packet_sequence_id=2, timestamp=250, sequence_flags=2,
                       track_event=pb.TrackEvent(type=2, track_uuid=5))]
    path = tmp_path / "k.pftrace"
    path.write_bytes(b"".join(packets))
    con = open_store(tmp_path / "s.duckdb", create=True)
    load_trace(con, path)
    assert con.execute("""SELECT name, start_ns, end_ns, correlation_id, grid_x, block_x, smem_static_bytes,
                          local_memory_per_thread_bytes, device_id, stream_id FROM kernels""").fetchall() == [
        ("k", 100, 250, 2**40 + 7, 16, 256, 512, -3, 0, 3)]
