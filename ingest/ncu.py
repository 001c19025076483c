"""Nsight Compute's measured metrics, read from its `--csv --page raw` output (or an `.ncu-rep`
report, turned into that CSV by `ncu --import REPORT --csv --page raw`).

The CSV has a header row of metric names, a row of their units ('byte', 'Kbyte', 'ns', 'ms', '%',
...) and one row per profiled kernel launch, in launch order ('ID'); ncu may print `==PROF==`
notices before the header, and the profiled application's own output where it went to the same
stream (the header is the first line that starts with `"ID",`). Numbers carry thousands separators ('1,701,184'). `read_ncu` keeps
per launch its name, grid, block, the NVTX push/pop stack of its thread (recorded with
`ncu --nvtx`) and the metrics of `METRICS`, converted by the unit row to bytes, nanoseconds and
percent; a metric the report lacks is null. Anything else is refused in one TraceFormatError line
that names the file; the store is not touched here (`traceq.analysis.efficiency.ncu` joins the
launches to a trace's kernels).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
import os
import re
import shutil
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from traceq.errors import TraceFormatError
from traceq.ingest.json_events import GZIP_MAGIC
from traceq.ingest.texts import capped

METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    # stored column: (kind of unit, the ncu metrics that give it, the first present wins)
    "gpu_time_ns": ("time", ("gpu__time_duration.sum",)),
    "achieved_occupancy_pct": ("pct", ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    "theoretical_occupancy_pct": ("pct", ("sm__maximum_warps_per_active_cycle_pct",)),
    "sm_throughput_pct": ("pct", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    "tensor_pipe_pct": ("pct", ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
                                "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                                "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active")),
    "memory_throughput_pct": ("pct", ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",)),
    "dram_throughput_pct": ("pct", ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",)),
    "dram_read_bytes": ("bytes", ("dram__bytes_read.sum",)),
    "dram_write_bytes": ("bytes", ("dram__bytes_write.sum",)),
    "l2_bytes": ("bytes", ("lts__t_bytes.sum",)),
    "l1_bytes": ("bytes", ("l1tex__t_bytes.sum",)),
    "global_sectors": ("count", ("memory_l2_theoretical_sectors_global",)),
    "global_sectors_ideal": ("count", ("memory_l2_theoretical_sectors_global_ideal",)),
    "l2_cycles_active": ("count", ("lts__cycles_active.sum",)),
    "l2_cycles_elapsed": ("count", ("lts__cycles_elapsed.sum",)),
}
"""The metrics kept per launch: the SpeedOfLight, Occupancy and memory-workload metrics a
`ncu --set basic|full` report has, the byte counters the traffic model is checked against, and
the SourceCounters section's global-memory sectors against the ideal of the same accesses with
the L2's active and elapsed cycles (what ncu's UncoalescedGlobalAccess rule weighs, and traceq's
`uncoalesced_access` finding)."""

_UNITS = {
    "time": {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
             "second": 1e9},
    "bytes": {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6,
              "GB": 1e9, "Kibyte": 1024.0, "Mibyte": 1024.0 ** 2, "Gibyte": 1024.0 ** 3},
    "pct": {"%": 1.0},
    "count": {"": 1.0, "sector": 1.0, "sectors": 1.0, "cycle": 1.0, "cycles": 1.0, "Ksector": 1e3, "Msector": 1e6,
              "Gsector": 1e9, "Kcycle": 1e3, "Mcycle": 1e6, "Gcycle": 1e9},
}
_KEPT = ("ID", "Kernel Name", "Grid Size", "Block Size")
_NVTX_PUSHPOP = "thread Domain:Push/Pop_Range"
_TRIPLE = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)$")
_NVTX_ENTRY = re.compile(r'"([^"]*)"')
NVTX_SEP = "\x1f"
"""Separator of the range names in a launch's NVTX path (a character no range name has)."""

