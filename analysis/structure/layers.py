"""GPU time per layer, pass, library and training stage: the `traceq layers`, `libs` and `stages`
analyses, and the NVTX context columns of `traceq top`.

Built on `attribution.point_contexts` (which NVTX ranges enclose each launch) and
`classify.classify_names` (which library each kernel name belongs to). Times are integer ns.

Traces can hold ten million kernels, so no analysis here holds a string per kernel: the
per-layer tables, `compare` and RU by layer group kernels by their attribution context, name,
configuration and queue, as integer ids summed in DuckDB, into a few hundred groups first
(`launch_groups`, and `kernel_groups` over them); where the store keeps the attribution its
rows are read as they lie, paired with the launches by position. `stage_times` sums per
context code too. `attributed_kernels` does have a row per kernel; its strings are shared with a
small table, not copied.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.kernels.classify import classify_names, default_rules
from traceq.analysis.structure.attribution import gpu_operations, kernel_launches, point_contexts
from traceq.analysis.structure.conventions import ITERATION_REGEX

STAGE_COLUMNS = ("data_copy", "forward", "backward", "weight_update", "other")


def _kernels(
    con: duckdb.DuckDBPyConnection, trace_id: int, columns: tuple[str, ...], *, ordered: bool,
    between: tuple[int, int] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`attribution.kernel_launches`, the names classified (library, operation)."""
    kernels, names = kernel_launches(con, trace_id, columns, ordered=ordered, between=between)
    return kernels, _classified(names)


def _classified(names: pl.DataFrame) -> pl.DataFrame:
    """`names` (name, short_name, ...) with library and operation; its rows stay name rows."""
    classes = classify_names(names["name"].unique(maintain_order=True)).select("name", "library", "operation")
    return names.join(classes, on="name", how="left", maintain_order="left")


