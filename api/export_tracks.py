"""Where `traceq export` (api/export.py) puts each event: its process (pid) and thread (tid) in
the file, their names, and the extra tracks that overlapping work is moved to.

Perfetto's JSON importer keeps one stack of `X` slices per (pid, tid): a slice must nest in the
one open below it or start after it ends, else it is dropped or drawn in the wrong place. Work
on one GPU stream may overlap (a kernel starting before the previous one ends: programmatic
dependent launch, a profiler's rounding), and a thread's API calls and NVTX ranges may cross.
Such work goes on extra tracks of its stream or thread (`stream 7 · 2`), assigned greedily in
start order (each slice on the first track where it fits): a stream's tracks hold slices that
never overlap, a thread's slices that nest or are disjoint. A stream's groups of overlapping
work are found in SQL (window functions) and only they are read into Python and placed; a
thread's calls and ranges are read in order (four numbers each) and placed in one pass with a
stack, holding no more than the slices open at once.

Processes: one per GPU and one per host process of each trace, each with one name. A trace
alone keeps its GPUs' device ids (as PyTorch's profiler writes them) and its processes' pids,
where one is unknown or equal to a device id it gets a number of its own; a run's traces are
numbered 1, 2, ... in rank order (the real device ids and pids are in the names, with the rank).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from traceq.store import first_row

if TYPE_CHECKING:
    import duckdb

LANE_TID_BASE = 1_000_000_000
"""Extra tracks' tids count up from here: above any thread id Linux gives (2^22) and below 2^31."""

SYNTHETIC_PID_BASE = 2_000_000_000
"""A host process whose pid is unknown, or collides with a GPU's, gets a pid counting up from here."""

RANGES = "kind <> 'startend' AND end_ns IS NOT NULL"
"""The NVTX ranges drawn as slices of their thread (push/pop; api/export.py writes them alike)."""

@dataclass(frozen=True)
class Part:
    """One trace of an export, and what puts its times on the export's clock (a run's: its
    shift and drift, `analysis.multigpu.runs`)."""

    trace_id: int
    shift_ns: int = 0
    drift_ppm: float = 0.0
    shift_at_ns: int = 0
    ranks: tuple[tuple[int, int | None, int | None], ...] = ()  # (rank, pid, device_id) of the trace
    world_size: int = 1

    def clock(self, column: str) -> str:
        """SQL: the time `column` (ns, this trace's clock) on the export's clock."""
        if not self.drift_ppm:
            return f"({column} + {int(self.shift_ns)})" if self.shift_ns else f"({column})"
        return (f"({column} + {int(self.shift_ns)} + round(({column} - {int(self.shift_at_ns)}) * "
                f"{float(self.drift_ppm):.17g} * 1e-6)::BIGINT)")

    def rank_label(self, *, pid: int | None = None, device: int | None = None) -> str:
        """'rank 3 · ' for the GPU `device` or host process `pid`, where the run has several ranks."""
        if self.world_size <= 1:
            return ""
        own = [r for r, p, d in self.ranks if (device is not None and d == device) or (pid is not None and p == pid)]
        own = own or [r for r, p, d in self.ranks if p is None and d is None]
        if not own:
            return ""
        return f"rank{'s' if len(own) > 1 else ''} {', '.join(map(str, sorted(own)))} · "


def trace_parts(con: duckdb.DuckDBPyConnection, trace_id: int) -> list[Part]:
    """A trace alone: its own clock, its ranks' labels from the run it is a rank of."""
    row = first_row(con, "SELECT run_id FROM ranks WHERE trace_id = ? ORDER BY run_id LIMIT 1", [trace_id])
    if row is None:
        return [Part(int(trace_id))]
    ranks = con.execute("SELECT rank, pid, device_id FROM ranks WHERE run_id = ? AND trace_id = ? ORDER BY rank",
                        [row[0], trace_id]).fetchall()
    world = first_row(con, "SELECT world_size FROM runs WHERE run_id = ?", [row[0]])[0]
    return [Part(int(trace_id), ranks=tuple(ranks), world_size=int(world))]