COLUMNS = ["ncu_id", "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "nvtx_path", *METRICS]


@dataclass(frozen=True)
class NcuReport:
    """An Nsight Compute report as read: `launches` (COLUMNS, one row per profiled launch, in
    the report's ID order), the metrics it had (`present`), whether it recorded NVTX stacks."""

    path: Path
    sha256: str
    launches: pl.DataFrame
    present: tuple[str, ...]
    has_nvtx: bool


def read_ncu(path: Path, *, ncu_bin: str | None = None, cache: Path | None = None) -> NcuReport:
    """Read an Nsight Compute `--csv --page raw` file (plain or gzipped), or an `.ncu-rep`
    report through `ncu` (`ncu_bin`, else $TRACEQ_NCU, else `ncu` on PATH), its CSV kept in
    `cache` (a folder beside the store) so a second load reads it directly.

    Raises TraceFormatError for a missing, empty or damaged file, or one that is not such a CSV."""
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(f"{path}: no such file" if not path.exists() else f"{path} is not a file")
    if path.stat().st_size == 0:
        raise TraceFormatError(f"{path} is empty (0 bytes), not an Nsight Compute report")
    sha = _sha256(path)
    with path.open("rb") as f:
        head = f.read(4)
    if path.suffix == ".ncu-rep" or (head[:2] != GZIP_MAGIC and b"\0" in head):
        text = _imported(path, sha, ncu_bin, cache)
    else:
        text = _text(path, head)
    launches, present, has_nvtx = parse_raw_csv(text, path)
    return NcuReport(path, sha, launches, present, has_nvtx)


def parse_raw_csv(text: str, path: Path) -> tuple[pl.DataFrame, tuple[str, ...], bool]:
    """The launches of a `--csv --page raw` text (see `NcuReport`); TraceFormatError naming
    `path` when it is not one or is damaged."""
    lines = text.splitlines(keepends=True)
    # before the header: ncu's `==PROF==` notices and, where the application's output went to the
    # same stream (`ncu --csv ... python app.py > report.csv`), whatever the application printed
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')),
                 next((i for i, line in enumerate(lines) if not line.startswith("==")), len(lines)))
    try:
        rows = list(csv.reader(io.StringIO("".join(lines[start:])), strict=True))
    except csv.Error as e:
        raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV ({e})") from None
    if not rows or not rows[0] or rows[0][0] != "ID" or not all(c in rows[0] for c in _KEPT):
        raise TraceFormatError(f"{path} is not an Nsight Compute `--csv --page raw` report (no header row with "
                               "ID, Kernel Name, Grid Size and Block Size); make one with "
                               "`ncu --import REPORT.ncu-rep --csv --page raw > report.csv`")
    header = rows[0]
    if len(set(header)) != len(header):
        raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV (a column name repeats)")
    if len(rows) < 2 or rows[1][:1] != [""]:
        raise TraceFormatError(f"{path} is an Nsight Compute CSV without its units row: export it with "
                               "`--page raw` (and without --print-units none)")
    units, body = rows[1], rows[2:]
    if not body:
        raise TraceFormatError(f"{path} holds no profiled kernel (only the header)")
    where = {name: i for i, name in enumerate(header)}
    nvtx = next((i for i, name in enumerate(header) if name.startswith(_NVTX_PUSHPOP)), None)
    chosen = {column: next((m for m in names if m in where), None) for column, (_, names) in METRICS.items()}
    scale = {column: _scale(path, metric, units[where[metric]] if where[metric] < len(units) else "", kind)
             for column, (kind, _) in METRICS.items() if (metric := chosen[column]) is not None}
    data: dict[str, list] = {c: [] for c in COLUMNS}
    seen: set[int] = set()
    for number, row in enumerate(body, start=3):
        if len(row) != len(header):
            raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV: row {number} has {len(row)} fields, "
                                   f"the header {len(header)} (cut short?)")
        ncu_id = _integer(path, row[where["ID"]], "ID", number)
        if ncu_id in seen:
            raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV: ID {ncu_id} repeats (row {number})")
        seen.add(ncu_id)
        name = row[where["Kernel Name"]]
        if not name:
            raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV: row {number} has no kernel name")
        data["ncu_id"].append(ncu_id)
        data["name"].append(capped(name))
        for label, key in (("Grid Size", "grid"), ("Block Size", "block")):
            for axis, value in zip("xyz", _triple(path, row[where[label]], label, number)):
                data[f"{key}_{axis}"].append(value)
        data["nvtx_path"].append(nvtx_path(row[nvtx]) if nvtx is not None else None)
        for column, metric in chosen.items():
            data[column].append(None if metric is None else
                                _number(path, row[where[metric]], metric, number, scale[column]))
    schema = {"ncu_id": pl.Int64, "name": pl.String, **{f"{k}_{a}": pl.Int64 for k in ("grid", "block") for a in "xyz"},
              "nvtx_path": pl.String, **{c: pl.Float64 for c in METRICS}}
    frame = pl.DataFrame(data, schema=schema).sort("ncu_id")
    return frame, tuple(c for c, m in chosen.items() if m is not None), nvtx is not None