def _libraries(index: pl.Series, name_row: pl.Series, contexts: pl.DataFrame,
               names: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """(code per kernel, libraries): each kernel's library by the operation that launched it
    (`classify` [[launcher]] rules over its context's launcher op, else its innermost range,
    `layer`), as a row number
    into the small `libraries` table. Where no rule applies it is the name's library."""
    rules = default_rules()
    libraries = names["library"].unique(maintain_order=True)
    code_of = {library: code for code, library in enumerate(libraries.to_list())}
    by_name = names["library"].replace_strict(code_of, return_dtype=pl.UInt32).cast(pl.UInt32).gather(name_row)
    launcher = pl.coalesce("launcher", "layer") if "launcher" in contexts.columns else pl.col("layer")
    launching = contexts.with_row_index("context").with_columns(launcher=launcher).filter(
        pl.col("launcher").map_elements(rules.launches, return_dtype=pl.Boolean, skip_nulls=True).fill_null(False))
    if launching.is_empty():
        return by_name, libraries
    # the distinct (context, name) pairs that a rule's operations launched: a few hundred
    n = names.height
    key = index.cast(pl.UInt64) * n + name_row.cast(pl.UInt64)
    pairs = pl.DataFrame({"key": key.filter(index.is_in(launching["context"].implode()))}).unique()
    pairs = pairs.with_columns(context=(pl.col("key") // n).cast(pl.UInt32), name_row=(pl.col("key") % n).cast(pl.UInt32))
    pairs = pairs.join(launching.select("context", "launcher"), on="context")
    relabelled = [rules.launcher_library(launcher, names["library"][row]) for launcher, row in
                  pairs.select("launcher", "name_row").iter_rows()]
    for library in relabelled:
        code_of.setdefault(library, len(code_of))
    codes = pl.Series([code_of[library] for library in relabelled], dtype=pl.UInt32)
    libraries = pl.Series("library", list(code_of), dtype=pl.String)
    return key.replace_strict(pairs["key"], codes, default=None).fill_null(by_name), libraries


def kernel_contexts(
    con: duckdb.DuckDBPyConnection, trace_id: int, columns: tuple[str, ...] = (),
    iteration_regex: str = ITERATION_REGEX, *, ordered: bool = True, stored: bool = True,
    between: tuple[int, int] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Every kernel with the row of its attribution context and of its name: (kernels, names,
    contexts), the strings in the two small tables.

    kernels: id (kernel_id), name_row, context, and `columns` (of device_id, start_ns, dur_ns);
    in kernel_id order if `ordered`. names: name, short_name, library (the name's:
    implementation), operation. contexts: layer, pass, iteration, stage, attribution, library
    (by the launching operation, `_libraries`), one row per distinct combination. Read from the
    store where `traceq load` or `traceq attribute` kept the attribution made with these options
    (`analysis.structure.stored`), unless not `stored`; computed otherwise (`attribution.point_contexts`).
    `between` (lo, hi): only the kernels of those kernel_ids and their names, computed (the
    attribution of a launch does not depend on the other launches: `keep` attributes in windows).
    """
    from traceq.analysis.structure.stored import read_attribution

    if stored and between is None and (kept := read_attribution(con, trace_id, iteration_regex, columns,
                                                                 ordered=ordered)) is not None:
        kernels, names, contexts = kept
        return kernels, _classified(names), contexts
    kernels, names = _kernels(con, trace_id, columns, ordered=ordered, between=between)
    index, contexts = point_contexts(con, trace_id, kernels, iteration_regex, paths=False)
    code, libraries = _libraries(index, kernels["name_row"], contexts, names)
    # one context per distinct (NVTX context, library): a few thousand at most
    pair = index.cast(pl.UInt64) * len(libraries) + code.cast(pl.UInt64)
    pairs = pair.unique().sort()
    table = contexts.select("layer", "pass", "iteration", "stage", "attribution").gather(pairs // len(libraries))
    table = table.with_columns(library=libraries.gather(pairs % len(libraries)))
    kernels = kernels.select("id", "name_row", *columns, context=pairs.search_sorted(pair).cast(pl.UInt32))
    return kernels, names, table


def attributed_kernels(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Every kernel with its duration, name, classification and attribution.

    Columns: kernel_id, device_id, start_ns, dur_ns, name, short_name, library (by the operation
    that launched it where a [[launcher]] rule says, else by name), implementation (the
    library its name says), operation, layer, pass, iteration, stage, attribution ('range', or
    the rule that gave the layer, or why there is none: `analysis.structure.inference`); in kernel_id
    order.
    """
    kernels, names, contexts = kernel_contexts(con, trace_id, ("device_id", "start_ns", "dur_ns"), iteration_regex)
    row, context = kernels["name_row"], kernels["context"]
    return kernels.select(
        pl.col("id").alias("kernel_id"), "device_id", "start_ns", "dur_ns",
        *[names[c].gather(row) for c in ("name", "short_name")],
        contexts["library"].gather(context), names["library"].gather(row).alias("implementation"),
        names["operation"].gather(row),
        *[contexts[c].gather(context) for c in ("layer", "pass", "iteration", "stage", "attribution")])


_LAUNCH_GROUPS = """
    SELECT context, name_row, config_id, queue_id, count(*) AS instances, sum(dur_ns)::BIGINT AS dur_ns,
           max(dur_ns) AS longest_ns, max(dur_ns::HUGEINT * 18446744073709551616 - id) AS longest_first,
           min(id) AS lowest_kernel{extra}
    FROM {launches} GROUP BY ALL"""
"""Launches (id, context, name_row, config_id, queue_id, dur_ns) summed per group. longest_first
packs the first (smallest id) of the longest launches with its time: max() of one number is a
third of arg_min()'s time over a (time, id) pair; `_first_kernel` unpacks it."""


_CONTEXT_COLUMNS = ("layer", "pass", "iteration", "stage", "attribution", "library")


def _first_kernel(groups: pl.DataFrame) -> pl.DataFrame:
    """`groups` with first_kernel (the smallest kernel_id of each group's longest launches) in
    place of `_LAUNCH_GROUPS`' longest_first."""
    first = pl.col("longest_ns").cast(pl.Int128) * 18446744073709551616 - pl.col("longest_first")
    return groups.with_columns(first_kernel=first.cast(pl.Int64)).drop("longest_first")


def _kept_groups(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """`_LAUNCH_GROUPS` of the kept attribution (`stored.read_kept_launches`), its contexts'
    columns in place of context ids."""
    from traceq.analysis.structure.stored import read_kept_launches

    t = int(trace_id)

    def query(kept: str) -> str:
        launches = f"""(SELECT kernel_id AS id, context, name_id AS name_row, config_id, queue_id,
                               end_ns - start_ns AS dur_ns, misplaced FROM {kept})"""
        grouped = _LAUNCH_GROUPS.format(launches=launches, extra=", count(*) FILTER (WHERE misplaced) AS misplaced")
        # a kept context is also split by precision: contexts alike in their columns merge (a few thousand rows)
        return f"""
            SELECT {', '.join(f'c.{c}' for c in _CONTEXT_COLUMNS)}, g.name_row, g.config_id,
                   g.queue_id, sum(g.instances)::BIGINT AS instances, sum(g.dur_ns)::BIGINT AS dur_ns,
                   max(g.longest_ns) AS longest_ns, max(g.longest_first) AS longest_first,
                   min(g.lowest_kernel) AS lowest_kernel, sum(g.misplaced) AS misplaced
            FROM ({grouped}) g
            LEFT JOIN kernel_contexts c ON c.trace_id = {t} AND c.context_id = g.context
            GROUP BY ALL"""

    return read_kept_launches(con, t, query)


def launch_groups(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX, *, stored: bool = True
) -> pl.DataFrame:
    """Kernels grouped by attribution context, name, launch configuration and queue: at ten
    million launches a few thousand rows that still say everything `compare` and `ru` by layer
    need (the groups are summed in DuckDB over integer ids, no string per kernel).

    Columns: layer, pass, iteration, stage, attribution, library (as in `attributed_kernels`),
    name, short_name, implementation, operation, config_id, queue_id, instances, dur_ns (their
    total), longest_ns, first_kernel (the smallest kernel_id of the longest launches) and
    lowest_kernel (the smallest kernel_id of all). From
    the attribution the store keeps when there is one for these options (and `stored`), else
    from `kernel_contexts` computed here.
    """
    from traceq.analysis.operations import by_row
    from traceq.analysis.structure.stored import is_kept
    from traceq.store import registered

    t = int(trace_id)
    if stored and is_kept(con, t, iteration_regex):
        groups = _kept_groups(con, t)
        names = _classified(con.sql(f"SELECT name_id::UINTEGER AS name_row, name, short_name FROM kernel_names "
                                    f"WHERE trace_id = {t}").pl())
    else:
        kernels, names, contexts = kernel_contexts(con, t, ("dur_ns",), iteration_regex, ordered=False, stored=False)
        ids = con.sql(f"SELECT kernel_id, config_id, queue_id FROM kernel_events WHERE trace_id = {t} "
                      f"ORDER BY kernel_id").pl()
        launches = kernels.with_columns(by_row(ids, "kernel_id", kernels["id"], ("config_id", "queue_id")))
        with registered(con, launches=launches) as view:
            groups = con.sql(_LAUNCH_GROUPS.format(launches=view["launches"], extra="")).pl()
        groups = (groups.join(contexts.with_row_index("context"), on="context", how="left")
                  .group_by(*_CONTEXT_COLUMNS, "name_row", "config_id", "queue_id")  # as the kept contexts merge
                  .agg(pl.col("instances", "dur_ns").sum(), pl.col("longest_ns", "longest_first").max(),
                       pl.col("lowest_kernel").min()))
        names = names.with_row_index("name_row")
    return (_first_kernel(groups).cast({"name_row": pl.UInt32})
            .join(names.rename({"library": "implementation"}), on="name_row", how="left")
            .select("layer", "pass", "iteration", "stage", "attribution", "library", "name", "short_name",
                    "implementation", "operation", "config_id", "queue_id", "instances", "dur_ns", "longest_ns",
                    "first_kernel", "lowest_kernel"))


def kernel_groups(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Kernels grouped by layer, pass, name, library and attribution: what `attributed_kernels`
    holds, summed (from `launch_groups`, a few hundred rows at ten million launches).

    Columns: layer, pass, name, short_name, library, implementation, operation, attribution,
    kernels (count), dur_ns (total), first_kernel (the smallest kernel_id, for 'the first
    kernel's' choices).
    """
    return kernel_groups_of(launch_groups(con, trace_id, iteration_regex))


def kernel_groups_of(launches: pl.DataFrame) -> pl.DataFrame:
    """`kernel_groups` from the trace's `launch_groups`, when the caller has them."""
    keys = ["layer", "pass", "name", "short_name", "library", "implementation", "operation", "attribution"]
    return (launches.group_by(keys)
            .agg(kernels=pl.col("instances").sum().cast(pl.UInt32), dur_ns=pl.col("dur_ns").sum(),
                 first_kernel=pl.col("lowest_kernel").min()))


def attribution_shares(groups: pl.DataFrame) -> dict[str, float]:
    """Share of all kernel time (%) by how the kernels got their layer, from `kernel_groups`: one
    key per attribution ('range', 'module', 'op sequence', 'XLA op', ...), every 'rule: ...' as
    'rule' and every 'none: ...' (or no attribution) as 'none'; 'range', 'rule' and 'none'
    always present, the rest where some kernel time has them; largest first."""
    total = max(int(groups["dur_ns"].sum()), 1)
    kind = pl.col("attribution").fill_null("none").str.replace(r"^(rule|none):.*$", "$1")
    shares = dict(groups.group_by(kind.alias("kind")).agg(pl.col("dur_ns").sum()).iter_rows())
    shares = {k: 100.0 * v / total for k, v in shares.items()}
    for k in ("range", "rule", "none"):
        shares.setdefault(k, 0.0)
    return dict(sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])))


def time_split(frame: pl.DataFrame, keys: list[str], column: str, label: str) -> pl.DataFrame:
    """Per group of `keys` of `frame` (with dur_ns): 'cuDNN 80%, PyTorch ATen 20%', the values of
    `column` by their share of the group's time, largest first; shares that round to 0 or 100
    without being so read '<1%' and '>99%'."""
    parts = (frame.group_by([*keys, column]).agg(pl.col("dur_ns").sum())
             .with_columns(share=(pl.col("dur_ns") / pl.col("dur_ns").sum().over(keys)).fill_nan(0.0))  # 0 / 0 ns
             .sort([*keys, "dur_ns", column], descending=[False] * len(keys) + [True, False], nulls_last=True))
    pct = (pl.col("share") * 100).round(0).cast(pl.Int64)
    shown = (pl.when((pct == 0) & (pl.col("share") > 0)).then(pl.lit("<1"))
             .when((pct == 100) & (pl.col("share") < 1)).then(pl.lit(">99")).otherwise(pct.cast(pl.String)))
    parts = parts.with_columns(text=pl.col(column).fill_null("none") + " " + shown + "%")
    return parts.group_by(keys, maintain_order=True).agg(pl.col("text").str.join(", ").alias(label))


def layer_times(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX,
    groups: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """GPU time per (layer, pass), heaviest first (`groups`: the trace's `kernel_groups`, when
    the caller has them).

    Columns: layer (null: in no layer), pass, kernels, total_ns, pct (share of all kernel
    time, %), heaviest (short name of the kernel with most time in the group), libraries
    ('cuDNN 80%, PyTorch ATen 20%', all of them, largest first), attribution ('range' inside
    the layer's ranges, the rule that placed the kernels (`analysis.structure.inference`), or why they
    have no layer; by share of time when several).
    """
    k = kernel_groups(con, trace_id, iteration_regex) if groups is None else groups
    keys = ["layer", "pass"]
    totals = k.group_by(keys).agg(kernels=pl.col("kernels").sum().cast(pl.Int64),
                                  total_ns=pl.col("dur_ns").sum().cast(pl.Int64))
    heaviest = (k.group_by([*keys, "short_name"]).agg(pl.col("dur_ns").sum())
                .sort([*keys, "dur_ns", "short_name"], descending=[False, False, True, False], nulls_last=True)
                .group_by(keys, maintain_order=True).agg(heaviest=pl.col("short_name").first()))
    grand = max(int(k["dur_ns"].sum()), 1)
    attribution = time_split(k, keys, "attribution", "attribution").with_columns(
        pl.col("attribution").str.replace(r" 100%$", ""))
    return (totals.join(heaviest, on=keys, how="left", nulls_equal=True)
            .join(time_split(k, keys, "library", "libraries"), on=keys, how="left", nulls_equal=True)
            .join(attribution, on=keys, how="left", nulls_equal=True)
            .with_columns(pct=100.0 * pl.col("total_ns") / grand)
            .sort(["total_ns", "layer", "pass"], descending=[True, False, False], nulls_last=True)
            .select("layer", "pass", "kernels", "total_ns", "pct", "heaviest", "libraries", "attribution"))


def library_times(
    con: duckdb.DuckDBPyConnection, trace_id: int, by_layer: bool = False,
    iteration_regex: str = ITERATION_REGEX, groups: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """GPU time per library (per layer, pass and library with `by_layer`), heaviest first
    (`groups`: the trace's `kernel_groups`, when the caller has them).

    Columns: [layer, pass,] library, kernels, total_ns, pct (share of all kernel time, %),
    operations ('convolution 90%, gemm 10%'), implementations (the libraries the kernels' names
    say, 'cuDNN 70%, cuBLAS 30%': they differ where an operation of one library launched
    another's kernels, a [[launcher]] rule).
    """
    k = kernel_groups(con, trace_id, iteration_regex) if groups is None else groups
    keys = ["layer", "pass", "library"] if by_layer else ["library"]
    grand = max(int(k["dur_ns"].sum()), 1)
    frame = (k.group_by(keys).agg(kernels=pl.col("kernels").sum().cast(pl.Int64),
                                  total_ns=pl.col("dur_ns").sum().cast(pl.Int64))
             .join(time_split(k, keys, "operation", "operations"), on=keys, how="left", nulls_equal=True)
             .join(time_split(k, keys, "implementation", "implementations"), on=keys, how="left", nulls_equal=True)
             .with_columns(pct=100.0 * pl.col("total_ns") / grand))
    order = (["total_ns", "library"], [True, False])
    if by_layer:  # layers heaviest first, libraries heaviest first within each
        layer_total = frame.group_by("layer", "pass").agg(layer_ns=pl.col("total_ns").sum())
        frame = frame.join(layer_total, on=["layer", "pass"], how="left", nulls_equal=True)
        order = (["layer_ns", "layer", "pass", "total_ns", "library"], [True, False, False, True, False])
    return (frame.sort(order[0], descending=order[1], nulls_last=True)
            .select(*keys, "kernels", "total_ns", "pct", "operations", "implementations"))


def stage_times(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """GPU time per iteration and device in each training stage (the paper's figure 4).

    Columns: iteration, device_id, data_copy_ns, forward_ns, backward_ns, weight_update_ns,
    other_ns (GPU time of kernels, memcpys and memsets launched in each stage; copies count
    where they were issued), span_ns (first GPU start to last GPU end of the iteration's work),
    busy_ns (time any of it ran), idle_ns (span_ns - busy_ns), idle_pct (% of the span).
    Work launched outside every iteration range is one row with a null iteration.

    The kernels' iteration and stage come from the kept attribution where the store has it (the
    copies' are found here: a few thousand calls), else from `gpu_operations`. Sums run over
    context row numbers, busy time over one sort (`intervals.union_lengths`).
    """
    from traceq.analysis.intervals import union_lengths

    ops, contexts = _stage_operations(con, trace_id, iteration_regex)
    iterations = contexts["iteration"].unique(maintain_order=True)
    # each context's iteration as a number (null: the last), each launch's too: no string per launch
    named = iterations.drop_nulls()
    iteration_code = contexts["iteration"].replace_strict(named, pl.int_range(0, named.len(), eager=True),
                                                          default=named.len(), return_dtype=pl.Int64)
    # each (iteration, device) as one number: devices numbered from 1 up (0: none)
    lowest, highest = (int(v) if v is not None else 0 for v in (ops["device_id"].min(), ops["device_id"].max()))

    def device_code(device: pl.Series | pl.Expr) -> pl.Series | pl.Expr:
        return (device.cast(pl.Int64) - lowest + 1).fill_null(0)

    devices = highest - lowest + 2
    group = iteration_code.gather(ops["context"]) * devices + device_code(ops["device_id"])
    busy = union_lengths(group, ops["start_ns"], ops["end_ns"])
    by_context = (ops.group_by("context", "device_id")
                  .agg(pl.col("dur_ns").sum(), first_ns=pl.col("start_ns").min(), last_ns=pl.col("end_ns").max()))
    at = by_context["context"]
    by_context = by_context.with_columns(
        iteration=contexts["iteration"].gather(at), stage=contexts["stage"].gather(at),
        group=iteration_code.gather(at) * devices + device_code(pl.col("device_id")))
    keys = ["iteration", "device_id"]
    frame = (by_context.group_by(*keys, "group")
             .agg(*[pl.col("dur_ns").filter(pl.col("stage") == s).sum().alias(f"{s}_ns") for s in STAGE_COLUMNS],
                  span_ns=pl.col("last_ns").max() - pl.col("first_ns").min(), first_ns=pl.col("first_ns").min())
             .join(busy.rename({"length": "busy_ns"}), on="group", how="left")
             .with_columns(idle_ns=pl.col("span_ns") - pl.col("busy_ns"))
             .with_columns(idle_pct=pl.when(pl.col("span_ns") != 0)
                           .then(100.0 * pl.col("idle_ns") / pl.col("span_ns")).otherwise(0.0)))
    schema = {"iteration": pl.String, "device_id": pl.Int32, **{f"{s}_ns": pl.Int64 for s in STAGE_COLUMNS},
              "span_ns": pl.Int64, "busy_ns": pl.Int64, "idle_ns": pl.Int64, "idle_pct": pl.Float64,
              "first_ns": pl.Int64}
    frame = frame.select(*schema).cast(schema)
    return (frame.with_columns(order=pl.col("first_ns").min().over("iteration"))
            .sort(pl.col("iteration").is_null(), "order", "device_id", "iteration")
            .drop("first_ns", "order"))


def _stage_operations(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(ops: device_id, start_ns, end_ns, dur_ns, context; contexts: iteration, stage) of every
    kernel, memcpy and memset: the kernels' contexts kept in the store where it has them for
    these options (`stored.read_kept_launches`), with the copies' after them; else
    `gpu_operations`."""
    from traceq.analysis.operations import by_row
    from traceq.analysis.structure.attribution import copy_operations
    from traceq.analysis.structure.stored import is_kept, read_kept_launches

    t = int(trace_id)
    if not is_kept(con, t, iteration_regex):
        ops, _, _, contexts = gpu_operations(con, t, iteration_regex)
        return (ops.select("device_id", "start_ns", "end_ns", "dur_ns", "context"),
                contexts.select("iteration", "stage"))
    kernels = read_kept_launches(con, t, lambda kept: f"""
        SELECT queue_id, start_ns, end_ns, end_ns - start_ns AS dur_ns, context::UINTEGER AS context, misplaced
        FROM {kept}""")
    # each launch's device by its queue's row (a join in DuckDB took nine times the scan)
    queues = con.sql(f"SELECT queue_id, device_id FROM kernel_queues WHERE trace_id = {t} ORDER BY queue_id").pl()
    kernels = kernels.select(*by_row(queues, "queue_id", kernels["queue_id"], ("device_id",)),
                             "start_ns", "end_ns", "dur_ns", "context")
    kept = con.sql(f"SELECT iteration, stage FROM kernel_contexts WHERE trace_id = {t} ORDER BY context_id").pl()
    copies, copy_contexts = copy_operations(con, t, iteration_regex)
    ops = pl.concat([kernels, copies.with_columns(pl.col("context") + kept.height)],
                    how="vertical_relaxed")
    return ops, pl.concat([kept, copy_contexts])


def names_context(groups: pl.DataFrame, name_column: str = "name") -> pl.DataFrame:
    """Per kernel name (as grouped by `name_column`: name or short_name) of a trace's
    `kernel_groups`: layer, pass and library, for `traceq top`.

    layer: the layers the name ran in, most time first, joined with ', ' (all of them: tables
    shorten the list); pass: 'forward', 'backward' or 'both'; library: the one the name says (a
    kernel's implementation, whatever launched it), as the fast path without attribution gives it.
    """
    k = groups
    if name_column != "name":
        k = k.drop("name").rename({name_column: "name"}) if name_column in k.columns else k
    per_layer = (k.group_by("name", "layer").agg(pl.col("dur_ns").sum())
                 .sort(["name", "dur_ns", "layer"], descending=[False, True, False], nulls_last=True)
                 .drop_nulls("layer")
                 .group_by("name", maintain_order=True)
                 .agg(layer=pl.col("layer").str.join(", ")))
    passes = (k.group_by("name").agg(
        pl.when(pl.col("pass").drop_nulls().n_unique() > 1).then(pl.lit("both"))
        .otherwise(pl.col("pass").drop_nulls().first()).alias("pass"),
        pl.col("implementation").sort_by("first_kernel").first().alias("library")))
    return passes.join(per_layer, on="name", how="left").select("name", "layer", "pass", "library")
