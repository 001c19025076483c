"""`traceq load --ncu REPORT --into TRACE` on the Nsight Compute recordings of sample_traces/ncu/
(one step under ncu --nvtx, two under nsys, same program) and sample_traces/alexnet_ncu_raw.csv
(no NVTX, against alexnet_b256_cudnn.sqlite). The expected counts and values are read here from
the raw CSVs (csv module) and the SQLite files (sqlite3), not through traceq's reader."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import re
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from conftest import NCU_STACK, SAMPLES, assert_load_refused
from typer.testing import CliRunner

from traceq.cli import app

NCU = SAMPLES / "ncu"
PAIRS = {"alexnet_b256_fp32": 30, "resnet50_b32_fp32": 217}  # profiled launches in each CSV
runner = CliRunner()


def _csv_rows(path: Path) -> tuple[list[str], list[str], list[dict[str, str]]]:
    """(header, units, rows) of an ncu --csv --page raw file, its `==` notices skipped."""
    data = path.read_bytes()
    text = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith("==")]
    table = list(csv.reader(io.StringIO("".join(lines))))
    return table[0], table[1], [dict(zip(table[0], row)) for row in table[2:]]


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _plain(name: str) -> str:
    """A demangled name with no namespace, no cast before a number and no space: how the test
    compares ncu's shortened demangling with nsys' full one."""
    while True:
        shorter = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*::", "", name)
        if shorter == name:
            break
        name = shorter
    return re.sub(r"\([A-Za-z_][A-Za-z0-9_ ]*\)(?=-?[0-9])", "", name).replace(" ", "")


def _sqlite_launches(path: Path) -> Counter:
    """(plain name, grid, block) -> launches, from the nsys export itself."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT s.value, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ "
                           "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName").fetchall()
    finally:
        con.close()
    return Counter((_plain(r[0]), r[1:4], r[4:7]) for r in rows)


def _ncu_key(row: dict[str, str]) -> tuple:
    triple = (lambda s: tuple(int(v) for v in s.strip("()").split(",")))
    return _plain(row["Kernel Name"]), triple(row["Grid Size"]), triple(row["Block Size"])


