"""Reads a Perfetto protobuf trace (`.pftrace`, `.perfetto-trace`): a `Trace` message that is a
stream of `TracePacket`s (field 1), as the Perfetto SDK writes them, rocprofv3's
`--output-format pftrace` among them (docs/perfetto.md).

The file is memory-mapped and its packets are decoded one at a time with our own wire-format
reader (`ingest/protobuf.py`): nothing is decoded ahead of the packet being read, and a slice
becomes a compact row as soon as its end is read. What a packet means depends on its sequence
(`trusted_packet_sequence_id`): the interned names (`interned_data`: event names, categories,
debug-annotation names and string values), the packet defaults (`trace_packet_defaults`: the
timestamp clock, the default track) and the incremental clocks (`clock_snapshot` clocks with
`is_incremental`, whose packets carry deltas) are per sequence and dropped when a packet says
`SEQ_INCREMENTAL_STATE_CLEARED`; a packet that needs that state on a sequence that never set it
(the start of a ring buffer that wrapped) is skipped and counted, as Perfetto's trace processor
does.

Track events: `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pairs on a track (`track_uuid`, else the
sequence's default track) make slices; `TYPE_INSTANT` a slice without an end; counters are
counted and left out. Tracks (`TrackDescriptor`) give a slice's process and thread: their own
`process`/`thread`, else their parent's (`parent_uuid`). What each slice becomes in the store is
`pftrace_rows`' to decide (rocprofv3's categories, else a range per track).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from traceq.errors import TraceFormatError
from traceq.ingest import protobuf as pb
from traceq.ingest.base import LoadOptions, Sink, SourceInfo
from traceq.ingest.pftrace_rows import ARGS

SUFFIXES = (".pftrace", ".perfetto-trace", ".perfetto")
BOOTTIME = 6
"""Perfetto's builtin clock ids 1-6 (realtime ... boottime) are all read as nanoseconds as they
are; the track-event default is boottime."""
INCREMENTAL_CLEARED, NEEDS_INCREMENTAL = 1, 2
BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4
MAX_DEPTH = 256
"""Slices open at once on one track: more is a damaged (or crafted) file."""

_LENGTH = 2


@dataclass
class Track:
    """A track: its name, parent, and the process and thread it names (its own, else its parent's)."""

    name: str = ""
    parent: int | None = None
    pid: int | None = None
    tid: int | None = None
    thread_name: str | None = None
    process_name: str | None = None


@dataclass
class Sequence:
    """A writer's incremental state: its interning tables, defaults and incremental clocks."""

    valid: bool = False
    names: dict[int, str] = field(default_factory=dict)
    categories: dict[int, str] = field(default_factory=dict)
    annotation_names: dict[int, str] = field(default_factory=dict)
    annotation_strings: dict[int, str] = field(default_factory=dict)
    clock: int | None = None
    track: int | None = None
    clocks: dict[int, list[int]] = field(default_factory=dict)
    """clock id -> [last value in the clock's units, unit in ns, ns offset to boottime, incremental]"""


@dataclass
class Slice:
    """A finished slice: times in ns (end None for an instant), name, categories, track and its
    debug annotations by name."""

    start_ns: int
    end_ns: int | None
    name: str
    categories: tuple[str, ...]
    track: int
    args: dict[str, Any]


class PftraceSource(pb.MappedFile):
    """The Perfetto file, mapped."""


def looks_like_trace(head: bytes) -> bool:
    """True when `head` starts like a Perfetto trace: a TracePacket (field 1, length-delimited)
    whose fields are well-formed and include one a packet of the SDK starts a file with (a
    clock snapshot, a sequence id, a track descriptor, a track event, interned data)."""
    try:
        key, pos = pb.varint(head, 0)
        if key != (1 << 3 | _LENGTH):
            return False
        length, pos = pb.varint(head, pos)
        end = min(pos + length, len(head))  # a first packet past the probe: what of it the probe holds
        known = {6, 8, 10, 11, 12, 13, 36, 41, 43, 44, 58, 59, 60, 87}
        seen = set()
        try:
            for number, _, _ in pb.fields(head, pos, end):
                seen.add(number)
        except pb.WireError:
            if end == len(head) and seen:  # cut by the probe, not damaged
                return bool(seen & known)
            return False
        return bool(seen & known) and not seen & {2}  # an XSpace's plane has field 2 (its name)
    except (pb.WireError, ValueError):
        return False


class PftraceReader:
    """Reads a Perfetto protobuf trace (`.pftrace`): rocprofv3's, or any track-event trace."""

    name: ClassVar[str] = "pftrace"
    container: ClassVar[str] = "protobuf"

    def sniff(self, head: bytes) -> bool:
        return looks_like_trace(head)

    def open(self, path: Path, options: LoadOptions) -> PftraceSource:
        return PftraceSource(Path(path))

    def estimate_rows(self, src: PftraceSource) -> int:
        return len(src.buf)

    def read(self, src: PftraceSource, sink: Sink) -> SourceInfo:
        from traceq.ingest.pftrace_rows import Rows

        rows = Rows(sink.damage)
        decoder = Decoder(src.buf, rows)
        try:
            decoder.run(sink.progress)
        except pb.WireError as e:
            raise TraceFormatError(f"{src.path} is a damaged Perfetto protobuf ({e})") from None
        return rows.write(sink, decoder)


class Decoder:
    """Walks the packets, keeping the tracks and each sequence's state; finished slices go to `rows`."""

    def __init__(self, buf: Any, rows: Any):
        self.buf = buf
        self.rows = rows
        self.tracks: dict[int, Track] = {}
        self.sequences: dict[int, Sequence] = {}
        self.open: dict[int, list[tuple[int, str, tuple[str, ...], dict[str, Any]]]] = {}
        self.skipped = 0
        self.counters = 0
        self.unmatched_ends = 0
        self.packets = 0

    def run(self, progress: Any) -> None:
        done = 0
        for number, wire, value in pb.fields(self.buf):
            if number != 1:
                continue  # a Trace has only packets; other fields are nothing we read
            if wire != _LENGTH:
                raise pb.WireError(f"the trace's field 1 has wire type {wire}")
            self.packet(value)  # type: ignore[arg-type]
            self.packets += 1
            if progress is not None and self.packets % 65536 == 0:
                progress(value[1] - done)  # type: ignore[index]
                done = value[1]  # type: ignore[index]
        if progress is not None:
            progress(len(self.buf) - done)
        for stack in self.open.values():  # slices still open at the end: no end to give them
            self.rows.unfinished(len(stack))

    def packet(self, span: pb.Span) -> None:
        ts = clock = None
        seq_id = flags = 0
        cleared = False
        interned = defaults = event = descriptor = snapshot = None
        for number, value in _fields(self.buf, *span, _PACKET, "a packet's"):
            if number == 11:
                event = value
            elif number == 8:
                ts = value
            elif number == 10:
                seq_id = value
            elif number == 13:
                flags = value
            elif number == 58:
                clock = value
            elif number == 12:
                interned = value
            elif number == 41:
                cleared = bool(value)
            elif number == 59:
                defaults = value
            elif number == 60:
                descriptor = value
            elif number == 6:
                snapshot = value
        seq = self.sequences.get(seq_id)  # type: ignore[arg-type]
        if seq is None or cleared or flags & INCREMENTAL_CLEARED:
            seq = self.sequences[seq_id] = Sequence(valid=cleared or bool(flags & INCREMENTAL_CLEARED))  # type: ignore[index]
        if defaults is not None:
            self._defaults(seq, defaults)
        if interned is not None:
            self._interned(seq, interned)
        if snapshot is not None:
            self._snapshot(seq, snapshot)
        if descriptor is not None:
            self._descriptor(descriptor)
        if event is None:
            return
        if flags & NEEDS_INCREMENTAL and not seq.valid:
            self.skipped += 1
            return
        self._event(seq, event, self._time(seq, ts or 0, clock))  # type: ignore[arg-type]

    def _time(self, seq: Sequence, ts: int, clock: int | None) -> int:
        clock = clock or seq.clock or BOOTTIME
        state = seq.clocks.get(clock)
        if state is None:
            return ts
        if state[3]:
            state[0] += ts
            return state[0] * state[1] + state[2]
        return ts * state[1] + state[2]

    def _defaults(self, seq: Sequence, span: pb.Span) -> None:
        for number, value in _fields(self.buf, *span, _DEFAULTS, "the packet defaults'"):
            if number == 58:
                seq.clock = value
            else:
                for _, track in _fields(self.buf, *value, _EVENT_DEFAULTS, "the track-event defaults'"):
                    seq.track = track

    def _interned(self, seq: Sequence, span: pb.Span) -> None:
        tables = {1: seq.categories, 2: seq.names, 3: seq.annotation_names, 29: seq.annotation_strings}
        for number, value in _fields(self.buf, *span, _INTERNED, "the interned data's"):
            iid, name = 0, ""
            for n, v in _fields(self.buf, *value, _INTERNED_ENTRY, "an interned entry's"):
                if n == 1:
                    iid = v
                else:
                    name = pb.text(self.buf, v)
            tables[number][iid] = name

    def _snapshot(self, seq: Sequence, span: pb.Span) -> None:
        clocks: list[tuple[int, int, bool, int]] = []
        for _, value in _fields(self.buf, *span, _SNAPSHOT, "a clock snapshot's"):
            clock_id = ts = 0
            incremental, unit = False, 1
            for n, v in _fields(self.buf, *value, _CLOCK, "a clock's"):
                if n == 1:
                    clock_id = v
                elif n == 2:
                    ts = v
                elif n == 3:
                    incremental = bool(v)
                else:
                    unit = v or 1
            clocks.append((clock_id, ts, incremental, unit))
        boot = next((ts for clock_id, ts, _, _ in clocks if clock_id == BOOTTIME), None)
        for clock_id, ts, incremental, unit in clocks:
            if clock_id >= 64 or incremental:  # a sequence's own clock: its value maps to boottime here
                offset = boot - ts * unit if boot is not None else 0
                seq.clocks[clock_id] = [ts, unit, offset, int(incremental)]

    def _descriptor(self, span: pb.Span) -> None:
        buf = self.buf
        uuid = 0
        track = Track()
        for number, value in _fields(buf, *span, _DESCRIPTOR, "a track descriptor's"):
            if number == 1:
                uuid = value
            elif number == 5:
                track.parent = value
            elif number in (2, 10):
                track.name = pb.text(buf, value)
            elif number == 3:
                for n, v in _fields(buf, *value, _PROCESS, "a process descriptor's"):
                    if n == 1:
                        track.pid = pb.signed(v)
                    else:
                        track.process_name = pb.text(buf, v)
            else:
                for n, v in _fields(buf, *value, _THREAD, "a thread descriptor's"):
                    if n == 1:
                        track.pid = pb.signed(v)
                    elif n == 2:
                        track.tid = pb.signed(v)
                    else:
                        track.thread_name = pb.text(buf, v)
        old = self.tracks.get(uuid)
        if old is None or track.name or track.pid is not None or track.tid is not None:
            self.tracks[uuid] = track  # a descriptor repeated on each sequence: the same track

    def thread_of(self, uuid: int) -> Track:
        """The track with its process and thread filled from its ancestors (parent chain, at most 16)."""
        track = self.tracks.get(uuid) or Track()
        out = Track(track.name, track.parent, track.pid, track.tid, track.thread_name, track.process_name)
        parent, hops = track.parent, 0
        while parent is not None and hops < 16 and (out.pid is None or out.process_name is None):
            up = self.tracks.get(parent)
            if up is None:
                break
            out.pid = out.pid if out.pid is not None else up.pid
            out.process_name = out.process_name or up.process_name
            parent, hops = up.parent, hops + 1
        return out

    def _event(self, seq: Sequence, span: pb.Span, ts: int) -> None:
        buf = self.buf
        kind = 0
        track = seq.track or 0
        name: str | None = None
        name_iid = None
        categories: list[str] = []
        annotations: list[pb.Span] = []
        for number, value in _fields(buf, *span, _EVENT, "a track event's"):
            if number == 4:
                annotations.append(value)
            elif number == 9:
                kind = value
            elif number == 11:
                track = value
            elif number == 10:
                name_iid = value
            elif number == 3:
                for iid in _packed(buf, value):
                    categories.append(seq.categories.get(iid, f"#{iid}"))
            elif number == 23:
                name = pb.text(buf, value)
            else:
                categories.append(pb.text(buf, value))
        if kind == END:
            stack = self.open.get(track)
            if not stack:
                self.unmatched_ends += 1
                return
            start, begun, cats, args = stack.pop()
            self.rows.add(Slice(start, ts, begun, cats, track, args), self)
            return
        if kind == COUNTER:
            self.counters += 1
            return
        if kind not in (BEGIN, INSTANT):
            return
        if name is None:
            name = seq.names.get(name_iid, f"#{name_iid}") if name_iid is not None else ""  # type: ignore[arg-type]
        args = {}
        for a in annotations:
            found = _annotation_by_iid(buf, a, seq.annotation_names)
            if found is None:
                key, value = self._annotation(seq, a)
                args[key] = value
            elif found is not _SKIP:
                args[found[0]] = found[1]
        if kind == INSTANT:
            self.rows.add(Slice(ts, None, name, tuple(categories), track, args), self)
            return
        stack = self.open.setdefault(track, [])
        if len(stack) >= MAX_DEPTH:
            raise pb.WireError(f"more than {MAX_DEPTH} slices open at once on one track")
        stack.append((ts, name, tuple(categories), args))

    def _annotation(self, seq: Sequence, span: pb.Span) -> tuple[str, Any]:
        name, value = "", None
        for number, raw in _fields(self.buf, *span, _ANNOTATION, "a debug annotation's"):
            if number == 1:
                name = seq.annotation_names.get(raw, f"#{raw}")
            elif number == 3 or number == 7:
                value = raw
            elif number == 4:
                value = pb.signed(raw)
            elif number == 6:
                value = pb.text(self.buf, raw)
            elif number == 10:
                name = pb.text(self.buf, raw)
            elif number == 2:
                value = bool(raw)
            elif number == 5:
                value = pb.double(raw)
            else:
                value = seq.annotation_strings.get(raw)
        return name, value


_SKIP = ("", None)


def _annotation_by_iid(buf: Any, span: pb.Span, names: dict[int, str]) -> tuple[str, Any] | None:
    """The common debug annotation read without a scan: its name interned (field 1, an iid of one
    or two bytes, as the SDK writes it first) and, for a name the rows read (ARGS), an integer
    value (uint_value 3 or int_value 4) ending the annotation. _SKIP for a name no row reads (its
    value is not decoded, nor checked); None for any other layout, which `Decoder._annotation`
    reads field by field."""
    at, stop = span
    if stop - at < 3 or buf[at] != 0x08:
        return None
    iid = buf[at + 1]
    at += 2
    if iid >= 0x80:
        high = buf[at]
        if high >= 0x80:
            return None
        iid = iid & 0x7F | high << 7
        at += 1
    name = names.get(iid)
    if name not in ARGS:
        return _SKIP
    key = buf[at] if at < stop else 0
    if key != 0x18 and key != 0x20:
        return None
    value = shift = 0
    at += 1
    while at < stop:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    else:
        return None  # the varint does not end inside the annotation
    if at != stop or shift >= 70:
        return None
    return name, pb.signed(value) if key == 0x20 else value  # type: ignore[return-value]


_V, _F64, _L = 1 << 0, 1 << 1, 1 << 2
"""The wire types a field may have, as bits of a mask: varint, 64-bit, length-delimited."""
_PACKET = {8: _V, 58: _V, 10: _V, 13: _V, 41: _V, 12: _L, 59: _L, 11: _L, 60: _L, 6: _L}
_DEFAULTS = {58: _V, 11: _L}
_EVENT_DEFAULTS = {11: _V}
_INTERNED = {1: _L, 2: _L, 3: _L, 29: _L}
_INTERNED_ENTRY = {1: _V, 2: _L}
_SNAPSHOT = {1: _L}
_CLOCK = {1: _V, 2: _V, 3: _V, 4: _V}
_DESCRIPTOR = {1: _V, 5: _V, 2: _L, 10: _L, 3: _L, 4: _L}
_PROCESS = {1: _V, 6: _L}
_THREAD = {1: _V, 2: _V, 5: _L}
_EVENT = {9: _V, 11: _V, 10: _V, 23: _L, 22: _L, 3: _V | _L, 4: _L}  # category_iids may be packed
_ANNOTATION = {1: _V, 10: _L, 2: _V, 3: _V, 7: _V, 4: _V, 5: _F64, 6: _L, 17: _V}
"""The fields read of each message, by number, and the wire types each may have: another is a
damaged file; fields of other numbers are skipped."""


def _fields(buf: Any, pos: int, end: int, wires: dict[int, int], what: str) -> list[tuple[int, Any]]:
    """(number, value) of the fields of the message in buf[pos:end] that `wires` names, values as
    `protobuf.fields` gives them; a field `wires` names with another wire type raises WireError
    ('{what} field N has wire type W'), as does any field that is not well-formed. One loop over
    the message, one-byte keys, varints and lengths read inline (most of a trace's), for speed:
    every message of a Perfetto trace is read through here."""
    out: list[tuple[int, Any]] = []
    append = out.append
    varint = pb.varint
    try:
        while pos < end:
            key = buf[pos]
            if key < 0x80:
                pos += 1
            else:
                key, pos = varint(buf, pos)
            wire = key & 7
            if wire == 0:
                value = buf[pos]
                pos += 1
                if value >= 0x80:  # timestamps, ids: several bytes, read here rather than by a call
                    value &= 0x7F
                    shift = 7
                    while True:
                        b = buf[pos]
                        pos += 1
                        value |= (b & 0x7F) << shift
                        if b < 0x80:
                            break
                        shift += 7
                        if shift >= 70:
                            raise pb.WireError(f"a varint longer than 10 bytes at byte {pos}")
            elif wire == 2:
                n = buf[pos]
                if n < 0x80:
                    pos += 1
                else:
                    n, pos = varint(buf, pos)
                value = (pos, pos + n)
                pos += n
            elif wire == 1:
                value = bytes(buf[pos:pos + 8])
                pos += 8
            elif wire == 5:
                value = bytes(buf[pos:pos + 4])
                pos += 4
            else:
                raise pb.WireError(f"wire type {wire} (field {key >> 3}) at byte {pos}: not a message")
            if pos > end or key < 8:
                raise pb.WireError(f"field {key >> 3} runs past the end of its message at byte {pos}")
            mask = wires.get(key >> 3)
            if mask is not None:
                if not mask >> wire & 1:
                    raise pb.WireError(f"{what} field {key >> 3} has wire type {wire}")
                append((key >> 3, value))
    except IndexError:
        raise pb.WireError(f"the data ends inside a field at byte {pos}") from None
    return out


def _packed(buf: Any, value: Any) -> list[int]:
    """A repeated varint field's values: one (unpacked, an int) or a packed run (a span)."""
    if isinstance(value, int):
        return [value]
    out, pos = [], value[0]
    while pos < value[1]:
        v, pos = pb.varint(buf, pos)
        out.append(v)
    if pos != value[1]:
        raise pb.WireError(f"a packed field runs past its end at byte {pos}")
    return out
