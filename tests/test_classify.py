"""Kernel classification by name: traceq.analysis.kernels.classify and kernel_rules.toml.

CASES are real kernel names copied from the traces in ../shared (the comment above each names the
trace, relative to ../shared/realtraces unless it starts with reference/ or method/), with what
the packaged rules must answer for them; together they make every packaged rule decide at least
once. They run without ../shared. The coverage tests at the end read the traces themselves,
straight from SQLite and JSON, and are skipped when ../shared is absent; run them with
`pytest -rP tests/test_classify.py` to see the per-trace coverage tables. The precision of every
kernel name in those traces and in sample_traces/ is checked against tests/kernel_precisions.tsv,
whose expectations were verified by hand, name by name.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import sqlite3
from importlib import resources
from pathlib import Path

import polars as pl
import pytest

from traceq.analysis.kernels.classify import (
    Classification,
    RuleSet,
    classify,
    classify_names,
    default_rules,
    load_rules,
)
from traceq.errors import TraceqError

TESTS = Path(__file__).resolve().parent
SHARED = TESTS.parents[1] / "shared"
SAMPLES = TESTS.parent / "sample_traces"
FLOP_OPERATIONS = ("convolution", "gemm", "attention")


def _expected_precisions() -> dict[str, str | None]:
    """tests/kernel_precisions.tsv: kernel name -> precision (None for '-')."""
    rows = [line.split("\t", 1) for line in (TESTS / "kernel_precisions.tsv").read_text("utf-8").splitlines()
            if line and not line.startswith("#")]
    assert len({name for _, name in rows}) == len(rows), "a name is listed twice"
    return {name: None if precision == "-" else precision for precision, name in rows}


PRECISIONS = _expected_precisions()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize over CASES, defined at the end of this file with the data."""
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", CASES, ids=[case[0][:60] for case in CASES])


def test_real_kernel_names(case: tuple[object, ...]) -> None:
    name, *expected = case
    assert classify(name) == Classification(name, *expected, precision=PRECISIONS.get(name))


def test_every_packaged_rule_decides_a_case() -> None:
    rules = default_rules()
    deciding = {where for name, *_ in CASES for where in rules.explain(name).values()}
    unused = [rule.where for question in rules.rules.values() for rule in question
              if rule.where not in deciding]
    assert unused == []


def test_every_packaged_rule_names_its_trace_in_a_comment() -> None:
    text = resources.files("traceq.analysis.kernels").joinpath("kernel_rules.toml").read_text("utf-8")
    headers = [line for line in text.splitlines() if line.startswith("[[")]
    assert headers and all("#" in line for line in headers)


# (launching range, kernel name, library): real pairs. resnet50: reference/resnet50_b32_autograd_40it;
# mi300: kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint (Kineto's cpu_op of the launch)
LAUNCHED = [
    ("aten::cudnn_convolution", "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(T1::Params)",
     "cuDNN"),
    ("aten::convolution_backward", "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1_"
     "execute_segment_k_off_kernel__5x_cublas", "cuDNN"),
    ("aten::miopen_convolution", "Cijk_Ailk_Bljk_BBS_BH_MT32x32x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0", "MIOpen"),
    ("aten::convolution_backward", "Cijk_Ailk_Bjlk_BBS_BH_MT32x32x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0", "MIOpen"),
    ("aten::addmm", "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_"
     "alignc4_execute_kernel__5x_cublas", "cuBLAS"),
    ("aten::convolution_backward", "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, "
     "(bool)0, (bool)1, (cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<T3>, const T1 *, "
     "T2 *)", "cuDNN"),
    (None, "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(T1::Params)", "cuBLAS"),
]


@pytest.mark.parametrize("launcher, name, library", LAUNCHED)
def test_library_by_the_operation_that_launched_the_kernel(launcher: str | None, name: str, library: str) -> None:
    rules = default_rules()
    assert rules.launcher_library(launcher, classify(name).library) == library


def test_every_packaged_launcher_rule_decides_a_pair() -> None:
    rules = default_rules()
    deciding = {next(r.where for r in rules.launchers if classify(name).library in r.implementation
                     and r.pattern.search(launcher)) for launcher, name, _ in LAUNCHED
                if launcher and rules.launcher_library(launcher, classify(name).library) != classify(name).library}
    assert deciding == {rule.where for rule in rules.launchers}


def test_user_launcher_rules_come_first(tmp_path: Path) -> None:
    rules_file = tmp_path / "mine.toml"
    rules_file.write_text("[[launcher]]  # our own op\nmatch = '^myop::conv'\nimplementation = [\"cuBLAS\"]\n"
                          "value = \"MyConv\"\n")
    rules = load_rules(rules_file)
    assert rules.launcher_library("myop::conv2d", "cuBLAS") == "MyConv"
    assert rules.launcher_library("aten::cudnn_convolution", "cuBLAS") == "cuDNN"
    with pytest.raises(TraceqError, match=r"\[\[launcher\]\] rule 1: needs implementation"):
        bad = tmp_path / "bad.toml"
        bad.write_text("[[launcher]]\nmatch = 'x'\nvalue = \"y\"\n")
        load_rules(bad)


def test_classification_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        classify("volta_sgemm_128x64_nn").library = "cuDNN"  # type: ignore[misc]


def test_mangled_only_names_are_searched_as_mangled() -> None:
    # Kineto recorded this Composable Kernel convolution under its mangled name alone.
    assert classify(CK_BWD_WEIGHT).library == "Composable Kernel"
    assert classify("kernel", mangled=CK_BWD_WEIGHT).library == "Composable Kernel"


# ---------------------------------------------------------------------------------------------
# classify_names
# ---------------------------------------------------------------------------------------------

GEMM = "volta_sgemm_128x64_nn"
SAXPY = "saxpy(double *, double *, double *, double, int)"
NCCL = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


def test_classify_names_classifies_each_distinct_name_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    classify_one = RuleSet.classify

    def counting(self: RuleSet, name: str, mangled: str | None = None) -> Classification:
        seen.append(name)
        return classify_one(self, name, mangled)

    monkeypatch.setattr(RuleSet, "classify", counting)
    launches = pl.Series("name", [GEMM, SAXPY, GEMM, None, NCCL, SAXPY] * 1000)
    frame = classify_names(launches)
    assert seen == [GEMM, SAXPY, NCCL]
    assert frame["name"].to_list() == [GEMM, SAXPY, NCCL]


def test_classify_names_columns() -> None:
    frame = classify_names([GEMM, SAXPY, NCCL])
    assert frame.schema == pl.Schema({
        "name": pl.String, "library": pl.String, "operation": pl.String,
        "direction": pl.String, "algorithm": pl.String, "collective": pl.String,
        "gemm_variant": pl.String, "tensor_cores": pl.Boolean, "precision": pl.String})
    assert frame.select("library", "operation", "collective", "gemm_variant").rows() == [
        ("cuBLAS", "gemm", None, "nn"), ("custom", "elementwise", None, None),
        ("NCCL", "communication", "send_recv", None)]
    assert classify_names([]).schema == frame.schema


