"""SQL for the summary columns `nsys stats` reports share: the statistics of a duration, and an
API function's name as nsys prints it (used by `stats` and `launches`)."""

from __future__ import annotations


def statistics(value: str, suffix: str = "ns", prefix: str = "") -> str:
    """avg, median, min, max and sample stddev of the SQL expression `value`, named
    `{prefix}avg_{suffix}` and so on."""
    return (f"avg({value})::DOUBLE AS {prefix}avg_{suffix}, "
            f"quantile_cont({value}, 0.5)::DOUBLE AS {prefix}median_{suffix}, "
            f"min({value})::BIGINT AS {prefix}min_{suffix}, max({value})::BIGINT AS {prefix}max_{suffix}, "
            f"coalesce(stddev_samp({value}), 0)::DOUBLE AS {prefix}stddev_{suffix}")


def api_name(name: str) -> str:
    """The API name as nsys prints it: a `_vNNNN` suffix of exactly six characters is cut
    ('cudaLaunchKernel_v7000' -> 'cudaLaunchKernel'), a longer one is kept
    ('cudaLaunchKernelExC_v11060')."""
    return (f"CASE WHEN substr({name}, length({name}) - 5, 2) = '_v' "
            f"THEN left({name}, length({name}) - 6) ELSE {name} END")
