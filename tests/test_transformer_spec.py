"""Transformer specs for `traceq mfu --spec` (analysis/efficiency/transformer_spec.py): the
parameter count equals `sum(p.numel())` of the real model, counted here from the model's own
definition, and `--spec` gives the MFU of the equivalent `--params/--tokens/--layers/--d-model/
--seq` call."""

from __future__ import annotations

import importlib.util
import math
import shutil

import pytest
from conftest import ROOT, sample, shared
from typer.testing import CliRunner

TRAIN_SPEC = "conventions/gpt_train.model.toml"
PLAIN = "conventions/gpt_kineto_plain.json.gz"


class _Param:
    def __init__(self, *shape: int) -> None:
        self.shape = shape


class _Module:
    """Enough of torch.nn.Module for `gpt()`'s constructors: parameters are the `_Param`s and
    the submodules found in the attributes."""

    def __init__(self) -> None:
        pass

    def parameters(self):
        for value in vars(self).values():
            if isinstance(value, _Param):
                yield value
            elif isinstance(value, _Module):
                yield from value.parameters()
            elif isinstance(value, list):
                for item in value:
                    yield from item.parameters()


class _FakeNN:
    """torch.nn's parameter shapes as PyTorch documents them: Linear(in, out) a weight [out, in]
    and a bias [out]; LayerNorm(d) a weight and a bias [d]; Embedding(V, d) a weight [V, d]."""

    Module = _Module
    functional = None

    class Linear(_Module):
        def __init__(self, n_in: int, n_out: int, bias: bool = True) -> None:
            self.weight, self.bias = _Param(n_out, n_in), (_Param(n_out) if bias else None)

    class LayerNorm(_Module):
        def __init__(self, d: int) -> None:
            self.weight, self.bias = _Param(d), _Param(d)

    class Embedding(_Module):
        def __init__(self, vocab: int, d: int) -> None:
            self.weight = _Param(vocab, d)

    class ModuleList(_Module, list):
        def __init__(self, modules) -> None:
            list.__init__(self, modules)

        def parameters(self):
            for item in self:
                yield from item.parameters()


def _recorded_gpt():
    """The GPT of tools/record_conventions.py, built by its own `gpt()` on `_FakeNN`."""
    where = ROOT / "tools" / "record_conventions.py"
    spec = importlib.util.spec_from_file_location("record_conventions_for_test", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gpt(None, _FakeNN)


def test_gpt_spec_counts_the_recorded_models_parameters() -> None:
    from traceq.analysis.efficiency.transformer_spec import load_transformer_spec

    model = _recorded_gpt()
    shapes = [p.shape for p in model.parameters()]
    numel = sum(math.prod(s) for s in shapes)
    # the matrices that multiply activations: 2-D weights but the embedding table [8192, 512]
    matrices = sum(math.prod(s) for s in shapes if len(s) == 2) - 8192 * 512
    spec = load_transformer_spec(sample(TRAIN_SPEC))
    assert numel == spec.params == 21_007_360
    assert matrices == spec.matmul_params == 16_777_216
    assert spec.tokens == 8 * 256 and spec.training


def _write(path, **values) -> str:
    def toml(v) -> str:
        return str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, str) else str(v)

    path.write_text("[transformer]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in values.items()))
    return str(path)


QWEN_CONFIG = {  # Qwen/Qwen1.5-0.5B's config.json (Qwen2ForCausalLM)
    "layers": 24, "d_model": 1024, "heads": 16, "kv_heads": 16, "ffn": 2816, "vocab": 151_936, "mlp": "gated",
    "norm": "rmsnorm", "qkv_bias": True, "tied_embeddings": True}


def test_qwen_spec_counts_hf_qwen2_parameters(tmp_path) -> None:
    """Qwen1.5-0.5B's config (hidden_size 1024, intermediate_size 2816, 24 layers, 16 attention and
    16 key-value heads, vocab_size 151,936, tie_word_embeddings true) and HF's Qwen2 modules:
    q/k/v_proj Linear with bias, o_proj and the SiLU-gated MLP's gate/up/down_proj without,
    two RMSNorms (weight only) a layer and a final one; the LM head is the embedding."""
    from traceq.analysis.efficiency.transformer_spec import load_transformer_spec

    d, f, v = 1024, 2816, 151_936
    layer = 3 * (d * d + d) + d * d + 3 * d * f + 2 * d
    numel = v * d + 24 * layer + d
    spec = load_transformer_spec(_write(tmp_path / "qwen.toml", **QWEN_CONFIG, seq=559, batch=16, mode="inference"))
    assert spec.params == numel == 463_987_712
    assert spec.matmul_params == 24 * (4 * d * d + 3 * d * f) + v * d


def test_grouped_kv_heads_and_untied_head(tmp_path) -> None:
    """A Llama-style model with 4 key-value heads for 32 query heads (TinyLlama-1.1B's config:
    d 2048, ffn 5632, 22 layers, vocab 32,000, untied head, RMSNorm, no biases): k and v_proj
    are [256, 2048]."""
    from traceq.analysis.efficiency.transformer_spec import load_transformer_spec

    d, kv, f, v = 2048, 4 * 64, 5632, 32_000
    layer = 2 * d * d + 2 * kv * d + 3 * d * f + 2 * d
    spec = load_transformer_spec(_write(tmp_path / "llama.toml", layers=22, d_model=d, heads=32, kv_heads=4,
                                        ffn=f, vocab=v, mlp="gated", norm="rmsnorm", seq=2048, batch=1,
                                        mode="training"))
    assert spec.params == 2 * v * d + 22 * layer + d == 1_100_048_384
    # attention's products use the 32 query heads: 12 L h dh (S / 2) T
    assert spec.attention_flops == 12 * 22 * 32 * 64 * 1024 * 2048


def test_megatron_formula(tmp_path) -> None:
    """Narayanan et al. 2021 (no recomputation): 72 B s l h^2 (1 + s / 6h + V / 12 l h) for a GPT
    with a 4h MLP, full (not halved) attention, training."""
    from traceq.analysis.efficiency.transformer_spec import load_transformer_spec

    b, s, l, h, v = 4, 2048, 24, 2048, 51_200
    spec = load_transformer_spec(_write(tmp_path / "m.toml", layers=l, d_model=h, heads=16, ffn=4 * h, vocab=v,
                                        seq=s, batch=b, mode="training", causal=False))
    assert spec.model_flops == pytest.approx(72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h)), rel=1e-12)


