"""text.visible shows control characters as escapes; the expectations are written out by hand."""

from traceq.text import visible


def test_escape_sequences_become_visible():
    assert visible("\x1b[2Jgemm") == "\\x1b[2Jgemm"
    assert visible("\x1b]0;title\x07k") == "\\x1b]0;title\\x07k"
    assert visible("a\u202eb") == "a\\u202eb"
    assert visible("\x9b31m") == "\\x9b31m"


def test_line_breaks_escaped_unless_kept():
    assert visible("a\nb\tc") == "a\\x0ab\\x09c"
    assert visible("a\nb", keep_newlines=True) == "a\nb"
    assert visible("a\x1bb", keep_newlines=True) == "a\\x1bb"


def test_ordinary_text_unchanged():
    name = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params) µs ±"
    assert visible(name) == name
    assert visible(123) == "123"


def test_file_names_made_from_trace_names_stay_in_their_folder():
    from traceq.text import file_name

    assert file_name("../../../x", ".json.gz") == "x.json.gz"
    assert file_name("/etc/passwd") == "etc_passwd"
    assert file_name("..") == "trace"
    assert file_name(".hidden", ".html") == "hidden.html"
    assert file_name("run\x1b[2J name;rm -rf ~", ".gz") == "run_2J_name_rm_-rf.gz"
    assert file_name("alexnet_b256_cudnn", ".json.gz") == "alexnet_b256_cudnn.json.gz"
    assert len(file_name("a" * 1000, ".json.gz")) == 120 + len(".json.gz")


def test_different_names_never_print_alike_at_any_width():
    """Names that share long stretches (cuDNN's sm90 kernels differ in one segment) stay apart
    at every width a table gives them; the check is a plain set comparison."""
    import random

    from traceq.render.table import cut_names

    rng = random.Random(7)
    base = "sm90_xmma_dgrad_implicit_gemm_indexed_f32f32_tf32f32_f32_nhwckrsc_nchw_tilesize{}x{}x32_segment_k_{}_kernel__5x_cudnn"
    names = [base.format(a, b, c) for a in (64, 128, 256) for b in (64, 128) for c in ("on", "off")]
    names += ["".join(rng.choice("ab_") for _ in range(60)) for _ in range(40)]
    for width in (8, 12, 16, 23, 40, 80):  # 8: the least a name column gets (NAME_WIDTHS)
        shown = cut_names(names, width)
        assert len(set(shown)) == len(set(names)), width
        assert all(len(s) <= width for s in shown), width
