"""Each row of a batch keyed by its values in some columns, on the reading threads: the step
before `base.Names` numbers a trace's distinct names, configurations, queues and threads."""

from __future__ import annotations

import pyarrow as pa


def whole(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`a` as one array: a chunked array's only chunk as it is (`combine_chunks` copies even one:
    half a megabyte per column of a 65,536-row batch), its chunks combined where it has several."""
    if not isinstance(a, pa.ChunkedArray):
        return a
    return a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()


def key_rows(*columns: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
    """Each row's key, the tuple of its values in `columns`, dictionary-encoded: int32 indices into
    a struct array of the batch's distinct keys, in the order they first appear.

    Vectorised, and safe on any thread: readers run it on their reading threads, so that the
    thread writing the store only looks up each batch's few distinct keys (`Names.number_keys`).
    The rows' values are packed into one int64 code (an integer column as it is, or shifted by its minimum,
    NULL as 0; any other column as its dictionary indices; a column of one value, nothing), and
    the code is dictionary-encoded; where the code would pass 63 bits, it is replaced by its
    dictionary indices first.
    """
    import pyarrow.compute as pc

    columns = [whole(c) for c in columns]
    names = [f"k{i}" for i in range(len(columns))]
    code: pa.Array | None = None
    bits = 0
    for column in columns:
        part = _key_part(column)
        if part is None:
            continue
        values, width = part
        if code is not None and bits + width > _KEY_BITS:
            code, bits = _dense(code)
            if bits + width > _KEY_BITS:
                values, width = _dense(values)
        code = values if code is None else pc.add(pc.shift_left(code, pa.scalar(width, pa.int64())), values)
        bits += width
    if code is None:  # every column holds one value: one key, the first row's
        rows = len(columns[0])
        keys = pa.StructArray.from_arrays([c.slice(0, min(rows, 1)) for c in columns], names)
        return pa.DictionaryArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), rows), keys)
    encoded = pc.dictionary_encode(code)
    keys = pa.StructArray.from_arrays([c.take(_first_rows(encoded.indices, len(encoded.dictionary)))
                                       for c in columns], names)
    return pa.DictionaryArray.from_arrays(encoded.indices, keys)


def _first_rows(indices: pa.Array, keys: int) -> pa.Array:
    """The row where each of `keys` dictionary indices first appears: `dictionary_encode` numbers
    keys in the order they first appear, so a key first appears where the running maximum of the
    indices rises (cheaper than a hash lookup of every row)."""
    import pyarrow.compute as pc

    if keys <= 1:
        return pa.array([0] * keys, pa.int64())
    highest = pc.cumulative_max(indices)
    rises = pc.indices_nonzero(pc.not_equal(highest.slice(1), highest.slice(0, len(highest) - 1)))
    return pa.concat_arrays([pa.array([0], pa.uint64()), pc.add(rises, pa.scalar(1, pa.uint64()))])


_KEY_BITS = 63
"""Bits of an int64 that `key_rows` packs a key into (the sign bit stays 0)."""


def _key_part(column: pa.Array) -> tuple[pa.Array, int] | None:
    """`column` as non-negative int64 codes, equal where the values are, and the bits they need;
    None when every row has the same value (NULL included), which tells no key from another."""
    import pyarrow.compute as pc

    if pa.types.is_integer(column.type) or pa.types.is_boolean(column.type):
        values = column if column.type == pa.int64() else pc.cast(column, pa.int64())
        bounds = pc.min_max(values).as_py()
        nulls = values.null_count
        if bounds["min"] is None or (bounds["min"] == bounds["max"] and nulls == 0):
            return None
        span = bounds["max"] - bounds["min"] + 1  # codes 1..span, NULL 0
        if (bounds["min"] >= 1 or (bounds["min"] == 0 and not nulls)) and bounds["max"].bit_length() <= span.bit_length():
            return (pc.fill_null(values, 0) if nulls else values), span.bit_length()  # as compact unshifted
        if span.bit_length() < _KEY_BITS:
            shifted = pc.subtract(values, pa.scalar(bounds["min"] - 1, pa.int64()))  # a typed scalar: 3x faster
            return (pc.fill_null(shifted, 0) if nulls else shifted), span.bit_length()
    return _dense(column)


def _dense(column: pa.Array) -> tuple[pa.Array, int]:
    """`column`'s dictionary indices (NULL a value of its own) as int64, and the bits they need."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column, null_encoding="encode")
    return pc.cast(encoded.indices, pa.int64()), len(encoded.dictionary).bit_length()