def test_decode_with_a_kv_cache(tmp_path) -> None:
    """Inference with 1,000 tokens in the cache and one new token: each query meets context +
    seq / 2 keys, 2 N T + 4 L h dh K T."""
    from traceq.analysis.efficiency.transformer_spec import load_transformer_spec

    spec = load_transformer_spec(_write(tmp_path / "d.toml", layers=2, d_model=64, heads=4, ffn=256, vocab=100,
                                        seq=1, batch=3, mode="inference", context=1000))
    n = 2 * (4 * 64 * 64 + 2 * 64 * 256) + 100 * 64
    assert spec.model_flops == 2 * n * 3 + 4 * 2 * 64 * 1000.5 * 3


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    import traceq

    return traceq.load(sample(PLAIN), tmp_path_factory.mktemp("spec") / "s.duckdb")


def test_spec_gives_the_mfu_of_the_equivalent_description(plain) -> None:
    by_spec = plain.mfu(spec=sample(TRAIN_SPEC))
    by_hand = plain.mfu(params=16_777_216, tokens=2048, layers=4, d_model=512, seq=256)
    assert by_spec["iteration"].to_list() == by_hand["iteration"].to_list()
    assert by_spec["model_flops"].to_list() == by_hand["model_flops"].to_list()
    assert by_spec["mfu_pct"].to_list() == pytest.approx(by_hand["mfu_pct"].to_list(), rel=1e-12)
    assert set(by_spec["model_flops"].head(3)) == {6 * 16_777_216 * 2048 + 12 * 4 * 256 * 512 * 2048 / 2}


