"""Damaged traces: what each kind of damage does (traceq.ingest.validate), counted against SQLite.

Each test damages a copy of a real trace with SQL, loads it, and checks the load's one-line
summary and the store against counts SQLite gives on the damaged file itself. The reproducers in
../shared/fuzz-repro and the fuzzer (tools/fuzz.py) check the general promise on many more.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import duckdb
import pytest
from conftest import ROOT, assert_load_refused, sample, shared, shared_files, source_rows
from typer.testing import CliRunner

from traceq.cli import app

sys.path.insert(0, str(ROOT / "tools"))
import fuzz  # noqa: E402  (tools/ is not a package)

runner = CliRunner()
K = "CUPTI_ACTIVITY_KIND_"


def damaged(tmp_path: Path, source: Path, *statements: str, params: tuple = ()) -> Path:
    """A copy of `source` with `statements` run on it (each with `params`)."""
    copy = tmp_path / f"damaged{source.suffix}"
    shutil.copy(source, copy)
    con = sqlite3.connect(copy)
    for sql in statements:
        con.execute(sql, params if "?" in sql else ())
    con.commit()
    con.close()
    return copy


def load(tmp_path: Path, path: Path, engine: str = "auto") -> tuple[str, duckdb.DuckDBPyConnection]:
    """`traceq load` of `path` into a new store: (the summary's notes after the time, a read-only
    connection to the store)."""
    db = tmp_path / f"{engine}.duckdb"
    result = runner.invoke(app, ["load", str(path), "--db", str(db)], env={"TRACEQ_SQLITE_READER": engine})
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert "\n" not in line
    notes = line.split(" s; ", 1)[1] if " s; " in line else ""
    return notes, duckdb.connect(str(db), read_only=True)


def test_kernels_with_end_before_start_are_dropped_and_counted(tmp_path: Path) -> None:
    path = damaged(tmp_path, sample("lenet_b256_cudnn.sqlite"),
                   f'UPDATE {K}KERNEL SET "end" = start - 1 WHERE rowid % 20 = 3')
    reversed_ = source_rows(path, f'SELECT count(*) FROM {K}KERNEL WHERE "end" < start')[0][0]
    kept = source_rows(path, f'SELECT start, "end" FROM {K}KERNEL WHERE "end" >= start ORDER BY rowid')
    assert reversed_ == 13
    notes, con = load(tmp_path, path)
    assert notes == "13 kernels with end < start dropped"
    assert con.execute("SELECT start_ns, end_ns FROM kernels ORDER BY kernel_id").fetchall() == kept
    assert con.execute("SELECT kernel_count FROM traces").fetchall() == [(len(kept),)]


def test_rows_without_times_or_out_of_range_are_dropped_and_counted(tmp_path: Path) -> None:
    path = damaged(tmp_path, sample("lenet_b256_cudnn.sqlite"),  # start is NOT NULL: rebuild the table without it
                   f"CREATE TABLE copy AS SELECT * FROM {K}MEMCPY", f"DROP TABLE {K}MEMCPY",
                   f"ALTER TABLE copy RENAME TO {K}MEMCPY",
                   f"UPDATE {K}MEMCPY SET start = NULL WHERE rowid IN (1, 2, 3)",
                   f"UPDATE {K}KERNEL SET start = -9223372036854775808 WHERE rowid IN (5, 6)",
                   f'UPDATE {K}RUNTIME SET "end" = 4611686018427387904 WHERE rowid = 7')
    copies = source_rows(path, f"SELECT count(*) FROM {K}MEMCPY WHERE start IS NOT NULL")[0][0] + source_rows(
        path, f"SELECT count(*) FROM {K}MEMSET")[0][0]
    notes, con = load(tmp_path, path)
    assert notes == ("2 kernels with times out of range dropped; 1 API call with times out of range dropped; "
                     "3 memcpy/memset without a start or end time dropped")
    assert con.execute("SELECT count(*) FROM memops").fetchall() == [(copies,)]
    assert con.execute("SELECT count(*) FROM kernels").fetchall() == [(258,)]


def test_durations_adding_up_past_64_bits_refuse_the_file(tmp_path: Path) -> None:
    """Each kernel 2^50 ns long (13 days, within range): 37,284 of them add up to 1.3 millennia."""
    path = damaged(tmp_path, sample("alexnet_b256_nocudnn.sqlite"), f'UPDATE {K}KERNEL SET "end" = start + {2**50}')
    line = assert_load_refused(tmp_path / "store.duckdb", path, "kernel durations add up to", "years")
    assert "1,330 years" in line  # 37,284 x 2^50 ns


def test_values_of_the_wrong_type_become_null_and_are_counted(tmp_path: Path) -> None:
    """Text and floats in integer columns, on both readers of big tables: ADBC (whose chunk is read
    again by sqlite3) and sqlite3 alone give the same store and the same summary."""
    path = damaged(tmp_path, sample("lenet_b256_cudnn.sqlite"),
                   f"UPDATE {K}KERNEL SET gridX = 'abc' WHERE rowid IN (10, 11)",
                   f"UPDATE {K}KERNEL SET blockX = 1e400 WHERE rowid = 12",
                   f"UPDATE {K}MEMSET SET value = 'NaN' WHERE rowid = 1")
    corr = {r[0] for r in source_rows(path, f"SELECT correlationId FROM {K}KERNEL WHERE rowid IN (10, 11, 12)")}
    stores = {}
    for engine in ("adbc", "stdlib"):
        notes, con = load(tmp_path, path, engine)
        assert notes == ("3 non-integer values set to NULL (CUPTI_ACTIVITY_KIND_KERNEL); "
                         "1 non-integer value set to NULL (CUPTI_ACTIVITY_KIND_MEMSET)")
        nulls = con.execute("SELECT correlation_id FROM kernels WHERE grid_x IS NULL OR block_x IS NULL").fetchall()
        assert {r[0] for r in nulls} == corr
        stores[engine] = [con.execute(f"SELECT * EXCLUDE (trace_id) FROM {t} ORDER BY ALL").fetchall()
                          for t in ("kernels", "memops", "api_calls", "nvtx")]
    assert stores["adbc"] == stores["stdlib"]


def test_integers_too_large_for_the_store_become_null(tmp_path: Path) -> None:
    path = damaged(tmp_path, sample("lenet_b256_cudnn.sqlite"), f"UPDATE {K}KERNEL SET gridX = {2**40} WHERE rowid = 4")
    notes, con = load(tmp_path, path)
    assert notes == "1 value too large for kernel_configs.grid_x set to NULL"
    assert con.execute("SELECT count(*) FROM kernels WHERE grid_x IS NULL").fetchall() == [(1,)]


def test_rows_lacking_a_value_the_store_needs_are_dropped(tmp_path: Path) -> None:
    """A memory event whose operation is neither alloc nor free has no `op`, which the store needs."""
    path = damaged(tmp_path, sample("alexnet_b64_nocache.sqlite"),
                   "UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET memoryOperationType = 7 WHERE rowid IN (3, 4)")
    events = source_rows(path, "SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS")[0][0]
    notes, con = load(tmp_path, path)
    assert notes == "2 memory events without op dropped"
    assert con.execute("SELECT count(*) FROM memory_events").fetchall() == [(events - 2,)]


@pytest.mark.parametrize("engine", ["adbc", "stdlib"])
def test_text_that_is_not_utf8_is_read_with_replacement(tmp_path: Path, engine: str) -> None:
    """In StringIds (read with sqlite3) and in NVTX texts (read by ADBC, which passes the bytes
    through: the chunk is read again with sqlite3)."""
    path = damaged(tmp_path, sample("alexnet_b256_cudnn.sqlite"),
                   "UPDATE StringIds SET value = CAST(CAST(value AS BLOB) || X'CCFF' AS TEXT) WHERE id = "
                   f"(SELECT shortName FROM {K}KERNEL ORDER BY rowid LIMIT 1)",
                   "UPDATE NVTX_EVENTS SET text = CAST(X'636F6E76C328' AS TEXT) WHERE rowid IN (SELECT rowid "
                   "FROM NVTX_EVENTS WHERE text IS NOT NULL AND eventType = 59 ORDER BY rowid LIMIT 2)")
    notes, con = load(tmp_path, path, engine)
    assert notes == "3 texts not UTF-8 read with U+FFFD for the bad bytes"
    assert con.execute("SELECT count(*) FROM nvtx WHERE name = 'conv\ufffd('").fetchall() == [(2,)]
    assert con.execute("SELECT count(DISTINCT short_name) FROM kernels WHERE short_name LIKE '%\ufffd%'"
                       ).fetchall() == [(1,)]


def test_nvprof_kernel_names_with_negative_ids(tmp_path: Path) -> None:
    """Every kernel's name id negative (no string table holds one): every kernel unnamed, none
    lost; the unknown id is counted once (kernel names are looked up per distinct id)."""
    source = shared("realtraces", "nvprof_sqlite", "m-goldstein__GPU_ML__timeline.nvvp")
    path = damaged(tmp_path, source, f"UPDATE {K}CONCURRENT_KERNEL SET name = -5")
    kernels = source_rows(path, f"SELECT count(*) FROM {K}CONCURRENT_KERNEL")[0][0]
    notes, con = load(tmp_path, path)
    assert notes == "1 unknown string id read as no text"
    assert con.execute("SELECT name, count(*) FROM kernels GROUP BY name").fetchall() == [("<unnamed kernel>", kernels)]


def test_string_ids_that_resolve_to_nothing_leave_names_empty(tmp_path: Path) -> None:
    """A kernel whose three name ids are gone is '<unnamed kernel>'; an API call's name is NULL."""
    path = damaged(tmp_path, sample("lenet_b256_cudnn.sqlite"),
                   f"UPDATE {K}KERNEL SET demangledName = 999999, shortName = 999999, mangledName = 999999 "
                   "WHERE rowid = 1",
                   f"UPDATE {K}RUNTIME SET nameId = -5 WHERE rowid IN (1, 2)")
    notes, con = load(tmp_path, path)
    assert notes == "5 unknown string ids read as no text"  # a kernel's three, and two calls'
    assert con.execute("SELECT name, short_name FROM kernels WHERE kernel_id = 0").fetchall() == [
        ("<unnamed kernel>", "<unnamed kernel>")]
    assert con.execute("SELECT count(*) FROM api_calls WHERE name IS NULL").fetchall() == [(2,)]


