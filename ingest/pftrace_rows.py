"""What the slices of a Perfetto trace become in the store (ingest/pftrace.py decodes them).

rocprofv3 (rocprofiler-sdk's `generatePerfetto.cpp`) names each slice's category after what
it traced and attaches debug annotations (docs/perfetto.md):
- `kernel_dispatch`: a kernel, named by the (demangled) kernel; `agent` ('Agent-2', 'GPU-0': the
  device), `queue` (the HSA queue's handle), `corr_id`, `grid_size` and `workgroup_size` (in
  work-items, the product of the three dimensions: stored as grid_x and block_x),
  `group_segment_size` (LDS, stored as static shared memory), `private_segment_size` (scratch
  per work-item). Its track is a `STREAM [" N "]` (the HIP stream, the default) or a
  `COMPUTE ... QUEUE [n]` track (`--group-by-queue`): the stream id.
- `hip_api`, `hsa_api`, `rccl_api`, `rocdecode_api`, `rocjpeg_api`: an API call of the thread
  `tid` (its `THREAD n (tid)` track), `corr_id` linking it to the work it launched.
- `memory_copy`: a copy; direction from its name (`MEMORY_COPY_HOST_TO_DEVICE`, ...), bytes
  from `copy_bytes`, device from `dst_agent` (host to device) or `src_agent`.
- `marker_api`: a roctx range of its thread (domain 'roctx').
rocprofv3 writes no registers and no GPU description (name, CUs, clock) into the trace:
kernels have no registers (so no occupancy) and each device is 'AMD GPU N'.

Any other slice (another tool's trace, or a category rocprofv3 adds later) becomes a range of
its track: a push/pop range of the track's thread where it has one, else a start/end range;
its domain is its category (else its track's name). The load's notes say how many, of which
categories.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from traceq.errors import TraceFormatError
from traceq.ingest.base import (
    KERNEL_CONFIG_COLUMNS,
    KERNEL_QUEUE_COLUMNS,
    Names,
    Sink,
    SourceInfo,
    api_names,
    api_threads,
    kernel_batch,
    kernel_configs,
    kernel_names,
    kernel_queues,
    numbered,
)
from traceq.ingest.validate import Damage

if TYPE_CHECKING:
    from traceq.ingest.pftrace import Decoder, Slice

CALLS = ("hip_api", "hsa_api", "rccl_api", "rocdecode_api", "rocjpeg_api")
ROCPROF = {"kernel_dispatch", "memory_copy", "marker_api", "memory_allocation", "counter_collection",
           "kfd_events", "openmp", "none", *CALLS}
"""rocprofiler-sdk's Perfetto categories (`rocprofiler-sdk/cxx/perfetto.hpp`)."""
ARGS = frozenset({"agent", "queue", "corr_id", "grid_size", "workgroup_size", "group_segment_size",
                  "private_segment_size", "tid", "copy_bytes", "dst_agent", "src_agent"})
"""The debug annotations the rows below read: the decoder leaves the values of others undecoded."""
_COPY_KINDS = {"HOST_TO_DEVICE": "Host-to-Device", "DEVICE_TO_HOST": "Device-to-Host",
               "DEVICE_TO_DEVICE": "Device-to-Device", "HOST_TO_HOST": "Host-to-Host"}
_AGENT = re.compile(r"^\s*(\w+)\W+(\d+)\s*$")
_STREAM = re.compile(r"^STREAM \[\W*(\d+)")
_QUEUE = re.compile(r"QUEUE \[(\d+)\]")
_THREAD = re.compile(r"^THREAD \d+ \((\d+)\)")
_KD = re.compile(r"(\s*\[clone \.kd\]|\.kd)$")
Range = tuple[int, int | None, str, str, str, int | None, int | None]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _positive(value: Any) -> int | None:
    v = _int(value)
    return v if v is not None and v > 0 else None


