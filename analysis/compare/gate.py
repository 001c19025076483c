"""A regression gate for CI: `traceq compare A B --gate 5%` fails when run B's iterations are
slower than run A's by more than the threshold and by more than their iteration-to-iteration
noise.

An iteration's time is the GPU span of its work (`layers.stage_times`: the first start to the
last end of the kernels, copies and memsets launched inside it; the longest over devices). The
change is the ratio of the medians; it counts as beyond the noise when a one-sided
Mann-Whitney U test (a rank test: no assumption of normal times, robust to an outlier
iteration) says B's times are larger than A's with p below `alpha`. With few iterations the
test cannot reach that (4 against 4 gives p = 1/70 at best): then the gate cannot fail, and
says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import duckdb
import polars as pl

from traceq.analysis.structure.conventions import ITERATION_REGEX, WARM_UP, steady
from traceq.errors import MissingDataError
from traceq.store import side_by_side

ALPHA = 0.05
"""The test's significance level."""

EXACT_MAX = 400
"""Exact p-values up to n x m = this (20 against 20 iterations); the normal approximation (with tie
correction) above."""


@dataclass(frozen=True)
class GateResult:
    """The gate's answer for runs a and b (`Trace.gate`): `failed` is the verdict, `verdict` the
    line `traceq compare --gate` prints, the fields its numbers (medians in ns, change and
    threshold as fractions)."""

    a_iterations: int
    b_iterations: int
    a_median_ns: float
    b_median_ns: float
    change: float  # b_median / a_median - 1
    p_value: float  # one-sided: B's times larger than A's
    threshold: float
    alpha: float

    @property
    def failed(self) -> bool:
        return self.change > self.threshold and self.p_value < self.alpha

    @property
    def decidable(self) -> bool:
        """Whether the test could ever reach alpha with these many iterations."""
        return 1 / math.comb(self.a_iterations + self.b_iterations, self.a_iterations) < self.alpha

    @property
    def verdict(self) -> str:
        """The verdict in one line, as `traceq compare --gate` prints it."""
        from traceq.units import format_duration

        numbers = (f"b's median iteration {format_duration(self.b_median_ns)} vs a's "
                   f"{format_duration(self.a_median_ns)} ({100 * self.change:+.1f} %, gate {100 * self.threshold:g} %), "
                   f"{self.b_iterations} vs {self.a_iterations} iterations, one-sided Mann-Whitney "
                   f"p = {self.p_value:.3g} (alpha {self.alpha:g})")
        if self.failed:
            return f"gate failed: b is slower: {numbers}"
        return f"gate passed: {numbers}" + ("" if self.decidable else "; too few iterations for the test to reach "
                                            "alpha: the gate cannot fail")


def iteration_times(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX,
                    stages: pl.DataFrame | None = None) -> pl.Series:
    """Each iteration's GPU span, ns, in time order (the longest over the devices). `stages`:
    the trace's `layers.stage_times`, when the caller has it already; else the spans come from
    each operation's iteration alone (`gaps.operation_iterations`, as attribution finds it), not
    from the stages' full attribution: at ten million kernels about a second, not seven."""
    if stages is not None:
        stages = stages.filter(steady())
        return stages.group_by("iteration", maintain_order=True).agg(pl.col("span_ns").max())["span_ns"]
    from traceq.analysis.operations import gpu_work
    from traceq.analysis.timeline.gaps import operation_iterations
    from traceq.store import registered

    work = gpu_work(con, trace_id)
    names, codes = operation_iterations(con, trace_id, work, iteration_regex)
    # by code, not name: a string a launch made the frame's hand-over to DuckDB most of the cost.
    # The codes number the names in sorted order, so ties order as the names would.
    steady_codes = [code for code, name in enumerate(names.to_list()) if name is not None and name != WARM_UP]
    frame = pl.DataFrame([codes.alias("iteration"), work.of("device_id"), work.ops["start_ns"], work.ops["end_ns"]])
    with registered(con, work=frame, steady=pl.DataFrame({"code": steady_codes}, schema={"code": pl.UInt32})) as view:
        return con.sql(f"""
            SELECT max(span_ns) AS span_ns FROM (
                SELECT iteration, max(end_ns) - min(start_ns) AS span_ns, min(start_ns) AS first_ns
                FROM {view['work']} WHERE iteration IN (SELECT code FROM {view['steady']})
                GROUP BY iteration, device_id)
            GROUP BY iteration ORDER BY min(first_ns), iteration""").pl()["span_ns"]


