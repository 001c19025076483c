"""What a GEMM or implicit-GEMM kernel's name says about how it runs: its CTA tile, how its
warps split the tile, its math, its schedule (split-K, segment-K, stream-K), whether its
operand loads pass through L1, and the activation layout it reads. The memory-traffic model
(`traffic_model`) takes these as inputs.

The rules are data, `tile_rules.toml`, in the format of `kernel_rules.toml`: one ordered list
per question, the first rule whose regex matches answers it. A tile rule gives numbers through
named groups, `(?P<m>\\d+)x(?P<n>\\d+)x(?P<k>\\d+)`, or fixed keys (`k = 8`). A kernel that no
tile rule matches gets `DEFAULT_TILE` and the flag 'default tile'; one that a `not_modelled`
rule matches (split-K reductions, Winograd, FFT, GEMV) gets no tile and the rule's reason.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from traceq.analysis.kernels.classify import classify
from traceq.errors import TraceqError

DEFAULT_TILE = (128, 128, 32)
"""The CTA tile (M x N x K) assumed when no rule reads one from the name."""

MATHS = ("ffma", "fp16x2", "tf32", "fp16", "bf16", "fp8", "int8")
ELEMENT_BYTES = {"ffma": 4, "tf32": 4, "fp16x2": 2, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
"""Bytes per operand element, by math: TF32 kernels read and write FP32 tensors."""

_CHOICES = {"schedule": ("split_k", "segment_k", "stream_k"),
            "operand_path": ("l1", "bypass", "tma"), "layout": ("nchw", "nhwc")}
_NUMBERS = ("m", "n", "k", "stages")
_KEYS = {"not_modelled": ("reason",), "tile": _NUMBERS, "warps": (),
         **{question: ("value",) for question in _CHOICES}}
_DEFAULTS = {"operand_path": "l1", "layout": "nchw"}


@dataclass(frozen=True)
class KernelTile:
    """What the model needs from one kernel name; see the module docstring."""

    name: str
    reason: str | None          # set: the model does not cover this kernel, and why
    m: int
    n: int
    k: int
    stages: int | None
    warps_m: int | None         # warps (or warp groups) along M and N; None: not in the name
    warps_n: int | None
    math: str                   # one of MATHS
    schedule: str | None        # split_k | segment_k | stream_k | None (one CTA per tile)
    operand_path: str           # l1 | bypass | tma
    layout: str                 # nchw | nhwc
    flags: tuple[str, ...]      # 'default tile', 'math assumed ffma'

    @property
    def modelled(self) -> bool:
        return self.reason is None

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.math]

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass(frozen=True)
class _Rule:
    patterns: tuple[re.Pattern[str], ...]
    fixed: dict[str, str | int]
    field: str
    where: str

    def answer(self, name: str, mangled: str | None) -> dict[str, str | int] | None:
        text = mangled if self.field == "mangled" else name
        if not text:
            return None
        for pattern in self.patterns:
            found = pattern.search(text)
            if found is not None:
                groups = {key: int(value) for key, value in found.groupdict().items() if value is not None}
                return {**self.fixed, **groups}
        return None


def _parse(text: str, source: str) -> dict[str, tuple[_Rule, ...]]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TraceqError(f"{source}: not valid TOML ({e})") from None
    rules: dict[str, tuple[_Rule, ...]] = {}
    for question, tables in document.items():
        if question not in _KEYS or not isinstance(tables, list):
            raise TraceqError(f"{source}: unknown rule list [[{question}]]; expected {', '.join(_KEYS)}")
        rules[question] = tuple(_rule(table, question, f"{source}: [[{question}]] rule {i}")
                                for i, table in enumerate(tables, start=1))
    return rules


def _rule(table: dict[str, object], question: str, where: str) -> _Rule:
    allowed = ("match", "field", *_KEYS[question])
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise TraceqError(f"{where}: unknown key {unknown[0]!r}; a rule here has only {', '.join(allowed)}")
    match = table.get("match")
    regexes = [match] if isinstance(match, str) else match
    if not (isinstance(regexes, list) and regexes and all(isinstance(r, str) for r in regexes)):
        raise TraceqError(f"{where}: needs match = 'regex' or a list of regexes")
    try:
        patterns = tuple(re.compile(str(r)) for r in regexes)
    except re.error as e:
        raise TraceqError(f"{where}: bad regex ({e})") from None
    fixed = {key: value for key, value in table.items() if key in _KEYS[question]}
    value = fixed.get("value")
    if question in _CHOICES and value not in _CHOICES[question]:
        raise TraceqError(f"{where}: value must be one of {', '.join(_CHOICES[question])}")
    if question == "not_modelled" and not isinstance(fixed.get("reason"), str):
        raise TraceqError(f"{where}: needs reason = \"why the model does not cover it\"")
    return _Rule(patterns, fixed, str(table.get("field", "name")), where)


@lru_cache(maxsize=1)
def tile_rules() -> dict[str, tuple[_Rule, ...]]:
    """The packaged rules, compiled once."""
    text = resources.files("traceq.analysis.efficiency").joinpath("tile_rules.toml").read_text("utf-8")
    return _parse(text, "traceq/analysis/tile_rules.toml")


def _first(question: str, name: str, mangled: str | None) -> dict[str, str | int] | None:
    for rule in tile_rules().get(question, ()):
        answer = rule.answer(name, mangled)
        if answer is not None and (question != "tile" or {"m", "n"} <= set(answer)):
            return answer
    return None


def kernel_math(name: str, mangled: str | None) -> str | None:
    """The unit whose peak bounds the kernel, from the precision and tensor-core answers of
    `classify` (the one place kernel names are read for precision): FP32 is 'ffma' on the CUDA
    cores, FP16 without tensor cores 'fp16x2' (packed half), a tensor-core type itself. None
    where the name tells no precision, or one the model has no peak for (FP64)."""
    kernel = classify(name, mangled)
    if kernel.precision == "fp32":
        return "ffma"
    if kernel.precision == "fp16" and not kernel.tensor_cores:
        return "fp16x2"
    return kernel.precision if kernel.precision in MATHS else None


@lru_cache(maxsize=4096)
def kernel_tile(name: str, mangled: str | None = None) -> KernelTile:
    """What the rules read from one kernel name (and its mangled name, when known)."""
    if mangled is None and name.startswith("_Z"):
        mangled = name  # some Kineto traces record only the mangled name
    flags: list[str] = []
    skip = _first("not_modelled", name, mangled)
    tile = _first("tile", name, mangled)
    if tile is None:
        tile = dict(zip(("m", "n", "k"), DEFAULT_TILE))
        if skip is None:
            flags.append("default tile")
    warps = _first("warps", name, mangled) or {}
    choice = {question: (_first(question, name, mangled) or {}).get("value") for question in _CHOICES}
    math = kernel_math(name, mangled)
    if math is None and skip is None:
        flags.append("math assumed ffma")
    return KernelTile(
        name=name, reason=str(skip["reason"]) if skip else None,
        m=int(tile["m"]), n=int(tile["n"]), k=int(tile.get("k", DEFAULT_TILE[2])),
        stages=int(tile["stages"]) if "stages" in tile else None,
        warps_m=int(warps["wm"]) if "wm" in warps else None, warps_n=int(warps["wn"]) if "wn" in warps else None,
        math=math or "ffma", schedule=choice["schedule"],  # type: ignore[arg-type]
        operand_path=str(choice["operand_path"] or _DEFAULTS["operand_path"]),
        layout=str(choice["layout"] or _DEFAULTS["layout"]), flags=tuple(flags))
