"""Mutation fuzzer for `traceq load` and the commands after it (issue 16; run on demand or from a test).

    python tools/fuzz.py --mutants 10000 --seed 1 --jsonl fuzz.jsonl --keep /tmp/fuzz-failures
    python tools/fuzz.py --mutants 200 --start 4800 --seed 1       # one chunk of a longer run
    python tools/fuzz.py --only 4873 --seed 1 --keep /tmp/one       # replay a single mutant

Each mutant is a copy of one corpus trace with one mutation (`MUTATIONS`), loaded with
`traceq load` into a copy of a store that already holds a good trace. What must hold:

- no traceback, and an exit status of 0 or 1;
- a refusal (exit 1) is one `traceq: ...` line on stderr, and the store is byte for byte as before;
- after an acceptance (exit 0) the store's earlier trace is unchanged, and each of `COMMANDS`
  (`traces`, `top`, `layers`, `libs`, `stages`, `ru`, `memory`, `report` with `advise` and so
  `idle` in it, `idle --by iteration`, `launches`, the two `stats` reports that join launches to
  their calls, `comm`, `overlap`, `ranks`) either works or refuses in one line.

Mutant i of a run is made from `random.Random(f"{seed}:{i}")` alone, so any mutant of any run
can be made again (`--only i`) and a long run can be cut into chunks (`--start`). The commands
run in this process through typer's CliRunner (a process each would cost a second per command).

Mutations are classes, one per kind of damage, each naming the trace formats it applies to; a
corpus file's format is judged by `trace_format`. Supporting a new format is one entry in
`trace_format`, its mutation classes appended to `MUTATIONS`, and its files in `corpus()`.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import hashlib
import json
import random
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

FIRST_SAMPLES = ("lenet_b256_cudnn.sqlite", "alexnet_b256_cudnn.sqlite", "alexnet_b64_nocache.sqlite",
                 "ddp_resnet18_2gpu.sqlite", "alexnet_b256_kineto.json")
"""The samples of the first campaigns' corpus: replaying one of their mutants needs this list (a
mutant's file is drawn from the corpus by index)."""
SAMPLES = (*FIRST_SAMPLES, "alexnet_b64_graph.sqlite", "conventions/cnn_nsys_gpu_metrics.sqlite")
"""Bundled samples in the corpus: every nsys feature traceq reads (NVTX layers, memory events,
two GPUs, CUDA-graph replays: CUDA_GRAPH_NODE_EVENTS and kernels' graph node ids; GPU metrics:
GPU_METRICS and TARGET_INFO_GPU_METRICS), each small enough to load in a fraction of a second, and
a Kineto JSON trace."""

REALTRACES = (
    "nsys_sqlite/martisu1631998__kmeans-parallel__report2.sqlite",  # old schema, TARGET_INFO_CUDA_GPU
    "nsys_sqlite/MohanadOdema__DLProf__w_Relu__nsys_profile.sqlite",  # nsys 2022.1, NVTX op ranges
    "nsys_sqlite/LeiWang1999__memfusion_artifact__report1.sqlite",  # nsys 2023.1, NVTX, 4 GPUs
    "nsys_sqlite/CO18326__uvmTorch__report1.sqlite",  # no kernel table
    "nvprof_sqlite/eganhila__mandelbrot_csgf_2017__output.nvvp",  # Version 9, one kernel
    "nvprof_sqlite/m-goldstein__GPU_ML__timeline.nvvp",  # Version 12, cuDNN
    "nvprof_sqlite/F64081169__Nvprof_Jetson_Nano_Example__yolo.nvvp",  # NVTX markers
    "nvprof_sqlite/josiahdavis__profiling-lm__net.sql",  # pyprof markers
    "nvprof_sqlite/esarmstrong__ece408__forward1_analysis.nvprof",  # KERNEL, not CONCURRENT_KERNEL
    "nvprof_sqlite/shukoushuu__EM-Algorithm__analysis.nvprof",  # Version 8, Fermi
    "kineto_json/pytorch__kineto__before_fix_trace.json",  # plain JSON, old categories (Kernel, Runtime)
    "kineto_json/facebookresearch__param__dlrm_kineto__worker0_step_12.1694128201545.pt.trace.json.gz",  # NCCL
    "kineto_json/facebookresearch__HolisticTraceAnalysis__with_gpu_user_annotation__step_based_trace_2543932.json.gz",
    "kineto_json/facebookresearch__HolisticTraceAnalysis__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm
)
"""Third-party traces from ../shared/realtraces (used where present, never copied into the repo)."""

PROTOBUF_TRACES = (
    "xplane/AMD-AGI__TraceLens__mi300__jax08_gemm__tw003.xplane.pb",  # XPlane protobuf, JAX 0.8
    "xplane/AMD-AGI__TraceLens__mi300__jax_conv_minimal_legacy__chi-mi300x-013.xplane.pb",  # older JAX, copies
)
"""XPlane profiles from ../shared/realtraces, fuzzed when `--format protobuf` asks (kept out of the
default corpus, whose mutant numbers earlier runs' reproducers name)."""

AMD_TRACES = (
    "rocpd/AMD-AGI__TraceLens__rocprof__908_results.json.gz",  # rocprofv3 JSON, 43,915 dispatches
    "rocpd/ROCm__rocmProfileData__matmul_result.rpd",  # RPD SQLite: kernels, copies, API calls
    "rocpd/ROCm__rocprofiler-sdk__docs__kernel_trace.csv",  # rocprofv3 kernel_trace.csv
    "rocpd/amd__HPCTrainingExamples__finite-difference__results.csv",  # rocprof v1 CSV
    "rocpd/amd__HPCTrainingExamples__finite-difference__results.db",  # rocprof v1 SQLite (KERN)
)
"""AMD profiles from ../shared/realtraces, fuzzed when `--amd` asks (kept out of the default
corpus for the same reason as the XPlanes)."""

COLUMNAR_SAMPLES = ("exports/tiny_torch.parquetdir", "exports/tiny_torch.arrow")
"""nsys's Parquet and Arrow exports of a small PyTorch run (the bundled sample), fuzzed when
`--columnar` asks."""

BASE_TRACE = ROOT / "sample_traces" / "lenet_b256_cudnn.sqlite"
"""The good trace every mutant's store already holds."""

FIRST_COMMANDS = (("traces",), ("top",), ("layers",), ("libs",), ("stages",), ("ru",), ("memory",), ("report",))
"""The commands of the first campaigns: the replays of their failing mutants (tests) run these."""
COMMANDS = (*FIRST_COMMANDS, ("idle", "--by", "iteration"), ("launches",), ("stats", "-r", "nvtx_gpu_proj_sum"),
            ("stats", "-r", "cuda_kern_exec_sum"), ("comm",), ("overlap",), ("ranks",))
"""Commands that must work (or refuse in one line) on an accepted mutant, the mutant's trace being
the latest loaded, so each runs on it by default."""


def corpus(include_shared: bool = True, protobuf: bool = False, amd: bool = False,
           samples: Sequence[str] = SAMPLES, columnar: bool = False, base: bool = True) -> list[Path]:
    """The traces mutants are made from: the samples (`samples`: FIRST_SAMPLES to replay the first
    campaigns' mutants; with `columnar`, the nsys Parquet and Arrow exports after them), and the
    realtraces when ../shared is there (with `protobuf`, the XPlane profiles too; with `amd`, the
    AMD profiles). Without `base`, only what those flags add (no samples, no nsys, nvprof or
    Kineto realtraces)."""
    files = [ROOT / "sample_traces" / name for name in (*(samples if base else ()),
                                                        *(COLUMNAR_SAMPLES if columnar else ()))]
    if include_shared and (SHARED / "realtraces").is_dir():
        shared = (REALTRACES if base else ()) + (PROTOBUF_TRACES if protobuf else ()) + (AMD_TRACES if amd else ())
        files += [p for p in (SHARED / "realtraces" / rel for rel in shared) if p.exists()]
    return files


