"""traceq from Python: a store of traces, and one method per `traceq` command.

    import traceq

    store = traceq.open("traceq.duckdb")          # read-only unless it loads
    t = store.trace("alexnet_b256_cudnn")         # a name, an id, or None for the latest loaded
    t.layers()                                    # a polars DataFrame: what `traceq layers` prints

Every `Trace` method is one command's analysis with the command's options as keywords, and
returns what the command prints as a `polars.DataFrame` (its columns are csv and json's: times
in ns, sizes in bytes, shares as fractions); `traceq.cli` calls these methods and renders what
they return, so the numbers are the same. Errors are `traceq.TraceqError`s with a one-line
message; notes a command prints on stderr (`traceq: note: ...`) are `traceq.TraceqWarning`s.

Nothing here imports polars until an analysis needs it: `traceq top` runs on this module in a
fraction of a second.
"""

from __future__ import annotations

from pathlib import Path

from traceq.api.run import Run  # noqa: F401 (re-exported)
from traceq.api.store import Store, load, load_dataset, open
from traceq.api.trace import AUTO_CONTEXT_MAX_KERNELS, Trace
from traceq.errors import TraceqError


def occupancy(cc: str, threads: int, regs: int, *, smem_static: int = 0, smem_dynamic: int = 0,
              carveout: int | None = None, opt_in: bool = False, grid: int | None = None,
              sms: int | None = None) -> dict[str, object]:
    """`traceq occupancy`: the offline occupancy calculator for one launch shape on compute
    capability `cc` ('9.0'): blocks_per_sm, limit_<resource>, limiter, occupancy, and with
    `grid` and `sms` waves and ru."""
    from traceq.analysis.efficiency.gpu_specs import limits_for_cc
    from traceq.analysis.efficiency.occupancy import occupancy_dict

    major, _, minor = cc.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise TraceqError(f"{cc!r} is not a compute capability like 9.0")
    return occupancy_dict(threads, regs, limits_for_cc(int(major), int(minor)), static_smem=smem_static,
                          dynamic_smem=smem_dynamic, carveout=carveout, opt_in=opt_in, grid_blocks=grid, sms=sms)


def use_rules(path: str | Path | None) -> None:
    """Put the kernel rules of a TOML file (the format of analysis/kernels/kernel_rules.toml) in front
    of the packaged ones for every analysis after this call, as `traceq --rules FILE` does
    (None: back to $TRACEQ_RULES or none). Raises TraceqError for a bad file."""
    from traceq.analysis.kernels.classify import use_rules as choose

    choose(path)


__all__ = ["AUTO_CONTEXT_MAX_KERNELS", "Run", "Store", "Trace", "load", "load_dataset", "occupancy", "open", "use_rules"]
