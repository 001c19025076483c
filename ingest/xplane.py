"""Reads a JAX / TensorFlow profile (`*.xplane.pb`, the `XSpace` protobuf that
`jax.profiler.trace` and TensorFlow's profiler write under `plugins/profile/<run>/`).

An XSpace holds planes; a plane holds lines (a GPU stream, a host thread) of events, each event
naming its metadata (the kernel or function name) and carrying stats (key-value pairs whose keys,
and string values given by reference, are the plane's stat metadata). Times: a line's
`timestamp_ns` plus an event's `offset_ps`; durations in picoseconds (stored as whole ns).

What goes where (docs/schema.md, "XPlane"):
- `/device:GPU:N` planes: device N; the plane's stats give the GPU (vendor, cores, clock in kHz,
  memory, bandwidth, compute capability or gfx version). Their `Stream #S(...)` lines hold kernels
  of stream S (`kernel_details`: grid, block, registers, shared/group memory) and copies
  (`memcpy_details`, or a name starting with Memcpy/Memset).
- `/host:CPU`: an event with a `correlation_id` is a runtime API call (cuLaunchKernel,
  hipModuleLaunchKernel, ...) of the line's thread; the other events with a duration are ranges of
  that thread (TraceMe annotations, Python functions: kind 'pushpop', domain = the line's name
  without its numeric suffix); MemoryAllocation/MemoryDeallocation events are memory events.
- XLA's own structure, as xprof derives its "XLA Ops" and "XLA Modules" lines: each kernel's
  `hlo_op` becomes a range `Thunk:#hlo_op=OP#` over the kernel (domain 'XLA Ops'), and runs of
  kernels of one `hlo_module`/`program_id` a range `XlaModule:#hlo_module=M,program_id=P#`
  (domain 'XLA Modules'; a new execution starts where the module's first op comes again): the
  names XLA gives its NVTX ranges under nsys, so one recogniser reads both.
The file has no process ids: every event is process 0 (kernels find their launches by
correlation id within it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from traceq.errors import TraceFormatError
from traceq.ingest import protobuf as pb
from traceq.ingest.base import LoadOptions, Sink, SourceInfo
from traceq.ingest.xla_hlo import op_names

if TYPE_CHECKING:
    from traceq.ingest.xplane_rows import Gathered

PID = 0
"""XPlane records no process: every event is this process's."""
_DEVICE = re.compile(r"^/device:GPU:(\d+)")
_STREAM = re.compile(r"^Stream #(\d+)")
_SUFFIX = re.compile(r"[/ ]?\d+$")


@dataclass
class Line:
    id: int = 0
    name: str = ""
    timestamp_ns: int = 0
    span: pb.Span = (0, 0)


@dataclass
class Plane:
    name: str = ""
    lines: list[pb.Span] = field(default_factory=list)
    event_names: dict[int, str] = field(default_factory=dict)
    stat_names: dict[int, str] = field(default_factory=dict)
    stats: list[pb.Span] = field(default_factory=list)
    span: pb.Span | None = None


@dataclass
class Event:
    """One event, decoded: start and end in ns, its name, and its stats by name."""

    start_ns: int
    end_ns: int | None
    name: str
    stats: dict[str, Any]


class XPlaneSource(pb.MappedFile):
    """The XPlane file, mapped."""


def looks_like_xspace(head: bytes) -> bool:
    """True when `head` starts like an XSpace: field 1 (a plane, length-delimited) whose first
    fields are a plane's (id, name), the name one the profilers write ('/host:', '/device:',
    'Task Environment', ...)."""
    try:
        key, pos = pb.varint(head, 0)
        if key != (1 << 3 | 2):  # field 1, length-delimited
            return False
        length, pos = pb.varint(head, pos)
        end = min(pos + length, len(head))
        key, inner = pb.varint(head, pos)
        if key == (1 << 3 | 0):  # the plane's id first, then its name
            _, inner = pb.varint(head, inner)
            key, inner = pb.varint(head, inner)
        if key != (2 << 3 | 2):
            return False
        size, inner = pb.varint(head, inner)
        if inner + size > end:
            return False
        name = pb.text(head, (inner, inner + size))
        return name.startswith(("/host:", "/device:", "/gpu:", "Task Environment", "/custom:"))
    except (pb.WireError, ValueError):
        return False
    return False