def nvtx_path(cell: str) -> str | None:
    """The push/pop range names of ncu's `thread Domain:Push/Pop_Range:...` cell, outermost
    first, joined by NVTX_SEP; None when the launch was in no range. A cell is the thread id, then
    one quoted `Domain:Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg` per open range (a range
    name may hold ':', so the six trailing fields are cut from the right)."""
    names = []
    for entry in _NVTX_ENTRY.findall(cell):
        inner = entry.split(":", 1)[1] if ":" in entry else entry
        parts = inner.rsplit(":", 6)
        names.append(capped(parts[0] if len(parts) == 7 else inner))
    return NVTX_SEP.join(names) if names else None


def _scale(path: Path, metric: str, unit: str, kind: str) -> float:
    factor = _UNITS[kind].get(unit.strip())
    if factor is None:
        raise TraceFormatError(f"{path}: the unit {unit.strip()[:40]!r} of {metric} is not one traceq reads "
                               f"(expected one of {', '.join(_UNITS[kind])})")
    return factor


def _number(path: Path, text: str, metric: str, row: int, scale: float) -> float | None:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV: {metric} of row {row} is not a number "
                               f"({text[:40]!r})") from None
    if not math.isfinite(value) or value < 0:
        raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV: {metric} of row {row} is {text[:40]!r}")
    return value * scale


def _integer(path: Path, text: str, what: str, row: int) -> int:
    text = text.strip().replace(",", "")
    if not text.isdigit() or len(text) > 18:
        raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV: {what} of row {row} is {text[:40]!r}, "
                               "not a whole number")
    return int(text)


def _triple(path: Path, text: str, what: str, row: int) -> tuple[int, int, int]:
    match = _TRIPLE.match(text.strip())
    if match is None or any(len(g) > 9 for g in match.groups()):
        raise TraceFormatError(f"{path} is a damaged Nsight Compute CSV: {what} of row {row} is {text[:40]!r}, "
                               "not '(x, y, z)'")
    x, y, z = (int(g) for g in match.groups())
    return x, y, z


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _text(path: Path, head: bytes) -> str:
    try:
        data = gzip.decompress(path.read_bytes()) if head[:2] == GZIP_MAGIC else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(f"{path} is a truncated or damaged gzip file ({e}); copy it again") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceFormatError(f"{path} is not an Nsight Compute CSV: it is not UTF-8 text") from None


def ncu_command(ncu_bin: str | None = None) -> str | None:
    """The `ncu` to run: `ncu_bin`, else $TRACEQ_NCU, else `ncu` on PATH (None: none)."""
    given = ncu_bin or os.environ.get("TRACEQ_NCU")
    if given:
        return shutil.which(given) or (given if Path(given).is_file() else None)
    return shutil.which("ncu")


def _imported(path: Path, sha: str, ncu_bin: str | None, cache: Path | None) -> str:
    """The CSV `ncu --import path --csv --page raw` prints, from `cache` when made before."""
    cached = cache / f"{sha[:32]}.csv" if cache is not None else None
    if cached is not None and cached.is_file():
        return cached.read_text(encoding="utf-8")
    ncu = ncu_command(ncu_bin)
    manual = f"`ncu --import {path} --csv --page raw > {path.with_suffix('.csv').name}`"
    if ncu is None:
        raise TraceFormatError(f"{path} is an Nsight Compute report and `ncu` is not on PATH (nor given by --ncu-bin "
                               f"or TRACEQ_NCU): get it with the CUDA toolkit or Nsight Compute, or run {manual} "
                               "where it is and load the .csv")
    try:
        done = subprocess.run([ncu, "--import", str(path), "--csv", "--page", "raw"], capture_output=True,
                              timeout=3600, check=False)
    except OSError as e:
        raise TraceFormatError(f"{path}: could not run {ncu} ({e.strerror}); run {manual} and load the .csv") from None
    out = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0 or not out.strip():
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit status {done.returncode}"]
        raise TraceFormatError(f"{path}: `ncu --import` failed ({detail[-1][:200]})")
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.part")
            partial.write_text(out, encoding="utf-8")
            partial.replace(cached)
        except OSError:
            pass  # a cache that cannot be written only costs the next load another import
    return out


__all__ = ["COLUMNS", "METRICS", "NVTX_SEP", "NcuReport", "ncu_command", "nvtx_path", "parse_raw_csv", "read_ncu"]
