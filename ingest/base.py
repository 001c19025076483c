"""The reader contract: one reader per trace format, all writing the tables of schema.sql.

A reader opens its own files (`Reader.open`: an SQLite connection for the SQLite exports, the
file itself for JSON traces), then gets that source and a `Sink`. It sends the sink Arrow tables whose column
names are store columns (`kernels`, `api_calls`, ...); columns it lacks are stored as NULL. It
returns a `SourceInfo` describing the file. It never touches the store directly, never holds a
whole table in Python, and never commits: `traceq.ingest.load_trace` owns the transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, ClassVar, Protocol

import duckdb
import pyarrow as pa

from traceq.ingest.keys import key_rows, whole
from traceq.ingest.sqlite_source import open_sqlite, source_damage
from traceq.ingest.validate import EVENT_NOUNS, Damage

Progress = Callable[[int], None]
"""Called with the number of source rows just read."""


@dataclass(frozen=True)
class SourceInfo:
    """What a reader learned about the file besides its events (rank, world_size and backend:
    the distributed job the trace is one rank of, where the file says)."""

    format: str
    tool: str | None = None
    schema_version: str | None = None
    session_start_utc_ns: int | None = None
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None


@dataclass(frozen=True)
class LoadOptions:
    """How to read a file; each reader takes the options that concern it."""

    engine: str = "auto"  # SQLite readers: 'auto', 'adbc' or 'stdlib' (see `open_sqlite`)
    python_functions: bool = False  # Kineto: keep `python_function` events as ranges


class Source(Protocol):
    """What `Reader.open` returns: whatever the reader reads from, closed after the load."""

    def close(self) -> None: ...


class Reader(Protocol):
    """One trace format. `sniff` is cheap; `read` streams the opened file into the sink.

    `container` says what `sniff` is shown (`detect.reader_for` decides from the file's first
    bytes): 'sqlite', the set of the database's table names; 'json', the first 64 KiB of the
    JSON text (decompressed when the file is gzip).
    """

    name: ClassVar[str]
    container: ClassVar[str]

    def sniff(self, probe: Any) -> bool:
        """True when a file showing `probe` is this reader's format."""
        ...

    def open(self, path: Path, options: LoadOptions) -> Source:
        """The source `estimate_rows` and `read` take."""
        ...

    def estimate_rows(self, src: Any) -> int:
        """About how many units (rows, or bytes for JSON) `read` will report to the progress callback."""
        ...

    def read(self, src: Any, sink: Sink) -> SourceInfo:
        """Send every event of `src` to `sink`."""
        ...


class SqliteReader:
    """Base of the readers of SQLite exports: their source is a read-only sqlite3 connection."""

    container: ClassVar[str] = "sqlite"

    def open(self, path: Path, options: LoadOptions) -> sqlite3.Connection:
        return open_sqlite(path, options.engine)