class XPlaneReader:
    """Reads a JAX / TensorFlow XPlane profile (`*.xplane.pb`)."""

    name: ClassVar[str] = "xplane"
    container: ClassVar[str] = "protobuf"

    def sniff(self, head: bytes) -> bool:
        return looks_like_xspace(head)

    def open(self, path: Path, options: LoadOptions) -> XPlaneSource:
        return XPlaneSource(Path(path))

    def estimate_rows(self, src: XPlaneSource) -> int:
        return len(src.buf)

    def read(self, src: XPlaneSource, sink: Sink) -> SourceInfo:
        """A plane at a time, a line at a time: each event decoded as its line is walked, its row
        gathered into Arrow columns a batch at a time (host ranges written to the store as they
        come); the kernels and calls are kept as columns for the XLA ranges made at the end."""
        from traceq.ingest.columns import no_collection
        from traceq.ingest.xplane_rows import Gathered

        hosts: list[str] = []
        rows = Gathered(sink)
        try:
            with no_collection():
                for number, wire, value in pb.fields(src.buf):
                    if number == 1 and wire == 2:
                        plane = _plane(src.buf, value)  # type: ignore[arg-type]
                        device = _DEVICE.match(plane.name)
                        if device:
                            _read_device(src.buf, plane, int(device.group(1)), rows, src.release)
                        elif plane.name == "/host:metadata" and plane.span is not None:
                            rows.op_names.update(op_names(src.buf, plane.span))
                        elif plane.name.startswith("/host:"):
                            _read_host(src.buf, plane, rows, src.release)
                        src.release(*value)  # type: ignore[misc]  # the plane is read: its pages may go
                    elif number == 4 and wire == 2:
                        hosts.append(pb.text(src.buf, value))
        except pb.WireError as e:
            raise TraceFormatError(f"{src.path} is a damaged XPlane protobuf ({e})") from None
        rows.write()
        if sink.progress is not None:
            sink.progress(len(src.buf))
        return SourceInfo(format="xplane", tool="JAX/TensorFlow profiler (XPlane)"
                          + (f", host {', '.join(hosts)}" if hosts else ""))


def _plane(buf: Any, span: pb.Span) -> Plane:
    plane = Plane(span=span)
    for number, wire, value in pb.fields(buf, *span):
        if wire != 2:
            continue
        if number == 2:
            plane.name = pb.text(buf, value)
        elif number == 3:
            plane.lines.append(value)  # type: ignore[arg-type]
        elif number in (4, 5):  # map<int64, XEventMetadata | XStatMetadata>: entries of (key 1, value 2)
            key, meta = _map_entry(buf, value)  # type: ignore[arg-type]
            if meta is not None:
                names = plane.event_names if number == 4 else plane.stat_names
                names[key] = _metadata_name(buf, meta, key, names_display=number == 4)
        elif number == 6:
            plane.stats.append(value)  # type: ignore[arg-type]
    return plane


def _map_entry(buf: Any, span: pb.Span) -> tuple[int, pb.Span | None]:
    key, meta = 0, None
    for number, wire, value in pb.fields(buf, *span):
        if number == 1 and wire == 0:
            key = pb.signed(value)  # type: ignore[arg-type]
        elif number == 2 and wire == 2:
            meta = value
    return key, meta  # type: ignore[return-value]


def _metadata_name(buf: Any, span: pb.Span, key: int, *, names_display: bool) -> str:
    """An XEventMetadata's name (its display_name where the name is empty) or an XStatMetadata's."""
    name = display = ""
    for number, wire, value in pb.fields(buf, *span):
        if number == 2 and wire == 2:
            name = pb.text(buf, value)
        elif number == 4 and wire == 2 and names_display:
            display = pb.text(buf, value)
    return name or display or f"#{key}"


_RELEASE_BYTES = 1 << 22
"""How far a walk goes between its releases of the mapped pages behind it (`MappedFile.release`)."""


def _line(buf: Any, span: pb.Span, release: Callable[[int, int], None] | None = None) -> Line:
    """A line's id, name and timestamp (its events are read by `_events`, as it is walked again;
    `release(start, end)`: the mapped pages behind the walk dropped every _RELEASE_BYTES)."""
    line = Line(span=span)
    display = ""
    low = span[0]
    for number, wire, value in pb.fields(buf, *span):
        if number == 4 and wire == 2:  # an event: what the walk steps over, its bytes the line's bulk
            if release is not None and value[0] - low >= _RELEASE_BYTES:  # type: ignore[index]
                release(low, value[0])  # type: ignore[index]
                low = value[0]  # type: ignore[index]
        elif number == 1 and wire == 0:
            line.id = pb.signed(value)  # type: ignore[arg-type]
        elif number == 2 and wire == 2:
            line.name = pb.text(buf, value)
        elif number == 11 and wire == 2:
            display = pb.text(buf, value)
        elif number == 3 and wire == 0:
            line.timestamp_ns = pb.signed(value)  # type: ignore[arg-type]
    line.name = line.name or display
    return line


