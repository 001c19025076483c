"""A decoder-only transformer described in TOML (a model-spec file whose one table is
`[transformer]`): its parameter count and the model FLOPs of one step, by the standard formulas
(docs/mfu.md states them with their sources).

Parameters (what `sum(p.numel())` counts on the model): the token embedding V d, a learned
position table (`positions` rows) x d, per layer the attention projections (query d h dh, key
and value d g dh each with g kv heads, output h dh d), the MLP (2 d f plain, 3 d f gated), their
biases where the model has them, two norms (2 d a LayerNorm, d an RMSNorm), then a final norm
and the LM head V d (plus V of bias) unless it is tied to the embedding.

Model FLOPs of a step: (6 for training, 2 for inference) x N x T plus attention's two products
(Kaplan et al. 2020, table 1; PaLM, Chowdhery et al. 2022, appendix B; Megatron-LM, Narayanan et
al. 2021, section 5.1), where T = batch x seq tokens and N is the weights that multiply
activations: every layer's projection and MLP matrices and the LM head (tied or not: its product
runs), not the embedding lookups, biases or norms. Attention: each query meets K keys over h dh
columns twice (Q K^T and P V), 4 L h dh K FLOP a token forward, 3 times that a training step;
K = context + seq / 2 for causal attention (half the score matrix is masked, the convention of
PaLM and of traceq's counted FLOPs) and context + seq without the mask, `context` being the
tokens already in a KV cache (0 for training and prefill).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from traceq.analysis.choices import Precision
from traceq.analysis.efficiency.modelspec import _check_keys
from traceq.analysis.efficiency.modelspec import _SpecProblem as _Problem  # what is wrong with a spec
from traceq.errors import OptionError

_REQUIRED = ("layers", "d_model", "heads", "ffn", "vocab", "seq", "batch", "mode")
_OPTIONAL = ("name", "kv_heads", "head_dim", "mlp", "norm", "bias", "qkv_bias", "tied_embeddings", "lm_head",
             "positions", "causal", "context", "precision")
MODES = ("training", "inference")
MLPS = ("plain", "gated")
NORMS = {"layernorm": 2, "rmsnorm": 1}  # parameters per channel: weight and bias, or weight


@dataclass(frozen=True)
class TransformerSpec:
    """A `[transformer]` table, checked; defaults filled in."""

    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    seq: int
    batch: int
    training: bool
    gated: bool = False
    norm: str = "layernorm"
    bias: bool = False
    qkv_bias: bool = False
    tied_embeddings: bool = False
    lm_head: bool = True
    positions: int = 0
    causal: bool = True
    context: int = 0
    precision: str | None = None  # the peak MFU is measured against, unless the caller names one

    @property
    def tokens(self) -> int:
        """Tokens a step processes: batch x seq."""
        return self.batch * self.seq

    @property
    def layer_matrices(self) -> int:
        """Weights of one layer's matrices: attention's four projections and the MLP."""
        d, q, kv = self.d_model, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return d * q + 2 * d * kv + q * d + (3 if self.gated else 2) * d * self.ffn

    @property
    def matmul_params(self) -> int:
        """N of 6 N T: every layer's matrices and the LM head's (its product runs, tied or not)."""
        return self.layers * self.layer_matrices + (self.vocab * self.d_model if self.lm_head else 0)

    @property
    def params(self) -> int:
        """All parameters, as `sum(p.numel() for p in model.parameters())` counts them."""
        d, q, kv = self.d_model, self.heads * self.head_dim, self.kv_heads * self.head_dim
        biases = (q + 2 * kv if self.qkv_bias else 0) + ((d + (2 if self.gated else 1) * self.ffn + d)
                                                         if self.bias else 0)
        norm = NORMS[self.norm] * d
        layer = self.layer_matrices + biases + 2 * norm
        head = 0 if self.tied_embeddings or not self.lm_head else self.vocab * d + (self.vocab if self.bias else 0)
        return (self.vocab + self.positions) * d + self.layers * layer + norm + head

    @property
    def keys_per_query(self) -> float:
        """K: the keys a query meets on average (context + seq / 2 causal, context + seq not)."""
        return self.context + self.seq / (2.0 if self.causal else 1.0)

    @property
    def attention_flops(self) -> float:
        """Attention's products in one step: (12 or 4) L h dh K T."""
        return ((12.0 if self.training else 4.0) * self.layers * self.heads * self.head_dim
                * self.keys_per_query * self.tokens)

    @property
    def model_flops(self) -> float:
        """Model FLOPs of one step: (6 or 2) N T + the attention term."""
        return (6.0 if self.training else 2.0) * self.matmul_params * self.tokens + self.attention_flops