def test_string_table_rows_with_ids_that_are_not_integers_are_dropped(tmp_path: Path) -> None:
    path = damaged(tmp_path, sample("lenet_b256_cudnn.sqlite"),  # id is the INTEGER PRIMARY KEY: rebuild without
                   "CREATE TABLE copy AS SELECT * FROM StringIds", "DROP TABLE StringIds",
                   "ALTER TABLE copy RENAME TO StringIds", "UPDATE StringIds SET id = 'x' || id WHERE id < 3")
    notes, _ = load(tmp_path, path)
    assert notes.startswith("3 StringIds rows with an id that is not a non-negative integer dropped")


def test_a_table_lacking_a_required_column_refuses_the_file(tmp_path: Path) -> None:
    path = damaged(tmp_path, sample("lenet_b256_cudnn.sqlite"), f"ALTER TABLE {K}KERNEL DROP COLUMN start")
    db = tmp_path / "store.duckdb"
    assert runner.invoke(app, ["load", str(sample("alexnet_b128_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    assert_load_refused(db, path, f"{K}KERNEL lacks column start")


def test_nvprof_times_reversed_or_unknown(tmp_path: Path) -> None:
    """nvprof: a start of 0 is CUPTI's unknown time; time zero ignores a damaged early record."""
    source = shared("realtraces", "nvprof_sqlite", "m-goldstein__GPU_ML__timeline.nvvp")
    path = damaged(tmp_path, source, f'UPDATE {K}CONCURRENT_KERNEL SET "end" = start - 5 WHERE rowid IN (2, 4)',
                   f"UPDATE {K}CONCURRENT_KERNEL SET start = 0 WHERE rowid = 6",
                   f"UPDATE {K}RUNTIME SET start = 5 WHERE rowid = 1")
    first = source_rows(path, " UNION ALL ".join(
        f'SELECT min(start) FROM {K}{t} WHERE start > 946684800000000000 AND "end" >= start'
        for t in ("CONCURRENT_KERNEL", "RUNTIME", "DRIVER", "MEMCPY", "MEMSET")))
    notes, con = load(tmp_path, path)
    assert notes == ("2 kernels with end < start dropped; 1 kernel without a start or end time dropped; "
                     "1 API call with times out of range dropped")
    assert con.execute("SELECT kernel_count, session_start_utc_ns FROM traces").fetchall() == [
        (38 - 3, min(r[0] for r in first))]


REPRODUCERS = shared_files("fuzz-repro", "sig*")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> fuzz.Harness:
    return fuzz.Harness([], "repro", tmp_path_factory.mktemp("repro"), commands=fuzz.FIRST_COMMANDS)


@pytest.mark.parametrize("path", REPRODUCERS or [pytest.param(None, marks=pytest.mark.skip(
    reason="../shared/fuzz-repro is absent"))], ids=lambda p: p.name[:5] if p else "absent")
def test_reproducer(harness: fuzz.Harness, path: Path) -> None:
    """Each damaged trace that once gave a traceback: refused in one line with the store as it was,
    or loaded with every command working (or refusing in one line) on it."""
    outcome = harness.check_file(path)
    assert outcome.problems == [], outcome
    if outcome.result == "refused":
        assert any(w in outcome.message for w in ("damaged", "lacks column")), outcome.message


@pytest.mark.parametrize("name", ["nsys_sqlite/CO18326__uvmTorch__report1.sqlite",  # no kernels
                                  "nsys_sqlite/D-W-Chiang__JACC.jl__cg_trace.sqlite",  # nor API calls
                                  "nvprof_sqlite/esarmstrong__ece408__forward1_analysis.nvprof",  # no copies
                                  # ROCm: ranges without a process id (advise's iteration window)
                                  "kineto_json/facebookresearch__HolisticTraceAnalysis__amd_trace__"
                                  "mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
def test_every_command_works_on_real_traces_without_kernels_or_copies(harness: fuzz.Harness, name: str) -> None:
    """Undamaged real traces, and what a damaged one becomes once its bad rows are dropped."""
    path = shared("realtraces", *name.split("/"))
    outcome = harness.check_file(path)
    assert outcome.result == "loaded" and outcome.problems == [], outcome


def test_every_command_works_when_every_kernel_lasts_0_ns(harness: fuzz.Harness, tmp_path: Path) -> None:
    """Kernels of zero duration are valid times; layers' and libs' shares of 0 ns once raised (a
    Kineto mutant of the fuzzer, `dur = 0` in all kernels)."""
    source = sample("alexnet_b256_kineto.json")
    trace = json.loads(source.read_bytes(), parse_float=fuzz.Raw, parse_int=fuzz.Raw)
    for event in trace["traceEvents"]:
        if event.get("cat") == "kernel":
            event["dur"] = 0
    path = tmp_path / "zero.json"
    path.write_bytes(fuzz._Json().encode(trace))
    outcome = harness.check_file(path)
    assert outcome.result == "loaded" and outcome.problems == [], outcome


DEVICE_RUN_FAILURES = (1624, 2862, 3377, 5396, 5943, 7048, 7336, 7462, 8408, 9044)
"""The mutants of seed 'device10k' (9,170 mutants of the full corpus on a 32-core machine,
docs/damaged-traces.md) that failed before their fixes: a Kineto range without a process id and a
grid of unknown size in advise, a refusal that quoted a damaged schema's newlines, one correlation
id shared by many launch calls (gaps; and, every call of a trace sharing one, 20 GB asked for by the
load's attribution: four workers of that run were killed for memory), an iteration range whose end
is not an integer (gaps)."""


@pytest.mark.skipif(not shared_files("realtraces", "*"), reason="../shared/realtraces is absent")
def test_the_large_runs_failures() -> None:
    with fuzz.scratch() as work:
        outcomes = fuzz.run(fuzz.Harness(fuzz.corpus(samples=fuzz.FIRST_SAMPLES), "device10k", work,
                                          commands=fuzz.FIRST_COMMANDS),
                            DEVICE_RUN_FAILURES)
    assert [(o.index, o.problems) for o in outcomes if o.problems] == []


def test_fuzzing_a_small_budget() -> None:
    """6 mutants of the samples (the seed is fixed: the same 6 each run), about 10 s on an idle
    machine; `python tools/fuzz.py --mutants 10000` is the large budget, run on demand."""
    with fuzz.scratch() as work:
        harness = fuzz.Harness(fuzz.corpus(include_shared=False), "ci", work)
        outcomes = fuzz.run(harness, range(6))
    assert [o.problems for o in outcomes if o.problems] == []
    assert {o.result for o in outcomes} >= {"loaded", "refused"}


def test_fuzzing_kineto_a_small_budget(tmp_path: Path) -> None:
    """8 mutants of the Kineto sample, plain and gzip-compressed (fixed seed: JSON cut short, wrong
    types, missing fields, bad numbers, duplicate keys, text not UTF-8, gzip damage), about 15 CPU s."""
    plain = fuzz.ROOT / "sample_traces" / "alexnet_b256_kineto.json"
    compressed = tmp_path / "alexnet_b256_kineto.json.gz"
    compressed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    with fuzz.scratch() as work:
        outcomes = fuzz.run(fuzz.Harness([plain, compressed], "ci-kineto-37", work), range(8))
    assert [o.problems for o in outcomes if o.problems] == []
    assert {o.result for o in outcomes} >= {"loaded", "refused"}
    assert len({o.mutation for o in outcomes}) >= 6  # the seed was chosen to try most classes


def test_the_fuzzer_is_reproducible(tmp_path: Path) -> None:
    """The same seed and index give the same mutant, byte for byte."""
    files = fuzz.corpus(include_shared=False)
    digests = []
    for run in ("a", "b"):
        harness = fuzz.Harness(files, "same", tmp_path / run, base=None)
        path, outcome = harness.mutant(7)
        digests.append((hashlib.sha256(path.read_bytes()).hexdigest(), outcome.what))
    assert digests[0] == digests[1]


@pytest.mark.skipif(not shared_files("realtraces/xplane", "*.xplane.pb"), reason="../shared/realtraces is absent")
def test_fuzzing_xplane_a_small_budget() -> None:
    """6 mutants of two real XPlane profiles (fixed seed: bytes changed, cut short, a length past
    the end): each refused in one line with the store unchanged, or loaded and every command
    working; `python tools/fuzz.py --format protobuf --mutants 150` ran 150 with no failure."""
    files = [p for p in fuzz.corpus(protobuf=True) if fuzz.trace_format(p) == "protobuf"]
    with fuzz.scratch() as work:
        outcomes = fuzz.run(fuzz.Harness(files, "ci-xplane", work, commands=fuzz.FIRST_COMMANDS), range(6))
    assert [o.problems for o in outcomes if o.problems] == []
    assert "refused" in {o.result for o in outcomes}
