"""The critical path and what-if replay (`traceq critical`, `traceq whatif`): the trace's
dependency graph (`graph.py`), its replay with fixed durations and the backward walk that gives
each iteration's critical path (`replay.py`), the path's segments and composition (`path.py`)
and the changes a what-if applies before replaying (`whatif.py`). docs/critical.md describes the
edges and what each trace format provides."""
