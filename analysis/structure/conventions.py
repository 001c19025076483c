"""How a trace names its structure: the range names that mark an iteration or a stage, the
suffixes an autograd op name carries, the range domains that are the application's."""

from __future__ import annotations

import polars as pl

ITERATION_REGEX = (r"(?i)^\s*(((train(ing)?|global)[\s_-]*)?(iteration|iter|step|ProfilerStep)[\s_#:-]*"
                   r"|decode[\s_-]*(step)?[\s_#:-]*)\d+\s*$")
"""Range names that mark one step: 'iteration 0', 'step 12', Kineto's 'ProfilerStep#3', the
common 'train_step 5' and 'training step 5', and an inference loop's 'decode 7'."""

STAGE_NAMES = {
    "data_copy": r"data[\s_-]*(copy|load|loading)|h2d|batch[\s_-]*(copy|load)|enumerate\(dataloader\).*",
    "forward": r"forward|fwd|forward[\s_-]*(compute|pass|step)",
    "backward": r"backward|bwd|backward[\s_-]*(compute|pass|step)",
    "weight_update": r"weight[\s_-]*update|optimizer|optimizer[\s_-]*step|optim[\s_-]*step|opt[\s_-]*step",
}
"""Stage range names, by the stage they mark (whole names, any case, `#` and spaces around them
aside, as PARAM's `## backward ##`): the paper's own
(`data_copy`, `forward`, `backward`, `weight_update`) and the ones Megatron-style training loops
use (`forward-compute`, `backward-compute`, `optimizer-step`), and the profiler's
`enumerate(DataLoader)#...` around fetching a batch."""


def stage_of(name: str) -> str:
    """SQL: the stage the range name expression `name` marks (STAGE_NAMES), else NULL."""
    cases = " ".join(f"WHEN regexp_full_match(trim(lower({name}), '# '), '{pattern}') THEN '{stage}'"
                     for stage, pattern in STAGE_NAMES.items())
    return f"(CASE {cases} END)"

COMMUNICATION = "communication"
"""The pass of the work a communication library's own ranges enclose (COMMUNICATION_REGEX)."""

COMMUNICATION_REGEX = r"^(nccl[A-Z]\w*|nccl:\w+|rccl[A-Z]\w*|gloo:\w+)$"
"""Range names that mark a collective or a send/receive: NCCL's and RCCL's own NVTX ranges
(domain NCCL: `ncclAllReduce`, `ncclBroadcast`, `ncclSend`), the profiler's record_param_comms
annotations (`nccl:all_reduce`, `gloo:broadcast`)."""

COMMUNICATION_DOMAINS = ("NCCL", "RCCL")
"""Libraries' NVTX domains whose ranges name the work inside them (COMMUNICATION_REGEX): layers
all the same. Other libraries' and tools' domains enclose no layer."""

APPLICATION_DOMAINS = ("user_annotation", "cpu_op", "python_function")
"""Range domains that are the application's besides NVTX's default one (NULL): Kineto's
categories for record_function ranges, operators and Python frames. Libraries' own NVTX domains
(NCCL's, ...) are not."""

STAGES = ("data_copy", "forward", "backward", "weight_update")
"""Stage range names (the paper's stages 3 to 5); anything else is 'other'."""

SUFFIX_REGEX = r",\s*(seq|op_id|sizes|input_op_ids)\s*=.*$"
"""', seq = 470, op_id = 1, sizes = [...]' and the like after an autograd op name (emit_nvtx)."""

WARM_UP = "warm-up"
"""The iteration of the work done while compiling or in an iteration that compiled
(`phases`): shown like an iteration, left out of per-iteration statistics."""


def steady(column: str = "iteration") -> pl.Expr:
    """Polars: whether the iteration column names a steady-state iteration (neither null nor WARM_UP)."""
    return pl.col(column).is_not_null() & (pl.col(column) != WARM_UP)


def steady_sql(column: str = "iteration") -> str:
    """SQL: whether the iteration expression `column` names a steady-state iteration."""
    return f"({column} IS NOT NULL AND {column} <> '{WARM_UP}')"
