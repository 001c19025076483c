"""Build a Perfetto protobuf trace (`.pftrace`) laid out as rocprofv3 writes one
(`--output-format pftrace`), filled from a rocprofv3 JSON output (`--output-format json`).

    python tools/make_pftrace.py results.json.gz out.pftrace [--limit N] [--synthetic-api]
        [--group-by-queue] [--clear-every N]

No file written by rocprofv3 itself was at hand (no AMD GPU here), so this follows the source of
rocprofiler-sdk's writer, `source/lib/output/generatePerfetto.cpp` (ROCm/rocprofiler-sdk at
a5a2f86a6b91ea4eccae83854849554c7c2cc6df) and its categories
(`source/include/rocprofiler-sdk/cxx/perfetto.hpp`), and the Perfetto SDK's way of writing track
events:
- one writer sequence; its first packet clears the incremental state, sets the packet defaults
  (timestamps on the incremental clock 64) and a clock snapshot (boottime and clock 64 at the
  first timestamp); a packet's timestamp is then the delta from the previous one, or, when time
  goes backwards, absolute on boottime (`timestamp_clock_id` 6);
- event names, categories and debug-annotation names interned (`interned_data`, `name_iid`,
  `category_iids`), each the first time the sequence uses it;
- tracks: the process (pid, name), the main thread's track (`ThreadTrack::Current()`), a
  `THREAD n (tid)` track per other thread, a `STREAM [" N "] ` track per HIP stream (the
  default) or `COMPUTE Agent [i] QUEUE [n] GPU` per queue (`--group-by-queue`);
- kernel dispatches (category `kernel_dispatch`) as begin/end slices named by the demangled
  kernel, sorted by start per agent and queue, with rocprofv3's annotations: begin_ns, end_ns,
  delta_ns, kind, agent ('Agent-N', N the agent's logical node id), agent_type, corr_id, queue,
  tid, kernel_id, private_segment_size, group_segment_size, workgroup_size and grid_size (the
  products of the three dimensions);
- a flow id per slice (`Flow::ProcessScoped(corr_id)`).

The JSON rocprofv3 wrote beside the trace has only kernel dispatches (its API, copy and marker
records are empty), so `--synthetic-api` adds a made-up `hipLaunchKernel` slice (category
`hip_api`, on the launching thread, 10 µs before its kernel, 2 µs long, the same corr_id) to
test the linking of calls to kernels: it is not data rocprofv3 recorded. `--clear-every N`
clears the sequence's incremental state every N events and interns again under new ids (the
SDK does so when a trace buffer wraps), so a reader that kept stale names would name events
wrongly.

Needs the `perfetto` package (its `perfetto_trace_pb2`; `pip install perfetto protobuf`): a tool
and test dependency only, never traceq's.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

SEQ = 1
INCREMENTAL_CLOCK = 64
BOOTTIME = 6


def _fnv(text: str) -> int:
    """A 63-bit hash of a track's name (the SDK hashes names into track uuids)."""
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h >> 1


