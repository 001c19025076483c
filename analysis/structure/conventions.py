"""How a trace names its structure: the range names that mark an iteration or a stage, the
suffixes an autograd op name carries, the range domains that are the application's."""

from __future__ import annotations

ITERATION_REGEX = r"(?i)^\s*(iteration|iter|step|ProfilerStep)[\s_#]*\d+\s*$"
"""Range names that mark one training step: 'iteration 0', 'step 12', Kineto's 'ProfilerStep#3'."""

APPLICATION_DOMAINS = ("user_annotation", "cpu_op", "python_function")
"""Range domains that are the application's besides NVTX's default one (NULL): Kineto's
categories for record_function ranges, operators and Python frames. Libraries' own NVTX domains
(NCCL's, ...) are not."""

STAGES = ("data_copy", "forward", "backward", "weight_update")
"""Stage range names (the paper's stages 3 to 5); anything else is 'other'."""

SUFFIX_REGEX = r",\s*(seq|op_id|sizes|input_op_ids)\s*=.*$"
"""', seq = 470, op_id = 1, sizes = [...]' and the like after an autograd op name (emit_nvtx)."""
