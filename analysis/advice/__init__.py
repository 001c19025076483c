"""The findings catalogue of `traceq advise` beyond the idle, launch and efficiency rules of
`analysis.advise`: communication (exposed collectives; communication kernels are never given
compute advice), data layout (NCHW/NHWC transforms) and the allocator (cudaMalloc/cudaFree in
steady state). Each rule takes advise's shared facts and returns its findings (none or one).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    rule: str
    title: str
    time_ns: float
    evidence: str
    fix: str