class Writer:
    """Packets of one SDK-like writer sequence, written as they are made."""

    def __init__(self, out: Any, clear_every: int = 0):
        self.out = out
        self.clear_every = clear_every
        self.events = 0
        self.last: int | None = None
        self.epoch = 0
        self.interned: dict[tuple[str, str], int] = {}
        self.next_iid = 1

    def write(self, packet: pb.TracePacket) -> None:
        trace = pb.Trace()
        trace.packet.append(packet)
        self.out.write(trace.SerializeToString())

    def clear(self, ts: int) -> None:
        p = pb.TracePacket(trusted_packet_sequence_id=SEQ)
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.first_packet_on_sequence = self.last is None
        p.trace_packet_defaults.timestamp_clock_id = INCREMENTAL_CLOCK
        p.clock_snapshot.clocks.add(clock_id=BOOTTIME, timestamp=ts)
        p.clock_snapshot.clocks.add(clock_id=INCREMENTAL_CLOCK, timestamp=ts, is_incremental=True)
        p.clock_snapshot.primary_trace_clock = BOOTTIME
        self.write(p)
        self.last = ts
        self.interned = {}
        self.epoch += 1
        self.next_iid = 1000 * self.epoch + 1  # new ids after each clear

    def descriptor(self, uuid: int, name: str | None = None, parent: int | None = None,
                   pid: int | None = None, tid: int | None = None, process_name: str | None = None) -> None:
        p = pb.TracePacket(trusted_packet_sequence_id=SEQ)
        d = p.track_descriptor
        d.uuid = uuid
        if name is not None:
            d.name = name
        if parent is not None:
            d.parent_uuid = parent
        if tid is not None:
            d.thread.pid, d.thread.tid = pid, tid
        elif pid is not None:
            d.process.pid = pid
            if process_name:
                d.process.process_name = process_name
        self.write(p)

    def _iid(self, p: pb.TracePacket, table: str, name: str) -> int:
        key = (table, name)
        iid = self.interned.get(key)
        if iid is None:
            iid = self.interned[key] = self.next_iid
            self.next_iid += 1
            getattr(p.interned_data, table).add(iid=iid, name=name)
        return iid

    def _stamp(self, p: pb.TracePacket, ts: int) -> None:
        if self.last is not None and ts >= self.last:
            p.timestamp = ts - self.last
            self.last = ts
        else:
            p.timestamp = ts
            p.timestamp_clock_id = BOOTTIME

    def slice(self, category: str, name: str, track: int, start: int, end: int, flow: int,
              args: list[tuple[str, Any]]) -> None:
        if self.clear_every and self.events and self.events % self.clear_every == 0:
            self.clear(self.last or start)
        self.events += 1
        p = pb.TracePacket(trusted_packet_sequence_id=SEQ)
        p.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        self._stamp(p, start)
        e = p.track_event
        e.type = pb.TrackEvent.TYPE_SLICE_BEGIN
        e.track_uuid = track
        e.category_iids.append(self._iid(p, "event_categories", category))
        e.name_iid = self._iid(p, "event_names", name)
        e.flow_ids.append(flow)
        for key, value in args:
            a = e.debug_annotations.add(name_iid=self._iid(p, "debug_annotation_names", key))
            if isinstance(value, str):
                a.string_value = value
            elif value < 0:
                a.int_value = value
            else:
                a.uint_value = value
        self.write(p)
        p = pb.TracePacket(trusted_packet_sequence_id=SEQ)
        p.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        self._stamp(p, end)
        p.track_event.type = pb.TrackEvent.TYPE_SLICE_END
        p.track_event.track_uuid = track
        p.track_event.category_iids.append(self._iid(p, "event_categories", category))
        self.write(p)


def tool_entry(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)["rocprofiler-sdk-tool"]
    return data[0] if isinstance(data, list) else data


def _product(d: dict[str, Any]) -> int:
    return int(d.get("x", 1)) * int(d.get("y", 1)) * int(d.get("z", 1))