PFTRACE_SOURCE = "rocpd/AMD-AGI__TraceLens__rocprof__908_results.json.gz"
"""The rocprofv3 JSON the fuzzed Perfetto trace is built from (its licence allows test use, not copying)."""


def pftrace(folder: Path, limit: int = 300) -> Path:
    """A `.pftrace` in rocprofv3's layout with `limit` of PFTRACE_SOURCE's dispatches and a
    made-up launching call each (tools/make_pftrace.py), built into `folder`: the fuzzer's
    Perfetto corpus file (a protobuf; its mutants keep the suffix)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import make_pftrace

    out = folder / "rocprofv3.pftrace"
    make_pftrace.build(SHARED / "realtraces" / PFTRACE_SOURCE, out, limit=limit, synthetic_api=True,
                       group_by_queue=True)
    return out


def rocpd(folder: Path, limit: int = 300) -> Path:
    """A rocprofv3 rocpd database (`results.db`: the schema of tests/data/rocpd_schema_v3.sql)
    holding the first `limit` dispatches of PFTRACE_SOURCE and the HIP calls, roctx range and copy
    tests/test_rocpd.py adds, built into `folder` by that test's `build_rocpd`: no real one exists
    to fuzz (docs/amd.md)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_rocpd import UUID, build_rocpd

    out = folder / "results.db"
    build_rocpd(SHARED / "realtraces" / PFTRACE_SOURCE, out)
    con = sqlite3.connect(out)
    con.execute(f'DELETE FROM "rocpd_kernel_dispatch{UUID}" WHERE id > ?', [limit])
    used = " UNION ".join(f'SELECT {c} FROM "{t}{UUID}"' for t in ("rocpd_kernel_dispatch", "rocpd_region",
                                                                    "rocpd_memory_copy") for c in ("start_id", "end_id"))
    con.execute(f'DELETE FROM "rocpd_timestamp{UUID}" WHERE id NOT IN ({used})')
    events = " UNION ".join(f'SELECT event_id FROM "{t}{UUID}"' for t in ("rocpd_kernel_dispatch", "rocpd_region",
                                                                          "rocpd_memory_copy"))
    con.execute(f'DELETE FROM "rocpd_event{UUID}" WHERE id NOT IN ({events})')
    con.execute(f'DELETE FROM "rocpd_info_kernel_symbol{UUID}" WHERE id NOT IN '
                f'(SELECT kernel_id FROM "rocpd_kernel_dispatch{UUID}")')
    con.commit()
    con.execute("VACUUM")
    con.close()
    return out


def trace_format(path: Path) -> str:
    """The container a corpus file is in, which decides the mutations that apply to it."""
    if path.is_dir():  # nsys's parquetdir export: a folder of TABLE.parquet
        return "parquetdir"
    head = path.read_bytes()[:16]
    if head.startswith(b"\xff\xff\xff\xff"):  # nsys's arrow export: Arrow IPC streams
        return "arrow"
    if head.startswith(b"SQLite format 3\x00"):
        return "sqlite"
    if head.startswith(b"\x1f\x8b"):
        return "json.gz"
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    if path.suffix == ".csv":  # rocprof's CSV (a header row of quoted names)
        return "csv"
    if head[:1] == b"\x0a":  # protobuf: field 1, length-delimited (an XSpace's first plane, a Perfetto packet)
        return "protobuf"
    raise ValueError(f"{path}: no mutations for this format")


# ---------------------------------------------------------------------------------- mutations


class NotApplicable(Exception):
    """The mutation has nothing to act on in this file (no such column, say): pick another."""


class Mutation:
    """One kind of damage. `apply` writes the mutant at `dst` (a copy of the source is already
    there) and returns what it did in a few words."""

    name: str = ""
    formats: tuple[str, ...] = ()

    def apply(self, dst: Path, rng: random.Random) -> str:
        raise NotImplementedError


# Tables the readers read, the usual targets (others are hit a fifth of the time).
READ_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_DRIVER", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMCPY2",
    "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_MARKER", "CUPTI_ACTIVITY_KIND_MARKER_DATA",
    "CUPTI_ACTIVITY_KIND_DEVICE", "CUPTI_ACTIVITY_KIND_NAME", "NVTX_EVENTS", "CUDA_GPU_MEMORY_USAGE_EVENTS",
    "StringIds", "StringTable", "TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU", "META_DATA_EXPORT",
    "EXPORT_META_DATA", "TARGET_INFO_SESSION_START_TIME", "PROCESSES", "ThreadNames", "Version",
)
AMD_TABLES = ("rocpd_", "KERN")
"""Prefixes of the AMD databases' tables the readers read (RPD's `rocpd_op`..., rocprofv3's
`rocpd_kernel_dispatch_<uuid>`..., rocprof v1's `KERN`): usual targets too. No nsys or nvprof
table starts so, so their mutants are drawn as before."""
TIME_COLUMNS = ("start", "end", "timestamp")
AMD_TIME_COLUMNS = ("value", "DispatchNs", "BeginNs", "EndNs", "CompleteNs")
"""Times in the AMD tables besides start and end: rocpd_timestamp's value, rocprof v1's KERN."""


def _is_amd(table: str) -> bool:
    return table.startswith(AMD_TABLES)


def _time_columns(table: str, cols) -> list[str]:
    """The columns of `table` holding times (AMD_TIME_COLUMNS only in the AMD tables)."""
    return [c for c, _ in cols if c in TIME_COLUMNS or _is_amd(table) and c in AMD_TIME_COLUMNS]
STRING_ID_COLUMNS = {  # columns holding ids into StringIds (nsys) or StringTable (nvprof)
    "CUPTI_ACTIVITY_KIND_KERNEL": ("demangledName", "shortName", "mangledName", "name"),
    "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL": ("name",),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("nameId",),
    "NVTX_EVENTS": ("textId",),
    "CUPTI_ACTIVITY_KIND_MARKER": ("name", "domain"),
    "CUPTI_ACTIVITY_KIND_DEVICE": ("name",),
    "CUPTI_ACTIVITY_KIND_NAME": ("name",),
    "ThreadNames": ("nameId",),
}


