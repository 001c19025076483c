"""traceq: GPU trace analysis from Nsight Systems, nvprof and PyTorch profiler traces.

    import traceq
    t = traceq.open("traceq.duckdb").trace("alexnet_b256_cudnn")
    t.layers()            # a polars DataFrame: GPU time per layer and pass

`traceq.open` and `traceq.load` give a Store; its Traces have one method per `traceq` command,
each returning a polars DataFrame (docs/api.md). The modules behind them stay importable:
`traceq.store`, `traceq.ingest`, `traceq.analysis`, `traceq.render`. Names here are imported on
first use, so `import traceq` (and the `traceq` command) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from traceq.errors import (
    MissingDataError,
    NotFoundError,
    OptionError,
    RegressionError,
    StoreError,
    TraceFormatError,
    TraceqError,
    TraceqWarning,
)

__version__ = "0.3.0"

_API = ("Run", "Store", "Trace", "load", "load_dataset", "occupancy", "open", "use_rules")
_MODULES = ("analysis", "api", "cli", "dataset", "errors", "ingest", "render", "store")

__all__ = [*_API, "MissingDataError", "NotFoundError", "RegressionError", "StoreError", "TraceFormatError",
           "TraceqError", "TraceqWarning", "OptionError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module("traceq.api"), name)
    if name in _MODULES:
        return importlib.import_module(f"traceq.{name}")
    raise AttributeError(f"module 'traceq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
