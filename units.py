"""Numbers as a person reads them: durations, sizes and counts with their unit (1234 ns ->
'1.234 µs'). One place for every layer that writes text: the renderers' tables, and the sentences
of `advise` and the gate."""

from __future__ import annotations

import re


def _scaled(n: float | int | None, units: tuple[tuple[str, float], ...], decimals: int, smallest: str) -> str:
    """`n` in the largest of `units` ((name, scale), largest first) it reaches, with `decimals`;
    a smaller `n` whole, followed by `smallest`."""
    if n is None:
        return ""
    value = float(n)
    for unit, scale in units:
        if abs(value) >= scale:
            return f"{value / scale:.{decimals}f} {unit}"
    return f"{value:.0f}{smallest}"


def format_duration(ns: float | int | None) -> str:
    """1234 -> '1.234 µs'; picks ns, µs, ms or s so the number stays short."""
    return _scaled(ns, (("s", 1e9), ("ms", 1e6), ("µs", 1e3)), 3, " ns")


def format_bytes(n: float | int | None) -> str:
    """1536 -> '1.5 KiB'; picks B, KiB, MiB or GiB."""
    return _scaled(n, (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)), 1, " B")


def format_count(n: float | int | None) -> str:
    """917290000000 -> '917.29 G': SI prefixes for large counts such as FLOPs."""
    return _scaled(n, (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)), 2, "")


_UNIT_AFTER_NUMBER = re.compile(r"(?<=\d) (?=(?:ns|µs|ms|s|%|B|KiB|MiB|GiB|TiB|GB/s|TB/s|TFLOP/s|FLOP|GPUs?|ppm)"
                                r"(?![\w/]))")
_GLUE = "\u00a0"  # a space textwrap does not break at


def wrap(text: str, width: int, **options: object) -> list[str]:
    """`textwrap.wrap(text, width, **options)` that never breaks a line between a number and its
    unit ('23.1 %', '4.549 ms' stay on one line)."""
    import textwrap

    if _GLUE in text:  # a name that holds the glue itself: wrapped as it is
        return textwrap.wrap(text, width, **options)  # type: ignore[arg-type]
    glued = _UNIT_AFTER_NUMBER.sub(_GLUE, text)
    return [line.replace(_GLUE, " ") for line in textwrap.wrap(glued, width, **options)]  # type: ignore[arg-type]
