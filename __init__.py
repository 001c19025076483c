"""traceq: GPU trace analysis from Nsight Systems and nvprof exports.

Library use mirrors the CLI: `traceq.store.open_store()` gives a DuckDB connection,
`traceq.ingest.load_trace()` loads a file into it, and the functions in `traceq.analysis`
turn the store into Polars DataFrames.
"""

__version__ = "0.1.0"