def run_parts(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Part]:
    """Each trace of a run, in rank order, with its shift and drift onto the run's clock."""
    rows = con.execute("SELECT rank, trace_id, pid, device_id, shift_ns, drift_ppm, shift_at_ns FROM ranks "
                       "WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()
    world = int(first_row(con, "SELECT world_size FROM runs WHERE run_id = ?", [run_id])[0])
    parts: dict[int, Part] = {}
    for rank, t, pid, device, shift, drift, at in rows:
        had = parts.get(int(t))
        ranks = (*(had.ranks if had else ()), (int(rank), pid, device))
        parts[int(t)] = Part(int(t), int(shift), float(drift or 0.0), int(at or 0), ranks, world)
    return list(parts.values())


@dataclass
class Layout:
    """Every process and thread of an export: pids, tids, names, and the slices moved to extra tracks."""

    gpu_pid: dict[tuple[int, int], int] = field(default_factory=dict)           # (trace, device) -> pid
    host_pid: dict[tuple[int, int | None], int] = field(default_factory=dict)   # (trace, pid) -> pid
    annotation_device: dict[int, dict[int, int]] = field(default_factory=dict)  # trace -> stream -> device
    processes: list[tuple[int, str]] = field(default_factory=list)              # (pid, name), in order
    threads: list[tuple[int, int, str, int]] = field(default_factory=list)      # (pid, tid, name, sort)
    moved: list[tuple] = field(default_factory=list)  # (src, trace, a, b, kernel_id, start_ns, end_ns, tid)

    def gpu_case(self, t: int, column: str) -> str:
        """SQL: the pid of the GPU `column` (a device id, NULL: 0) names in trace `t`."""
        whens = " ".join(f"WHEN {d} THEN {p}" for (tt, d), p in self.gpu_pid.items() if tt == t)
        return f"(CASE coalesce({column}, 0) {whens} END)" if whens else "NULL"

    def host_case(self, t: int, column: str) -> str:
        """SQL: the pid of the host process `column` (a pid) names in trace `t`."""
        known = {p: q for (tt, p), q in self.host_pid.items() if tt == t}
        whens = " ".join(f"WHEN {p} THEN {q}" for p, q in known.items() if p is not None)
        unknown = known.get(None)
        inner = f"CASE {column} {whens} END" if whens else "NULL"
        return f"(CASE WHEN {column} IS NULL THEN {'NULL' if unknown is None else unknown} ELSE {inner} END)"

    def annotation_pid(self, t: int, stream: str) -> str | None:
        """SQL: the GPU pid of a start/end range of no process (Kineto's gpu_user_annotation, on
        stream `stream`): the GPU whose work used that stream; None where the trace has no GPU."""
        streams = self.annotation_device.get(t)
        gpus = [(d, p) for (tt, d), p in self.gpu_pid.items() if tt == t]
        if not gpus:
            return None
        whens = " ".join(f"WHEN {s} THEN {self.gpu_pid[t, d]}" for s, d in (streams or {}).items())
        default = min(gpus)[1]
        return f"(CASE coalesce({stream}, 0) {whens} ELSE {default} END)" if whens else str(default)


def layout(con: duckdb.DuckDBPyConnection, parts: list[Part]) -> Layout:
    """The processes, threads and extra tracks of an export of `parts`."""
    out = Layout()
    gpus = {p.trace_id: [int(d) for (d,) in con.execute(
        f"SELECT DISTINCT coalesce(device_id, 0) AS d FROM kernels WHERE trace_id = {p.trace_id} UNION "
        f"SELECT DISTINCT coalesce(device_id, 0) FROM memops WHERE trace_id = {p.trace_id} ORDER BY 1").fetchall()]
        for p in parts}
    orphans = {p.trace_id: bool(gpus[p.trace_id]) for p in parts}  # start/end ranges of no process go to a GPU
    hosts = {p.trace_id: [r[0] for r in con.execute(
        f"SELECT DISTINCT pid FROM api_calls WHERE trace_id = {p.trace_id} UNION "
        f"SELECT DISTINCT pid FROM nvtx WHERE trace_id = {p.trace_id}"
        f"{' AND NOT (pid IS NULL AND kind = ' + chr(39) + 'startend' + chr(39) + ')' if orphans[p.trace_id] else ''} "
        "UNION SELECT DISTINCT pid FROM kernel_launches WHERE trace_id = "
        f"{p.trace_id} AND launch_start_ns IS NOT NULL ORDER BY 1 NULLS LAST").fetchall()] for p in parts}
    _number(out, parts, gpus, hosts)
    _name_processes(con, out)
    for p in parts:
        t = p.trace_id
        streams = con.execute(f"""
            SELECT DISTINCT coalesce(device_id, 0), coalesce(stream_id, 0) FROM kernels WHERE trace_id = {t}
            UNION SELECT DISTINCT coalesce(device_id, 0), coalesce(stream_id, 0) FROM memops WHERE trace_id = {t}
            ORDER BY 1, 2""").fetchall()
        by_stream: dict[int, int] = {}
        for d, s in streams:
            by_stream.setdefault(int(s), int(d))
        out.annotation_device[t] = by_stream
        tracks: dict[int, dict[int, str]] = {}
        for d, s in streams:
            tracks.setdefault(out.gpu_pid[t, d], {})[int(s)] = f"stream {s}"
        if orphans[t]:
            for (s,) in con.execute(f"SELECT DISTINCT coalesce(tid, 0) FROM nvtx WHERE trace_id = {t} AND pid IS NULL "
                                    "AND kind = 'startend' ORDER BY 1").fetchall():
                d = by_stream.get(int(s), min(gpus[t]))
                tracks.setdefault(out.gpu_pid[t, d], {}).setdefault(int(s), f"stream {s}")
        names = {(pid, tid): name for pid, tid, name in con.execute(
            f"SELECT pid, tid, min(name) FROM threads WHERE trace_id = {t} AND name IS NOT NULL GROUP BY ALL").fetchall()}
        for pid, tid in con.execute(f"""
                SELECT DISTINCT pid, coalesce(tid, 0) FROM api_calls WHERE trace_id = {t}
                UNION SELECT DISTINCT pid, coalesce(tid, 0) FROM nvtx WHERE trace_id = {t}
                {"AND NOT (pid IS NULL AND kind = 'startend')" if orphans[t] else ""}
                UNION SELECT DISTINCT pid, coalesce(launch_tid, 0) FROM kernel_launches WHERE trace_id = {t}
                AND launch_start_ns IS NOT NULL ORDER BY 1 NULLS LAST, 2""").fetchall():
            label = _clean(names.get((pid, tid))) or f"thread {tid}"
            tracks.setdefault(out.host_pid[t, pid], {})[int(tid)] = label
        lanes = _moved(con, t, out)
        for pid, own in tracks.items():
            order = sorted(own.items())
            sort = 0
            for tid, name in order:
                out.threads.append((pid, tid, name, sort))
                sort += 1
                for lane, lane_tid in lanes.get((pid, tid), []):
                    out.threads.append((pid, lane_tid, f"{name} · {lane + 1}", sort))
                    sort += 1
    return out


def _clean(name: str | None) -> str | None:
    """A thread's name as the trace gives it, without spaces around it."""
    return name.strip() if name and name.strip() else None


def _number(out: Layout, parts: list[Part], gpus: dict[int, list[int]], hosts: dict[int, list[int | None]]) -> None:
    """Give every GPU and host process its pid and name."""
    alone = len(parts) == 1
    used: set[int] = set()
    synthetic = SYNTHETIC_PID_BASE
    dense = 0
    names = {}
    for p in parts:
        t = p.trace_id
        for d in gpus[t]:
            dense += 1
            pid = d if alone and 0 <= d < 2**31 else dense
            out.gpu_pid[t, d] = pid
            used.add(pid)
            names[pid] = f"{p.rank_label(device=d)}GPU {d}"
        for h in hosts[t]:
            dense += 1
            if alone:
                pid = h if h is not None and 0 <= h < 2**31 and h not in used else None
                if pid is None:
                    while synthetic in used:
                        synthetic += 1
                    pid = synthetic
            else:
                pid = dense
            out.host_pid[t, h] = pid
            used.add(pid)
            names[pid] = f"{p.rank_label(pid=h)}{{process}} (pid {'unknown' if h is None else h})"
    out.processes = list(names.items())


def _name_processes(con: duckdb.DuckDBPyConnection, out: Layout) -> None:
    """Fill the GPUs' product names and the host processes' names from the store."""
    named = []
    gpu_of = {pid: (t, d) for (t, d), pid in out.gpu_pid.items()}
    host_of = {pid: (t, h) for (t, h), pid in out.host_pid.items()}
    for pid, name in out.processes:
        if pid in gpu_of:
            t, d = gpu_of[pid]
            row = first_row(con, "SELECT min(name) FROM gpus WHERE trace_id = ? AND device_id = ?", [t, d])
            product = row[0] if row else None
            named.append((pid, f"{name}: {product}" if product else name))
        else:
            t, h = host_of[pid]
            row = None if h is None else first_row(
                con, "SELECT min(name) FROM processes WHERE trace_id = ? AND pid = ? AND name IS NOT NULL", [t, h])
            named.append((pid, name.replace("{process}", (_clean(row[0]) if row and row[0] else None) or "process")))
    out.processes = named


def _moved(con: duckdb.DuckDBPyConnection, t: int, out: Layout) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Place trace `t`'s overlapping slices on extra tracks (appended to `out.moved`); returns,
    per (pid, tid) of the file, its extra tracks as (lane, tid). A moved slice is named by its
    kernel id, else by its track, start and end: two slices alike in those get one track (they
    nest, as Perfetto wants)."""
    lanes: dict[tuple[int, int], list[tuple[int, int]]] = {}
    next_tid = LANE_TID_BASE + len({r[7] for r in out.moved})
    for gpu, query in ((True, _GPU_OVERLAPS), (False, _HOST_SLICES)):
        tids: dict[tuple, int] = {}
        for src, a, b, kernel_id, start, end, lane in _place(con.execute(query.format(t=t, range=RANGES)), gpu):
            pid = out.gpu_pid[t, a] if gpu else out.host_pid[t, a]
            key = (pid, b, lane)
            if key not in tids:
                tids[key] = next_tid
                lanes.setdefault((pid, b), []).append((lane, next_tid))
                next_tid += 1
            out.moved.append((src, t, a, b, kernel_id, start, end, tids[key]))
    return lanes


def _place(cursor: duckdb.DuckDBPyConnection, disjoint: bool) -> Iterator[tuple]:
    """Rows (src, a, b, kernel_id, start_ns, end_ns) in start order per track (a, b), the
    longer first of two starting together: each on the first of its track's lanes where it fits
    (`disjoint`: after the lane's last slice ends; else also inside the innermost slice still
    open there); yields those placed on a lane after the first, with their lane (1, 2, ...)."""
    track = None
    stacks: list[list[int]] = []
    while rows := cursor.fetchmany(50_000):
        for src, a, b, kernel_id, start, end in rows:
            if (a, b) != track:
                track, stacks = (a, b), [[]]
            first = stacks[0]
            while first and first[-1] <= start:
                first.pop()
            if not first or (not disjoint and end <= first[-1]):
                first.append(end)  # the common case: lane 0
                continue
            lane = None
            for i in range(1, len(stacks)):
                stack = stacks[i]
                while stack and stack[-1] <= start:
                    stack.pop()
                if not stack or (not disjoint and end <= stack[-1]):
                    lane = i
                    break
            if lane is None:
                lane = len(stacks)
                stacks.append([])
            stacks[lane].append(end)
            yield src, a, b, kernel_id, start, end, lane


_ORDER = "ORDER BY start_ns, end_ns DESC, src, id"

_GPU_OVERLAPS = """
    WITH w AS (SELECT 'k' AS src, coalesce(device_id, 0) AS a, coalesce(stream_id, 0) AS b, kernel_id AS id,
                      start_ns, end_ns FROM kernels WHERE trace_id = {t}
               UNION ALL
               SELECT 'm', coalesce(device_id, 0), coalesce(stream_id, 0), NULL, start_ns, end_ns
               FROM memops WHERE trace_id = {t}),
         c AS (SELECT *, max(end_ns) OVER (PARTITION BY a, b """ + _ORDER + """
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM w),
         g AS (SELECT *, sum(CASE WHEN reach IS NULL OR start_ns >= reach THEN 1 ELSE 0 END)
                         OVER (PARTITION BY a, b """ + _ORDER + """ ROWS UNBOUNDED PRECEDING) AS grp FROM c),
         busy AS (SELECT a, b, grp FROM g GROUP BY ALL HAVING count(*) > 1)
    SELECT src, a, b, id, start_ns, end_ns FROM g SEMI JOIN busy USING (a, b, grp)
    ORDER BY a, b, start_ns, end_ns DESC, src, id"""
"""The groups of a GPU's kernels and memops (a: device, b: stream) that overlap on one stream
(SQL: a group starts where a slice starts after every slice before it ended)."""

_HOST_SLICES = """
    SELECT 'a' AS src, pid AS a, coalesce(tid, 0) AS b, NULL AS id, start_ns, end_ns FROM api_calls
    WHERE trace_id = {t}
    UNION ALL
    SELECT 'n', pid, coalesce(tid, 0), NULL, start_ns, end_ns FROM nvtx WHERE trace_id = {t} AND {range}
    ORDER BY a NULLS LAST, b, start_ns, end_ns DESC, src"""
"""A host thread's API calls and NVTX ranges (a: pid, b: tid), in the order they are placed in:
where they nest, each fits on the first lane, so placing them all is one pass with a stack."""
