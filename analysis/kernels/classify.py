"""Kernel classification by name: which library a kernel came from, what it computes, and how.

The rules are data: `kernel_rules.toml` in this package, optionally preceded by a user rules
file in the same format (so the user's rules win). The file has one ordered list per question
(`[[library]]`, `[[operation]]`, `[[direction]]`, `[[algorithm]]`, `[[collective]]`,
`[[gemm_variant]]`, `[[tensor_cores]]`, `[[precision]]`), and each question is answered by the
first rule of its list whose regex matches. A rule is a table with

    match = 'regex'          # or a list of regexes, any of which may match; Python `re`
                             # syntax, searched (not anchored) in the name
    value = "label"          # what the rule answers (true/false for tensor_cores); when
                             # absent, the regex's first capture group, lowercased
    field = "mangled"        # optional: search the mangled name instead of the demangled one

Names are classified one distinct name at a time: traces hold millions of launches of a few
hundred distinct kernels, so `classify_names` works on the distinct names only.

One more list, `[[launcher]]`, decides a kernel's library by the operation that launched it
rather than by its name (`RuleSet.launcher_library`): a GEMM that cuDNN runs for a convolution
belongs to the convolution. Its rules have

    match = 'regex'              # searched in the name of the innermost range enclosing the
                                 # launch (an emit_nvtx op range: 'aten::cudnn_convolution')
    implementation = ["cuBLAS"]  # the name-based libraries the rule re-labels
    value = "cuDNN"              # the library they then belong to
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from traceq.analysis.choices import PRECISIONS
from traceq.errors import TraceqError

if TYPE_CHECKING:
    import polars as pl

QUESTIONS = ("library", "operation", "direction", "algorithm", "collective", "gemm_variant",
             "tensor_cores", "precision")
RULE_KEYS = ("match", "value", "field")
LAUNCHER = "launcher"
LAUNCHER_KEYS = ("match", "implementation", "value")
FIELDS = ("name", "mangled")


@dataclass(frozen=True)
class Classification:
    """What a kernel's name says about it; None where the name does not tell."""

    name: str
    library: str = "other"  # "custom": application code; "other": no rule recognised it
    operation: str = "other"
    direction: str | None = None  # convolutions: forward, data_gradient, weight_gradient
    algorithm: str | None = None  # convolutions: implicit_gemm, winograd, fft, gemm
    collective: str | None = None  # all_reduce, broadcast, all_gather, send_recv
    gemm_variant: str | None = None  # operand transposes: nn, nt, tn, tt
    tensor_cores: bool = False
    precision: str | None = None  # arithmetic format: fp64, fp32, tf32, fp16, bf16, fp8, int8


@dataclass(frozen=True)
class Rule:
    """One compiled rule: regexes over one name field and the answer they give."""

    patterns: tuple[re.Pattern[str], ...]  # the rule matches when any of them does
    value: str | bool | None  # None: the first capture group, lowercased
    field: str  # "name" or "mangled"
    where: str  # "<file>: [[library]] rule 3", for explanations and error messages

    def answer(self, name: str, mangled: str | None) -> str | bool | None:
        """The rule's answer for this kernel, or None when it does not match."""
        text = mangled if self.field == "mangled" else name
        if not text:
            return None
        for pattern in self.patterns:
            found = pattern.search(text)
            if found is None:
                continue
            if self.value is not None:
                return self.value
            if found.group(1):
                return found.group(1).lower()
        return None


@dataclass(frozen=True)
class LauncherRule:
    """A `[[launcher]]` rule: kernels of the `implementation` libraries launched inside a range
    whose name `pattern` matches belong to `value`."""

    pattern: re.Pattern[str]
    implementation: frozenset[str]
    value: str
    where: str


MEMO_NAMES = 50_000
"""Distinct names a RuleSet remembers the classification of (then it starts over)."""