def _stats(buf: Any, plane: Plane, spans: list[pb.Span]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for span in spans:
        key, value = None, None
        for number, wire, raw in pb.fields(buf, *span):
            if number == 1 and wire == 0:
                key = plane.stat_names.get(pb.signed(raw), f"#{raw}")  # type: ignore[arg-type]
            elif number == 2 and wire == 1:
                value = pb.double(raw)
            elif number == 3 and wire == 0:
                value = raw
            elif number == 4 and wire == 0:
                value = pb.signed(raw)  # type: ignore[arg-type]
            elif number in (5, 6) and wire == 2:
                value = pb.text(buf, raw)
            elif number == 7 and wire == 0:  # a string given by reference to a stat metadata's name
                value = plane.stat_names.get(raw, "")  # type: ignore[call-overload]
        if key is not None:
            out[key] = value
    return out


def _events(buf: Any, plane: Plane, line: Line, release: Callable[[int, int], None] | None = None) -> Iterator[Event]:
    low = line.span[0]
    for key, kind, span in pb.fields(buf, *line.span):
        if key != 4 or kind != 2:
            continue
        if release is not None and span[0] - low >= _RELEASE_BYTES:  # type: ignore[index]
            release(low, span[0])  # type: ignore[index]
            low = span[0]  # type: ignore[index]
        meta, offset_ps, duration_ps, stat_spans = 0, 0, None, []
        for number, wire, value in pb.fields(buf, *span):  # type: ignore[misc]
            if number == 1 and wire == 0:
                meta = value
            elif number == 2 and wire == 0:
                offset_ps = pb.signed(value)  # type: ignore[arg-type]
            elif number == 3 and wire == 0:
                duration_ps = pb.signed(value)  # type: ignore[arg-type]
            elif number == 4 and wire == 2:
                stat_spans.append(value)
        start = line.timestamp_ns + offset_ps // 1000
        end = start + duration_ps // 1000 if duration_ps else None
        yield Event(start, end, plane.event_names.get(meta, f"#{meta}"), _stats(buf, plane, stat_spans))  # type: ignore[call-overload]


@dataclass
class _Tables:
    """Rows gathered per store table as Python values, written by `xplane_tables.write_tables`
    (the AMD readers that keep their rows so: rocpd's database, rocprofv3 JSON's copies and
    ranges; the XPlane reader gathers columns, `xplane_rows.Gathered`)."""

    kernels: list[dict[str, Any]] = field(default_factory=list)
    memops: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[int, int, str, int, int | None]] = field(default_factory=list)
    ranges: list[tuple[int, int | None, str, str, str, int | None, int | None]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    op_names: dict[tuple[str, str], str] = field(default_factory=dict)

    def write(self, sink: Sink) -> None:
        from traceq.ingest.xplane_tables import write_tables

        write_tables(self, sink)


def _read_device(buf: Any, plane: Plane, device: int, rows: Gathered,
                 release: Callable[[int, int], None] | None = None) -> None:
    from traceq.ingest.xplane_tables import gpu_row, kernel_row, memop_row

    rows.gpus.append(gpu_row(device, _stats(buf, plane, plane.stats)))
    for span in plane.lines:
        line = _line(buf, span, release)
        stream = _STREAM.match(line.name)
        if stream is None:  # derived lines (XLA Ops, Steps, ...) some writers add: made here from the kernels
            continue
        for event in _events(buf, plane, line, release):
            if event.end_ns is None:
                continue
            if "memcpy_details" in event.stats or event.name.lower().startswith(("memcpy", "memset")):
                rows.memop(memop_row(event, device, int(stream.group(1))))
            else:
                rows.kernel(kernel_row(event, device, int(stream.group(1))))


def _read_host(buf: Any, plane: Plane, rows: Gathered, release: Callable[[int, int], None] | None = None) -> None:
    from traceq.ingest.xplane_tables import memory_row

    for span in plane.lines:
        line = _line(buf, span, release)
        tid = _thread_id(line)
        domain = _SUFFIX.sub("", line.name) or "host"
        for event in _events(buf, plane, line, release):
            if event.name in ("MemoryAllocation", "MemoryDeallocation"):
                rows.memory(memory_row(event, tid))
            elif "correlation_id" in event.stats and event.end_ns is not None:
                rows.call(event.start_ns, event.end_ns, event.name, tid, _int(event.stats.get("correlation_id")))
            elif event.end_ns is not None:
                rows.range(event.start_ns, event.end_ns, event.name, domain, tid)


def _thread_id(line: Line) -> int:
    """The thread a host line is: the number in 'Host Threads/1083', else the line's id."""
    found = re.search(r"/(\d+)$", line.name)
    return int(found.group(1)) if found and line.name.startswith("Host Threads") else line.id


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