def build(source: Path | dict[str, Any], out_path: Path, *, limit: int | None = None, synthetic_api: bool = False,
          group_by_queue: bool = False, clear_every: int = 0) -> dict[str, int]:
    """Write the trace from the JSON at `source` (or its `rocprofiler-sdk-tool` entry, already
    parsed); returns counts of what it holds (kernels, calls)."""
    tool = source if isinstance(source, dict) else tool_entry(source)
    meta = tool["metadata"]
    pid = int(meta["pid"])
    agents = {a["id"]["handle"]: a for a in tool["agents"]}
    symbols = {s["kernel_id"]: s for s in tool["kernel_symbols"]}
    dispatches = sorted(tool["buffer_records"]["kernel_dispatch"], key=lambda r: r["correlation_id"]["internal"])
    if limit is not None:
        dispatches = dispatches[:limit]
    main_tid = pid
    tids = sorted({r["thread_id"] for r in dispatches})
    start = min(r["start_timestamp"] for r in dispatches) - 20_000
    with out_path.open("wb") as out:
        w = Writer(out, clear_every)
        w.clear(start)
        process = _fnv(f"process {pid}")
        w.descriptor(process, pid=pid, process_name=Path(meta["command"][0]).name if meta.get("command") else None)
        thread_track: dict[int, int] = {}
        for n, tid in enumerate(t for t in tids if t != main_tid):
            thread_track[tid] = tid
            w.descriptor(tid, name=f"THREAD {n + 1} ({tid})", parent=process)
        thread_track[main_tid] = process ^ main_tid
        w.descriptor(thread_track[main_tid], parent=process, pid=pid, tid=main_tid)
        queue_track: dict[tuple[int, int], int] = {}
        for r in dispatches:
            info = r["dispatch_info"]
            agent, queue = info["agent_id"]["handle"], info["queue_id"]["handle"]
            key = (agent, queue) if group_by_queue else (0, r["stream_id"]["handle"])
            if key in queue_track:
                continue
            if group_by_queue:
                n = sum(1 for k in queue_track if k[0] == agent)
                name = f"COMPUTE Agent [{agents[agent]['logical_node_id']}] QUEUE [{n}] GPU"
            else:
                name = f'STREAM [" {key[1]} "] '
            queue_track[key] = _fnv(name)
            w.descriptor(queue_track[key], name=name, parent=process)
        calls = 0
        if synthetic_api:
            for r in dispatches:
                corr = r["correlation_id"]["internal"]
                s = r["start_timestamp"] - 10_000
                w.slice("hip_api", "hipLaunchKernel", thread_track[r["thread_id"]], s, s + 2_000, corr,
                        [("begin_ns", s), ("end_ns", s + 2_000), ("delta_ns", 2_000), ("tid", r["thread_id"]),
                         ("kind", 2), ("operation", 0), ("corr_id", corr), ("ancestor_id", 0)])
                calls += 1
        bins: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for r in dispatches:
            info = r["dispatch_info"]
            bins.setdefault((info["agent_id"]["handle"], info["queue_id"]["handle"]), []).append(r)
        kernels = 0
        for (agent_handle, queue), records in bins.items():
            records.sort(key=lambda r: r["start_timestamp"])
            agent = agents[agent_handle]
            for r in records:  # rocprofv3's overlap fix (firmware timestamps) left out: the source's times as they are
                info = r["dispatch_info"]
                symbol = symbols.get(info["kernel_id"], {})
                name = symbol.get("demangled_kernel_name") or symbol.get("kernel_name") or f"kernel {info['kernel_id']}"
                key = (agent_handle, queue) if group_by_queue else (0, r["stream_id"]["handle"])
                b, e = r["start_timestamp"], r["end_timestamp"]
                corr = r["correlation_id"]["internal"]
                w.slice("kernel_dispatch", name, queue_track[key], b, e, corr, [
                    ("begin_ns", b), ("end_ns", e), ("delta_ns", e - b), ("kind", r["kind"]),
                    ("agent", f"Agent-{agent['logical_node_id']}"), ("agent_type", "GPU"), ("corr_id", corr),
                    ("queue", queue), ("tid", r["thread_id"]), ("kernel_id", info["kernel_id"]),
                    ("private_segment_size", info["private_segment_size"]),
                    ("group_segment_size", info["group_segment_size"]),
                    ("workgroup_size", _product(info["workgroup_size"])), ("grid_size", _product(info["grid_size"]))])
                kernels += 1
    return {"kernels": kernels, "calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="rocprofv3 JSON output (.json or .json.gz)")
    parser.add_argument("out", type=Path, help="the .pftrace to write")
    parser.add_argument("--limit", type=int, default=None, help="only the first N dispatches (by correlation id)")
    parser.add_argument("--synthetic-api", action="store_true", help="add a made-up hipLaunchKernel per dispatch")
    parser.add_argument("--group-by-queue", action="store_true", help="COMPUTE queue tracks, not STREAM tracks")
    parser.add_argument("--clear-every", type=int, default=0, help="clear the incremental state every N events")
    args = parser.parse_args()
    counts = build(args.source, args.out, limit=args.limit, synthetic_api=args.synthetic_api,
                   group_by_queue=args.group_by_queue, clear_every=args.clear_every)
    print(f"{args.out}: {counts['kernels']:,} kernels, {counts['calls']:,} API calls")


if __name__ == "__main__":
    main()