class Rows:
    """The store rows of the slices, gathered compactly: a kernel is a tuple of numbers, its
    name, configuration and queue numbered once each."""

    def __init__(self, damage: Damage):
        self.damage = damage
        self.kernels: list[tuple[int, int, int | None, int, int, int]] = []
        self.names: dict[str, int] = {}
        self.base_names: dict[str, str] = {}
        self.configs: dict[tuple[Any, ...], int] = {}
        self.queues: dict[tuple[Any, ...], int] = {}
        self.queue_numbers: dict[tuple[str, int], int] = {}
        self.calls: list[tuple[int, int, int, int, int | None]] = []
        self.call_names: dict[str, int] = {}
        self.threads: dict[tuple[int | None, int | None], int] = {}
        self.memops: list[dict[str, Any]] = []
        self.ranges: list[Range] = []
        self.other: dict[str, int] = {}
        self.rocprof = 0
        self.pids: set[int] = set()
        self.dropped = 0
        self.open_at_end = 0

    def unfinished(self, n: int) -> None:
        self.open_at_end += n

    def add(self, s: Slice, decoder: Decoder) -> None:
        if s.end_ns is not None and s.end_ns < s.start_ns:
            self.dropped += 1
            return
        cats = s.categories
        if "kernel_dispatch" in cats and s.end_ns is not None:
            self.rocprof += 1
            self._kernel(s, decoder)
        elif any(c in CALLS for c in cats) and s.end_ns is not None:
            self.rocprof += 1
            self._call(s, decoder)
        elif "memory_copy" in cats and s.end_ns is not None:
            self.rocprof += 1
            self._copy(s)
        else:
            track = decoder.thread_of(s.track)
            tid = _int(s.args.get("tid")) if "marker_api" in cats else None
            tid = tid if tid is not None else track.tid if track.tid is not None else _thread(track.name)
            if track.pid is not None:
                self.pids.add(track.pid)
            if "marker_api" in cats:
                self.rocprof += 1
                domain = "roctx"
            else:
                key = ", ".join(cats) or "(no category)"
                if not any(c in ROCPROF for c in cats):
                    self.other[key] = self.other.get(key, 0) + 1
                domain = ", ".join(cats) or track.name or "perfetto"
            kind = "mark" if s.end_ns is None else "pushpop" if tid is not None else "startend"
            self.ranges.append((s.start_ns, s.end_ns, s.name, kind, domain, track.pid, tid))

    def _kernel(self, s: Slice, decoder: Decoder) -> None:
        a = s.args
        track = decoder.tracks.get(s.track)
        track_name = track.name if track is not None else ""
        agent = str(a.get("agent") or "")
        found = _STREAM.match(track_name) or _QUEUE.search(track_name)
        if found:
            stream = int(found.group(1))
        else:  # a queue's handle: numbered per agent in order of first use
            key = (agent, _int(a.get("queue")) or 0)
            stream = self.queue_numbers.setdefault(key, sum(1 for k in self.queue_numbers if k[0] == agent))
        workgroup, grid = _positive(a.get("workgroup_size")), _positive(a.get("grid_size"))
        blocks = -(-grid // workgroup) if grid is not None and workgroup is not None else None
        config = (blocks, 1 if blocks else None, 1 if blocks else None, workgroup, 1 if workgroup else None,
                  1 if workgroup else None, None, _int(a.get("group_segment_size")), None, None, None,
                  _int(a.get("private_segment_size")), None, None)
        name = self.base_names.get(s.name)
        if name is None:
            name = self.base_names[s.name] = _KD.sub("", s.name) or s.name
        self.kernels.append((
            s.start_ns, s.end_ns, _int(a.get("corr_id")),  # type: ignore[arg-type]
            self.names.setdefault(name, len(self.names)),
            self.configs.setdefault(config, len(self.configs)),
            self.queues.setdefault((agent, stream), len(self.queues))))

    def _call(self, s: Slice, decoder: Decoder) -> None:
        track = decoder.thread_of(s.track)
        tid = _int(s.args.get("tid"))
        tid = tid if tid is not None else track.tid if track.tid is not None else _thread(track.name)
        if track.pid is not None:
            self.pids.add(track.pid)
        thread = self.threads.setdefault((track.pid, tid), len(self.threads))
        self.calls.append((s.start_ns, s.end_ns, self.call_names.setdefault(s.name, len(self.call_names)),  # type: ignore[arg-type]
                           thread, _int(s.args.get("corr_id"))))

    def _copy(self, s: Slice) -> None:
        a = s.args
        upper = s.name.upper()
        kind = next((v for k, v in _COPY_KINDS.items() if k in upper), "Other")
        agent = a.get("dst_agent" if kind == "Host-to-Device" else "src_agent")
        self.memops.append({"start_ns": s.start_ns, "end_ns": s.end_ns, "dur_ns": s.end_ns - s.start_ns,  # type: ignore[operator]
                            "op": "memcpy", "copy_kind": kind, "bytes": _int(a.get("copy_bytes")),
                            "device_id": str(agent or ""), "stream_id": None,
                            "correlation_id": _int(a.get("corr_id")), "pid": None})

    def devices(self) -> dict[str, int]:
        """Each agent's device number: N of 'GPU-N' (rocprofv3's type-relative index); else the
        agents' order by their index ('Agent-2', 'Agent-3' -> 0, 1), as the JSON reader numbers
        GPUs by node id."""
        agents = {agent for agent, _ in self.queues} | {m["device_id"] for m in self.memops}
        parsed = {a: _AGENT.match(a) for a in agents}
        if all(m is not None and m.group(1).upper() == "GPU" for m in parsed.values()):
            return {a: int(m.group(2)) for a, m in parsed.items()}  # type: ignore[union-attr]
        order = sorted(agents, key=lambda a: (parsed[a] is None, int(parsed[a].group(2)) if parsed[a] else 0, a))  # type: ignore[union-attr]
        return {a: i for i, a in enumerate(order)}

    def write(self, sink: Sink, decoder: Decoder) -> SourceInfo:
        from traceq.ingest.amd import gpu_row
        from traceq.ingest.xplane import _Tables

        if not self.kernels and not self.calls and not self.memops and not self.ranges:
            raise TraceFormatError(f"the trace holds no track-event slices ({decoder.packets:,} packets)")
        self._notes(decoder)
        pids = self.pids | {t.pid for t in decoder.tracks.values() if t.pid is not None}
        pid = min(pids) if len(pids) == 1 else None
        device_of = self.devices()
        tables = _Tables()
        tables.gpus = [gpu_row(d, None) for d in sorted(set(device_of.values()))]
        for m in self.memops:
            m["device_id"], m["pid"] = device_of.get(m["device_id"], 0), pid
        tables.memops, tables.ranges = self.memops, self.ranges
        tables.write(sink)
        self._write_calls(sink)
        self._write_kernels(sink, device_of, pid)
        rocprof = self.rocprof > 0
        return SourceInfo(format="pftrace", tool=("rocprofv3 (rocprofiler-sdk) Perfetto trace" if rocprof
                                                  else "Perfetto trace") + (f", pid {pid}" if pid is not None else ""))

    def _notes(self, decoder: Decoder) -> None:
        d = self.damage
        if self.other:
            top = sorted(self.other.items(), key=lambda kv: -kv[1])
            names = ", ".join(k for k, _ in top[:4]) + (", ..." if len(top) > 4 else "")
            d.add("slice", f"of a layout traceq does not recognise (categories {names}) kept as ranges of their tracks",
                  sum(self.other.values()))
        d.add("kernel", "with end < start dropped", self.dropped)
        d.add("slice", "still open at the end of the trace left out", self.open_at_end)
        d.add("slice end", "without a begin on its track ignored", decoder.unmatched_ends)
        d.add("counter value", "(Perfetto counter tracks) left out", decoder.counters)
        d.add("packet", "before its sequence's state was set skipped", decoder.skipped)

    def _write_calls(self, sink: Sink) -> None:
        if not self.calls:
            return
        from traceq.ingest.xplane_tables import _api

        columns = list(zip(*self.calls))
        sink.append("api_events", pa.table({
            "start_ns": pa.array(columns[0], pa.int64()), "end_ns": pa.array(columns[1], pa.int64()),
            "name_id": pa.array(columns[2], pa.int32()), "thread_id": pa.array(columns[3], pa.int32()),
            "correlation_id": pa.array(columns[4], pa.int64())}), source_rows=0)
        labels = list(self.call_names)
        sink.append("api_names", api_names([_api(n) for n in labels], labels), source_rows=0)
        keys = list(self.threads)
        sink.append("api_threads", api_threads([k[0] for k in keys], [k[1] for k in keys], [None] * len(keys)),
                    source_rows=0)

    def _write_kernels(self, sink: Sink, device_of: dict[str, int], pid: int | None) -> None:
        if not self.kernels:
            return
        queue_keys = list(self.queues)
        queue_device = [device_of.get(agent, 0) for agent, _ in queue_keys]
        rows = sorted(self.kernels, key=lambda k: (k[0], queue_device[k[5]], queue_keys[k[5]][1]))
        self.kernels = []
        columns = list(zip(*rows))
        configs, queues = Names(), Names()
        config_keys = list(self.configs)
        batch = {"start_ns": pa.array(columns[0], pa.int64()), "end_ns": pa.array(columns[1], pa.int64()),
                 "correlation_id": pa.array(columns[2], pa.int64()), "graph_node_id": pa.nulls(len(rows), pa.int64())}
        config_rows = [config_keys[c] for c in columns[4]]
        for i, c in enumerate(KERNEL_CONFIG_COLUMNS):
            batch[c] = pa.array([r[i] for r in config_rows], pa.int64())
        queue_rows = [(queue_device[q], None, queue_keys[q][1], pid) for q in columns[5]]
        for i, c in enumerate(KERNEL_QUEUE_COLUMNS):
            batch[c] = pa.array([r[i] for r in queue_rows], pa.int64())
        table = pa.table(batch)
        name_ids = pa.array(columns[3], pa.int32())
        sink.append("kernel_events", numbered(kernel_batch(
            table, name_id=name_ids, config_id=configs.number(*[table[c] for c in KERNEL_CONFIG_COLUMNS]),
            queue_id=queues.number(*[table[c] for c in KERNEL_QUEUE_COLUMNS])), 0), source_rows=0)
        sink.append("kernel_configs", kernel_configs(configs.keys, optin_code=1, launch_types={}), source_rows=0)
        sink.append("kernel_queues", kernel_queues(queues.keys), source_rows=0)
        from traceq.ingest.xplane_tables import _short

        names = list(self.names)
        sink.append("kernel_names", kernel_names(names, [_short(n) for n in names], [None] * len(names)),
                    source_rows=0)


def _thread(name: str) -> int | None:
    found = _THREAD.match(name)
    return int(found.group(1)) if found else None