def test_classify_names_passes_mangled_names(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text("[[library]]\nmatch = '^_Z4axpy'\nfield = \"mangled\"\n"
                          "value = \"mine\"\n")
    frame = classify_names(["axpy(float)", "axpy(float)", GEMM], ["_Z4axpyf", "_Z4axpyf", None],
                           rules=load_rules(rules_file))
    assert frame["library"].to_list() == ["mine", "cuBLAS"]


# ---------------------------------------------------------------------------------------------
# user rules
# ---------------------------------------------------------------------------------------------

def test_user_rules_come_first(tmp_path: Path) -> None:
    rules_file = tmp_path / "mine.toml"
    rules_file.write_text(
        "[[library]]  # our own build of cuBLAS kernels\n"
        "match = '^volta_sgemm_'\nvalue = \"MyBLAS\"\n"
        "[[operation]]  # the rule's first capture group is the answer\n"
        "match = '^wilson_(dslash)_'\n")
    rules = load_rules(rules_file)
    assert classify(GEMM, rules=rules).library == "MyBLAS"
    assert classify(GEMM, rules=rules).operation == "gemm"  # packaged rules still answer
    dslash = "wilson_dslash_x_send(void*, void*, void*, void*, int, void*, void*)"
    assert classify(dslash, rules=rules).operation == "dslash"
    assert rules.explain(GEMM)["library"] == f"{rules_file}: [[library]] rule 1"
    assert classify(GEMM).library == "cuBLAS"  # the packaged rules are left alone


@pytest.mark.parametrize("text, message", [
    ("[[library]]\nmatch = 'volta_(sgemm'\nvalue = \"x\"\n",
     "[[library]] rule 1: bad regex 'volta_(sgemm'"),
    ("[[library]]\nmatch = 'x'\nvalue = \"x\"\nlibary = \"y\"\n",
     "[[library]] rule 1: unknown key 'libary'"),
    ("[[libraries]]\nmatch = 'x'\nvalue = \"x\"\n", "unknown rule list [[libraries]]"),
    ("[[tensor_cores]]\nmatch = 'x'\nvalue = \"yes\"\n",
     "[[tensor_cores]] rule 1: value must be a boolean"),
    ("[[tensor_cores]]\nmatch = '(x)'\n", "[[tensor_cores]] rule 1: needs a value"),
    ("[[precision]]\nmatch = 'x'\nvalue = \"fp4\"\n", "[[precision]] rule 1: value must be one of fp64, fp32"),
    ("[[operation]]\nmatch = 'x'\n", "[[operation]] rule 1: needs a value"),
    ("[[operation]]\nvalue = \"x\"\n", "[[operation]] rule 1: needs match"),
    ("[[operation]]\nmatch = ['x', 1]\nvalue = \"x\"\n", "[[operation]] rule 1: needs match"),
    ("[[operation]]\nmatch = 'x'\nvalue = \"x\"\nfield = \"short\"\n",
     "[[operation]] rule 1: field must be"),
    ("[library]\nmatch = 'x'\n", "must be a list of [[library]] tables"),
    ("[[library]]\nmatch = 'x\n", "not valid TOML"),
])
def test_bad_user_rules_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    rules_file = tmp_path / "bad.toml"
    rules_file.write_text(text)
    with pytest.raises(TraceqError) as error:
        load_rules(rules_file)
    assert str(error.value).startswith(f"{rules_file}: ")
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_user_rules_file(tmp_path: Path) -> None:
    with pytest.raises(TraceqError, match="cannot read rules file .*nowhere.toml"):
        load_rules(tmp_path / "nowhere.toml")


# ---------------------------------------------------------------------------------------------
# coverage on the traces in ../shared
# ---------------------------------------------------------------------------------------------

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"{SHARED} not found: these tests read the shared traces")


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _tables(con: sqlite3.Connection) -> set[str]:
    return {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _frame(rows: list[tuple[str, str | None, int]]) -> pl.DataFrame:
    """Kernel time per distinct name: name, mangled (or null), ns."""
    return (pl.DataFrame(rows, schema={"name": pl.String, "mangled": pl.String, "ns": pl.Int64},
                         orient="row")
            .group_by("name").agg(pl.col("mangled").first(), pl.col("ns").sum()))


def nsys_kernel_times(path: Path) -> pl.DataFrame | None:
    """From an Nsight Systems export; None when it has no kernel table."""
    with _connect(path) as con:
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in _tables(con):
            return None
        columns = {row[1] for row in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
        mangled = "m.value" if "mangledName" in columns else "NULL"
        join = "LEFT JOIN StringIds m ON m.id = k.mangledName" if "mangledName" in columns else ""
        rows = con.execute(f"""
            SELECT d.value, {mangled}, sum(k."end" - k.start)
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName {join}
            GROUP BY 1, 2""").fetchall()
    return _frame(rows)


def nvprof_kernel_times(path: Path) -> pl.DataFrame:
    """From an nvprof database: mangled names, demangled with cxxfilt."""
    import cxxfilt

    rows = []
    with _connect(path) as con:
        for table in ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL"):
            if table in _tables(con):
                rows += con.execute(f"""
                    SELECT s.value, sum(k."end" - k.start) FROM {table} k
                    JOIN StringTable s ON s._id_ = k.name GROUP BY 1""").fetchall()
    return _frame([(cxxfilt.demangle(mangled), mangled, ns) for mangled, ns in rows])


def kineto_kernel_times(path: Path) -> pl.DataFrame:
    """From a PyTorch profiler (Kineto) JSON trace, gzipped or not."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return _frame([(e["name"], None, round(e.get("dur", 0) * 1000)) for e in events
                   if str(e.get("cat", "")).lower() == "kernel"])


def library_times(kernels: pl.DataFrame) -> dict[str, int]:
    """Kernel time per library, ns."""
    labels = classify_names(kernels["name"], kernels["mangled"]).select("name", "library")
    totals = kernels.join(labels, on="name").group_by("library").agg(pl.col("ns").sum())
    return dict(totals.iter_rows())


def share(times: dict[str, int], excluded: tuple[str, ...]) -> float:
    """The fraction of kernel time in libraries other than `excluded`."""
    return sum(ns for library, ns in times.items() if library not in excluded) / sum(times.values())


@functools.cache
def realtrace_kernels() -> dict[str, pl.DataFrame]:
    """Kernel time per name for every readable trace in ../shared/realtraces, by path (read once
    per test session: several tests use them)."""
    readers = [("nsys_sqlite/*.sqlite", nsys_kernel_times),
               ("nvprof_sqlite/*", nvprof_kernel_times),
               ("kineto_json/*.json*", kineto_kernel_times)]
    found = {}
    for pattern, read in readers:
        for path in sorted((SHARED / "realtraces").glob(pattern)):
            kernels = read(path)
            if kernels is not None and kernels["ns"].sum() > 0:
                found[str(path.relative_to(SHARED))] = kernels
    return found


def all_realtraces() -> dict[str, dict[str, int]]:
    """Library times for every readable trace in ../shared/realtraces, by path."""
    return {path: library_times(kernels) for path, kernels in realtrace_kernels().items()}


def report(title: str, per_file: dict[str, dict[str, int]]) -> None:
    print(f"\n{title} (library: neither other nor custom)\n{'not other':>9} {'library':>9}  trace")
    for path, times in per_file.items():
        print(f"{share(times, ('other',)):9.2%} {share(times, ('other', 'custom')):9.2%}  {path}")


@needs_shared
def test_reference_traces_are_covered() -> None:
    per_file = {str(path.relative_to(SHARED)): library_times(nsys_kernel_times(path))
                for path in sorted(SHARED.glob("reference/*.sqlite"))}
    report("kernel time classified, reference traces", per_file)
    assert per_file
    for path, times in per_file.items():
        assert share(times, ("other",)) >= 0.99, path
        assert share(times, ("other", "custom")) >= 0.99, path  # DL training: all library code


@needs_shared
def test_realtraces_are_covered() -> None:
    per_file = all_realtraces()
    report("kernel time classified, realtraces", per_file)
    pooled = {}
    for times in per_file.values():
        for library, ns in times.items():
            pooled[library] = pooled.get(library, 0) + ns
    def mean(excluded: tuple[str, ...]) -> float:
        return sum(share(times, excluded) for times in per_file.values()) / len(per_file)

    print(f"pooled by time: {share(pooled, ('other',)):.2%} not other, "
          f"{share(pooled, ('other', 'custom')):.2%} library; mean over the "
          f"{len(per_file)} traces: {mean(('other',)):.2%} not other, "
          f"{mean(('other', 'custom')):.2%} library")
    assert len(per_file) >= 60
    assert share(pooled, ("other",)) >= 0.95
    assert mean(("other",)) >= 0.95


def precision_mismatches(kernels: pl.DataFrame) -> list[tuple[str, str | None, str | None]]:
    """(name, expected, classified) for each name whose precision differs from
    kernel_precisions.tsv, or that is a GEMM, convolution or attention kernel the file lacks."""
    classes = classify_names(kernels["name"], kernels["mangled"])
    wrong = []
    for name, operation, precision in classes.select("name", "operation", "precision").iter_rows():
        listed = name in PRECISIONS
        if PRECISIONS.get(name) != precision or (operation in FLOP_OPERATIONS and not listed):
            wrong.append((name[:120], PRECISIONS.get(name, "(not listed)"), precision))
    return wrong


def test_precision_of_every_sample_kernel_name() -> None:
    kernels = pl.concat([nsys_kernel_times(path) for path in sorted(SAMPLES.glob("*.sqlite"))]
                        + [kineto_kernel_times(path) for path in sorted(SAMPLES.glob("*.json"))])
    assert kernels.height > 100
    assert precision_mismatches(kernels) == []


@needs_shared
def test_precision_of_every_corpus_kernel_name() -> None:
    traces = realtrace_kernels()
    kernels = pl.concat([*traces.values(), *(nsys_kernel_times(path) for path in SHARED.glob("reference/*.sqlite"))])
    precisions = classify_names(kernels["name"], kernels["mangled"])["precision"]
    assert len(traces) >= 60 and precisions.drop_nulls().n_unique() == 5  # fp32 tf32 fp16 bf16 fp8
    assert precision_mismatches(kernels) == []


@needs_shared
def test_alexnet_without_cudnn_is_im2col_plus_cublas_gemm() -> None:
    names = nsys_kernel_times(SHARED / "reference" / "alexnet_b256_nocudnn.sqlite")
    labels = classify_names(names["name"], names["mangled"])
    im2col = labels.filter(pl.col("name").str.contains("im2col_kernel"))
    col2im = labels.filter(pl.col("name").str.contains("col2im_kernel"))
    gemm = labels.filter(pl.col("name").str.contains("(?i)gemm"))
    assert im2col.height and set(im2col["operation"]) == {"im2col"}
    assert col2im.height and set(col2im["operation"]) == {"col2im"}
    assert gemm.height >= 10
    assert set(zip(gemm["library"], gemm["operation"])) == {("cuBLAS", "gemm")}
    assert labels.filter(pl.col("operation") == "convolution").is_empty()


@needs_shared
def test_ddp_nccl_kernels_are_communication_with_their_collective() -> None:
    names = nsys_kernel_times(SHARED / "reference" / "ddp_resnet18_2gpu.sqlite")
    nccl = classify_names(names["name"], names["mangled"]).filter(
        pl.col("name").str.starts_with("nccl"))
    expected = {"ncclDevKernel_AllReduce": "all_reduce", "ncclDevKernel_Broadcast": "broadcast"}
    assert nccl.height == 2
    for name, library, operation, collective in nccl.select(
            "name", "library", "operation", "collective").iter_rows():
        assert (library, operation) == ("NCCL", "communication")
        assert collective == next(v for k, v in expected.items() if name.startswith(k))


# ---------------------------------------------------------------------------------------------
# real kernel names and what the packaged rules must answer for them
# ---------------------------------------------------------------------------------------------

# Names too long to read inline, used in CASES below.

# kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint: CK weight-gradient convolution
CK_BWD_WEIGHT = (
    "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm_b"
    "k0mk1_bk0nk1_mn_xdlops_bwd_weightILi64EttftLNS_25InMemoryDataOperationEnumE1ENS_16TensorDe"
    "scriptorINS_5TupleIJNS_5EmbedINS6_IJiiEEENS6_IJiNS_17integral_constantIiLi1EEEEEELb0EEENS_"
    "8RightPadIiiLb0EEENS_11PassThroughIiEENS_7UnMergeINS6_IJiiiEEELb0EEESG_SG_SG_SE_SG_EEENS6_"
    "IJNS_8SequenceIJLi0EEEENSL_IJLi1EEEENSL_IJLi2EEEENSL_IJLi3EEEENSL_IJLi4EEEENSL_IJLi5EEEENS"
    "L_IJLi6EEEENSL_IJLi8EEEENSL_IJLi7EEEEEEENS6_IJNSL_IJLi1ELi2EEEESP_SQ_NSL_IJLi5ELi6ELi7EEEE"
    "ST_NSL_IJLi9EEEENSL_IJLi10EEEENSL_IJLi11EEEENSL_IJLi12EEEEEEENSL_IJLi9ELi10ELi11ELi12EEEEl"
    "EENS5_INS6_IJNS7_INS6_IJiiiiEEES15_Lb0EEESG_NS_3PadIiiiLb0EEES18_SG_SG_NS7_IS8_S8_Lb0EEES1"
    "9_SG_NS_23Merge_v2_magic_divisionISI_EES1B_SE_SG_SJ_SG_SG_SG_SE_SG_EEENS6_IJSM_SN_SO_SP_SQ"
    "_SR_SS_SU_ST_NSL_IJLi10ELi12ELi14EEEENSL_IJLi9ELi11ELi13EEEENSL_IJLi16EEEENSL_IJLi15EEEENS"
    "L_IJLi17EEEENSL_IJLi18EEEENSL_IJLi19EEEENSL_IJLi20EEEENSL_IJLi22EEEENSL_IJLi21EEEEEEENS6_I"
    "JNSL_IJLi1ELi2ELi3ELi4EEEESR_SS_SU_ST_SY_NSL_IJLi10ELi11EEEENSL_IJLi12ELi13EEEENSL_IJLi14E"
    "EEES1G_S1F_S1H_S1I_NSL_IJLi19ELi20ELi21EEEES1L_NSL_IJLi23EEEENSL_IJLi24EEEENSL_IJLi25EEEEN"
    "SL_IJLi26EEEEEEENSL_IJLi23ELi24ELi25ELi26EEEElEENS5_INS6_IJSC_SE_SE_EEENS6_IJSM_SN_SO_EEEN"
    "S6_IJSW_SP_SQ_EEENSL_IJLi3ELi4EEEElEENS0_12element_wise11PassThroughES26_S26_Li64ELi64ELi4"
    "ELi32ELi32ELi8ELi2ELi2ENSL_IJLi1ELi4ELi8ELi2EEEENSL_IJLi0ELi3ELi1ELi2EEEENSL_IJLi0ELi2ELi1"
    "ELi3EEEELi2ELi8ELi4ELb0ELb1ELi8ELi8ELi4ES27_S28_S29_Li2ELi8ELi4ELb0ELb1ELi8ELi8ELi4ELi1ELi"
    "1ELi8ENSL_IJLi1ELi16ELi1ELi4EEEELb1ELb1ELi1ELNS_15PipelineVersionE0EttEEtttS26_S26_S26_S14"
    "_S1Z_NS5_INS6_IJSC_SE_SE_NSH_INS6_IJiNS9_IiLi64EEEEEELb0EEES2F_EEENS6_IJSM_SN_SO_SP_SQ_EEE"
    "NS6_IJSW_SP_SQ_NSL_IJLi5ELi6EEEENSL_IJLi7ELi8EEEEEEENSL_IJLi5ELi6ELi7ELi8EEEElEENS_38Block"
    "ToCTileMap_KSplit_M00_N00_M01_N01ILi64ELi64ES24_Lb0EEENS1_30ComputePtrOffsetOfStridedBatch"
    "ILi1ELi1ELi0EvEELb1EEEvPKT0_PKT1_PT2_T3_T4_T5_iT6_T7_T8_T9_T10_")

# reference/alexnet_b256_kineto.json: cuDNN's CUTLASS weight-gradient convolution (mangled)
CUDNN_WGRAD_MANGLED = (
    "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22"
    "ImplicitGemmMultistageINS_4gemm9GemmShapeILi64ELi128ELi16EEENS4_52Conv2dWgradOutputGradien"
    "tTileAccessIteratorOptimizedINS_11MatrixShapeILi64ELi16EEENS_10tfloat32_tENS_9transform29P"
    "itchLinearWarpRakedThreadMapINS_16PitchLinearShapeILi64ELi16EEELi128ENSF_ILi8ELi4EEELi4EEE"
    "NS_12AlignedArrayISC_Li4ELi16EEEEENSD_11threadblock25RegularTileAccessIteratorISB_SC_NS_6l"
    "ayout40ColumnMajorTensorOpMultiplicandCongruousILi32ELi32EEELi1ESI_Li16EEELNS_4arch14Cache"
    "Operation4KindE0ENS4_48Conv2dWgradActivationTileAccessIteratorOptimizedINSA_ILi16ELi128EEE"
    "SC_NSE_INSF_ILi128ELi16EEELi128ESH_Li4EEESK_EENSN_ISW_SC_NSO_37RowMajorTensorOpMultiplican"
    "dCongruousILi32ELi32EEELi0ESY_Li16EEELSU_0ENS6_11threadblock9MmaPolicyINS6_4warp11MmaTenso"
    "rOpINS7_ILi32ELi64ELi16EEESC_SQ_SC_S11_fNSO_8RowMajorENS15_17MmaTensorOpPolicyINSS_3MmaINS"
    "7_ILi16ELi8ELi8EEELi32ESC_S18_SC_NSO_11ColumnMajorEfS18_NSS_13OpMultiplyAddEEENSA_ILi1ELi1"
    "EEEEELi1ELb0EbEENSA_ILi0ELi0EEES1I_Li1EEELi6EbEENS_8epilogue11threadblock8EpilogueIS8_S1H_"
    "Li1ENS1M_22PredicatedTileIteratorINS1M_26OutputTileOptimalThreadMapINS1M_15OutputTileShape"
    "ILi128ELi8ELi2ELi1ELi1EEENS1Q_ILi1ELi4ELi1ELi1ELi4EEELi128ELi4ELi32EEEfLb0ENSO_9NoPermuteE"
    "Lb0EEENS1L_4warp24FragmentIteratorTensorOpIS17_S1B_fNS_5ArrayIfLi4ELb1EEES18_EENS1W_20Tile"
    "IteratorTensorOpIS17_S1B_fS18_EENS1M_18SharedLoadIteratorINS1T_18CompactedThreadMapEfLi16E"
    "EENS1L_6thread17LinearCombinationIfLi4EffLNS26_9ScaleType4KindE0ELNS_15FloatRoundStyleE2EE"
    "ENSA_ILi0ELi8EEELi2ELi1EEENS13_30GemmIdentityThreadblockSwizzleILi4EEELNS1_8OperatorE2ENS1"
    "_17Conv2dProblemSizeELNS1_9GroupModeE0EEEEEvNT_6ParamsE")

# nsys_sqlite/wenscarl__cutlass_benchmark__report1: a GEMM built from CUTLASS templates
CUTLASS_GEMM = (
    "void cutlass::Kernel<cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPipelined<"
    "cutlass::gemm::GemmShape<(int)128, (int)128, (int)32>, cutlass::transform::threadblock::Pr"
    "edicatedTileIterator<cutlass::MatrixShape<(int)128, (int)32>, float, cutlass::layout::RowM"
    "ajor, (int)1, cutlass::transform::PitchLinearWarpRakedThreadMap<cutlass::PitchLinearShape<"
    "(int)32, (int)128>, (int)128, cutlass::PitchLinearShape<(int)4, (int)8>, (int)8>, (int)4, "
    "(bool)0, cutlass::layout::NoPermute>, cutlass::transform::threadblock::RegularTileIterator"
    "<cutlass::MatrixShape<(int)128, (int)32>, cutlass::half_t, cutlass::layout::RowMajorTensor"
    "OpMultiplicandCrosswise<(int)16, (int)32>, (int)0, cutlass::transform::PitchLinearWarpRake"
    "dThreadMap<cutlass::PitchLinearShape<(int)32, (int)128>, (int)128, cutlass::PitchLinearSha"
    "pe<(int)4, (int)8>, (int)8>, (int)16>, cutlass::transform::threadblock::PredicatedTileIter"
    "ator<cutlass::MatrixShape<(int)32, (int)128>, float, cutlass::layout::RowMajor, (int)0, cu"
    "tlass::transform::PitchLinearWarpRakedThreadMap<cutlass::PitchLinearShape<(int)128, (int)3"
    "2>, (int)128, cutlass::PitchLinearShape<(int)8, (int)4>, (int)8>, (int)4, (bool)0, cutlass"
    "::layout::NoPermute>, cutlass::transform::threadblock::RegularTileIterator<cutlass::Matrix"
    "Shape<(int)32, (int)128>, cutlass::half_t, cutlass::layout::RowMajorTensorOpMultiplicandCo"
    "ngruous<(int)16, (int)64>, (int)0, cutlass::transform::PitchLinearWarpRakedThreadMap<cutla"
    "ss::PitchLinearShape<(int)128, (int)32>, (int)128, cutlass::PitchLinearShape<(int)8, (int)"
    "4>, (int)8>, (int)16>, float, cutlass::layout::RowMajor, cutlass::gemm::threadblock::MmaPo"
    "licy<cutlass::gemm::warp::MmaTensorOp<cutlass::gemm::GemmShape<(int)64, (int)64, (int)32>,"
    " cutlass::half_t, cutlass::layout::RowMajorTensorOpMultiplicandCrosswise<(int)16, (int)32>"
    ", cutlass::half_t, cutlass::layout::RowMajorTensorOpMultiplicandCongruous<(int)16, (int)64"
    ">, float, cutlass::layout::RowMajor, cutlass::gemm::warp::MmaTensorOpPolicy<cutlass::arch:"
    ":Mma<cutlass::gemm::GemmShape<(int)16, (int)8, (int)8>, (int)32, cutlass::half_t, cutlass:"
    ":layout::RowMajor, cutlass::half_t, cutlass::layout::ColumnMajor, float, cutlass::layout::"
    "RowMajor, cutlass::arch::OpMultiplyAdd>, cutlass::MatrixShape<(int)1, (int)1>>, (int)1, (b"
    "ool)0, bool>, cutlass::MatrixShape<(int)0, (int)0>, cutlass::MatrixShape<(int)0, (int)0>, "
    "(int)1>, cutlass::NumericArrayConverter<cutlass::half_t, float, (int)32, (cutlass::FloatRo"
    "undStyle)2, cutlass::transform::thread::UnaryTransform::Identity>, cutlass::NumericArrayCo"
    "nverter<cutlass::half_t, float, (int)32, (cutlass::FloatRoundStyle)2, cutlass::transform::"
    "thread::UnaryTransform::Identity>, bool>, cutlass::epilogue::threadblock::Epilogue<cutlass"
    "::gemm::GemmShape<(int)128, (int)128, (int)32>, cutlass::gemm::warp::MmaTensorOp<cutlass::"
    "gemm::GemmShape<(int)64, (int)64, (int)32>, cutlass::half_t, cutlass::layout::RowMajorTens"
    "orOpMultiplicandCrosswise<(int)16, (int)32>, cutlass::half_t, cutlass::layout::RowMajorTen"
    "sorOpMultiplicandCongruous<(int)16, (int)64>, float, cutlass::layout::RowMajor, cutlass::g"
    "emm::warp::MmaTensorOpPolicy<cutlass::arch::Mma<cutlass::gemm::GemmShape<(int)16, (int)8, "
    "(int)8>, (int)32, cutlass::half_t, cutlass::layout::RowMajor, cutlass::half_t, cutlass::la"
    "yout::ColumnMajor, float, cutlass::layout::RowMajor, cutlass::arch::OpMultiplyAdd>, cutlas"
    "s::MatrixShape<(int)1, (int)1>>, (int)1, (bool)0, bool>, (int)1, cutlass::epilogue::thread"
    "block::PredicatedTileIterator<cutlass::epilogue::threadblock::OutputTileOptimalThreadMap<c"
    "utlass::epilogue::threadblock::OutputTileShape<(int)128, (int)8, (int)2, (int)1, (int)1>, "
    "cutlass::epilogue::threadblock::OutputTileShape<(int)1, (int)8, (int)1, (int)1, (int)8>, ("
    "int)128, (int)4, (int)32>, float, (bool)0, cutlass::layout::NoPermute, (bool)0>, cutlass::"
    "epilogue::warp::FragmentIteratorTensorOp<cutlass::gemm::GemmShape<(int)64, (int)64, (int)3"
    "2>, cutlass::gemm::GemmShape<(int)16, (int)8, (int)8>, float, cutlass::Array<float, (int)4"
    ", (bool)1>, cutlass::layout::RowMajor>, cutlass::epilogue::warp::TileIteratorTensorOp<cutl"
    "ass::gemm::GemmShape<(int)64, (int)64, (int)32>, cutlass::gemm::GemmShape<(int)16, (int)8,"
    " (int)8>, float, cutlass::layout::RowMajor>, cutlass::epilogue::threadblock::SharedLoadIte"
    "rator<cutlass::epilogue::threadblock::OutputTileOptimalThreadMap<cutlass::epilogue::thread"
    "block::OutputTileShape<(int)128, (int)8, (int)2, (int)1, (int)1>, cutlass::epilogue::threa"
    "dblock::OutputTileShape<(int)1, (int)8, (int)1, (int)1, (int)8>, (int)128, (int)4, (int)32"
    ">::CompactedThreadMap, float, (int)16>, cutlass::epilogue::thread::LinearCombinationGeneri"
    "c<cutlass::epilogue::thread::HardSwish, float, (int)4, float, float, (cutlass::epilogue::t"
    "hread::ScaleType::Kind)1, (cutlass::FloatRoundStyle)2, (bool)0>, cutlass::MatrixShape<(int"
    ")0, (int)8>, (int)2, (int)1>, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<("
    "int)1>, (bool)0>>(T1::Params)")

# name, then: library, operation, direction, algorithm, collective, gemm_variant, tensor_cores
CASES = [
    # sample_traces/alexnet_b256_amp (ours): cuDNN's fp16 first-layer convolution on HMMA
    (("sm90_xmma_fprop_image_first_layer_f16f16_f32_f16_nhwckrsc_nhwc_hmma_k64c4r7s7_stride2x2_tile16x64x64_"
      "tensor1688_execute_kernel_kernel__5x_cudnn"),
     "cuDNN", "convolution", "forward", None, None, None, True),
    # kineto_json/AMD-AGI__TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005 (cuBLAS's bf16 GEMM)
    (("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
      "segment_k_off_kernel__5x_cublas"),
     "cuBLAS", "gemm", None, None, None, "tn", True),
    # kineto_json/AMD-AGI__TraceLens__h100__gaunernst_bert-small-uncased__1016001
    (("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>"
      "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8::Params)"),
     "cuBLAS", "gemm", None, None, None, "tn", True),
    # nsys_sqlite/LeiWang1999__memfusion_artifact__report1
    ("trt_ampere_h16816gemm_64x64_ldg8_relu_stages_64x5_tn_v1",
     "TensorRT", "gemm", None, None, None, "tn", True),
    # nvprof_sqlite/F64081169__Nvprof_Jetson_Nano_Example__yolo.nvvp
    ("trt_maxwell_fp16x2_hcudnn_winograd_fp16x2_128x128_ldg1_ldg4_relu_tile148m_nt_v1",
     "TensorRT", "convolution", "forward", "winograd", None, "nt", False),
    # nsys_sqlite/LeiWang1999__memfusion_artifact__report1
    ("sm50_xmma_pooling_coalescedC_NHWC_kMAX_3_False_execute_kernel_trt",
     "TensorRT", "pooling", None, None, None, None, False),
    # nsys_sqlite/LeiWang1999__memfusion_artifact__report1
    (("sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize128x128x32_"
      "stage4_warpsize2x2x1_g1_tensor16x8x16_execute_kernel_trt"),
     "TensorRT", "convolution", "forward", "implicit_gemm", None, None, True),
    # nvprof_sqlite/F64081169__Nvprof_Jetson_Nano_Example__yolo.nvvp
    (("void cuInt8::nchhw2ToNchw<float>(__half const*, float*, int, int, int, int, int, "
      "int, cuInt8::ReducedDivisorParameters)"),
     "TensorRT", "layout_transform", None, None, None, None, False),
    # nvprof_sqlite/F64081169__Nvprof_Jetson_Nano_Example__yolo.nvvp
    (("void cuResizeLayer::ResizeNearestGenericKernel<float, 2, 128, (nvinfer1::ResizeRo"
      "undMode)2>(float*, float const*, cuResizeLayer::LaunchParams)"),
     "TensorRT", "interpolation", None, None, None, None, False),
    # nvprof_sqlite/F64081169__Nvprof_Jetson_Nano_Example__yolo.nvvp
    ("generatedNativePointwise",
     "TensorRT", "elementwise", None, None, None, None, False),
    # nvprof_sqlite/UCBerkeley-Spring2022-CS267-project__blinkplus-nccl-base__output.nvvp
    ("ncclAllReduceTreeLLKernel_sum_i32(ncclColl)",
     "NCCL", "communication", None, None, "all_reduce", None, False),
    # nvprof_sqlite/UCBerkeley-Spring2022-CS267-project__blinkplus-nccl-base__output.nvvp
    ("ncclBroadcastRingLLKernel_copy_i8(ncclColl)",
     "NCCL", "communication", None, None, "broadcast", None, False),
    # reference/ddp_resnet18_2gpu
    (("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4"
      "096>)"),
     "NCCL", "communication", None, None, "all_reduce", None, False),
    # reference/ddp_resnet18_2gpu
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
     "NCCL", "communication", None, None, "broadcast", None, False),
    # kineto_json/AMD-AGI__TraceLens__b200__eager_trace
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "NCCL", "communication", None, None, "all_gather", None, False),
    # sample_traces/multigpu/fsdp_transformer_2gpu_rank0 (ours, FSDP2)
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
     "NCCL", "communication", None, None, "reduce_scatter", None, False),
    # nvprof_sqlite/ZhangXin8069__qcu__test__log_x99-Yang_1236834.nvvp
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
     "NCCL", "communication", None, None, "send_recv", None, False),
    # kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
     "NCCL", "communication", None, None, None, None, False),
    # nsys_sqlite/MohanadOdema__DLProf__w_Relu__nsys_profile
    ("volta_scudnn_128x64_relu_interior_nn_v1",
     "cuDNN", "convolution", "forward", "implicit_gemm", None, "nn", False),
    # kineto_json/pytorch__kineto__resnet50_autograd_api_num_workers_0__worker0.pt.trace
    ("volta_scudnn_128x64_stridedB_interior_nn_v1",
     "cuDNN", "convolution", "data_gradient", "implicit_gemm", None, "nn", False),
    # kineto_json/pytorch__kineto__resnet50_autograd_api_num_workers_0__worker0.pt.trace
    ("volta_scudnn_128x128_stridedB_splitK_small_nn_v1",
     "cuDNN", "convolution", "weight_gradient", "implicit_gemm", None, "nn", False),
    # nsys_sqlite/MohanadOdema__DLProf__nsys_profile
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1",
     "cuDNN", "convolution", None, "winograd", None, "nt", False),
    # nvprof_sqlite/Raphael-Hao__Abacus__op_profile__tune.prof
    ("volta_s884cudnn_fp16_128x128_ldg8_relu_exp_interior_nhwc_tn_v1",
     "cuDNN", "convolution", "forward", "implicit_gemm", None, "tn", True),
    # reference/ddp_resnet18_2gpu
    (("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize12"
      "8x128x32_warpgroupsize1x1x1_g1_execute_split_k_kernel__5x_cudnn"),
     "cuDNN", "convolution", "weight_gradient", "implicit_gemm", None, None, True),
    # reference/alexnet_b128_cudnn
    (("sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32"
      "_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn"),
     "cuDNN", "convolution", "data_gradient", "implicit_gemm", None, None, True),
    # reference/alexnet_b256_cudnn
    (("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize1"
      "28x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn"),
     "cuDNN", "convolution", "forward", "implicit_gemm", None, None, True),
    # reference/alexnet_b128_cudnn
    (("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, (bool)0, ("
      "bool)1, (cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<"
      "T3>, const T1 *, T2 *)"),
     "cuDNN", "layout_transform", None, None, None, None, False),
    # reference/ddp_resnet18_2gpu
    (("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, (int)128, (bool)1, (int)"
      "1, (bool)1>(cudnnTensorStruct, const T1 *, cudnnTensorStruct, T1 *, const T2 *, c"
      "onst T2 *, T2, T2, T2 *, T2 *, T2 *, T2 *, T2, T2)"),
     "cuDNN", "normalization", None, None, None, None, False),
    # reference/ddp_resnet18_2gpu
    (("void cudnn::detail::dgrad_engine<float, (int)512, (int)6, (int)5, (int)3, (int)3,"
      " (int)3, (bool)0>(int, int, int, const T1 *, int, const T1 *, int, T1 *, kernel_g"
      "rad_params, unsigned long long, int, unsigned long long, int, float, int, int, in"
      "t)"),
     "cuDNN", "convolution", "data_gradient", None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__ns_resolution_trace__rank-0.Apr_03_18_51_
    (("void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>(cudnn::winograd"
      "_nonfused::WinogradDataParams<float, float>)"),
     "cuDNN", "convolution", "weight_gradient", "winograd", None, None, False),
    # nsys_sqlite/MohanadOdema__DLProf__nsys_profile
    (("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winogr"
      "ad_nonfused::WinogradDataParams<T1, T2>)"),
     "cuDNN", "convolution", None, "winograd", None, None, False),
    # nvprof_sqlite/esarmstrong__ece408__timeline.nvprof
    (("void cudnn::detail::activation_fw_4d_kernel<float, float, 128, 1, 4, cudnn::detai"
      "l::tanh_func<float> >(cudnnTensorStruct, float const*, cudnnTensorStruct, float*,"
      " float, float, int, float)"),
     "cuDNN", "activation", None, None, None, None, False),
    # nvprof_sqlite/m-goldstein__GPU_ML__timeline.nvvp
    (("void op_generic_tensor_kernel<2, float, float, float, 256, (cudnnGenericOp_t)7, ("
      "cudnnNanPropagation_t)0, (cudnnDimOrder_t)0, 1>(cudnnTensorStruct, float*, cudnnT"
      "ensorStruct, float const*, cudnnTensorStruct, float const*, float, float, float, "
      "float, dimArray, reducedDivisorArray)"),
     "cuDNN", "elementwise", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_128x128"
      "_16x4_nhwc_align4>(T1::Params)"),
     "cuDNN", "convolution", "forward", "implicit_gemm", None, None, True),
    # kineto_json/pytorch__kineto__resnet50_autograd_api_num_workers_0__worker0.pt.trace
    ("cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)",
     "cuDNN", "indexing", None, None, None, None, False),
    # reference/lenet_b256_cudnn
    (("void implicit_convolve_sgemm<float, float, (int)1024, (int)5, (int)5, (int)3, (in"
      "t)3, (int)3, (int)1, (bool)0, (bool)0, (bool)1>(int, int, int, const T1 *, int, T"
      "2 *, const T1 *, kernel_conv_params, unsigned long long, int, float, float, int, "
      "const T2 *, const T2 *, bool, bool, int, int)"),
     "cuDNN", "convolution", "forward", "implicit_gemm", None, None, False),
    # kineto_json/pytorch__kineto__resnet50_autograd_api_num_workers_0__worker0.pt.trace
    (("void explicit_convolve_sgemm<float, int, 1024, 5, 5, 3, 3, 3, 0, false>(int, int,"
      " int, float const*, int, float const*, int, float*, kernel_conv_params, unsigned "
      "long long, int, unsigned long long, int, float, float, int, float const*, float c"
      "onst*)"),
     "cuDNN", "convolution", "forward", "gemm", None, None, False),
    # reference/lenet_b256_cudnn
    (("void wgrad_alg0_engine<float, (int)128, (int)5, (int)5, (int)3, (int)3, (int)3, ("
      "bool)0, (int)512>(int, int, int, const T1 *, int, T1 *, const T1 *, kernel_grad_p"
      "arams, unsigned long long, int, float, int, int, int, int)"),
     "cuDNN", "convolution", "weight_gradient", None, None, None, False),
    # reference/lenet_b256_cudnn
    (("void tensorTransformGeneric<float, float, float, (bool)1, (bool)0, (bool)0, (cudn"
      "nKernelDataType_t)2>(cudnnTensorTransformStruct, tensorTransformParams, int, unsi"
      "gned long, const T1 *, T2 *, T3, T3)"),
     "cuDNN", "layout_transform", None, None, None, None, False),
    # nvprof_sqlite/Raphael-Hao__Abacus__op_profile__tune.prof
    (("void nhwcToNchwKernel<float, float, float, true, false>(int, int, int, int, float"
      " const*, float*, float, float)"),
     "cuDNN", "layout_transform", None, None, None, None, False),
    # nsys_sqlite/MohanadOdema__DLProf__nsys_profile
    (("void im2col4d_kernel<float, int>(im2col4d_params, cudnnConvolutionStruct, cudnnTe"
      "nsor4dStruct, const T1 *, T1 *, int)"),
     "cuDNN", "im2col", None, "gemm", None, None, False),
    # nsys_sqlite/MohanadOdema__DLProf__nsys_profile
    (("void fft2d_r2c_32x32<float, (bool)0, (unsigned int)1, (bool)0>(float2 *, const T1"
      " *, int, int, int, int, int, int, int, int, int, cudnn::reduced_divisor, bool, in"
      "t2, int, int)"),
     "cuDNN", "convolution", None, "fft", None, None, False),
    # nvprof_sqlite/Raphael-Hao__Abacus__op_profile__tune.prof
    (("void fft2d_c2r_16x16<float, false>(float*, float2*, int, int, int, int, int, int,"
      " int, int, int, int, float, float, int, float*, float*)"),
     "cuDNN", "convolution", None, "fft", None, None, False),
    # nsys_sqlite/MohanadOdema__DLProf__nsys_profile
    ("void flip_filter<float, float>(T2 *, const T1 *, int, int, int, int)",
     "cuDNN", "layout_transform", None, None, None, None, False),
    # kineto_json/pytorch__kineto__resnet50_autograd_api_num_workers_0__worker0.pt.trace
    (("void pointwise_mult_and_sum_complex<float2, 8, 4>(float2*, float2*, float2*, int,"
      " int, int, int, int, float2)"),
     "cuDNN", "convolution", None, "fft", None, None, False),
    # nsys_sqlite/MohanadOdema__DLProf__nsys_profile
    (("compute_gemm_pointers(float2 **, const float2 *, int, const float2 *, int, const "
      "float2 *, int, int)"),
     "cuDNN", "indexing", None, "fft", None, None, False),
    # nsys_sqlite/MohanadOdema__DLProf__w_Relu__nsys_profile
    ("volta_gcgemm_32x32_nt",
     "cuDNN", "convolution", None, "fft", None, "nt", False),
    # reference/alexnet_b128_cudnn
    (("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_a"
      "ligna4_alignc4_execute_kernel__5x_cublas"),
     "cuBLAS", "gemm", None, None, None, "tn", False),
    # reference/resnet50_b32_autograd_40it
    (("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1_exec"
      "ute_segment_k_off_kernel__5x_cublas"),
     "cuBLAS", "gemm", None, None, None, "nt", True),
    # reference/alexnet_b128_cudnn
    (("void cublasLt::epilogue::impl::globalKernel<(int)8, (int)32, float, float, float,"
      " (bool)1, (bool)1, (int)1>(int, int, long, T3 *, cublasLtEpilogue_t, int, T4 *, l"
      "ong, void *, long, long, long, T5 *, long, int *)"),
     "cuBLAS", "elementwise", None, None, None, None, False),
    # kineto_json/facebookresearch__param__dlrm_kineto__worker0_step_12.1694128201545.pt.trace
    (("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedB"
      "atched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTenso"
      "rStridedBatched<float> >(cublasGemmSmallNParams<cublasGemvTensorStridedBatched<fl"
      "oat const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedB"
      "atched<float>, float>)"),
     "cuBLAS", "gemm", None, None, None, "tn", False),
    # reference/alexnet_b128_cudnn
    (("void scal_kernel<float, float, (int)1, (bool)1, (int)6, (int)5, (int)5, (int)3>(c"
      "ublasTransposeParams<T2>, const T1 *, T1 *, const T2 *)"),
     "cuBLAS", "elementwise", None, None, None, None, False),
    # nsys_sqlite/NVIDIA__Fuser__report1__H200_nsys2025.1.1
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN",
     "cuBLAS", "gemm", None, None, None, "tn", True),
    # nsys_sqlite/NVIDIA__Fuser__report1__H200_nsys2024.6.2
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT",
     "cuBLAS", "gemm", None, None, None, "nt", True),
    # nvprof_sqlite/josiahdavis__profiling-lm__net.sql
    ("volta_sgemm_128x64_nn",
     "cuBLAS", "gemm", None, None, None, "nn", False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__df_index_resolver
    ("volta_sgemm_32x128_tt",
     "cuBLAS", "gemm", None, None, None, "tt", False),
    # nsys_sqlite/MohanadOdema__DLProf__w_Relu__nsys_profile
    ("volta_cgemm_32x32_tn",
     "cuBLAS", "gemm", None, None, None, "tn", False),
    # reference/alexnet_b256_nocudnn
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(T1::Params)",
     "cuBLAS", "gemm", None, None, None, "nn", False),
    # reference/resnet50_b32_autograd_40it
    (("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nt_align4>(T1::P"
      "arams)"),
     "cuBLAS", "gemm", None, None, None, "nt", True),
    # nsys_sqlite/NTHU-SC__ISC25-ICON-C__nsys_reports__gpu
    (("void cub::CUB_200300_89_NS::DeviceScanInitKernel<cub::CUB_200300_89_NS::ScanTileS"
      "tate<int, (bool)1>>(T1, int)"),
     "CUB/Thrust", "sort/scan", None, None, None, None, False),
    # nsys_sqlite/tomarriott__GTLS__report1
    (("void cub::DeviceReduceKernel<cub::DeviceReducePolicy<float, int, cub::Min>::Polic"
      "y600, float *, int, cub::Min, float>(T2, T5 *, T3, cub::GridEvenShare<T3>, T4)"),
     "CUB/Thrust", "reduction", None, None, None, None, False),
    # nsys_sqlite/tomarriott__GTLS__report1
    (("void thrust::cuda_cub::core::_kernel_agent<thrust::cuda_cub::__parallel_for::Para"
      "llelForAgent<thrust::cuda_cub::__transform::binary_transform_f<thrust::counting_i"
      "terator<unsigned long, thrust::use_default, thrust::use_default, thrust::use_defa"
      "ult>, thrust::constant_iterator<long, thrust::use_default, thrust::use_default>, "
      "thrust::device_ptr<unsigned long>, thrust::cuda_cub::__transform::no_stencil_tag,"
      " thrust::divides<unsigned long>, thrust::cuda_cub::__transform::always_true_predi"
      "cate>, long long>, thrust::cuda_cub::__transform::binary_transform_f<thrust::coun"
      "ting_iterator<unsigned long, thrust::use_default, thrust::use_default, thrust::us"
      "e_default>, thrust::constant_iterator<long, thrust::use_default, thrust::use_defa"
      "ult>, thrust::device_ptr<unsigned long>, thrust::cuda_cub::__transform::no_stenci"
      "l_tag, thrust::divides<unsigned long>, thrust::cuda_cub::__transform::always_true"
      "_predicate>, long long>(T2, T3)"),
     "CUB/Thrust", "other", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__negative_queue_length_values_check__rank0
    (("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*,"
      " int*)"),
     "FBGEMM", "other", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__negative_queue_length_values_check__rank0
    (("split_embedding_backward_codegen_find_long_segments(at::GenericPackedTensorAccess"
      "or<int, 1ul, at::RestrictPtrTraits, int>, at::GenericPackedTensorAccessor<int, 1u"
      "l, at::RestrictPtrTraits, int>, at::GenericPackedTensorAccessor<int, 1ul, at::Res"
      "trictPtrTraits, int>, at::GenericPackedTensorAccessor<int, 1ul, at::RestrictPtrTr"
      "aits, int>, at::GenericPackedTensorAccessor<int, 1ul, at::RestrictPtrTraits, int>"
      ", at::GenericPackedTensorAccessor<int, 1ul, at::RestrictPtrTraits, int>, at::Gene"
      "ricPackedTensorAccessor<int, 1ul, at::RestrictPtrTraits, int>, int, int, bool)"),
     "FBGEMM", "embedding", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__negative_queue_length_values_check__rank0
    (("void permute_pooled_embs_kernel<float>(float const*, long const*, long const*, lo"
      "ng const*, float*, long, long, long)"),
     "FBGEMM", "embedding", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__trace_filter__sampled_rank-0
    (("void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>("
      "float const*, float const*, int, int, unsigned char*, bool)"),
     "FBGEMM", "elementwise", None, None, None, None, False),
    # reference/alexnet_b256_nocudnn
    (("void at::native::im2col_kernel<float>(long, const T1 *, long, long, long, long, l"
      "ong, long, long, long, long, long, long, long, T1 *)"),
     "PyTorch ATen", "im2col", None, "gemm", None, None, False),
    # reference/alexnet_b256_nocudnn
    (("void at::native::col2im_kernel<float, float>(long, const T1 *, long, long, long, "
      "long, long, long, long, long, long, long, long, long, T1 *)"),
     "PyTorch ATen", "col2im", None, "gemm", None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_ad"
      "d<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)"),
     "PyTorch ATen", "elementwise", None, None, None, None, False),
    # nsys_sqlite/NVIDIA__Fuser__report1__H200_nsys2025.1.1
    (("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<fl"
      "oat>, std::array<char *, (unsigned long)1>>(int, T2, T3)"),
     "PyTorch ATen", "memset", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::vectorized_elementwise_kernel<(int)4, at::native::<unnamed>::lau"
      "nch_clamp_scalar(at::TensorIteratorBase &, c10::Scalar, c10::Scalar, at::native::"
      "detail::ClampLimits)::[lambda() (instance 1)]::operator ()() const::[lambda() (in"
      "stance 7)]::operator ()() const::[lambda(float) (instance 1)], std::array<char *,"
      " (unsigned long)2>>(int, T2, T3)"),
     "PyTorch ATen", "activation", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<"
      "float, float, float, void at::native::<unnamed>::threshold_kernel_impl<float>(at:"
      ":TensorIteratorBase &, T1, T1)::[lambda(float, float) (instance 1)]>, std::array<"
      "char *, (unsigned long)3>>(int, T2, T3)"),
     "PyTorch ATen", "activation", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::<unnamed>::max_pool_forward_nchw<float, int>(T2, const T1 *, lon"
      "g, long, long, int, int, int, int, int, int, int, int, int, int, T1 *, long *)"),
     "PyTorch ATen", "pooling", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::<unnamed>::atomic_adaptive_average_gradinput<float>(T1 *, const "
      "T1 *, int, int, int, int)"),
     "PyTorch ATen", "pooling", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::"
      "native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::opera"
      "tor ()(at::TensorIterator &)::[lambda(float, float) (instance 1)]>, unsigned int,"
      " float, (int)4, (int)4>>(T3)"),
     "PyTorch ATen", "reduction", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::<unnamed>::nll_loss_forward_reduce_cuda_kernel_2d<float, float, "
      "long>(T1 *, T1 *, const T1 *, const T3 *, const T1 *, bool, long, long, long, lon"
      "g)"),
     "PyTorch ATen", "loss", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::<unnamed>::fused_dropout_kernel_vec<float, float, unsigned int, "
      "(int)1, (int)4, bool>(at::cuda::detail::TensorInfo<const T1, T3>, at::cuda::detai"
      "l::TensorInfo<T1, T3>, at::cuda::detail::TensorInfo<T6, T3>, T3, T2, at::PhiloxCu"
      "daState)"),
     "PyTorch ATen", "dropout", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::Tens"
      "orListMetadata<(int)2>, at::native::<unnamed>::BinaryOpListAlphaFunctor<float, (i"
      "nt)2, (int)2, (int)0>, std::plus<float>, float>(T1, T2, T3...)"),
     "PyTorch ATen", "optimizer", None, None, None, None, False),
    # nsys_sqlite/yyhtbs-yye__mmagic_vsr_v2__net
    (("void at::native::<unnamed>::CatArrayBatchedCopy_aligned16_contig<float, unsigned "
      "int, (int)4, (int)128, (int)1>(T1 *, at::native::<unnamed>::CatArrInputTensorMeta"
      "data<T1, T2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4"
      ">, int, T2)"),
     "PyTorch ATen", "copy", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void <unnamed>::softmax_warp_forward<float, float, float, (int)10, (bool)1, (bool"
      ")0>(T2 *, const T1 *, int, int, int, const bool *, int, bool)"),
     "PyTorch ATen", "softmax", None, None, None, None, False),
    # kineto_json/facebookresearch__param__dlrm_kineto__worker0_step_12.1694128201545.pt.trace
    (("void (anonymous namespace)::indexing_backward_kernel<float, 4>(long*, long*, floa"
      "t*, float*, long, long, long, long, bool)"),
     "PyTorch ATen", "indexing", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__b200__eager_trace
    (("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BF"
      "loat16*, unsigned long, unsigned int**, unsigned long, unsigned long)"),
     "PyTorch ATen", "communication", None, None, "all_reduce", None, False),
    # nsys_sqlite/yyhtbs-yye__mmagic_vsr_v2__net
    (("void at::native::<unnamed>::upsample_bilinear2d_out_frame<float, float>(int, T2, "
      "T2, bool, at::GenericPackedTensorAccessor<T1, (unsigned long)4, at::DefaultPtrTra"
      "its, long>, at::GenericPackedTensorAccessor<T1, (unsigned long)4, at::DefaultPtrT"
      "raits, long>)"),
     "PyTorch ATen", "interpolation", None, None, None, None, False),
    # nsys_sqlite/NVIDIA__Fuser__report1__H200_nsys2024.6.2
    (("void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, (i"
      "nt)4, void at::native::templates::cuda::normal_and_transform<c10::Half, float, at"
      "::CUDAGeneratorImpl *, void at::native::templates::cuda::normal_kernel<at::CUDAGe"
      "neratorImpl *>(const at::TensorBase &, double, double, T1)::[lambda() (instance 1"
      ")]::operator ()() const::[lambda() (instance 3)]::operator ()() const::[lambda(fl"
      "oat) (instance 1)]>(at::TensorIteratorBase &, T3, T4)::[lambda(curandStatePhilox4"
      "_32_10 *) (instance 2)], void at::native::<unnamed>::distribution_nullary_kernel<"
      "c10::Half, float, float4, at::CUDAGeneratorImpl *, void at::native::templates::cu"
      "da::normal_and_transform<c10::Half, float, at::CUDAGeneratorImpl *, void at::nati"
      "ve::templates::cuda::normal_kernel<at::CUDAGeneratorImpl *>(const at::TensorBase "
      "&, double, double, T1)::[lambda() (instance 1)]::operator ()() const::[lambda() ("
      "instance 3)]::operator ()() const::[lambda(float) (instance 1)]>(at::TensorIterat"
      "orBase &, T3, T4)::[lambda(curandStatePhilox4_32_10 *) (instance 2)], void at::na"
      "tive::templates::cuda::normal_kernel<at::CUDAGeneratorImpl *>(const at::TensorBas"
      "e &, double, double, T1)::[lambda() (instance 1)]::operator ()() const::[lambda()"
      " (instance 3)]::operator ()() const::[lambda(float) (instance 1)]>(at::TensorIter"
      "atorBase &, T4, const T5 &, T6)::[lambda(int, float) (instance 1)]>(int, at::Phil"
      "oxCudaState, T3, T4)"),
     "PyTorch ATen", "random", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__unit_tests_nv__moe_01_many_experts_few_tokens
    (("void at::native::sbtopk::gatherTopK<c10::BFloat16, unsigned int, 2, false>(at::cu"
      "da::detail::TensorInfo<c10::BFloat16 const, unsigned int>, unsigned int, unsigned"
      " int, bool, unsigned int, unsigned int, at::cuda::detail::TensorInfo<c10::BFloat1"
      "6, unsigned int>, unsigned int, at::cuda::detail::TensorInfo<long, unsigned int>,"
      " unsigned int, c10::BFloat16*)"),
     "PyTorch ATen", "sort/scan", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__amd_trace__mi250_minitoy_train_ROCm6_2_ki
    (("void at::native::vectorized_elementwise_kernel<4, at::native::mse_kernel_cuda(at:"
      ":TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()"
      "() const::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native"
      "::mse_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{la"
      "mbda()#2}::operator()() const::{lambda(float, float)#1}, at::detail::Array<char*,"
      " 3>)"),
     "PyTorch ATen", "loss", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005
    (("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 1"
      "28, 128, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits"
      "<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true,"
      " false>(pytorch_flash::Flash_fwd_params)"),
     "PyTorch ATen", "attention", None, None, None, None, True),
    # nvprof_sqlite/josiahdavis__profiling-lm__net.sql
    (("void cunn_ClassNLLCriterion_updateOutput_kernel<float, float>(float*, float*, flo"
      "at*, long*, float*, int, int, int, int, long)"),
     "PyTorch ATen", "loss", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__trace_filter__sampled_rank-0
    ("void compute_cuda_kernel<long>(long*, long*, long*, long, long)",
     "PyTorch ATen", "other", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__triton_example
    ("triton_poi_fused_add_cos_sin_0",
     "Triton", "elementwise", None, None, None, None, False),
    # sample_traces/conventions/gpt_kineto_compile (ours): Inductor's fused Triton kernels
    ("triton_per_fused__to_copy_native_layer_norm_backward_view_3",
     "Triton", "normalization", None, None, None, None, False),
    ("triton_red_fused_sum_5", "Triton", "reduction", None, None, None, None, False),
    ("triton_poi_fused_gelu_view_8", "Triton", "activation", None, None, None, None, False),
    ("triton_poi_fused__to_copy_6", "Triton", "elementwise", None, None, None, None, False),
    # kineto_llm/AMD-AGI__TraceLens__torch_compile_triton: RMSNorm fused by Inductor
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "Triton", "normalization", None, None, None, None, False),
    # sample_traces/conventions/jax_nsys_train_step (ours): XLA's kernels
    ("gemm_fusion_dot_general_9", "XLA Triton", "gemm", None, None, None, None, False),
    ("loop_add_fusion_2", "XLA", "elementwise", None, None, None, None, False),
    ("input_reduce_fusion", "XLA", "reduction", None, None, None, None, False),
    ("stream_executor::gpu::RedzoneAllocatorKernelImpl(unsigned char *, unsigned char, unsigned long, unsigned int *)",
     "XLA autotuner", "other", None, None, None, None, False),
    # nsys_sqlite/NVIDIA__Fuser__report1__H200_nsys2025.1.1
    (("<unnamed>::nvfuser_pointwise_f0_c1_r0_g0(<unnamed>::Tensor<float, (int)2, (int)2>"
      ", <unnamed>::Tensor<float, (int)2, (int)2>)"),
     "nvFuser", "elementwise", None, None, None, None, False),
    # nsys_sqlite/tomarriott__GTLS__report1
    ("cupy_copy__float32_float32",
     "CuPy", "copy", None, None, None, None, False),
    # nsys_sqlite/tomarriott__GTLS__report1
    ("cupy_true_divide__float32_float32_float32",
     "CuPy", "elementwise", None, None, None, None, False),
    # nsys_sqlite/tomarriott__GTLS__report1
    ("cupy_inclusive_batch_scan_kernel",
     "CuPy", "sort/scan", None, None, None, None, False),
    # nvprof_sqlite/ZhangXin8069__qcu__test__log_x99-Yang_1236834.nvvp
    (("void gen_sequenced<curandStateXORWOW, double2, normal_args_double_st, &(double2 c"
      "urand_normal_scaled2_double<curandStateXORWOW>(curandStateXORWOW*, normal_args_do"
      "uble_st)), rng_config<curandStateXORWOW, (curandOrdering)101> >(curandStateXORWOW"
      "*, double2*, unsigned long, unsigned long, normal_args_double_st)"),
     "cuRAND", "random", None, None, None, None, False),
    # nsys_sqlite/LeiWang1999__memfusion_artifact__report1
    (("void CUTENSOR_NAMESPACE::permutationKernelPLC3<CUTENSOR_NAMESPACE::VectorWrite2DT"
      "ensorView<(unsigned char)0, (unsigned char)1, (bool)0, (unsigned int)4, float, __"
      "half, CUTENSOR_NAMESPACE::GeneralUnarySmall<float>>, CUTENSOR_NAMESPACE::VectorRe"
      "ad2DTensorView<(unsigned char)1, (unsigned char)0, (bool)0, (unsigned int)4, floa"
      "t, __half, CUTENSOR_NAMESPACE::GeneralUnarySmall<float>>, CUTENSOR_NAMESPACE::Thr"
      "eadLevelElementwise<CUTENSOR_NAMESPACE::ElementwiseConfig2DSmallMode0<CUTENSOR_NA"
      "MESPACE::GeneralUnarySmall<float>, CUTENSOR_NAMESPACE::GeneralBinary<float>, (int"
      ")2, (int)4, (int)512, (int)128, (signed char)4, (bool)0, (bool)0, (bool)0, (bool)"
      "0, (bool)0>, float>, CUTENSOR_NAMESPACE::ElementwiseRuntimePLC3<__half, float, __"
      "half, float>::Params>(T4)"),
     "cuTENSOR", "layout_transform", None, None, None, None, False),
    # nvprof_sqlite/esarmstrong__ece408__forward1_analysis.nvprof
    (("mxnet::op::forward_kernel(float*, float const*, float const*, int, int, int, int,"
      " int, int)"),
     "custom", "convolution", None, None, None, None, False),
    # nvprof_sqlite/esarmstrong__ece408__timeline.nvprof
    (("void mshadow::cuda::SoftmaxKernel<8, float, mshadow::expr::Plan<mshadow::Tensor<m"
      "shadow::gpu, 2, float>, float>, mshadow::expr::Plan<mshadow::Tensor<mshadow::gpu,"
      " 2, float>, float> >(mshadow::expr::Plan<mshadow::Tensor<mshadow::gpu, 2, float>,"
      " float>, mshadow::expr::Plan<mshadow::Tensor<mshadow::gpu, 2, float>, float>, uns"
      "igned int)"),
     "MXNet", "softmax", None, None, None, None, False),
    # nvprof_sqlite/ZhangXin8069__qcu__test__log_x99-Yang_1236834.nvvp
    (("std::enable_if<device::use_kernel_arg<quda::rngArg>(), void>::type quda::Kernel2D"
      "<quda::init_random, quda::rngArg, false>(quda::rngArg)"),
     "QUDA", "random", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__b200__eager_trace
    (("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentCont"
      "ext"),
     "TensorRT-LLM", "attention", None, None, None, None, True),
    # kineto_json/AMD-AGI__TraceLens__b200__eager_trace
    (("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp25"
      "6b_rM_TN_transOut_schedP2x1x2x3_biasM_bN_tma_tmaOpt_clmp_swiGlu_dynBatch_sm100f"),
     "TensorRT-LLM", "gemm", None, None, None, "tn", True),
    # kineto_json/AMD-AGI__TraceLens__b200__eager_trace
    (("void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingR"
      "enormalize::KernelParams<__nv_bfloat16, __nv_bfloat16, 128, false, true, true> >("
      "moe::dev::routing::routingRenormalize::KernelParams<__nv_bfloat16, __nv_bfloat16,"
      " 128, false, true, true>)"),
     "TensorRT-LLM", "sort/scan", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__b200__eager_trace
    (("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat1"
      "6*, c10::BFloat16*, c10::BFloat16 const*, int, long, long, long, int, int, int)"),
     "vLLM", "elementwise", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__b200__eager_trace
    (("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::typ"
      "e vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BF"
      "loat16*, c10::BFloat16 const*, float, int, int)"),
     "vLLM", "normalization", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint
    (("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x"
      "4x1x64_tb1x8x2x1_1x4x1x64_gkgs"),
     "MIOpen", "convolution", "forward", "implicit_gemm", None, None, True),
    # kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint
    (("igemm_bwd_gtcx3_nhwc_bf16_bx0_ex1_bt32x64x32_wt16x64x4_ws1x1_wr1x1_ta1x8x1x1_1x4x"
      "1x32_tb1x8x1x2_1x4x1x32_mh"),
     "MIOpen", "convolution", "data_gradient", "implicit_gemm", None, None, True),
    # kineto_json/AMD-AGI__TraceLens__mi300__ddp_resnet18_no_pool__train_resnet18
    (("igemm_wrw_gtcx3_nhwc_bf16_bx0_ex1_bt64x64x32_wt32x32x8_ws1x1_wr1x1_ta1x8x1x1_1x4x"
      "1x64_tb1x8x1x1_1x4x1x64_vs1_gkgs"),
     "MIOpen", "convolution", "weight_gradient", "implicit_gemm", None, None, True),
    # kineto_json/AMD-AGI__TraceLens__mi300__ddp_resnet18_no_pool__train_resnet18
    ("batched_transpose_32x32_half",
     "MIOpen", "layout_transform", None, None, None, None, False),
    # kineto_json/AMD-AGI__TraceLens__mi300__ddp_resnet18_no_pool__train_resnet18
    ("SubTensorOpWithScalar1d",
     "MIOpen", "elementwise", None, None, None, None, True),
    # kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint
    (("Cijk_Ailk_Bljk_BBS_BH_Bias_HAS_SAV_UserArgs_MT16x16x256_MI16x16x1_SN_LDSB1_AFC1_A"
      "FEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMBSK_G"
      "LS0_ISA942_IU1_K1_LBSPPA256_LBSPPB512_LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV0"
      "_MIWT1_1_MO40_NTn1_NTA4_NTB0_NTC0_NTD0_NTM0_NEPBS0_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PK"
      "A1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW1_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1"
      "_VSn1_VWA1_VWB1_WSGRA0_WSGRB0_WS64_WG16_4_4"),
     "hipBLASLt", "gemm", None, None, None, "nn", True),
    # kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint: Tensile without user arguments
    (("Cijk_Ailk_Bljk_BBS_BH_MT64x64x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1"
      "EM1_AMAS3_ASE_ASGT_ASLT_ASM_ASAE01_ASCE01_ASEM1_AAC0_BL1_BS1_CLR0_DTLA0_DTLB0_DTVA0"
      "_DTVB0_DVO0_ETSP_EPS1_ELFLR4_EMLL0_FSSC10_FL0_GLVWA2_GLVWB2_GRCGA1_GRCGB1_GRPM1_GRV"
      "Wn1_GSU1_GSUASB_GLS1_ISA942_IU1_K1_KLA_LBSPPA512_LBSPPB256_LPA32_LPB4_LDL1_LRVW4_LW"
      "PMn1_LDW0_FMA_MIAV0_MDA2_MO40_MMFSC_MKFGSU256_NTA0_NTB0_NTC2_NTD2_NEPBS0_NLCA1_NLCB1"
      "_ONLL1_OPLV0_PK0_PAP0_PGR2_PLR1_PKA0_SIA3_SLW1_SS1_SU64_SUM0_SUS512_SCIUI1_SPO1_SRV"
      "W0_SSO4_SVW2_SNLL0_TSGRA0_TSGRB0_TT2_32_TLDS1_UMLDSA0_UMLDSB1_U64SL1_USFGROn1_VAW1_"
      "VSn1_VW2_VWB2_VFLRP1_WSGRA0_WSGRB0_WS64_WG32_8_1_WGMn16"),
     "rocBLAS", "gemm", None, None, None, "nn", True),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__amd_trace__mi250_minitoy_train_ROCm6_2_ki
    (("Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1_AFEM1_A"
      "FEM1_ASEM1_CLR1_CADS0_EPS0_GRVWA1_GRVWB1_GSUAMB_ISA90a_IU1_K1_LBSPPA0_LBSPPB0_LBS"
      "PPM0_LPA0_LPB0_LPM0_LRVW1_LWPMn1_MIAV0_MIWT1_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0"
      "_NEPBS2_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO1_SRVW0_SSO0_SVW1_TLDS0_USFG"
      "ROn1_VSn1_VWA1_VWB1_WSGRA0_WSGRB0_WS64_WG64_4_1"),
     "hipBLASLt", "gemm", None, None, None, "nt", True),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__amd_trace__mi250_minitoy_train_ROCm6_2_ki
    (("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_A"
      "FEM1_ASEM1_CLR1_CADS0_EPS0_GRVWA2_GRVWB2_GSUAMB_ISA90a_IU1_K1_LBSPPA128_LBSPPB128"
      "_LBSPPM0_LPA8_LPB8_LPM0_LRVW4_LWPMn1_MIAV0_MIWT1_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_"
      "NTM0_NEPBS2_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO1_SRVW0_SSO0_SVW1_TLDS1_"
      "USFGROn1_VSn1_VWA1_VWB1_WSGRA1_WSGRB1_WS64_WG64_4_1"),
     "hipBLASLt", "gemm", None, None, None, "tn", True),
    # kineto_json/AMD-AGI__TraceLens__mi300__resnet_act_checkpoint
    (CK_BWD_WEIGHT,
     "Composable Kernel", "convolution", "weight_gradient", "implicit_gemm", None, None, True),
    # reference/alexnet_b256_kineto.json
    (CUDNN_WGRAD_MANGLED,
     "cuDNN", "convolution", "weight_gradient", "implicit_gemm", None, None, True),
    # nsys_sqlite/lockfuehrer__beast_ressoruces__report2
    ("__omp_offloading_31_18a80bc__Z_2...",
     "custom", "other", None, None, None, None, False),
    # nsys_sqlite/RajaATAli__SC23_Programming-Your-GPU-with-OpenMP_Tutorial__report3
    ("nvkernel_solve_F1L204_2",
     "custom", "other", None, None, None, None, False),
    # nsys_sqlite/martisu1631998__kmeans-parallel__report2
    ("kmeans_235_gpu",
     "custom", "other", None, None, None, None, False),
    # nsys_sqlite/hpcgroup__pipit__perlmutter-cloverleaf-cuda
    (("void clover::par_ranged2d_kernel<build_field(global_variables &)::[lambda(int, in"
      "t) (instance 1)]>(clover::Range2d, T1)"),
     "custom", "other", None, None, None, None, False),
    # nsys_sqlite/hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0
    ("saxpy(double *, double *, double *, double, int)",
     "custom", "elementwise", None, None, None, None, False),
    # nvprof_sqlite/ZhangXin8069__qcu__test__log_x99-Yang_1236834.nvvp
    ("wilson_dslash_x_send(void*, void*, void*, void*, int, void*, void*)",
     "custom", "other", None, None, None, None, False),
    # nsys_sqlite/bwyogatama__Mordred-Deprecated__report1
    (("void probe_GPU2<128, 4>(int*, int*, int*, int*, int*, int*, int*, int*, int, int,"
      " int, int, int*, int*, int*, int*, int, int*, int, int*, int, int*, int, int*, in"
      "t, int, int, int, int, int*, int*, int*, int*, int*, int*, int, short*)"),
     "custom", "other", None, None, None, None, False),
    # nsys_sqlite/tomarriott__GTLS__report1
    ("calcAllLowestResidualsGPU",
     "custom", "other", None, None, None, None, False),
    # nvprof_sqlite/skycs97__darknet__out.prof
    ("im2col_gpu_kernel(int, float const*, int, int, int, int, int, int, int, float*)",
     "custom", "im2col", None, "gemm", None, None, False),
    # nvprof_sqlite/skycs97__darknet__out.prof
    ("activate_array_kernel(float*, int, ACTIVATION)",
     "custom", "activation", None, None, None, None, False),
    # nvprof_sqlite/ZhangXin8069__qcu__test__log_x99-Yang_1236834.nvvp
    ("reduction_kernel(LatticeComplex*, LatticeComplex const*, int)",
     "custom", "reduction", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void sgemm_largek_lds64<(bool)1, (bool)0, (int)5, (int)5, (int)4, (int)4, (int)4,"
      " (int)34>(float *, const float *, const float *, int, int, int, int, int, int, co"
      "nst float *, const float *, float, float, int, int, int *, int *)"),
     "cuBLAS", "gemm", None, None, None, None, False),
    # kineto_json/facebookresearch__HolisticTraceAnalysis__trace_diff__control
    (("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, "
      "float, float, float, float, float, adamMode_t, float, int, int>(int, int volatile"
      "*, TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, "
      "float, adamMode_t, float, int, int)"),
     "Apex", "optimizer", None, None, None, None, False),
    # reference/alexnet_b128_cudnn
    (("void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK"
      "<cutlass__5x_cudnn::MatrixShape<(int)4, (int)128>, cutlass__5x_cudnn::epilogue::t"
      "hread::LinearCombination<float, (int)4, float, float, (cutlass__5x_cudnn::epilogu"
      "e::thread::ScaleType::Kind)0, (cutlass__5x_cudnn::FloatRoundStyle)2>, cutlass__5x"
      "_cudnn::reduction::thread::ReduceAdd<float, float, (int)4>, (int)4>>(T1::Params)"),
     "cuDNN", "reduction", None, None, None, None, False),
    # sample_traces/alexnet_b256_amp.sqlite: the split-K reduction stores half, adds in float
    (("void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK"
      "<cutlass__5x_cudnn::MatrixShape<(int)4, (int)256>, cutlass__5x_cudnn::epilogue::t"
      "hread::LinearCombination<cutlass__5x_cudnn::half_t, (int)8, float, float, (cutlas"
      "s__5x_cudnn::epilogue::thread::ScaleType::Kind)0, (cutlass__5x_cudnn::FloatRoundS"
      "tyle)2>, cutlass__5x_cudnn::reduction::thread::ReduceAdd<float, float, (int)8>, ("
      "int)4>>(T1::Params)"),
     "cuDNN", "reduction", None, None, None, None, False),
    # reference/alexnet_b128_cudnn: cuDNN's workspace initialisation before an xmma convolution
    (("void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_"
      "cudnn::implicit_gemm::fprop::Warp_specialized_params_non_template<xmma__5x_cudnn::"
      "Grid_constant_params>>(T1, bool)"),
     "cuDNN", "memset", "forward", "implicit_gemm", None, None, False),
    # reference/alexnet_b128_cudnn: cuBLASLt's split-K reduction
    (("void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, float, float, float,"
      " (bool)0, float, float, float, (bool)1, (bool)0, (bool)0, (bool)0>(cublasLt::cublasS"
      "plitKParams<T6>, const T4 *, const T10 *, T9 *, T5 *, const T6 *, const T6 *, const"
      " T11 *, const T4 *, T11 *, void *, long, T6 *, int *, T6 *, T6 *, const T6 *, const "
      "T6 *, const T6 *, const T6 *, const T6 *)"),
     "cuBLAS", "reduction", None, None, None, None, False),
    # sample_traces/resnet50_b32_amp_ops.sqlite: cuDNN's weight-gradient reduction
    ("void cudnn::cnn::reduce_wgrad_nchw_helper<float, __half>(void *, const void *, T1, int, int)",
     "cuDNN", "reduction", "weight_gradient", None, None, None, False),
    # kineto_json/facebookresearch__param__dlrm_kineto__worker0: the second pass of cuBLAS's dot
    (("void reduce_1Block_kernel<float, 128, 7, cublasGemvTensorStridedBatched<float>, cubla"
      "sGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float> >(float"
      " const*, float, cublasGemvTensorStridedBatched<float>, int, float const*, float, cubl"
      "asGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, cubla"
      "sPointerMode_t, cublasLtEpilogue_t, cublasGemvTensorStridedBatched<biasType<cublasGem"
      "vTensorStridedBatched<float>::value_type, float>::type const>)"),
     "cuBLAS", "reduction", None, None, None, None, False),
    # sample_traces/conventions/gpt_nsys_graph_infer.sqlite (ours): cuDNN's fused attention, whose
    # name says fprop like a convolution's
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
     "cuDNN", "attention", "forward", None, None, None, True),
    # sample_traces/conventions/gpt_nsys_train_step.sqlite (ours): its backward
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
     "cuDNN", "attention", None, None, None, None, True),
    # sample_traces/multigpu/fsdp_transformer_2gpu_rank0.sqlite (ours): ATen's memory-efficient
    # attention on float, 3xTF32 on tensor cores from sm80
    (("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float,"
      " cutlass::arch::Sm80, (bool)1, (int)64, (int)64, (int)64, (bool)1, (bool)1>::Params)"),
     "PyTorch ATen", "attention", None, None, None, None, True),
    (("fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKern"
      "el<cutlass::arch::Sm80, float, (bool)1, (bool)0, (bool)0, (int)64, (int)64, (int)64, ("
      "bool)0>::Params)"),
     "PyTorch ATen", "attention", None, None, None, None, True),
    # nsys_more/GindaChen__nsys-ai__fixtures__mfu_2gpu_before: the flash-attn package
    (("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (in"
      "t)4, (bool)0, (bool)0, cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, ("
      "int)64, (int)4, cutlass::bfloat16_t>>, (bool)0, (bool)0, (bool)0, (bool)0, (bool)0, ("
      "bool)1, (bool)0, (bool)0>(flash::Flash_fwd_params)"),
     "FlashAttention", "attention", None, None, None, None, True),
    # nsys_sqlite/wenscarl__cutlass_benchmark__report1
    (CUTLASS_GEMM,
     "CUTLASS", "gemm", None, None, None, None, True),
    # method/README.md table 3: Caffe + cuDNN 5.1 on a GTX 1080 (nvprof). bconv1 needs only
    # the weight gradient, bconv2 both gradients, conv3 is a forward winograd.
    ("maxwell_scudnn_128x32_stridedB_splitK_interior_nn",
     "cuDNN", "convolution", "weight_gradient", "implicit_gemm", None, "nn", False),
    ("maxwell_scudnn_128x64_stridedB_small_nn",
     "cuDNN", "convolution", "data_gradient", "implicit_gemm", None, "nn", False),
    ("maxwell_scudnn_128x32_interior_nn",
     "cuDNN", "convolution", "forward", "implicit_gemm", None, "nn", False),
    ("maxwell_scudnn_winograd_128x128_tile228n_nt",
     "cuDNN", "convolution", None, "winograd", None, "nt", False),
    ("maxwell_sgemm_128x128_raggedMn_tn",
     "cuBLAS", "gemm", None, None, None, "tn", False),
    ("void caffe::MaxPoolBackward",
     "Caffe", "pooling", None, None, None, None, False),
    # the table prints no namespace or arguments here, so no rule can place it
    ("void calc_bias_diff",
     "other", "other", None, None, None, None, False),
]
