"""Analyses: pure functions from the store (a DuckDB connection and a trace or run id) to Polars
DataFrames. They never print, plot or write files; the API calls them, the renderers draw what
they return.

By topic, one package each:

- `kernels/`: what each kernel is (library, operation, precision, from its name) and which took
  the time (`top`).
- `structure/`: which iteration, pass, layer and stage each piece of GPU work belongs to
  (attribution, kept attribution, `layers`, `libs`, `stages`).
- `timeline/`: when the GPU worked and why it waited (`idle`, `launches`, `stats`).
- `efficiency/`: how well the GPU was used (`ru`, `ce`, `traffic`, occupancy, peaks, FLOPs).
- `multigpu/`: ranks of a run and their collectives (making a run, `comm`, `overlap`, `ranks`).
- `compare/`: two traces or runs side by side (`compare`, the gate, scaling).

Beside them, the building blocks every topic uses (`operations`: GPU work and the calls that
issued it; `intervals`: as-of lookups; `choices`: the groupings offered), the whole-store
questions (`traces`, `sql`, `memory`), and `advise`, which sits on top of the topics and ranks
what to fix first.
"""
