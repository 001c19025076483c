"""A trace's structure: which iteration, pass, layer and stage each kernel, copy and memset
belongs to (attribution from NVTX and profiler ranges, CUDA-graph capture, inference rules), the
attribution kept in the store, and the `traceq layers`, `libs` and `stages` tables built on it."""