def _load(db: Path, *args: str) -> str:
    result = runner.invoke(app, ["load", *args, "--db", str(db)])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two nsys traces of the ncu recordings and alexnet_b256_cudnn, each with its report."""
    db = tmp_path_factory.mktemp("ncu") / "traceq.duckdb"
    for name, n in PAIRS.items():
        _load(db, str(NCU / f"{name}.sqlite"))
        out = _load(db, "--ncu", str(NCU / f"{name}_ncu.csv.gz"), "--into", name)
        assert f"{n} of {n} profiled launches matched ({n} within their NVTX" in out
    out = _load(db, str(SAMPLES / "alexnet_b256_cudnn.sqlite"), "--ncu", str(SAMPLES / "alexnet_ncu_raw.csv"))
    assert "302 of 302 profiled launches matched;" in out and "346 of the trace's 648 kernels" in out
    return db


def _sql(db: Path, query: str, params: list | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(query, params or []).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_matched_count_equals_an_independent_count(store: Path, name: str) -> None:
    """Every profiled launch whose name, grid and block the trace ran is matched, no more: the
    count from the raw CSV and the SQLite file (each key counted up to the trace's launches)."""
    _, _, rows = _csv_rows(NCU / f"{name}_ncu.csv.gz")
    profiled = Counter(_ncu_key(r) for r in rows)
    launched = _sqlite_launches(NCU / f"{name}.sqlite")
    expected = sum(min(n, launched[key]) for key, n in profiled.items())
    assert expected == PAIRS[name] == len(rows)
    stored = _sql(store, "SELECT r.launches, r.matched, count(m.kernel_id) FROM ncu_reports r JOIN traces t "
                         "USING (trace_id) JOIN ncu_metrics m USING (trace_id) WHERE t.name = ? GROUP BY ALL", [name])
    assert stored == [(len(rows), expected, expected)]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_each_launch_joins_the_kernel_of_its_layer_in_the_profiled_iteration(store: Path, name: str) -> None:
    """The kernel a profiled launch is joined to lies in the layer range ncu recorded for it (the
    trace's own attribution) and, forward, in the iteration ncu recorded (the first of two)."""
    _, _, rows = _csv_rows(NCU / f"{name}_ncu.csv.gz")
    joined = {i: (layer, it) for i, layer, it in _sql(
        store, "SELECT m.ncu_id, a.layer, a.iteration FROM ncu_metrics m JOIN traces t USING (trace_id) "
               "JOIN kernels_attributed a ON a.trace_id = m.trace_id AND a.kernel_id = m.kernel_id WHERE t.name = ?",
        [name])}
    assert len(joined) == len(rows)
    for row in rows:
        stack = re.findall(r'"<default domain>:(.*?)(?::none){6}"', row[NCU_STACK])
        layer, iteration = joined[int(row["ID"])]
        assert layer == stack[-1], (row["ID"], layer, stack)
        if stack[0].startswith("iteration"):
            assert iteration == stack[0]


def test_measured_values_are_the_csv_numbers(store: Path) -> None:
    """Bytes and times as the CSV gives them (byte, ns), and converted where its unit row says
    ms (alexnet_ncu_raw.csv): a few launches, each against its CSV row."""
    _, _, rows = _csv_rows(NCU / "resnet50_b32_fp32_ncu.csv.gz")
    stored = {r[0]: r[1:] for r in _sql(
        store, "SELECT ncu_id, dram_read_bytes, dram_write_bytes, l2_bytes, l1_bytes, gpu_time_ns, "
               "sm_throughput_pct, achieved_occupancy_pct FROM ncu_metrics JOIN traces USING (trace_id) "
               "WHERE name = 'resnet50_b32_fp32'")}
    for row in (rows[0], rows[57], rows[-1]):
        assert stored[int(row["ID"])] == (
            _num(row["dram__bytes_read.sum"]), _num(row["dram__bytes_write.sum"]), _num(row["lts__t_bytes.sum"]),
            _num(row["l1tex__t_bytes.sum"]), _num(row["gpu__time_duration.sum"]),
            _num(row["sm__throughput.avg.pct_of_peak_sustained_elapsed"]), None)
    header, units, rows = _csv_rows(SAMPLES / "alexnet_ncu_raw.csv")
    assert units[header.index("gpu__time_duration.sum")] == "ms"
    stored = {r[0]: r[1:] for r in _sql(
        store, "SELECT ncu_id, gpu_time_ns, achieved_occupancy_pct, tensor_pipe_pct, dram_bytes_null FROM "
               "(SELECT *, dram_read_bytes IS NULL AS dram_bytes_null FROM ncu_metrics) JOIN traces USING (trace_id) "
               "WHERE name = 'alexnet_b256_cudnn'")}
    for row in (rows[0], rows[150], rows[-1]):
        time_ns, occupancy, tensor, no_dram = stored[int(row["ID"])]
        assert time_ns == pytest.approx(_num(row["gpu__time_duration.sum"]) * 1e6, rel=1e-12)
        assert occupancy == _num(row["sm__warps_active.avg.pct_of_peak_sustained_active"])
        assert tensor == _num(row["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"])
        assert no_dram  # that report has no byte counters


def test_commands_show_the_measured_beside_the_theory(store: Path) -> None:
    """ru gains achieved occupancy, ce SM and tensor throughput, traffic DRAM and L2 bytes; a
    trace without a report gains nothing, and a report without a metric no column for it."""
    def csv_of(*args: str) -> list[dict[str, str]]:
        result = runner.invoke(app, [*args, "--db", str(store), "-f", "csv"])
        assert result.exit_code == 0, result.output
        return list(csv.DictReader(io.StringIO(result.stdout)))

    ru = csv_of("ru", "-t", "alexnet_b256_cudnn")
    assert sum(int(r["ncu_kernels"]) for r in ru) == 302
    (expected,) = _sql(store, "SELECT sum(m.achieved_occupancy_pct * (k.end - k.start)) / sum(k.end - k.start) / 100, "
                              "count(*) FROM ncu_metrics m JOIN (SELECT trace_id, kernel_id, start_ns AS start, end_ns AS "
                              "\"end\" FROM kernel_events) k USING (trace_id, kernel_id) JOIN kernels n USING (trace_id, "
                              "kernel_id) JOIN traces t USING (trace_id) WHERE t.name = 'alexnet_b256_cudnn' AND n.name = ?",
                       [ru[0]["name"]])
    assert float(ru[0]["ncu_occupancy_pct"]) == pytest.approx(100 * expected[0], rel=1e-9) and 0 < expected[0] <= 1
    assert int(ru[0]["ncu_kernels"]) == expected[1] < int(ru[0]["kernels"])
    assert "ncu_occupancy_pct" not in csv_of("ru", "-t", "alexnet_b256_fp32")[0]  # that report measured none
    ce = csv_of("ce", "-t", "alexnet_b256_cudnn", "--spec", str(SAMPLES / "alexnet.model.toml"))
    assert {"ncu_sm_pct", "ncu_tensor_pct", "ncu_kernels"} <= set(ce[0])
    traffic = csv_of("traffic", "-t", "alexnet_b256_fp32", "--spec", str(NCU / "alexnet_b256_fp32_shapes.json"),
                     "--by", "kernel")
    _, _, rows = _csv_rows(NCU / "alexnet_b256_fp32_ncu.csv.gz")
    conv1 = next(r for r in rows if r[NCU_STACK].rstrip().endswith('"<default domain>:conv1:none:none:none:none:none:none"'))
    row = next(r for r in traffic if r["layer"] == "conv1" and r["name"] == conv1["Kernel Name"])
    assert float(row["ncu_dram_bytes"]) == _num(conv1["dram__bytes_read.sum"]) + _num(conv1["dram__bytes_write.sum"])
    assert float(row["ncu_l2_bytes"]) == _num(conv1["lts__t_bytes.sum"])
    assert row["ncu_launches"] == "1" and row["launches"] == "2"
    db = store.with_name("plain.duckdb")
    _load(db, str(SAMPLES / "lenet_b256_cudnn.sqlite"))
    plain = runner.invoke(app, ["ru", "--db", str(db), "-f", "csv"])
    assert plain.exit_code == 0 and "ncu_" not in plain.stdout.splitlines()[0]


def test_extend_gives_the_other_iteration_the_measured_values(tmp_path: Path) -> None:
    """--ncu-extend: the second iteration's launches of each profiled name and configuration
    take the measured values, marked 'extended'; the line says how many."""
    db = tmp_path / "traceq.duckdb"
    out = _load(db, str(NCU / "alexnet_b256_fp32.sqlite"), "--ncu", str(NCU / "alexnet_b256_fp32_ncu.csv.gz"),
                "--ncu-extend")
    _, _, rows = _csv_rows(NCU / "alexnet_b256_fp32_ncu.csv.gz")
    launched = _sqlite_launches(NCU / "alexnet_b256_fp32.sqlite")
    extended = sum(launched[key] for key in {_ncu_key(r) for r in rows}) - len(rows)
    assert f"--ncu-extend: {extended} more kernels" in out and extended == 30
    counts = dict(_sql(db, "SELECT matched_by, count(*) FROM ncu_metrics GROUP BY 1"))
    assert counts == {"launch": 30, "extended": extended}
    assert _sql(db, "SELECT count(*) FROM ncu_metrics WHERE matched_by = 'extended' AND (ncu_id IS NOT NULL "
                    "OR l2_bytes IS NULL)") == [(0,)]
    again = _load(db, "--ncu", str(NCU / "alexnet_b256_fp32_ncu.csv.gz"), "--into", "alexnet_b256_fp32")
    assert again.startswith("replaced the Nsight Compute metrics of 'alexnet_b256_fp32'")
    assert _sql(db, "SELECT count(*) FROM ncu_metrics") == [(30,)]
    assert runner.invoke(app, ["rm", "alexnet_b256_fp32", "--db", str(db)]).exit_code == 0
    assert _sql(db, "SELECT (SELECT count(*) FROM ncu_metrics) + (SELECT count(*) FROM ncu_reports)") == [(0,)]


def _with_cell(text: str, column: str, value: str, row: int = 4) -> str:
    """`text` with `column` of its third launch (`row` 1: the units) set to `value` (rewritten by
    the csv module)."""
    lines = text.splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    table = list(csv.reader(io.StringIO("".join(lines[header:]))))
    table[row][table[0].index(column)] = value
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(table)
    return "".join(lines[:header]) + out.getvalue()


def _mutants(text: str) -> dict[str, str]:
    lines = text.splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    body = "".join(lines[header + 2:])
    return {
        "cut mid-row": text[: len(text) - len(lines[-1]) // 2],
        "a number that is not": _with_cell(text, "dram__bytes_read.sum", "1,70x,184"),
        "an unknown unit": _with_cell(text, "dram__bytes_read.sum", "furlong", row=1),
        "no units row": "".join(lines[: header + 1]) + body,
        "an ID twice": "".join(lines[: header + 3]) + lines[header + 2] + "".join(lines[header + 3:]),
        "a bad grid": _with_cell(text, "Grid Size", "(1, 6272)"),
        "no header": body,
        "only the header": "".join(lines[: header + 2]),
        "a negative value": _with_cell(text, "lts__t_bytes.sum", "-5"),
        "no kernel name": _with_cell(text, "Kernel Name", ""),
    }


@pytest.fixture(scope="module")
def one_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("ncu_bad") / "traceq.duckdb"
    _load(db, str(NCU / "alexnet_b256_fp32.sqlite"))
    _load(db, "--ncu", str(NCU / "alexnet_b256_fp32_ncu.csv.gz"), "--into", "alexnet_b256_fp32")
    return db


MUTANTS = ["cut mid-row", "a number that is not", "an unknown unit", "no units row", "an ID twice", "a bad grid",
           "no header", "only the header", "a negative value", "no kernel name", "gzip cut", "binary", "empty"]


@pytest.mark.parametrize("mutant", MUTANTS)
def test_a_damaged_report_is_refused_in_one_line(one_trace: Path, tmp_path: Path, mutant: str) -> None:
    text = gzip.decompress((NCU / "alexnet_b256_fp32_ncu.csv.gz").read_bytes()).decode()
    bad = tmp_path / "bad.csv"
    if mutant == "gzip cut":
        data = (NCU / "alexnet_b256_fp32_ncu.csv.gz").read_bytes()
        bad = tmp_path / "bad.csv.gz"
        bad.write_bytes(data[: len(data) // 2])
    elif mutant == "binary":
        bad.write_bytes(bytes(range(256)) * 8)
    elif mutant == "empty":
        bad.write_bytes(b"")
    else:
        assert _mutants(text)[mutant] != text
        bad.write_text(_mutants(text)[mutant])
    line = assert_load_refused(one_trace, [], str(bad), options=("--ncu", str(bad), "--into", "alexnet_b256_fp32"))
    assert "Traceback" not in line


def test_into_a_missing_trace_or_store_is_refused(one_trace: Path, tmp_path: Path) -> None:
    report = str(NCU / "alexnet_b256_fp32_ncu.csv.gz")
    assert_load_refused(one_trace, [], "no trace 'vgg16'", options=("--ncu", report, "--into", "vgg16"))
    missing = tmp_path / "none.duckdb"
    assert_load_refused(missing, [], "no such store", options=("--ncu", report, "--into", "x"))
    assert not missing.exists()


def test_an_ncu_rep_goes_through_ncu_into_a_cache(tmp_path: Path) -> None:
    """An .ncu-rep is turned into CSV by the ncu given (here a stand-in that prints the recorded
    CSV), kept beside the store, and read from there the next time; without ncu, one line with
    the command to run elsewhere."""
    db = tmp_path / "traceq.duckdb"
    _load(db, str(NCU / "alexnet_b256_fp32.sqlite"))
    report = tmp_path / "run.ncu-rep"
    report.write_bytes(b"\x00NCU-REP stand-in")
    csv_text = tmp_path / "exported.csv"
    csv_text.write_bytes(gzip.decompress((NCU / "alexnet_b256_fp32_ncu.csv.gz").read_bytes()))
    fake = tmp_path / "ncu"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --import ] && [ \"$3\" = --csv ] && cat '{csv_text}'\n")
    fake.chmod(0o755)
    out = _load(db, "--ncu", str(report), "--into", "alexnet_b256_fp32", "--ncu-bin", str(fake))
    assert "30 of 30 profiled launches matched" in out
    cached = list((tmp_path / "traceq.duckdb.ncu-cache").glob("*.csv"))
    assert len(cached) == 1 and cached[0].name.startswith(hashlib.sha256(report.read_bytes()).hexdigest()[:32])
    fake.unlink()
    shutil.copy(db, tmp_path / "copy.duckdb")
    again = runner.invoke(app, ["load", "--ncu", str(report), "--into", "alexnet_b256_fp32", "--db", str(db)],
                          env={"PATH": str(tmp_path), "TRACEQ_NCU": ""})
    assert again.exit_code == 0 and "30 of 30" in again.stdout  # from the cache: no ncu needed
    other = tmp_path / "other.ncu-rep"
    other.write_bytes(b"\x00another")
    runner_env = {"PATH": str(tmp_path / "nowhere"), "TRACEQ_NCU": ""}
    result = runner.invoke(app, ["load", "--ncu", str(other), "--into", "alexnet_b256_fp32", "--db", str(db)],
                           env=runner_env)
    assert result.exit_code == 1 and "`ncu` is not on PATH" in result.stderr
    assert f"ncu --import {other} --csv --page raw" in result.stderr and len(result.stderr.splitlines()) == 1


def test_nvtx_path_keeps_colons_in_range_names() -> None:
    from traceq.ingest.ncu import NVTX_SEP, nvtx_path

    cell = ('42  "<default domain>:iteration 0:none:none:none:none:none:none"  '
            '"<default domain>:aten::conv2d, seq = 7:none:none:none:none:none:none" ')
    assert nvtx_path(cell) == NVTX_SEP.join(["iteration 0", "aten::conv2d, seq = 7"])
    assert nvtx_path("42 ") is None


def test_a_skipped_window_without_nvtx_is_found_in_the_trace(store: Path, tmp_path: Path) -> None:
    """ncu with `--launch-skip 100` and no --nvtx (emulated: the first 100 launches of the
    ResNet-50 report dropped, its NVTX stacks blanked): each launch still joins the kernel the
    NVTX-guided join chose (counted in launch order from the trace's start instead of from where
    the profiled sequence recurs, 43 of the 117 would join earlier kernels)."""
    lines = gzip.decompress((NCU / "resnet50_b32_fp32_ncu.csv.gz").read_bytes()).decode().splitlines(keepends=True)
    table = list(csv.reader(io.StringIO("".join(line for line in lines if not line.startswith("==")))))
    stack = table[0].index(NCU_STACK)
    kept = [row for row in table[2:] if int(row[0]) >= 100]
    for row in kept:
        row[stack] = ""
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([table[0], table[1], *kept])
    report = tmp_path / "skipped.csv"
    report.write_text(out.getvalue())
    db = tmp_path / "traceq.duckdb"
    said = _load(db, str(NCU / "resnet50_b32_fp32.sqlite"), "--ncu", str(report))
    assert f"{len(kept)} of {len(kept)} profiled launches matched;" in said
    guided = dict(_sql(store, "SELECT ncu_id, kernel_id FROM ncu_metrics JOIN traces USING (trace_id) "
                              "WHERE name = 'resnet50_b32_fp32' AND ncu_id >= 100"))
    assert dict(_sql(db, "SELECT ncu_id, kernel_id FROM ncu_metrics")) == guided


@pytest.mark.parametrize("base", ["mangled_name", "short_name"])
def test_names_as_ncu_prints_them_with_another_kernel_base(store: Path, base: str) -> None:
    """`ncu --print-kernel-base mangled|function` writes the mangled or the short name: each
    profiled launch, renamed so in the ResNet-50 report, joins the same kernel as before."""
    from traceq.analysis.efficiency.ncu import match_launches, trace_kernels
    from traceq.ingest.ncu import read_ncu

    report = read_ncu(NCU / "resnet50_b32_fp32_ncu.csv.gz")
    con = duckdb.connect(str(store), read_only=True)
    try:
        (tid,) = con.execute("SELECT trace_id FROM traces WHERE name = 'resnet50_b32_fp32'").fetchall()[0]
        kernels = trace_kernels(con, tid, paths=True)
        before = con.execute("SELECT m.ncu_id, m.kernel_id, k.mangled_name, k.short_name FROM ncu_metrics m "
                             "JOIN kernels k USING (trace_id, kernel_id) WHERE m.trace_id = ? ORDER BY 1",
                             [tid]).fetchall()
    finally:
        con.close()
    names = {ncu_id: mangled if base == "mangled_name" else short for ncu_id, _, mangled, short in before}
    assert all(names.values())
    renamed = report.launches.with_columns(name=report.launches["ncu_id"].replace_strict(names))
    pairs = match_launches(renamed, kernels)
    assert list(zip(pairs["ncu_id"], pairs["kernel_id"])) == [(i, k) for i, k, _, _ in before]


def test_a_store_made_before_the_ncu_tables_gets_them_at_its_first_ncu_load(tmp_path: Path) -> None:
    db = tmp_path / "traceq.duckdb"
    _load(db, str(NCU / "alexnet_b256_fp32.sqlite"))
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE ncu_metrics")
    con.execute("DROP TABLE ncu_reports")
    con.close()
    ru = runner.invoke(app, ["ru", "--db", str(db), "-f", "csv"])
    assert ru.exit_code == 0 and "ncu_" not in ru.stdout
    _load(db, "--ncu", str(NCU / "alexnet_b256_fp32_ncu.csv.gz"), "--into", "alexnet_b256_fp32")
    assert _sql(db, "SELECT count(*) FROM ncu_metrics") == [(30,)]


def test_a_report_exported_by_ncu_itself(tmp_path: Path) -> None:
    """The CSV Nsight Compute 2025.3.1 wrote from a real `.ncu-rep` (`ncu --import REP --csv --page
    raw`, on an H200: AlexNet batch 64, `--nvtx --set basic --launch-count 60`) joins an nsys trace
    of another run of the same script: every profiled launch whose key the trace launched is
    matched (counted from the raw files), most inside their NVTX range."""
    csv_path, trace = NCU / "alexnet_b64_ncu_import.csv.gz", NCU / "alexnet_b64_for_import.sqlite"
    _, _, rows = _csv_rows(csv_path)
    profiled = Counter(_ncu_key(r) for r in rows)
    launched = _sqlite_launches(trace)
    expected = sum(min(n, launched[key]) for key, n in profiled.items())
    assert len(rows) == 60 and expected == 60
    db = tmp_path / "traceq.duckdb"
    out = _load(db, str(trace), "--ncu", str(csv_path))
    assert f"{expected} of {len(rows)} profiled launches matched" in out


def test_kernel_names_as_each_tool_demangles_them(tmp_path: Path) -> None:
    """The GPT's training step under torch.profiler and the same step under Nsight Compute 2025.3
    (sample_traces/conventions/gpt_ncu_step.json.gz, ncu/gpt_ncu_step_raw.csv.gz): CUPTI writes `{lambda()#3}`, `(anonymous
    namespace)`, `2ul`, `true` and each argument's type, ncu `[lambda()(instance3)]`,
    `<unnamed>`, `2`, `1` and `T1`: over 200 of the 267 launches' names differ as written. Every profiled launch
    joins, and the kernel it joins is the trace's launch at the same place in launch order, read
    here from the raw JSON (both runs launch the same 267 kernels in the same order)."""
    import json

    db = tmp_path / "g.duckdb"
    _load(db, str(SAMPLES / "conventions/gpt_ncu_step.json.gz"))
    said = _load(db, "--ncu", str(SAMPLES / "ncu/gpt_ncu_step_raw.csv.gz"), "--into", "gpt_ncu_step")
    assert "267 of 267 profiled launches matched" in said
    events = json.loads(gzip.decompress((SAMPLES / "conventions/gpt_ncu_step.json.gz").read_bytes()))["traceEvents"]
    in_order = [e["name"] for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])]
    _, _, rows = _csv_rows(SAMPLES / "ncu/gpt_ncu_step_raw.csv.gz")
    ids = sorted(int(r["ID"]) for r in rows)
    joined = _sql(db, "SELECT n.ncu_id, k.name FROM ncu_metrics n JOIN kernel_rows k USING (trace_id, kernel_id) "
                      "ORDER BY n.ncu_id")
    assert [ncu_id for ncu_id, _ in joined] == ids
    assert [name for _, name in joined] == in_order
    assert sum(a != b for a, b in zip((r["Kernel Name"] for r in sorted(rows, key=lambda r: int(r["ID"]))), in_order,
                                      strict=True)) > 200


def test_the_applications_own_output_before_the_header_is_skipped(tmp_path: Path) -> None:
    """`ncu --csv ... python app.py > report.csv` puts what the application printed in the same
    file, before ncu's table (the planted-uncoalesced recording has a JSON line there): the
    report still loads, every profiled launch read (counted here from the raw lines)."""
    raw = gzip.decompress((NCU / "planted_uncoalesced_raw.csv.gz").read_bytes()).decode()
    lines = raw.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID",'))
    assert any(line.startswith("{") for line in lines[:header])  # the script's own print
    launches = sum(1 for line in lines[header + 2:] if line.startswith('"'))
    from traceq.ingest.ncu import read_ncu

    report = read_ncu(NCU / "planted_uncoalesced_raw.csv.gz")
    assert report.launches.height == launches == 204
    assert {"global_sectors", "global_sectors_ideal", "l2_cycles_active", "l2_cycles_elapsed"} <= set(report.present)
    first = next(csv.reader([lines[header + 2]]))
    columns = next(csv.reader([lines[header]]))
    assert report.launches["global_sectors"][0] == _num(first[columns.index("memory_l2_theoretical_sectors_global")])


def test_an_ncu_table_of_an_older_traceq_gains_the_new_columns(tmp_path: Path) -> None:
    """A store whose ncu_metrics was made before the sector columns existed: the next --ncu load
    adds them (nullable) and fills them; the rows it had keep their values."""
    db = tmp_path / "traceq.duckdb"
    _load(db, str(NCU / "alexnet_b256_fp32.sqlite"), "--ncu", str(NCU / "alexnet_b256_fp32_ncu.csv.gz"))
    con = duckdb.connect(str(db))
    for column in ("global_sectors", "global_sectors_ideal", "l2_cycles_active", "l2_cycles_elapsed"):
        con.execute(f"ALTER TABLE ncu_metrics DROP COLUMN {column}")
    con.close()
    ru = runner.invoke(app, ["advise", "--db", str(db)])
    assert ru.exit_code == 0, ru.output
    _load(db, str(SAMPLES / "planted" / "uncoalesced.sqlite"), "--ncu", str(NCU / "planted_uncoalesced_raw.csv.gz"))
    assert _sql(db, "SELECT count(*), count(global_sectors), count(dram_read_bytes) FROM ncu_metrics") == [(234, 204, 234)]