def mann_whitney_greater(a: list[float], b: list[float]) -> float:
    """One-sided p-value that the values of `b` tend to be larger than those of `a` (Mann-Whitney
    U, ties counted half): exact for small samples, the normal approximation with tie
    correction and continuity correction for large ones."""
    n, m = len(a), len(b)
    if not n or not m:
        raise ValueError("both samples need values")
    u = sum((x > y) + 0.5 * (x == y) for x in b for y in a)  # pairs where b's value is larger
    values = sorted(a + b)
    ties = any(values[i] == values[i + 1] for i in range(len(values) - 1))
    if n * m <= EXACT_MAX and not ties:
        counts = _u_counts(n, m)
        return sum(counts[k] for k in range(math.ceil(u), n * m + 1)) / math.comb(n + m, n)
    mean = n * m / 2
    groups: dict[float, int] = {}
    for v in values:
        groups[v] = groups.get(v, 0) + 1
    correction = sum(t ** 3 - t for t in groups.values()) / ((n + m) * (n + m - 1))
    sd = math.sqrt(n * m / 12 * ((n + m + 1) - correction))
    if sd == 0:
        return 1.0
    z = (u - mean - 0.5) / sd
    return 0.5 * math.erfc(z / math.sqrt(2))


@lru_cache(maxsize=64)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n + m, n) orderings give each U = 0 .. n x m (the statistic's exact
    distribution without ties), by the recurrence over the largest value."""
    table: dict[tuple[int, int], list[int]] = {}

    def counts(i: int, j: int) -> list[int]:
        if i == 0 or j == 0:
            return [1]
        if (i, j) not in table:
            # the largest of the i + j values is one of the j (adds i to U) or one of the i
            with_j = [0] * i + counts(i, j - 1)
            with_i = counts(i - 1, j)
            size = max(len(with_j), len(with_i))
            table[(i, j)] = [(with_j[k] if k < len(with_j) else 0) + (with_i[k] if k < len(with_i) else 0)
                             for k in range(size)]
        return table[(i, j)]

    for i in range(n + 1):  # fill bottom-up: the recursion stays shallow
        for j in range(m + 1):
            counts(i, j)
    result = counts(n, m)
    return tuple(result + [0] * (n * m + 1 - len(result)))


def regression_gate(con: duckdb.DuckDBPyConnection, a: int, b: int, threshold: float, *,
                    alpha: float = ALPHA, iteration_regex: str = ITERATION_REGEX,
                    stages: tuple[pl.DataFrame, pl.DataFrame] | None = None) -> GateResult:
    """Whether trace `b` is slower per iteration than trace `a` by more than `threshold` (0.05 for
    5 %) and beyond the iterations' noise (`stages`: their `layers.stage_times`, when the caller
    has them). Raises MissingDataError when a trace marks no iterations."""
    if stages is None:  # the two traces at once (each about half a second at ten million launches)
        ta, tb = side_by_side(con, lambda c: iteration_times(c, a, iteration_regex),
                              lambda c: iteration_times(c, b, iteration_regex))
    else:
        ta, tb = (iteration_times(con, t, iteration_regex, s) for t, s in zip((a, b), stages))
    if ta.is_empty() or tb.is_empty():
        raise MissingDataError("--gate compares iteration times: both traces need iteration ranges "
                               "('iteration N' or 'step N' NVTX ranges, or --iteration-regex)")
    xa, xb = ta.cast(pl.Float64).to_list(), tb.cast(pl.Float64).to_list()
    median_a, median_b = float(ta.median()), float(tb.median())  # type: ignore[arg-type]
    return GateResult(a_iterations=len(xa), b_iterations=len(xb), a_median_ns=median_a, b_median_ns=median_b,
                      change=median_b / median_a - 1 if median_a else math.inf,
                      p_value=mann_whitney_greater(xa, xb), threshold=threshold, alpha=alpha)