@dataclass(frozen=True)
class RuleSet:
    """Ordered rule lists, one per question, ready to classify names. It remembers the names it
    classified (up to MEMO_NAMES): one process classifies the same few hundred names in each
    analysis of a trace, and in each rank file of a job that a dataset's worker loads."""

    rules: dict[str, tuple[Rule, ...]]
    launchers: tuple[LauncherRule, ...] = ()
    _memo: dict[tuple[str, str | None], Classification] = field(default_factory=dict, compare=False, repr=False)

    def launcher_library(self, launcher: str | None, library: str) -> str:
        """The library of a kernel that `classify` puts in `library`, launched inside the range
        named `launcher` (None: outside every range): the first [[launcher]] rule that matches
        both decides; without one, `library`."""
        if launcher:
            for rule in self.launchers:
                if library in rule.implementation and rule.pattern.search(launcher):
                    return rule.value
        return library

    def launches(self, launcher: str | None) -> bool:
        """Whether some [[launcher]] rule matches the range name `launcher`."""
        return bool(launcher) and any(rule.pattern.search(launcher) for rule in self.launchers)

    def classify(self, name: str, mangled: str | None = None) -> Classification:
        """Answer every question with the first matching rule of its list."""
        known = self._memo.get((name, mangled))
        if known is None:
            answers = {question: answer for question, (answer, _) in self._decide(name, mangled)}
            known = Classification(name, **answers)  # type: ignore[arg-type]
            if len(self._memo) >= MEMO_NAMES:
                self._memo.clear()
            self._memo[name, mangled] = known
        return known

    def explain(self, name: str, mangled: str | None = None) -> dict[str, str]:
        """Which rule answered each question, e.g. {"library": "...: [[library]] rule 7"};
        questions that no rule answered are left out."""
        return {question: rule.where for question, (_, rule) in self._decide(name, mangled)}

    def _decide(self, name: str, mangled: str | None
                ) -> Iterator[tuple[str, tuple[str | bool, Rule]]]:
        if mangled is None and name.startswith("_Z"):
            mangled = name  # some Kineto traces record only the mangled name
        for question, rules in self.rules.items():
            for rule in rules:
                answer = rule.answer(name, mangled)
                if answer is not None:
                    yield question, (answer, rule)
                    break