class Sink:
    """Appends Arrow batches to the store's tables for one trace, inside the caller's transaction.

    The last check at the boundary: a row with NULL where its store column is NOT NULL is dropped,
    and an integer too large for its (32-bit) store column becomes NULL, each counted in `damage`
    (see traceq.ingest.validate); readers drop rows with bad times before this, on their threads.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, trace_id: int, progress: Progress | None = None,
                 damage: Damage | None = None):
        self.con = con
        self.trace_id = trace_id
        self.progress = progress
        self.damage = damage if damage is not None else Damage()
        self.rows: dict[str, int] = {}
        self._columns: dict[str, _StoreColumns] = {}

    def append(self, table: str, batch: pa.Table, source_rows: int | None = None) -> None:
        """Insert `batch` into `table`, matching columns by name; unknown columns are an error."""
        self._check(table, batch.schema)
        batch = self._fit(table, batch)
        if batch.num_rows:
            self._insert(table, batch)
            self.rows[table] = self.rows.get(table, 0) + batch.num_rows
        if self.progress is not None:
            self.progress(batch.num_rows if source_rows is None else source_rows)

    def append_all(self, table: str, batches: Iterable[pa.Table]) -> None:
        """Insert every table of `batches` into `table` in one statement, streaming.

        For big tables: one INSERT keeps DuckDB's transaction-local storage flushing full row
        groups to the file as it goes, where thousands of small INSERTs held them in memory.
        Every batch is cast to the first one's schema. An exception raised while producing the
        batches propagates as itself, not as DuckDB's wrapping of it.
        """
        it = iter(batches)
        first = next(it, None)
        if first is None:
            return
        schema = first.schema
        self._check(table, schema)
        failure: list[BaseException] = []

        def stream() -> Iterator[pa.RecordBatch]:
            try:
                for t in chain([first], it):
                    if self.progress is not None:
                        self.progress(t.num_rows)
                    t = self._fit(table, t)
                    self.rows[table] = self.rows.get(table, 0) + t.num_rows
                    yield from _conform(t, schema).to_batches()
            except BaseException as e:
                failure.append(e)
                raise

        try:
            self._insert(table, pa.RecordBatchReader.from_batches(schema, stream()))
        except BaseException:
            if failure:
                raise failure[0] from None
            raise

    def _check(self, table: str, schema: pa.Schema) -> None:
        known = self._columns.get(table)
        if known is None:
            known = self._columns[table] = _STORE_COLUMNS.get(table) or _StoreColumns(self.con, table)
            _STORE_COLUMNS[table] = known
        extra = set(schema.names) - known.names
        if extra:
            raise AssertionError(f"reader sent columns {sorted(extra)} that {table} lacks")

    def _fit(self, table: str, batch: pa.Table) -> pa.Table:
        """`batch` less rows with NULL in a NOT NULL column, 32-bit columns' larger values NULL,
        texts longer than TEXT_CAP cut (`cap_texts`)."""
        import pyarrow.compute as pc

        from traceq.ingest.texts import cap_texts

        batch = cap_texts(table, batch, self.damage)
        columns = self._columns[table]
        for name in columns.int32 & set(batch.column_names):
            column = batch[name]
            if column.type != pa.int64() or not len(column):
                continue
            low, high = pc.min_max(column).values()
            if low.is_valid and (low.as_py() < -(2**31) or high.as_py() >= 2**31):
                fits = pc.and_(pc.greater_equal(column, -(2**31)), pc.less(column, 2**31))
                self.damage.add("value", f"too large for {table}.{name} set to NULL",
                                len(column) - column.null_count - int(pc.sum(pc.cast(fits, pa.int64())).as_py() or 0))
                batch = batch.set_column(batch.column_names.index(name), name,
                                         pc.if_else(fits, column, pa.scalar(None, pa.int64())))
        lacking = [name for name in columns.not_null & set(batch.column_names) if batch[name].null_count]
        if lacking:
            keep = pc.and_(*[pc.is_valid(batch[c]) for c in lacking]) if len(lacking) > 1 else pc.is_valid(batch[lacking[0]])
            self.damage.add(EVENT_NOUNS.get(table, f"{table} row"), f"without {' or '.join(sorted(lacking))} dropped",
                            batch.num_rows - int(pc.sum(pc.cast(keep, pa.int64())).as_py() or 0))
            batch = batch.filter(keep)
        return batch

    def _insert(self, table: str, data: pa.Table | pa.RecordBatchReader) -> None:
        """`data` read by DuckDB's replacement scan of this frame's variable, not registered: a
        view registered and dropped inside the load's transaction keeps its Arrow data alive
        until the commit (every batch a reader appended, at once: 96 MiB after reading a 52 MB
        XPlane, growing with the file)."""
        _traceq_batch = data  # read by name in the statement
        self.con.execute(f'INSERT INTO "{table}" BY NAME SELECT {self.trace_id} AS trace_id, * FROM _traceq_batch')


class _StoreColumns:
    """A store table's column names, those declared NOT NULL and those of 32-bit integers."""

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str):
        rows = con.execute("SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
                           "WHERE table_name = ?", [table]).fetchall()
        self.names = {r[0] for r in rows}
        self.not_null = {r[0] for r in rows if not r[2] and r[0] != "trace_id"}
        self.int32 = {r[0] for r in rows if r[1] == "INTEGER"}