class _Sql(Mutation):
    """A mutation made with SQL statements on the copy."""

    formats = ("sqlite",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        con = sqlite3.connect(dst)
        try:
            what = self.change(con, rng)
            con.commit()
        except sqlite3.DatabaseError as e:  # a constraint or a damaged copy: nothing to test
            raise NotApplicable(str(e)) from None
        finally:
            con.close()
        return what

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        raise NotImplementedError


def _tables(con: sqlite3.Connection) -> list[str]:
    return sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%'"))


def _columns(con: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    """(name, declared type) of each column."""
    return [(r[1], (r[2] or "").upper()) for r in con.execute(f'PRAGMA table_info("{table}")')]


def _pick_table(con: sqlite3.Connection, rng: random.Random, want=lambda t, cols: bool(cols)) -> str:
    """A table with rows for which `want(table, columns)` holds, mostly one the readers read."""
    tables = [t for t in _tables(con) if con.execute(f'SELECT 1 FROM "{t}" LIMIT 1').fetchone()
              and want(t, _columns(con, t))]
    read = [t for t in tables if t in READ_TABLES or _is_amd(t)]
    pool = read if read and rng.random() < 0.8 else tables
    if not pool:
        raise NotApplicable("no table to mutate")
    return rng.choice(pool)


def _where(con: sqlite3.Connection, table: str, rng: random.Random) -> tuple[str, str]:
    """A WHERE clause picking every row (a third of the time) or a few random ones, and how to
    say so. Row ids come from Python's generator, so the mutant is reproducible."""
    if rng.random() < 1 / 3:
        return "1", ""
    try:
        rowids = [r[0] for r in con.execute(f'SELECT rowid FROM "{table}"')]
    except sqlite3.OperationalError:  # WITHOUT ROWID
        return "1", ""
    chosen = rng.sample(rowids, min(len(rowids), rng.choice((1, 1, 2, 5, 20))))
    return f"rowid IN ({', '.join(map(str, chosen))})", f" in {len(chosen)} rows"


def _execute(con: sqlite3.Connection, table: str, sql: str, params: Sequence[object] = ()) -> None:
    """`sql` on `table`; where a constraint (NOT NULL, a typed key) refuses it, `table` is rebuilt
    without its constraints first, as a tool that rewrites a file without them would leave it."""
    try:
        con.execute(sql, params)
    except sqlite3.IntegrityError:
        _relax(con, table)
        con.execute(sql, params)


def _relax(con: sqlite3.Connection, table: str, drop: str | None = None) -> None:
    """Rebuild `table` with the same rows (less column `drop`) and no constraints."""
    keep = ", ".join(f'"{c}"' for c, _ in _columns(con, table) if c != drop)
    con.execute(f'CREATE TABLE "traceq_fuzz_tmp" AS SELECT {keep} FROM "{table}"')
    con.execute(f'DROP TABLE "{table}"')
    con.execute(f'ALTER TABLE "traceq_fuzz_tmp" RENAME TO "{table}"')


def _integer_columns(cols: Sequence[tuple[str, str]]) -> list[str]:
    return [c for c, t in cols if "INT" in t]


def _update(con: sqlite3.Connection, table: str, column: str, value: object, rng: random.Random,
            label: str) -> str:
    where, rows = _where(con, table, rng)
    _execute(con, table, f'UPDATE "{table}" SET "{column}" = ? WHERE {where}', [value])
    return f"{table}.{column} = {label}{rows}"


class SetNull(_Sql):
    name = "set_null"

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        table = _pick_table(con, rng)
        columns = [c for c, _ in _columns(con, table)]
        chosen = rng.sample(columns, min(len(columns), rng.choice((1, 1, 2))))
        where, rows = _where(con, table, rng)
        assignments = ", ".join(f'"{c}" = NULL' for c in chosen)
        _execute(con, table, f'UPDATE "{table}" SET {assignments} WHERE {where}')
        return f"{table}.{','.join(chosen)} = NULL{rows}"


class TextInInteger(_Sql):
    name = "text_in_int"
    VALUES = ("abc", "", "12x", "NaN", "éé", " 7", "0x10", "1e400", "9999999999999999999999999")

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        table = _pick_table(con, rng, lambda t, cols: bool(_integer_columns(cols)))
        column = rng.choice(_integer_columns(_columns(con, table)))
        value = rng.choice(self.VALUES)
        return _update(con, table, column, value, rng, repr(value))


class NonFinite(TextInInteger):
    """Floats in integer columns: SQLite keeps 1e400 as Inf, 1e22 and 2.5 as REAL."""

    name = "nonfinite"
    VALUES = (float("inf"), float("-inf"), 1e22, -1e19, 2.5, -0.5)


class ExtremeTimestamp(_Sql):
    name = "bad_ts"
    VALUES = (0, -1, 1, -(2**63), 2**63 - 1, 2**62, -(2**62), 10**18, 2**53, -(10**15))

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        table = _pick_table(con, rng, lambda t, cols: bool(_time_columns(t, cols)))
        column = rng.choice(_time_columns(table, _columns(con, table)))
        value = rng.choice(self.VALUES)
        return _update(con, table, column, value, rng, str(value))


class EndBeforeStart(_Sql):
    name = "end_lt_start"

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        table = _pick_table(con, rng, lambda t, cols: {"start", "end"} <= {c for c, _ in cols}
                            or t == "KERN" and {"BeginNs", "EndNs"} <= {c for c, _ in cols})
        start, end = ("BeginNs", "EndNs") if table == "KERN" else ("start", "end")
        where, rows = _where(con, table, rng)
        gap = rng.choice((1, 1000, 10**9))
        _execute(con, table, f'UPDATE "{table}" SET "{end}" = "{start}" - {gap} WHERE {where} AND "{start}" IS NOT NULL')
        return f"{table}.{end} = {start} - {gap}{rows}"


class DanglingStringId(_Sql):
    """String ids that resolve to nothing: ids past the string table, or strings deleted."""

    name = "dangling_id"

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        tables = _tables(con)
        strings = "StringIds" if "StringIds" in tables else "StringTable"
        if strings not in tables:
            return self.amd(con, tables, rng)
        key = "id" if strings == "StringIds" else "_id_"
        if rng.random() < 0.3:
            ids = [r[0] for r in con.execute(f'SELECT "{key}" FROM {strings}')]
            gone = rng.sample(ids, min(len(ids), rng.choice((1, 5, 50))))
            con.execute(f'DELETE FROM {strings} WHERE "{key}" IN ({", ".join(map(str, gone))})')
            return f"{len(gone)} rows of {strings} deleted"
        table = _pick_table(con, rng, lambda t, cols: any(c in STRING_ID_COLUMNS.get(t, ()) for c, _ in cols))
        column = rng.choice([c for c, _ in _columns(con, table) if c in STRING_ID_COLUMNS.get(table, ())])
        top = con.execute(f'SELECT max("{key}") FROM {strings}').fetchone()[0] or 0
        value = rng.choice((top + 1, top + 1000, -5, 2**31, 2**62))
        return _update(con, table, column, value, rng, str(value))


    AMD_IDS = ("description_id", "opType_id", "apiName_id", "args_id", "name_id", "category_id", "kernel_id")
    """Columns of the AMD databases holding ids into their string (or kernel symbol) table."""

    def amd(self, con: sqlite3.Connection, tables: list[str], rng: random.Random) -> str:
        """RPD's and rocpd's string table (`rocpd_string`, `rocpd_string_<uuid>`): rows deleted, or ids
        into it made to point nowhere."""
        strings = next((t for t in tables if t.startswith("rocpd_string")), None)
        if strings is None:
            raise NotApplicable("no string table")
        if rng.random() < 0.3:
            ids = [r[0] for r in con.execute(f'SELECT id FROM "{strings}"')]
            gone = rng.sample(ids, min(len(ids), rng.choice((1, 5, 50))))
            con.execute(f'DELETE FROM "{strings}" WHERE id IN ({", ".join(map(str, gone))})')
            return f"{len(gone)} rows of {strings} deleted"
        table = _pick_table(con, rng, lambda t, cols: _is_amd(t) and any(c in self.AMD_IDS for c, _ in cols))
        column = rng.choice([c for c, _ in _columns(con, table) if c in self.AMD_IDS])
        top = con.execute(f'SELECT max(id) FROM "{strings}"').fetchone()[0] or 0
        value = rng.choice((top + 1, top + 1000, -5, 2**31, 2**62))
        return _update(con, table, column, value, rng, str(value))


class BadUtf8(_Sql):
    name = "bad_utf8"
    VALUES = (b"\xcc\xff", b"conv\xc3(", b"\xed\xa0\x80", b"\x00\xfe")

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        table = _pick_table(con, rng, lambda t, cols: any("CHAR" in ty or "TEXT" in ty for _, ty in cols))
        column = rng.choice([c for c, ty in _columns(con, table) if "CHAR" in ty or "TEXT" in ty])
        value = rng.choice(self.VALUES)
        where, rows = _where(con, table, rng)
        _execute(con, table, f'UPDATE "{table}" SET "{column}" = CAST(coalesce("{column}", \'\') || CAST(? AS TEXT) '
                 f"AS TEXT) WHERE {where}", [value])
        return f"{table}.{column} += {value!r}{rows}"


class DropTable(_Sql):
    name = "drop_table"

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        table = _pick_table(con, rng, lambda t, cols: True)
        con.execute(f'DROP TABLE "{table}"')
        return f"DROP TABLE {table}"


class DropColumn(_Sql):
    """A column dropped; where SQLite refuses (a key or index uses it), the table is rebuilt
    without it ("relaxed": its constraints go too)."""

    name = "drop_column"

    def change(self, con: sqlite3.Connection, rng: random.Random) -> str:
        table = _pick_table(con, rng, lambda t, cols: len(cols) > 1)
        cols = [c for c, _ in _columns(con, table)]
        column = rng.choice(cols)
        try:
            con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
            return f"{table}.{column} dropped"
        except sqlite3.OperationalError:
            _relax(con, table, drop=column)
            return f"{table}.{column} dropped (relaxed)"


class _Bytes(Mutation):
    """Damage to the file's bytes, as a disk or a copy makes it."""

    formats = ("sqlite",)

    @staticmethod
    def page_size(data: bytes) -> int:
        size = int.from_bytes(data[16:18], "big")
        return 65536 if size == 1 else size or 4096


class ByteFlip(_Bytes):
    name = "byteflip"

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = bytearray(dst.read_bytes())
        page = self.page_size(data)
        pages = rng.sample(range(len(data) // page), min(len(data) // page, rng.choice((1, 2, 3))))
        for p in pages:
            for _ in range(rng.choice((1, 4, 16))):
                data[p * page + rng.randrange(page)] ^= 1 << rng.randrange(8)
        dst.write_bytes(bytes(data))
        return f"bits flipped in pages {pages}"


class ZeroPages(_Bytes):
    name = "zeropage"

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = bytearray(dst.read_bytes())
        page = self.page_size(data)
        pages = rng.sample(range(1, len(data) // page), min(len(data) // page - 1, rng.choice((1, 2, 3))))
        for p in pages:
            data[p * page:(p + 1) * page] = bytes(page)
        dst.write_bytes(bytes(data))
        return f"pages {pages} zeroed"


class Truncate(_Bytes):
    name = "truncate"

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = dst.read_bytes()
        keep = rng.randrange(1, len(data))
        dst.write_bytes(data[:keep])
        return f"cut at byte {keep:,} of {len(data):,}"


# --- protobuf (XPlane) --------------------------------------------------------------------------
# Damage to the wire format itself: flipped bytes (a varint's continuation bit, a length, a field
# number or wire type), a cut, a length that points past the end, a nested message's bytes zeroed.


class ProtoBytes(Mutation):
    name = "proto-bytes"
    formats = ("protobuf",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = bytearray(dst.read_bytes())
        where = sorted(rng.randrange(len(data)) for _ in range(rng.choice((1, 2, 8, 64))))
        for i in where:
            data[i] = rng.choice((0x00, 0xFF, 0x80, 0x7F, data[i] ^ (1 << rng.randrange(8))))
        dst.write_bytes(bytes(data))
        return f"{len(where)} bytes changed from byte {where[0]:,}"


class ProtoTruncate(Mutation):
    name = "proto-truncate"
    formats = ("protobuf",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = dst.read_bytes()
        keep = rng.randrange(1, len(data))
        dst.write_bytes(data[:keep])
        return f"cut at byte {keep:,} of {len(data):,}"


class ProtoLength(Mutation):
    """The first plane's length varint made larger than the file, or a 10-byte varint of all ones."""

    name = "proto-length"
    formats = ("protobuf",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = dst.read_bytes()
        pos = 1
        while data[pos] & 0x80:
            pos += 1
        bogus = rng.choice((b"\xff" * 9 + b"\x01", b"\xff\xff\xff\xff\x0f", b"\xff" * 11))
        dst.write_bytes(data[:1] + bogus + data[pos + 1:])
        return f"first length varint replaced by {bogus.hex()}"


# --- Kineto JSON (plain and gzip) ---------------------------------------------------------------
# A JSON mutation reads the trace (gunzipped), changes some events and writes it back in the same
# container, one event a line as Kineto does. Numbers keep their text (`Raw`), so an undamaged
# value is written exactly as it was read.


class Raw(str):
    """JSON text written as it is: a number as read, or a literal no encoder writes (NaN, 1e400)."""


def _dump(value: object) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dump(v) for v in value) + "]"
    return json.dumps(value)


def _read_json(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _write_json(path: Path, text: bytes, like: bytes) -> None:
    """`text` written to `path`, gzip-compressed (reproducibly: no time stamp) when `like` was."""
    path.write_bytes(gzip.compress(text, mtime=0) if like[:2] == b"\x1f\x8b" else text)


# Events the reader makes rows of (ingest/kineto.py `_KIND`): the usual targets.
READ_CATEGORIES = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_runtime", "Runtime",
                   "cuda_driver", "cpu_op", "Operator", "user_annotation", "gpu_user_annotation"}
EVENT_FIELDS = ("ts", "dur", "ph", "cat", "name", "pid", "tid", "args")
NUMBER_FIELDS = ("ts", "dur", "args.correlation", "args.device", "args.stream", "args.grid", "args.block",
                 "args.bytes", "args.Bytes", "args.Total Allocated", "args.Addr", "args.Device Type",
                 "args.External id", "args.registers per thread", "args.shared memory", "args.flops",
                 "args.est. achieved occupancy %", "args.In msg nelems", "pid", "tid")


class _Json(Mutation):
    """A mutation of some events of a Kineto trace, parsed and written back."""

    formats = ("json", "json.gz")

    def apply(self, dst: Path, rng: random.Random) -> str:
        raw = dst.read_bytes()
        try:
            doc = json.loads(_read_json(dst), parse_float=Raw, parse_int=Raw, parse_constant=Raw)
        except ValueError as e:  # not a whole JSON document: nothing to act on
            raise NotApplicable(str(e)) from None
        events = doc if isinstance(doc, list) else doc.get("traceEvents")
        if not isinstance(events, list) or not events:
            raise NotApplicable("no traceEvents")
        what = self.change(doc, events, rng)
        _write_json(dst, self.encode(doc), raw)
        return what

    def change(self, doc: dict | list, events: list, rng: random.Random) -> str:
        raise NotImplementedError

    def encode(self, doc: dict | list) -> bytes:
        events = doc if isinstance(doc, list) else doc["traceEvents"]
        body = "[\n  " + ",\n  ".join(_dump(e) for e in events) + "\n]" if isinstance(events, list) else _dump(events)
        if isinstance(doc, list):
            return body.encode()
        keys = [f"{json.dumps(k)}: {body if k == 'traceEvents' else _dump(v)}" for k, v in doc.items()]
        return ("{\n  " + ",\n  ".join(keys) + "\n}\n").encode()


def _pick_events(events: list, rng: random.Random, want=lambda e: True) -> tuple[list[dict], str]:
    """Some event objects for which `want(event)` holds, mostly ones the reader reads: all of
    them a third of the time, else 1 to 20; and how to say so."""
    objects = [e for e in events if isinstance(e, dict) and want(e)]
    read = [e for e in objects if e.get("cat") in READ_CATEGORIES or e.get("ph") == "M" or e.get("name") == "[memory]"]
    pool = read if read and rng.random() < 0.8 else objects
    if not pool:
        raise NotApplicable("no event to mutate")
    if rng.random() < 1 / 3:
        return pool, f" in all {len(pool)} such events"
    chosen = rng.sample(pool, min(len(pool), rng.choice((1, 1, 2, 5, 20))))
    return chosen, f" in {len(chosen)} events"


def _pick_key(events: list, keys: Sequence[str], rng: random.Random) -> str:
    """One of `keys` that some event has (so that a class rarely finds nothing to act on)."""
    present = [k for k in keys if any(isinstance(e, dict) and _has(e, k) for e in events)]
    if not present:
        raise NotApplicable("no such field")
    return rng.choice(present)


def _has(event: dict, key: str) -> bool:
    head, _, rest = key.partition(".")
    return head in event and (not rest or isinstance(event[head], dict) and rest in event[head])


def _set(event: dict, key: str, value: object) -> None:
    head, _, rest = key.partition(".")
    if rest:
        if not isinstance(event.get(head), dict):
            event[head] = {}
        event[head][rest] = value
    else:
        event[head] = value


class JsonWrongType(_Json):
    """A field of another JSON type: text for a number, a number for text, a list, an object, null."""

    name = "json_wrong_type"
    VALUES = ("abc", "", "12", "1e3", [], {}, [1, "x"], None, True, 3.5, -7, {"a": 1})

    def change(self, doc, events, rng):
        key = _pick_key(events, EVENT_FIELDS + NUMBER_FIELDS, rng)
        chosen, where = _pick_events(events, rng, lambda e: _has(e, key))
        value = rng.choice(self.VALUES)
        for event in chosen:
            _set(event, key, value)
        return f"{key} = {json.dumps(value)}{where}"


class JsonMissingField(_Json):
    name = "json_missing"

    def change(self, doc, events, rng):
        key = _pick_key(events, EVENT_FIELDS + NUMBER_FIELDS, rng)
        chosen, where = _pick_events(events, rng, lambda e: _has(e, key))
        head, _, rest = key.partition(".")
        for event in chosen:
            del (event[head] if rest else event)[rest or head]
        return f"{key} removed{where}"


class JsonNumber(_Json):
    """A number out of any range traceq reads: NaN and Infinity (JSON has neither, Python's and
    some C++ writers emit them), past 64 bits, negative, with 400 digits."""

    name = "json_number"
    VALUES = ("NaN", "Infinity", "-Infinity", "1e30", "-1e18", str(2**63), str(2**64 + 5), "1" + "0" * 400,
              "1e400", "-5", "0", "-0.0005", "9007199254740993.5")

    def change(self, doc, events, rng):
        key = _pick_key(events, NUMBER_FIELDS[:8] if rng.random() < 0.7 else NUMBER_FIELDS, rng)
        chosen, where = _pick_events(events, rng, lambda e: _has(e, key))
        value = rng.choice(self.VALUES)
        for event in chosen:
            _set(event, key, Raw(value))
        return f"{key} = {value[:24]}{where}"


class JsonDuplicateKey(_Json):
    """A key written twice in an event (JSON allows it; parsers keep the first or the last)."""

    name = "json_dup_key"

    def change(self, doc, events, rng):
        key = rng.choice(("ts", "dur", "ph", "cat", "name", "args"))
        chosen, where = _pick_events(events, rng, lambda e: key in e)
        value = rng.choice((Raw("-1"), Raw("1e30"), "x", None, {}, Raw("0")))
        first = rng.random() < 0.5
        for i, event in enumerate(events):
            if any(event is c for c in chosen):
                extra = f"{json.dumps(key)}: {_dump(value)}"
                text = _dump(event)
                events[i] = Raw("{" + extra + ", " + text[1:] if first else text[:-1] + ", " + extra + "}")
        return f"{key} again ({_dump(value)}, {'before' if first else 'after'} the original){where}"


class JsonBadUtf8(_Json):
    """Bytes that are not UTF-8 in a name or category."""

    name = "json_bad_utf8"
    MARK = "traceq-fuzz-not-utf8"
    VALUES = (b"\xcc\xff", b"conv\xc3(", b"\xed\xa0\x80", b"\xfe")

    def change(self, doc, events, rng):
        key = _pick_key(events, ("name", "cat", "args.stream", "args.name"), rng)
        chosen, where = _pick_events(events, rng, lambda e: _has(e, key))
        self.value = rng.choice(self.VALUES)
        for event in chosen:
            _set(event, key, self.MARK)
        return f"{key} = {self.value!r}{where}"

    def encode(self, doc):
        return super().encode(doc).replace(self.MARK.encode(), self.value)


class JsonNotEvents(_Json):
    """traceEvents not a list of event objects: another type, or some elements that are not objects."""

    name = "json_not_events"
    VALUES = ({}, "x", None, 5, [], Raw("NaN"))

    def change(self, doc, events, rng):
        if isinstance(doc, dict) and rng.random() < 0.4:
            value = rng.choice(self.VALUES)
            doc["traceEvents"] = value
            return f"traceEvents = {_dump(value)}"
        value = rng.choice((5, "x", [], None, [{"ph": "X"}], True))
        positions = rng.sample(range(len(events)), min(len(events), rng.choice((1, 3))))
        for i in positions:
            events[i] = value
        return f"traceEvents{positions} = {json.dumps(value)}"


class JsonTruncate(Mutation):
    """The JSON text cut short (then compressed again when the file was gzip)."""

    name = "json_truncate"
    formats = ("json", "json.gz")

    def apply(self, dst: Path, rng: random.Random) -> str:
        raw = dst.read_bytes()
        text = _read_json(dst)
        keep = rng.randrange(0, len(text))
        _write_json(dst, text[:keep], raw)
        return f"JSON text cut at byte {keep:,} of {len(text):,}"


class GzipDamage(Mutation):
    """A gzip file damaged: bits flipped in its stream, cut short, a wrong CRC or size in its
    trailer, bytes after its end."""

    name = "gzip_damage"
    formats = ("json.gz",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = bytearray(dst.read_bytes())
        how = rng.choice(("flip", "cut", "crc", "size", "trailing"))
        if how == "flip":
            at = rng.randrange(10, len(data) - 8)
            data[at] ^= 1 << rng.randrange(8)
            what = f"a bit flipped at byte {at:,}"
        elif how == "cut":
            keep = rng.randrange(1, len(data))
            del data[keep:]
            what = f"cut at byte {keep:,} of {len(data):,}"
        elif how in ("crc", "size"):
            at = len(data) - (8 if how == "crc" else 4) + rng.randrange(4)
            data[at] ^= 0xFF
            what = f"its trailer's {how.upper() if how == 'crc' else how} wrong"
        else:
            data += bytes(rng.randrange(256) for _ in range(rng.choice((1, 10, 100))))
            what = "bytes after its end"
        dst.write_bytes(bytes(data))
        return what


# --- CSV (rocprof) ------------------------------------------------------------------------------
# rocprof v1's results.csv and rocprofv3's kernel_trace.csv: a cell changed (empty, text in a
# number, a huge or negative number, an unclosed quote), rows cut short, bytes that are not UTF-8.


class CsvCell(Mutation):
    name = "csv_cell"
    formats = ("csv",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        lines = dst.read_bytes().split(b"\n")
        rows = [i for i, line in enumerate(lines) if i and line.strip()]
        if not rows:
            raise NotApplicable("no data row")
        i = rng.choice(rows)
        cells = lines[i].split(b",")
        j = rng.randrange(len(cells))
        value = rng.choice((b"", b"abc", b"-1", b"1e400", b"99999999999999999999999", b'"unclosed', b"NaN",
                            b"0x10", b"-9223372036854775809"))
        cells[j] = value
        lines[i] = b",".join(cells)
        dst.write_bytes(b"\n".join(lines))
        return f"row {i} cell {j} = {value.decode()!r}"


class CsvTruncate(Mutation):
    name = "csv_truncate"
    formats = ("csv",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = dst.read_bytes()
        keep = rng.randrange(1, len(data))
        dst.write_bytes(data[:keep])
        return f"cut at byte {keep:,} of {len(data):,}"


class CsvBytes(Mutation):
    name = "csv_bytes"
    formats = ("csv",)

    def apply(self, dst: Path, rng: random.Random) -> str:
        data = bytearray(dst.read_bytes())
        where = sorted(rng.randrange(len(data)) for _ in range(rng.choice((1, 4, 32))))
        for i in where:
            data[i] = rng.choice((0x00, 0xFF, 0x22, 0x2C, 0x0A, data[i] ^ (1 << rng.randrange(8))))
        dst.write_bytes(bytes(data))
        return f"{len(where)} bytes changed from byte {where[0]:,}"


# --- nsys Arrow and Parquet exports (`nsys export --type arrow|parquetdir`) ------------------------
# The export's tables are read with pyarrow, one changed and written back in the same form (a
# folder of TABLE.parquet, or one file of Arrow IPC streams, each schema naming its table): a
# table or column gone, values NULL, of another type, out of range, string ids that resolve to
# nothing, text that is not UTF-8 (as binary); or the bytes of one file flipped or cut.

COLUMNAR_READ = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                 "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS", "StringIds", "TARGET_INFO_GPU", "PROCESSES",
                 "ThreadNames", "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME")
"""The export's tables the reader reads (ingest/nsys_arrow.py: its event tables and STAGED), the usual targets."""


def _export_tables(path: Path) -> list[tuple[str, object]]:
    """(name, pyarrow Table) of each table of an export, in file order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import ipc

    if path.is_dir():
        return [(p.stem, pq.read_table(p)) for p in sorted(path.glob("*.parquet"))]
    out = []
    with pa.BufferReader(path.read_bytes()) as source:  # not mapped: the file is rewritten while they live
        while source.tell() < source.size():
            reader = ipc.open_stream(source)
            table = reader.read_all()
            out.append(((reader.schema.metadata or {}).get(b"table_name", b"?").decode(), table))
    return out


def _write_export(path: Path, tables: list[tuple[str, object]]) -> None:
    """The tables written back in the export's form, each schema keeping its table name."""
    import pyarrow.parquet as pq
    from pyarrow import ipc

    if path.is_dir():
        for p in path.glob("*.parquet"):
            p.unlink()
        for name, table in tables:
            pq.write_table(table, path / f"{name}.parquet")
        return
    with path.open("wb") as f:
        for _, table in tables:
            with ipc.new_stream(f, table.schema) as writer:
                writer.write_table(table)


def _named(table, name: str):
    """`table` with its schema's metadata saying its table name (kept where a column changed)."""
    meta = dict(table.schema.metadata or {})
    meta[b"table_name"] = name.encode()
    return table.replace_schema_metadata(meta)


class _Columnar(Mutation):
    """A change to one table of an nsys Arrow or Parquet export."""

    formats = ("parquetdir", "arrow")

    def apply(self, dst: Path, rng: random.Random) -> str:
        tables = _export_tables(dst)
        with_rows = [(i, name) for i, (name, t) in enumerate(tables) if t.num_rows and self.wants(t)]
        read = [(i, name) for i, name in with_rows if name in COLUMNAR_READ]
        pool = read if read and rng.random() < 0.8 else with_rows
        if not pool:
            raise NotApplicable("no table to change")
        i, name = rng.choice(pool)
        new, what = self.change(tables[i][1], rng)
        if new is None:
            del tables[i]
        else:
            tables[i] = (name, _named(new, name))
        _write_export(dst, tables)
        return f"{name}: {what}"

    def wants(self, table) -> bool:
        return True

    def change(self, table, rng: random.Random):
        """(the changed table, or None to drop it; what was done)."""
        raise NotImplementedError


def _rows(n: int, rng: random.Random) -> tuple[list[int], str]:
    if rng.random() < 1 / 3:
        return list(range(n)), ""
    chosen = rng.sample(range(n), min(n, rng.choice((1, 1, 2, 5, 20))))
    return chosen, f" in {len(chosen)} rows"


def _set_values(table, column: str, rows: list[int], value: object):
    """`column` with `value` at `rows`: in the column's type where it holds the value, else in
    the type pyarrow infers (an int column turned to text, say)."""
    import pyarrow as pa

    values = table[column].to_pylist()
    for r in rows:
        values[r] = value
    try:
        array = pa.array(values, table[column].type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        try:
            array = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            array = pa.array([None if v is None else str(v) for v in values], pa.large_string())
    return table.set_column(table.schema.get_field_index(column), pa.field(column, array.type), array)


def _int_columns(table) -> list[str]:
    import pyarrow.types as t

    return [f.name for f in table.schema if t.is_integer(f.type)]


class ColumnarDropTable(_Columnar):
    name = "col_drop_table"

    def change(self, table, rng):
        return None, "table removed"


class ColumnarDropColumn(_Columnar):
    name = "col_drop_column"

    def wants(self, table):
        return table.num_columns > 1

    def change(self, table, rng):
        column = rng.choice(table.column_names)
        return table.drop_columns([column]), f"{column} dropped"


class ColumnarSetNull(_Columnar):
    name = "col_set_null"

    def change(self, table, rng):
        column = rng.choice(table.column_names)
        rows, where = _rows(table.num_rows, rng)
        return _set_values(table, column, rows, None), f"{column} = NULL{where}"


class ColumnarWrongType(_Columnar):
    """Text, floats or non-finite values in a number column (the column's type changes with them)."""

    name = "col_wrong_type"
    VALUES = ("abc", "", "12x", "NaN", float("inf"), float("-inf"), 2.5, 1e22, -1e19, True)

    def wants(self, table):
        return bool(_int_columns(table))

    def change(self, table, rng):
        column = rng.choice(_int_columns(table))
        value = rng.choice(self.VALUES)
        rows, where = _rows(table.num_rows, rng)
        return _set_values(table, column, rows, value), f"{column} = {value!r}{where}"


class ColumnarBadTimestamp(_Columnar):
    name = "col_bad_ts"
    VALUES = ExtremeTimestamp.VALUES + (2**64 - 1,)

    def wants(self, table):
        return any(c in TIME_COLUMNS for c in table.column_names)

    def change(self, table, rng):
        column = rng.choice([c for c in table.column_names if c in TIME_COLUMNS])
        value = rng.choice(self.VALUES)
        rows, where = _rows(table.num_rows, rng)
        return _set_values(table, column, rows, value), f"{column} = {value}{where}"


class ColumnarEndBeforeStart(_Columnar):
    name = "col_end_lt_start"

    def wants(self, table):
        return {"start", "end"} <= set(table.column_names)

    def change(self, table, rng):
        import pyarrow as pa

        gap = rng.choice((1, 1000, 10**9))
        rows, where = _rows(table.num_rows, rng)
        starts, ends = table["start"].to_pylist(), table["end"].to_pylist()
        for r in rows:
            ends[r] = None if starts[r] is None else starts[r] - gap
        array = pa.array(ends, table["end"].type if min((e for e in ends if e is not None), default=0) >= 0
                         or not pa.types.is_unsigned_integer(table["end"].type) else pa.int64())
        return table.set_column(table.schema.get_field_index("end"), pa.field("end", array.type), array), \
            f"end = start - {gap}{where}"


class ColumnarDanglingId(_Columnar):
    """String ids past the string table, negative or huge (StringIds rows deleted, a third of the time)."""

    name = "col_dangling_id"
    COLUMNS = ("nameId", "textId", "demangledName", "shortName", "mangledName", "name", "domainId")

    def wants(self, table):
        return any(c in self.COLUMNS and c in _int_columns(table) for c in table.column_names) or \
            "value" in table.column_names and "id" in table.column_names

    def change(self, table, rng):
        columns = [c for c in _int_columns(table) if c in self.COLUMNS]
        if not columns or rng.random() < 0.3:
            if "id" not in table.column_names:
                raise NotApplicable("no string id column")
            keep = sorted(rng.sample(range(table.num_rows), max(0, table.num_rows - rng.choice((1, 5, 50)))))
            return table.take(keep), f"{table.num_rows - len(keep)} rows deleted"
        column = rng.choice(columns)
        value = rng.choice((10**6, -5, 2**31, 2**62))
        rows, where = _rows(table.num_rows, rng)
        return _set_values(table, column, rows, value), f"{column} = {value}{where}"


class ColumnarBadUtf8(_Columnar):
    """A text column's bytes made not UTF-8: the column becomes binary (an Arrow string must be UTF-8)."""

    name = "col_bad_utf8"
    VALUES = (b"\xcc\xff", b"conv\xc3(", b"\xed\xa0\x80", b"\x00\xfe")

    def wants(self, table):
        import pyarrow.types as t

        return any(t.is_string(f.type) or t.is_large_string(f.type) for f in table.schema)

    def change(self, table, rng):
        import pyarrow as pa
        import pyarrow.types as t

        column = rng.choice([f.name for f in table.schema if t.is_string(f.type) or t.is_large_string(f.type)])
        value = rng.choice(self.VALUES)
        rows, where = _rows(table.num_rows, rng)
        values = [None if v is None else v.encode() for v in table[column].to_pylist()]
        for r in rows:
            values[r] = (values[r] or b"") + value
        array = pa.array(values, pa.large_binary())
        return table.set_column(table.schema.get_field_index(column), pa.field(column, array.type), array), \
            f"{column} += {value!r}{where}"


class ColumnarBytes(Mutation):
    """Bytes of the export changed (of one table's file, in a folder), or the file cut short."""

    name = "col_bytes"
    formats = ("parquetdir", "arrow")

    def apply(self, dst: Path, rng: random.Random) -> str:
        target = dst
        if dst.is_dir():
            files = sorted(dst.glob("*.parquet"))
            read = [p for p in files if p.stem in COLUMNAR_READ]
            target = rng.choice(read if read and rng.random() < 0.8 else files)
        data = bytearray(target.read_bytes())
        label = target.name if dst.is_dir() else ""
        if rng.random() < 0.3:
            keep = rng.randrange(1, len(data))
            target.write_bytes(bytes(data[:keep]))
            return f"{label} cut at byte {keep:,} of {len(data):,}".strip()
        where = sorted(rng.randrange(len(data)) for _ in range(rng.choice((1, 2, 8, 64))))
        for i in where:
            data[i] = rng.choice((0x00, 0xFF, 0x80, 0x7F, data[i] ^ (1 << rng.randrange(8))))
        target.write_bytes(bytes(data))
        return f"{label} {len(where)} bytes changed from byte {where[0]:,}".strip()


MUTATIONS: tuple[Mutation, ...] = (
    ByteFlip(), ZeroPages(), Truncate(), DropTable(), DropColumn(), SetNull(), TextInInteger(),
    NonFinite(), ExtremeTimestamp(), EndBeforeStart(), DanglingStringId(), BadUtf8(),
    JsonTruncate(), JsonWrongType(), JsonMissingField(), JsonNumber(), JsonDuplicateKey(), JsonBadUtf8(),
    JsonNotEvents(), GzipDamage(), ProtoBytes(), ProtoTruncate(), ProtoLength(), CsvCell(), CsvTruncate(),
    CsvBytes(), ColumnarDropTable(), ColumnarDropColumn(), ColumnarSetNull(), ColumnarWrongType(),
    ColumnarBadTimestamp(), ColumnarEndBeforeStart(), ColumnarDanglingId(), ColumnarBadUtf8(), ColumnarBytes(),
)
"""Every mutation class; a mutant's class is drawn uniformly among those for its file's format."""


# ---------------------------------------------------------------------------------- checking


@dataclass
class Outcome:
    """What one mutant did. `problems` is empty when every property held."""

    index: int
    source: str
    mutation: str
    what: str
    result: str = ""  # 'refused', 'loaded', or 'skipped' (the mutation did not apply)
    message: str = ""  # the refusal, or the load's summary line
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Harness:
    """Makes and checks mutants in a scratch folder, against a store holding `base` (BASE_TRACE;
    None: no store, for making mutants only)."""

    def __init__(self, files: Sequence[Path], seed: str, workdir: Path, mutations: Sequence[Mutation] = MUTATIONS,
                 base: Path | None = BASE_TRACE, commands: Sequence[tuple[str, ...]] = COMMANDS):
        from typer.testing import CliRunner

        from traceq.cli import app

        self.app, self.runner = app, CliRunner()
        self.files = list(files)
        self.formats = {p: trace_format(p) for p in self.files}
        self.seed = seed
        self.mutations = list(mutations)
        self.commands = list(commands)
        self.work = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.base = workdir / "base.duckdb"
        if base is not None:
            result = self.runner.invoke(app, ["load", str(base), "--db", str(self.base)])
            if result.exit_code != 0:
                raise RuntimeError(f"cannot make the base store: {result.output}")
            self.base_rows = _fingerprint(self.base, 1)

    def mutant(self, index: int) -> tuple[Path, Outcome]:
        """Mutant `index` of this seed, written to the work folder."""
        rng = random.Random(f"{self.seed}:{index}")
        source = rng.choice(self.files)
        kinds = [m for m in self.mutations if self.formats[source] in m.formats]
        for _ in range(20):  # another mutation when one finds nothing to act on
            mutation = rng.choice(kinds)
            dst = self.work / f"m{index}_{mutation.name}{_suffix(source)}"
            _copy(source, dst)
            try:
                what = mutation.apply(dst, rng)
                return dst, Outcome(index, source.name, mutation.name, what)
            except NotApplicable:
                _remove(dst)
        return dst, Outcome(index, source.name, "none", "no mutation applied", result="skipped")

    def check(self, index: int) -> Outcome:
        """Make mutant `index` and check it; the mutant is deleted unless a property failed."""
        path, outcome = self.mutant(index)
        if outcome.result != "skipped":
            self.check_file(path, outcome)
            if not outcome.problems:
                _remove(path)
        return outcome

    def check_file(self, path: Path, outcome: Outcome | None = None) -> Outcome:
        """Load `path` into a copy of the base store and check every property (module docstring)."""
        started = time.perf_counter()
        outcome = outcome or Outcome(-1, path.name, "given", "as it is")
        db = self.work / "store.duckdb"
        shutil.copyfile(self.base, db)
        before = _digest(db)
        load = self._invoke(["load", str(path), "--db", str(db)], "load", outcome)
        if load is None:
            pass
        elif load.exit_code == 1:
            outcome.result, outcome.message = "refused", load.stderr.strip()
            if _digest(db) != before or Path(f"{db}.wal").exists():
                outcome.problems.append("store changed by a refused load")
        elif load.exit_code == 0:
            outcome.result, outcome.message = "loaded", load.stdout.strip()
            if _fingerprint(db, 1) != self.base_rows:
                outcome.problems.append("the earlier trace changed")
            for command in self.commands:
                extra = ["-o", str(self.work / "report.html")] if command == ("report",) else []
                self._invoke([*command, "--db", str(db), *extra], " ".join(command), outcome)
        outcome.seconds = round(time.perf_counter() - started, 3)
        return outcome

    def _invoke(self, args: list[str], label: str, outcome: Outcome):
        result = self.runner.invoke(self.app, args)
        try:
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                outcome.problems.append(f"{label}: traceback {signature(result.exception)}")
                return None
            if result.exit_code not in (0, 1):
                outcome.problems.append(f"{label}: exit status {result.exit_code}")
            elif result.exit_code == 1:
                lines = result.stderr.strip().splitlines()
                if len(lines) != 1 or not lines[0].startswith("traceq: "):
                    outcome.problems.append(f"{label}: refused with {len(lines)} lines: {result.stderr.strip()[:200]}")
            return result
        finally:
            gc.collect()  # a failed command's traceback holds its store connection open


def _copy(source: Path, dst: Path) -> None:
    """A copy of a corpus file, or of an export folder (parquetdir)."""
    if source.is_dir():
        shutil.copytree(source, dst)
    else:
        shutil.copyfile(source, dst)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def _suffix(path: Path) -> str:
    return ".json.gz" if path.name.endswith(".json.gz") else path.suffix


def signature(exc: BaseException) -> str:
    """'Type: message @ file:line' of an exception, numbers replaced by N, the frame the last
    in traceq's own code."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "traceq" in f.filename
              and "/tools/" not in f.filename]
    where = f" @ {Path(frames[-1].filename).parent.name}/{Path(frames[-1].filename).name}:{frames[-1].lineno}" \
        if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0][:120]
    return re.sub(r"\d+", "N", f"{type(exc).__name__}: {first}") + where


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fingerprint(db: Path, trace_id: int) -> str:
    """A digest of every row the store holds for one trace, table by table."""
    import duckdb

    from traceq.store import event_tables

    con = duckdb.connect(str(db), read_only=True)
    try:
        digest = hashlib.sha256()
        for table in event_tables(con):
            if table == "traces":
                rows = con.execute("SELECT * EXCLUDE (loaded_at, load_seconds) FROM traces "
                                   "WHERE trace_id = ?", [trace_id]).fetchall()
            else:
                rows = con.execute(f'SELECT * FROM "{table}" WHERE trace_id = ? ORDER BY ALL', [trace_id]).fetchall()
            digest.update(f"{table}:{rows!r}".encode())
        return digest.hexdigest()
    finally:
        con.close()


@contextmanager
def scratch() -> Iterator[Path]:
    """A scratch folder for a Harness, deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix="traceq-fuzz-") as tmp:
        yield Path(tmp)


def run(harness: Harness, indexes: Sequence[int], log=None, keep: Path | None = None,
        progress: bool = False) -> list[Outcome]:
    """Check each mutant; write each outcome as a JSON line to `log`, failing mutants to `keep`."""
    outcomes = []
    for n, index in enumerate(indexes):
        outcome = harness.check(index)
        outcomes.append(outcome)
        if log is not None:
            log.write(json.dumps(asdict(outcome)) + "\n")
            log.flush()
        if outcome.problems:
            mutant = next(harness.work.glob(f"m{index}_*"), None)
            if keep is not None and mutant is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.move(str(mutant), keep / mutant.name)
            elif mutant is not None:
                _remove(mutant)
        if progress:
            mark = "FAIL " + "; ".join(outcome.problems) if outcome.problems else outcome.result
            print(f"[{n + 1}/{len(indexes)}] #{index} {outcome.source} {outcome.what[:70]}: {mark[:160]}",
                  file=sys.stderr)
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> str:
    """A markdown table of outcomes per mutation class, then the distinct failures."""
    by_class: dict[str, Counter[str]] = {}
    for o in outcomes:
        row = by_class.setdefault(o.mutation, Counter())
        row["mutants"] += 1
        row[o.result or "none"] += 1  # none: the load raised
        row["failed"] += bool(o.problems)
    total: Counter[str] = Counter()
    for c in by_class.values():
        total.update(c)
    lines = ["| mutation | mutants | refused | loaded | skipped | failed |", "|---|---:|---:|---:|---:|---:|"]
    for name, c in [*sorted(by_class.items()), ("all", total)]:
        lines.append(f"| {name} | {c['mutants']} | {c['refused']} | {c['loaded']} | {c['skipped']} | {c['failed']} |")
    failures = Counter(p for o in outcomes for p in o.problems)
    if failures:
        lines += ["", "| failure | mutants |", "|---|---:|"] + [f"| {p} | {n} |" for p, n in failures.most_common()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=100, help="how many mutants (default 100)")
    parser.add_argument("--start", type=int, default=0, help="index of the first mutant (for chunks)")
    parser.add_argument("--only", type=int, action="append", help="check just this mutant (repeatable)")
    parser.add_argument("--seed", default="1", help="the run's seed: same seed, same mutants")
    parser.add_argument("--no-shared", action="store_true", help="the samples alone, not ../shared/realtraces")
    parser.add_argument("--format", action="append", choices=("sqlite", "json", "json.gz", "protobuf", "csv", "parquetdir", "arrow"),
                        help="only corpus files in this container (repeatable)")
    parser.add_argument("--amd", action="store_true", help="the AMD profiles of ../shared/realtraces/rocpd too")
    parser.add_argument("--xplane", action="store_true",
                        help="the XPlane profiles of ../shared/realtraces/xplane too (as --format protobuf, unfiltered)")
    parser.add_argument("--rocpd", action="store_true",
                        help="a rocprofv3 rocpd database too, built from the rocprofv3 JSON (tests/test_rocpd.py)")
    parser.add_argument("--columnar", action="store_true", help="nsys's Parquet and Arrow exports of a sample too")
    parser.add_argument("--added-only", action="store_true",
                        help="only the files --amd, --rocpd, --columnar, --pftrace, --xplane (or --format protobuf) add")
    parser.add_argument("--pftrace", action="store_true",
                        help="a Perfetto trace too, built from the rocprofv3 JSON (tools/make_pftrace.py; needs perfetto)")
    parser.add_argument("--jsonl", type=Path, help="append each mutant's outcome here as a JSON line")
    parser.add_argument("--keep", type=Path, help="move failing mutants into this folder")
    parser.add_argument("--quiet", action="store_true", help="no line per mutant on stderr")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="JSONL",
                        help="only print the summary of earlier runs' --jsonl files (chunks of one run)")
    args = parser.parse_args(argv)
    if args.summarize:
        outcomes = [Outcome(**json.loads(line)) for path in args.summarize for line in path.read_text().splitlines()]
        print(summary(outcomes))
        print(f"\n{len(outcomes)} mutants in {sum(o.seconds for o in outcomes):,.0f} s of checking")
        return 1 if any(o.problems for o in outcomes) else 0
    indexes = args.only or range(args.start, args.start + args.mutants)
    started = time.perf_counter()
    with scratch() as work:
        files = [p for p in corpus(not args.no_shared, protobuf=args.xplane or "protobuf" in (args.format or ()), amd=args.amd,
                                   columnar=args.columnar, base=not args.added_only)
                 if not args.format or trace_format(p) in args.format]
        if args.pftrace:
            files.append(pftrace(work))
        if args.rocpd:
            files.append(rocpd(work))
        harness = Harness(files, args.seed, work)
        log = args.jsonl.open("a") if args.jsonl else None
        try:
            outcomes = run(harness, list(indexes), log, args.keep, progress=not args.quiet)
        finally:
            if log is not None:
                log.close()
    print(summary(outcomes))
    print(f"\n{len(outcomes)} mutants, seed {args.seed!r}, in {time.perf_counter() - started:.0f} s")
    return 1 if any(o.problems for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