def is_transformer_spec(path: str | Path) -> bool:
    """Whether a TOML file is a transformer spec (has a `[transformer]` table); False when unreadable."""
    try:
        return isinstance(tomllib.loads(Path(path).read_text("utf-8")).get("transformer"), dict)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def load_transformer_spec(path: str | Path) -> TransformerSpec:
    """Read and check a transformer spec. Raises OptionError (one line naming the file) when it
    is missing, not TOML, lacks a `[transformer]` table or a required key, has an unknown key, a
    value of the wrong kind, or values that contradict each other."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text("utf-8"))
    except OSError as e:
        raise OptionError(f"cannot read transformer spec {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise OptionError(f"{path}: not a TOML transformer spec ({e}); see docs/mfu.md") from None
    try:
        return _parse(doc, path.stem.removesuffix(".model"))
    except _Problem as e:
        raise OptionError(f"{path}: {e}; see docs/mfu.md") from None


def _parse(doc: dict, default_name: str) -> TransformerSpec:
    table = doc.get("transformer")
    if set(doc) != {"transformer"} or not isinstance(table, dict):
        raise _Problem("a transformer spec has one [transformer] table and nothing else")
    _check_keys(table, _REQUIRED, _OPTIONAL, "[transformer]")
    sizes = {key: _int(table, key, 1) for key in ("layers", "d_model", "heads", "ffn", "vocab", "seq", "batch")}
    heads = sizes["heads"]
    kv_heads = _int(table, "kv_heads", 1, heads)
    if kv_heads > heads or heads % kv_heads:
        raise _Problem(f"kv_heads = {kv_heads} must divide heads = {heads} (grouped-query attention)")
    if "head_dim" not in table and sizes["d_model"] % heads:
        raise _Problem(f"d_model = {sizes['d_model']} is not a multiple of heads = {heads}: give head_dim")
    head_dim = _int(table, "head_dim", 1, sizes["d_model"] // heads)
    mode, mlp, norm = (_choice(table, key, choices, default) for key, choices, default in
                       (("mode", MODES, None), ("mlp", MLPS, "plain"), ("norm", tuple(NORMS), "layernorm")))
    flags = {key: _bool(table, key, default) for key, default in
             (("bias", False), ("tied_embeddings", False), ("lm_head", True), ("causal", True))}
    qkv_bias = _bool(table, "qkv_bias", flags["bias"])
    context = _int(table, "context", 0, 0)
    if mode == "training" and context:
        raise _Problem("context (tokens already in a KV cache) is for inference; a training step has none")
    if flags["tied_embeddings"] and not flags["lm_head"]:
        raise _Problem("tied_embeddings ties the LM head to the embedding, but lm_head = false")
    precision = None if "precision" not in table else _choice(table, "precision", tuple(p.value for p in Precision),
                                                              None)
    name = table.get("name", default_name)
    if not isinstance(name, str):
        raise _Problem("name must be a string")
    return TransformerSpec(name=name, kv_heads=kv_heads, head_dim=head_dim, training=mode == "training",
                           gated=mlp == "gated", norm=str(norm), qkv_bias=qkv_bias,
                           positions=_int(table, "positions", 0, 0), context=context, precision=precision,
                           **sizes, **flags)


def _int(table: dict, key: str, minimum: int, default: int | None = None) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _Problem(f"{key} must be an integer >= {minimum}, not {value!r}")
    return value


def _bool(table: dict, key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise _Problem(f"{key} must be true or false, not {value!r}")
    return value


def _choice(table: dict, key: str, choices: tuple[str, ...], default: str | None) -> str:
    value = table.get(key, default)
    if value not in choices:
        raise _Problem(f"{key} must be one of {', '.join(choices)}, not {value!r}")
    return str(value)