def test_qwen_spec_mfu_equals_the_hand_description(tmp_path) -> None:
    """TraceLens' Qwen1.5-0.5B prefill (16 x 559 tokens) has no LM head: `lm_head = false` gives
    the 2 P T + attention of test_mfu.test_qwen_prefill_mfu_by_hand."""
    import traceq

    path = shared("realtraces", "kineto_json", "AMD-AGI__TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    config = {**QWEN_CONFIG, "tied_embeddings": False}
    spec = _write(tmp_path / "q.toml", **config, lm_head=False, seq=559, batch=16, mode="inference")
    t = traceq.load(path, tmp_path / "q.duckdb")
    by_spec = t.mfu(spec=spec)
    by_hand = t.mfu(params=24 * (4 * 1024**2 + 3 * 1024 * 2816), tokens=16 * 559, inference=True, layers=24,
                    d_model=1024, seq=559)
    assert by_spec["mfu_pct"].to_list() == pytest.approx(by_hand["mfu_pct"].to_list(), rel=1e-12)


_BASE = ("[transformer]\nlayers = {layers}\nd_model = {d}\nheads = 8\nffn = 2048\nvocab = 10\nseq = 4\n"
         "batch = 1\nmode = \"{mode}\"\n")
_OK = {"layers": 4, "d": 512, "mode": "training"}
BAD = [
    ("[transformer]\nlayers = 4\n", "needs d_model"),
    (_BASE.format(**_OK) + "kv_heads = 3\n", "kv_heads = 3 must divide heads = 8"),
    (_BASE.format(**{**_OK, "d": 500}), "not a multiple of heads"),
    (_BASE.format(**_OK) + "context = 100\n", "context"),
    (_BASE.format(**{**_OK, "mode": "train"}), "mode must be one of"),
    (_BASE.format(**{**_OK, "layers": 0}), "layers must be an integer >= 1"),
    (_BASE.format(**_OK) + "headz = 3\n", "unknown key 'headz'"),
    (_BASE.format(**_OK) + "tied_embeddings = true\nlm_head = false\n", "tied_embeddings"),
    ("[model]\ninput = [3]\n", "one [transformer] table"),
    ("[transformer\n", "not a TOML"),
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A store holding the nsys GPT trace, loaded once (each test works on a copy)."""
    from traceq.cli import app

    db = tmp_path_factory.mktemp("loaded") / "s.duckdb"
    result = CliRunner().invoke(app, ["load", str(sample("conventions/gpt_nsys_train_step.sqlite")), "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db


@pytest.mark.parametrize(("text", "says"), BAD)
def test_bad_specs_are_refused_in_one_line_store_unchanged(loaded, tmp_path, text, says) -> None:
    from traceq.cli import app

    db = tmp_path / "s.duckdb"
    shutil.copy(loaded, db)
    runner = CliRunner()
    before = db.read_bytes()
    bad = tmp_path / "bad.model.toml"
    bad.write_text(text)
    result = runner.invoke(app, ["mfu", "--spec", str(bad), "--db", str(db)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceq: ") and says in lines[0], result.output
    assert db.read_bytes() == before


def test_spec_with_another_description_is_refused(plain) -> None:
    from traceq.errors import OptionError

    for other in ({"params": 1e6, "tokens": 10}, {"inference": True}, {"model_flops": 1e9}, {"seq": 4}):
        with pytest.raises(OptionError, match="--spec describes the whole model"):
            plain.mfu(spec=sample(TRAIN_SPEC), **other)


def test_cli_mfu_spec_title_states_the_count(tmp_path) -> None:
    from traceq.cli import app

    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample(PLAIN)), "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["mfu", "--spec", str(sample(TRAIN_SPEC)), "--db", str(db)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "21,007,360 parameters" in text and "N = 16,777,216" in text
    assert all(len(line) <= 80 for line in result.output.splitlines())


def test_run_mfu_from_a_spec(tmp_path) -> None:
    """`Run.mfu(spec=...)`: each rank's model FLOPs from the spec (per GPU), as with --params."""
    import traceq
    from traceq.cli import app

    files = [sample(f"conventions/gpt_kineto_fsdp_rank{r}.json.gz") for r in (0, 1)]
    db = tmp_path / "r.duckdb"
    loaded = CliRunner().invoke(app, ["load", *map(str, files), "--run", "fsdp", "--db", str(db)])
    assert loaded.exit_code == 0, loaded.output
    run = traceq.open(db).run("fsdp")
    by_spec = run.mfu(spec=sample(TRAIN_SPEC))
    by_hand = run.mfu(params=16_777_216, tokens=2048, layers=4, d_model=512, seq=256, precision="bf16")
    assert by_spec["rank"].to_list() == by_hand["rank"].to_list()
    assert by_spec["mfu_pct"].to_list() == pytest.approx(by_hand["mfu_pct"].to_list(), rel=1e-12)
    assert set(by_spec["precision"]) == {"bf16"}