def _parse_rules(text: str, source: str) -> dict[str, list]:
    """Validate and compile one rules document: question -> [Rule], and 'launcher' ->
    [LauncherRule]; errors name the source and the rule."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TraceqError(f"{source}: not valid TOML ({e}); fix the file's syntax") from None
    parsed: dict[str, list] = {}
    for question, tables in document.items():
        if question not in (*QUESTIONS, LAUNCHER):
            raise TraceqError(f"{source}: unknown rule list [[{question}]]; expected one of "
                              f"{', '.join((*QUESTIONS, LAUNCHER))}")
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise TraceqError(f"{source}: {question} must be a list of [[{question}]] tables")
        parse = _parse_launcher if question == LAUNCHER else _parse_rule
        parsed[question] = [parse(table, question, f"{source}: [[{question}]] rule {i}")
                            for i, table in enumerate(tables, start=1)]
    return parsed


def _parse_launcher(table: dict[str, object], question: str, where: str) -> LauncherRule:
    unknown = sorted(set(table) - set(LAUNCHER_KEYS))
    if unknown:
        raise TraceqError(f"{where}: unknown key {unknown[0]!r}; a launcher rule has only "
                          f"{', '.join(LAUNCHER_KEYS)}")
    match, libraries, value = table.get("match"), table.get("implementation"), table.get("value")
    if not isinstance(match, str):
        raise TraceqError(f"{where}: needs match = 'regex' (over the launching range's name)")
    if not (isinstance(libraries, list) and libraries and all(isinstance(x, str) for x in libraries)):
        raise TraceqError(f"{where}: needs implementation = [\"library\", ...] (the libraries it re-labels)")
    if not isinstance(value, str):
        raise TraceqError(f"{where}: needs value = \"library\"")
    return LauncherRule(_compile(match, where), frozenset(libraries), value, where)

def _parse_rule(table: dict[str, object], question: str, where: str) -> Rule:
    unknown = sorted(set(table) - set(RULE_KEYS))
    if unknown:
        raise TraceqError(f"{where}: unknown key {unknown[0]!r}; a rule has only "
                          f"{', '.join(RULE_KEYS)}")
    match, value, field = table.get("match"), table.get("value"), table.get("field", "name")
    regexes = [match] if isinstance(match, str) else match
    if not (isinstance(regexes, list) and regexes and all(isinstance(r, str) for r in regexes)):
        raise TraceqError(f"{where}: needs match = 'regex' or a list of regexes")
    patterns = tuple(_compile(str(regex), where) for regex in regexes)
    if field not in FIELDS:
        raise TraceqError(f"{where}: field must be \"name\" or \"mangled\", not {field!r}")
    wanted = bool if question == "tensor_cores" else str
    if value is None and (wanted is bool or any(p.groups == 0 for p in patterns)):
        raise TraceqError(f"{where}: needs a value" + ("" if wanted is bool else
                                                        " (or a capture group in match)"))
    if value is not None and not isinstance(value, wanted):
        raise TraceqError(f"{where}: value must be a {'boolean' if wanted is bool else 'string'}")
    if question == "precision" and value is not None and value not in PRECISIONS:
        raise TraceqError(f"{where}: value must be one of {', '.join(PRECISIONS)}, not {value!r}")
    return Rule(patterns, value, str(field), where)


def _compile(regex: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error as e:
        raise TraceqError(f"{where}: bad regex {regex!r} ({e}); fix or remove the rule") from None


@lru_cache(maxsize=1)
def _packaged_rules() -> dict[str, list[Rule]]:
    text = resources.files("traceq.analysis.kernels").joinpath("kernel_rules.toml").read_text("utf-8")
    return _parse_rules(text, "traceq/analysis/kernels/kernel_rules.toml")


def load_rules(user_rules: str | Path | None = None) -> RuleSet:
    """The packaged rules, with the rules of a user TOML file (same format) in front of them.

    Raises TraceqError when the user file is missing, is not valid TOML, or has a rule with
    a bad regex, an unknown key or a value of the wrong type.
    """
    combined: dict[str, list] = {question: list(rules) for question, rules in _packaged_rules().items()}
    if user_rules is not None:
        path = Path(user_rules)
        try:
            text = path.read_text("utf-8")
        except OSError as e:
            raise TraceqError(f"cannot read rules file {path}: {e.strerror}") from None
        for question, rules in _parse_rules(text, str(path)).items():
            combined[question] = rules + combined.get(question, [])
    launchers = tuple(combined.pop(LAUNCHER, []))
    return RuleSet({question: tuple(rules) for question, rules in combined.items()}, launchers)


RULES_ENV = "TRACEQ_RULES"
"""Environment variable naming a user rules file that every analysis puts in front of the
packaged rules (the CLI's `--rules FILE` sets it)."""


_chosen_rules: list[str | None] = [None]


def use_rules(user_rules: str | Path | None) -> RuleSet | None:
    """Make `user_rules` the file `default_rules` puts in front (None: back to $TRACEQ_RULES or
    none); returns its rules, so a bad file fails here and changes nothing. The CLI's `--rules`
    calls this."""
    if user_rules is None:
        _chosen_rules[0] = None
        return None
    rules = _rules_for(str(user_rules))  # raises before choosing
    _chosen_rules[0] = str(user_rules)
    return rules


def default_rules() -> RuleSet:
    """The rules analyses use: the file given to `use_rules`, else $TRACEQ_RULES's, in front of
    the packaged rules, or the packaged rules alone; compiled once per file."""
    return _rules_for(_chosen_rules[0] or os.environ.get(RULES_ENV) or None)


@lru_cache(maxsize=4)
def _rules_for(user_rules: str | None) -> RuleSet:
    return load_rules(user_rules)


def classify(name: str, mangled: str | None = None, rules: RuleSet | None = None) -> Classification:
    """Classify one kernel by its demangled name (and mangled name, when known)."""
    return (rules or default_rules()).classify(name, mangled)


def classify_names(
    names: pl.Series | Iterable[str],
    mangled: pl.Series | Iterable[str | None] | None = None,
    rules: RuleSet | None = None,
) -> pl.DataFrame:
    """Classify each distinct name once.

    `mangled`, when given, runs parallel to `names`; the first mangled name seen for a name is
    used. Returns one row per distinct non-null name, in order of first appearance, with the
    columns name, library, operation, direction, algorithm, collective, gemm_variant (strings,
    null where the name does not tell) and tensor_cores (boolean); join it back on `name`.
    """
    import polars as pl

    frame = pl.DataFrame({"name": _strings(names)}).with_columns(
        mangled=pl.lit(None, pl.String) if mangled is None else _strings(mangled))
    distinct = frame.drop_nulls("name").unique("name", keep="first", maintain_order=True)
    ruleset = rules or default_rules()
    columns = [f.name for f in fields(Classification)]  # its values are plain: no astuple's deep copy
    rows = [tuple(getattr(c, column) for column in columns)
            for c in (ruleset.classify(name, mangled_name) for name, mangled_name in distinct.iter_rows())]
    schema = {column: (pl.Boolean if column == "tensor_cores" else pl.String) for column in columns}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _strings(values: pl.Series | Iterable[str | None]) -> pl.Series:
    import polars as pl

    if isinstance(values, pl.Series):
        return values.cast(pl.String)
    return pl.Series(list(values), dtype=pl.String)
