"""Texts from a trace kept at a bounded length: a crafted name of megabytes would make every later
step (classification, the report's HTML) slow for nothing (docs/security.md)."""

from __future__ import annotations

import pyarrow as pa

from traceq.ingest.validate import Damage

TEXT_CAP = 65_536
"""Longest text the store keeps (characters: a kernel name, an NVTX text, any name). The longest
in the real traces of ../shared are 20,000 (an NVTX text) and 5,800 (emit_nvtx ranges with their
shapes); a crafted one of megabytes would make every later step (classification, the report's
HTML) slow for nothing. A longer text keeps its first TEXT_CAP_HEAD and last TEXT_CAP_TAIL
characters (a kernel name's end tells tiles apart) around a marker with its length and the first
12 hex digits of its SHA-1 (docs/security.md)."""
TEXT_CAP_HEAD, TEXT_CAP_TAIL = 32_768, 16_384


def capped(text: str) -> str:
    """`text` cut to the store's cap (see TEXT_CAP), unchanged when it fits."""
    if len(text) <= TEXT_CAP:
        return text
    import hashlib

    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{text[:TEXT_CAP_HEAD]}…[{len(text):,} characters, sha1 {digest}]…{text[-TEXT_CAP_TAIL:]}"


def cap_texts(table: str, batch: pa.Table, damage: Damage) -> pa.Table:
    """`batch` with every text longer than TEXT_CAP cut (`capped`), each counted in `damage`."""
    import pyarrow.compute as pc

    for i, field in enumerate(batch.schema):
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)) or not batch.num_rows:
            continue
        column = batch.column(i)
        longest = pc.max(pc.utf8_length(column)).as_py()
        if longest is None or longest <= TEXT_CAP:
            continue
        values = column.to_pylist()
        cut = sum(1 for v in values if v is not None and len(v) > TEXT_CAP)
        batch = batch.set_column(i, field, pa.array([capped(v) if v is not None else None for v in values],
                                                    field.type))
        damage.add(f"{table}.{field.name} text", f"longer than {TEXT_CAP:,} characters cut (its SHA-1 kept)", cut)
    return batch