_STORE_COLUMNS: dict[str, _StoreColumns] = {}
"""Each store table's _StoreColumns, asked of the first store a process loads into: every store
of this schema version has the same (a Dask worker loads hundreds of files, one store each)."""


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """`t` with `schema`'s types, strings dictionary-encoded or decoded to match."""
    if t.schema == schema:
        return t
    import pyarrow.compute as pc

    columns = []
    for field in schema:
        col = t[field.name]
        if pa.types.is_dictionary(field.type) and not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col.cast(field.type.value_type)).cast(field.type)
        elif pa.types.is_dictionary(col.type) and not pa.types.is_dictionary(field.type):
            col = col.cast(field.type)
        columns.append(col.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


class Strings:
    """An id -> text table (nsys StringIds, nvprof StringTable) for vectorised lookups.

    Ids are non-negative (a negative one, which no string table holds, resolves to nothing). With
    a `damage`, the ids looked up that resolve to nothing (or to a NULL text) are counted there:
    callers pass NULL, not an id, where the source means "no text".
    """

    def __init__(self, ids: Sequence[int], values: Sequence[str | None], damage: Damage | None = None):
        import pyarrow.compute as pc

        if any(i < 0 for i in ids):
            kept = [(i, v) for i, v in zip(ids, values) if i >= 0]
            ids, values = [i for i, _ in kept], [v for _, v in kept]
        self.damage = damage
        size = (max(ids) + 1) if ids else 0
        if size <= 4 * len(ids) + 1_000_000:
            dense: list[str | None] = [None] * size
            for i, v in zip(ids, values):
                dense[i] = v
            self._dense: pa.Array | None = pa.array(dense, type=pa.string())
            self._present: pa.Array | None = pc.is_valid(self._dense)
        else:  # sparse ids: look them up through a hash of the ids
            self._dense = self._present = None
        self._ids = pa.array(ids, type=pa.int64())
        self._values = pa.array(values, type=pa.string())

    def dictionary(self, ids: pa.Array) -> pa.DictionaryArray:
        """As `lookup`, dictionary-encoded: no string is copied, however many rows.

        An index is null wherever the text is (an unknown id or a NULL string), so
        `pyarrow.compute.coalesce` over such arrays falls through as it does over strings.
        """
        import pyarrow.compute as pc

        if self._dense is None or self._present is None:
            return self._counted(ids, pa.DictionaryArray.from_arrays(
                pc.cast(pc.index_in(ids, value_set=self._ids), pa.int32()), self._values))
        size = len(self._dense)
        ids = pc.cast(ids, pa.int64())
        inside = pc.and_(pc.greater_equal(ids, 0), pc.less(ids, size))
        safe = pc.if_else(inside, ids, pa.scalar(None, type=pa.int64()))
        keep = pc.fill_null(pc.take(self._present, safe), False)
        indices = pc.if_else(keep, pc.cast(ids, pa.int32(), safe=False), pa.scalar(None, type=pa.int32()))
        return self._counted(ids, pa.DictionaryArray.from_arrays(indices, self._dense))

    @classmethod
    def from_query(cls, src: sqlite3.Connection, sql: str, what: str) -> Strings:
        """The (id, text) rows `sql` selects; a row whose id is not a non-negative integer is
        dropped, and counted as damage to `what` (the table's name)."""
        damage = source_damage(src)
        rows = src.execute(sql).fetchall()
        good = [(i, v if isinstance(v, str) else None) for i, v in rows if type(i) is int and i >= 0]
        damage.add(f"{what} row", "with an id that is not a non-negative integer dropped", len(rows) - len(good))
        return cls([r[0] for r in good], [r[1] for r in good], damage)

    def lookup(self, ids: pa.Array) -> pa.Array:
        """The text for each id; null for null or unknown ids."""
        import pyarrow.compute as pc

        if self._dense is not None:
            size = len(self._dense)
            valid = pc.and_(pc.greater_equal(ids, 0), pc.less(ids, size))
            safe = pc.if_else(valid, ids, pa.scalar(None, type=ids.type))
            return self._counted(ids, pc.take(self._dense, safe))
        return self._counted(ids, pc.take(self._values, pc.index_in(ids, value_set=self._ids)))

    def _counted(self, ids: pa.Array, texts: pa.Array) -> pa.Array:
        if self.damage is not None:
            self.damage.add("unknown string id", "read as no text",
                            texts.null_count - ids.null_count)
        return texts


def enum_lookup(codes: pa.Array, labels: dict[int, str]) -> pa.DictionaryArray:
    """Map small integer codes to labels, dictionary-encoded; unknown codes become null."""
    return Strings(list(labels), list(labels.values())).dictionary(codes)


CUPTI_DEVICE_LIMITS: list[tuple[str, str, list[str]]] = [
        ("cc_major", "computeCapabilityMajor", ["computeCapabilityMajor"]),
        ("cc_minor", "computeCapabilityMinor", ["computeCapabilityMinor"]),
        ("sm_count", "numMultiprocessors", ["numMultiprocessors"]),
        ("l2_cache_bytes", "l2CacheSize", ["l2CacheSize"]),
        ("threads_per_warp", "numThreadsPerWarp", ["numThreadsPerWarp"]),
        ("max_threads_per_block", "maxThreadsPerBlock", ["maxThreadsPerBlock"]),
        ("max_warps_per_sm", "maxWarpsPerMultiprocessor", ["maxWarpsPerMultiprocessor"]),
        ("max_blocks_per_sm", "maxBlocksPerMultiprocessor", ["maxBlocksPerMultiprocessor"]),
        ("max_registers_per_sm", "maxRegistersPerMultiprocessor", ["maxRegistersPerMultiprocessor"]),
        ("max_registers_per_block", "maxRegistersPerBlock", ["maxRegistersPerBlock"]),
        ("max_smem_per_sm_bytes", "maxSharedMemoryPerMultiprocessor", ["maxSharedMemoryPerMultiprocessor"]),
        ("max_smem_per_block_bytes", "maxSharedMemoryPerBlock", ["maxSharedMemoryPerBlock"]),
]
"""`select_list` entries for the columns of CUPTI's device record that have the same name and unit
wherever a trace stores it (nvprof's CUPTI_ACTIVITY_KIND_DEVICE, the pre-2021.3 nsys
TARGET_INFO_CUDA_GPU). Clock, memory size and bandwidth are stored in different units by each, so
the readers map those themselves."""


KERNEL_EVENT_COLUMNS = ("start_ns", "end_ns", "correlation_id", "graph_node_id")
"""The columns of a reader's kernel rows that go into kernel_events as they are."""

KERNEL_QUEUE_COLUMNS = ("device_id", "context_id", "stream_id", "pid")
"""The columns of a reader's kernel rows that say where a launch was queued (kernel_queues): a
reader numbers them with `Names`."""

KERNEL_CONFIG_COLUMNS = (
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
    "smem_static_bytes", "smem_dynamic_bytes", "smem_carveout_bytes", "smem_optin",
    "local_memory_per_thread_bytes", "local_memory_total_bytes", "launch_type",
)
"""The columns of a reader's kernel rows that make a launch's configuration (kernel_configs), the
opt-in flag and the launch type as the source's codes: a reader numbers them with `Names`."""

AMD_CONFIG_COLUMNS = (*KERNEL_CONFIG_COLUMNS, "accum_vgprs", "sgprs")
"""KERNEL_CONFIG_COLUMNS and the registers an AMD kernel has besides its arch VGPRs
(`registers_per_thread`): accumulation VGPRs per work-item and SGPRs per wavefront."""


def kernel_batch(batch: pa.Table, *, name_id: pa.Array, config_id: pa.Array, queue_id: pa.Array) -> pa.Table:
    """The `kernel_events` columns but kernel_id for one batch of a reader's kernel rows.

    `batch` carries KERNEL_EVENT_COLUMNS under their store names, and the launching calls'
    `launches.LAUNCH_COLUMNS` where the reader found them; the reader supplies the name,
    configuration and queue ids (`Names`). `numbered` adds the kernel ids; `kernel_names`,
    `kernel_configs` and `kernel_queues` make the rows the ids stand for.
    """
    from traceq.ingest.launches import LAUNCH_COLUMNS

    return pa.table({**{c: batch[c] for c in KERNEL_EVENT_COLUMNS},
                     **{c: batch[c] for c in LAUNCH_COLUMNS if c in batch.column_names},
                     "name_id": name_id, "config_id": config_id, "queue_id": queue_id})


def kernel_queues(keys: Sequence[tuple[Any, ...]]) -> pa.Table:
    """`kernel_queues` rows for queue ids 0, 1, ...: `keys` are the values of KERNEL_QUEUE_COLUMNS."""
    return _numbered_keys("queue_id", KERNEL_QUEUE_COLUMNS, keys)


def _numbered_keys(
    id_column: str, columns: Sequence[str], keys: Sequence[tuple[Any, ...]],
    types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """Rows for ids 0, 1, ... (`id_column`) of the keys `Names` numbered: one column per element
    of the keys, int64 unless `types` says otherwise."""
    values = list(zip(*keys)) or [() for _ in columns]
    return pa.table({id_column: pa.array(range(len(keys)), pa.int32()),
                     **{c: pa.array(v, (types or {}).get(c, pa.int64())) for c, v in zip(columns, values)}})


NVTX_ATTRIBUTE_COLUMNS = ("kind", "domain", "category", "color", "pid", "tid", "global_tid", "end_tid")
"""The columns of a reader's NVTX rows that go into nvtx_attributes, numbered with `Names`;
global_tid may be missing (nvprof has none)."""


def nvtx_batch(batch: pa.Table, attributes: Names) -> pa.Table:
    """The `nvtx_events` columns for one batch of a reader's NVTX rows (start_ns, end_ns, name
    and NVTX_ATTRIBUTE_COLUMNS, or the `attributes_key` that `nvtx_attributes_key` made of them
    on a reading thread); `attributes` numbers their attributes (`nvtx_attributes` makes the rows)."""
    key = batch["attributes_key"] if "attributes_key" in batch.column_names else nvtx_attributes_key(batch)
    return pa.table({"start_ns": batch["start_ns"], "end_ns": batch["end_ns"], "name": batch["name"],
                     "attributes_id": attributes.number_keys(key)})


def nvtx_attributes_key(batch: pa.Table) -> pa.DictionaryArray:
    """`key_rows` of a batch of NVTX rows' NVTX_ATTRIBUTE_COLUMNS (a missing one is NULL)."""
    return key_rows(*[batch[c] if c in batch.column_names else pa.nulls(batch.num_rows, pa.int64())
                      for c in NVTX_ATTRIBUTE_COLUMNS])


def nvtx_attributes(keys: Sequence[tuple[Any, ...]]) -> pa.Table:
    """`nvtx_attributes` rows for attribute ids 0, 1, ...: `keys` are the values of NVTX_ATTRIBUTE_COLUMNS."""
    return _numbered_keys("attributes_id", NVTX_ATTRIBUTE_COLUMNS, keys, {"kind": pa.string(), "domain": pa.string()})


def kernel_configs(
    keys: Sequence[tuple[Any, ...]], *, optin_code: int, launch_types: dict[int, str],
    names: Sequence[str] = KERNEL_CONFIG_COLUMNS,
) -> pa.Table:
    """`kernel_configs` rows for configuration ids 0, 1, ...: `keys` are the values of `names`
    (KERNEL_CONFIG_COLUMNS, or AMD_CONFIG_COLUMNS), with the source's codes for the opt-in flag
    (`optin_code` means opted in) and the launch type (named by `launch_types`; an unknown code
    is NULL)."""
    columns = list(zip(*keys)) or [() for _ in names]
    values = dict(zip(names, columns))
    table = {"config_id": pa.array(range(len(keys)), pa.int32())}
    for name, column in values.items():
        if name == "smem_optin":
            table[name] = pa.array([None if c is None else c == optin_code for c in column], pa.bool_())
        elif name == "launch_type":
            table[name] = pa.array([None if c is None else launch_types.get(c) for c in column], pa.string())
        else:
            table[name] = pa.array(column, pa.int64())
    return pa.table(table)


UNNAMED_KERNEL = "<unnamed kernel>"


def kernel_names(
    demangled: Sequence[str | None], short: Sequence[str | None], mangled: Sequence[str | None],
) -> pa.Table:
    """`kernel_names` rows for name ids 0, 1, ...: a kernel always gets a name (demangled, else
    short, else mangled) and a short name (its own, else that name)."""
    names = [_first_given(d, s, m, UNNAMED_KERNEL) for d, s, m in zip(demangled, short, mangled)]
    return pa.table({
        "name_id": pa.array(range(len(names)), pa.int32()),
        "name": pa.array(names, pa.string()),
        "short_name": pa.array([_first_given(s, n) for s, n in zip(short, names)], pa.string()),
        "mangled_name": pa.array(mangled, pa.string()),
    })


def _first_given(*texts: str | None) -> str:
    return next(t for t in texts if t is not None)


class Names:
    """Numbers the distinct keys of a trace's events, so that an event stores a small integer.

    A key is the tuple of one row's values in some columns (a kernel's source string ids, say,
    or its launch configuration). Ids are 0, 1, ... in the order keys first appear in the rows, so
    a load gives the same ids whichever thread read which chunk; `keys[i]` is the key of id i.
    """

    def __init__(self) -> None:
        self.keys: list[tuple[Any, ...]] = []
        self._ids: dict[tuple[Any, ...], int] = {}

    def number(self, *columns: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The id of each row's key, as int32."""
        return self.number_keys(key_rows(*columns))

    def number_keys(self, keys: pa.DictionaryArray | pa.ChunkedArray) -> pa.Array:
        """`number` of the columns that `key_rows` encoded as `keys` (on a reading thread, say):
        a Python step per distinct key of the batch, and one `take`."""
        import pyarrow.compute as pc

        keys = whole(keys)
        ids = [self._id(tuple(row.values())) for row in keys.dictionary.to_pylist()]
        return pc.take(pa.array(ids, pa.int32()), keys.indices)

    def _id(self, key: tuple[Any, ...]) -> int:
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.keys)
            self.keys.append(key)
        return found


def api_names(apis: Sequence[str], names: Sequence[str | None]) -> pa.Table:
    """`api_names` rows for name ids 0, 1, ..."""
    return pa.table({
        "name_id": pa.array(range(len(apis)), pa.int32()),
        "api": pa.array(apis, pa.string()),
        "name": pa.array(names, pa.string()),
    })


def api_threads(pids: Sequence[int | None], tids: Sequence[int | None],
                global_tids: Sequence[int | None]) -> pa.Table:
    """`api_threads` rows for thread ids 0, 1, ..."""
    return _numbered_keys("thread_id", ("pid", "tid", "global_tid"), list(zip(pids, tids, global_tids)))


def numbered(kernels: pa.Table, first_id: int) -> pa.Table:
    """`kernels` with kernel_id first_id, first_id + 1, ... (ids follow the source's row order)."""
    import pyarrow.compute as pc

    ids = pc.add(row_numbers(kernels.num_rows), pa.scalar(first_id, type=pa.int64()))
    return kernels.add_column(0, "kernel_id", ids)


def decoded(a: pa.Array) -> pa.Array:
    """`a` as plain strings when it is dictionary-encoded."""
    return a.dictionary_decode() if pa.types.is_dictionary(a.type) else a


def coalesce_text(*arrays: pa.Array | None) -> pa.Array:
    """The first non-null of `arrays` (Nones skipped), kept dictionary-encoded when all are."""
    import pyarrow.compute as pc

    given = [a for a in arrays if a is not None]
    if len({str(a.type) for a in given}) > 1:
        given = [decoded(a) for a in given]
    return given[0] if len(given) == 1 else pc.coalesce(*given)


def row_numbers(n: int) -> pa.Array:
    """0, 1, ..., n - 1 as int64, without a Python loop."""
    import pyarrow.compute as pc

    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)
