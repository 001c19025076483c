"""Make a large Nsight Systems export from a real one by replicating its events (run on demand).

    python bench/scale.py SRC.sqlite --kernels 10000000 -o /tmp/traceq-bench/big.sqlite
    python bench/scale.py SRC.sqlite --nvtx-ranges 10000000 -o /tmp/traceq-bench/big.sqlite
    python bench/scale.py SRC.sqlite --copies 3 -o OUT.sqlite --check

OUT starts as a byte copy of SRC (every table, the schema unchanged). Copy k = 1, 2, ... of the
rows of the event tables (kernels, runtime and driver calls, memcpy, memset, NVTX ranges and
marks, GPU memory events) is then appended with every time shifted by k x (the source's span +
1 us) and every correlation id (and NVTX rangeId) offset by k x (their max + 1), so launches
still pair with their kernels and copies never overlap. Strings, GPUs, processes and threads are
shared. The copying is INSERT ... SELECT inside SQLite, one statement per table, over a
recursive CTE of copy numbers.

--kernels N (or --nvtx-ranges N) gives exactly N kernels (NVTX ranges): whole copies, then a
last partial copy cut at the time of the N-th row, every table cut at that time too.
--check loads OUT with traceq and asserts the kernel count and the top-15 kernel totals equal
the source's, times the copies (plus the partial copy).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
NVTX = "NVTX_EVENTS"
REPLICATED = (
    KERNEL, "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER",
    "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", NVTX, "CUDA_GPU_MEMORY_USAGE_EVENTS",
)
TIME_COLUMNS = ("start", "end")  # every replicated table has start; not all have end
ID_COLUMNS = ("correlationId", "rangeId")
NVTX_EVENT_KINDS = "34, 59, 60"  # marks, push/pop and start/end ranges; not domain/string registrations
NVTX_RANGE_KINDS = "59, 60"


def columns(con: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA {schema}.table_info("{table}")')]


def present(con: sqlite3.Connection) -> list[str]:
    names = {r[0] for r in con.execute("SELECT name FROM src.sqlite_master WHERE type = 'table'")}
    return [t for t in REPLICATED if t in names]


def row_filter(table: str) -> str:
    return f"eventType IN ({NVTX_EVENT_KINDS})" if table == NVTX else "1"


def span_and_id_step(con: sqlite3.Connection, tables: list[str]) -> tuple[int, int]:
    """(time shift per copy, id offset per copy): the span of all events + 1 us, max id + 1."""
    lo, hi, top_id = None, None, 0
    for t in tables:
        cols = columns(con, t, "src")
        agg = ['min("start")']
        agg += [f'max("{c}")' for c in TIME_COLUMNS if c in cols]
        agg += [f'max("{c}")' for c in ID_COLUMNS if c in cols]
        row = con.execute(f'SELECT {", ".join(agg)} FROM src."{t}" WHERE {row_filter(t)}').fetchone()
        if row[0] is None:
            continue
        n_times = len([c for c in TIME_COLUMNS if c in cols])
        lo = row[0] if lo is None else min(lo, row[0])
        hi = max([v for v in row[1:1 + n_times] if v is not None] + ([hi] if hi is not None else []))
        top_id = max([top_id, *(v for v in row[1 + n_times:] if v is not None)])
    if lo is None:
        raise SystemExit("the source has no events to replicate")
    return hi - lo + 1000, top_id + 1


def cutoff(con: sqlite3.Connection, table: str, extra: str, n: int) -> tuple[int, int]:
    """(start, rowid) of the n-th row (1-based) of `table` in (start, rowid) order."""
    row = con.execute(
        f'SELECT start, rowid FROM src."{table}" WHERE {extra} ORDER BY start, rowid LIMIT 1 OFFSET ?',
        [n - 1],
    ).fetchone()
    return int(row[0]), int(row[1])


def replicate(con: sqlite3.Connection, table: str, first: int, last: int, shift: int, step: int,
              cut: tuple[str, int, int] | None) -> int:
    """Append copies first..last of src.table to main.table; the last one cut at `cut`."""
    cols = columns(con, table)
    exprs = []
    for c in cols:
        q = f'"{c}"'
        if c in TIME_COLUMNS:
            exprs.append(f"{q} + c.k * {shift}")
        elif c in ID_COLUMNS:
            exprs.append(f"{q} + c.k * {step}")
        else:
            exprs.append(q)
    where = row_filter(table)
    if cut is not None:
        target, s, rid = cut
        time_cut = (f"(start < {s} OR (start = {s} AND t.rowid <= {rid}))" if table == target
                    else f"start <= {s}")
        where += f" AND (c.k < {last} OR {time_cut})"
    names = ", ".join(f'"{c}"' for c in cols)
    cur = con.execute(
        f"""
        INSERT INTO main."{table}" ({names})
        WITH RECURSIVE c(k) AS (SELECT {first} UNION ALL SELECT k + 1 FROM c WHERE k < {last})
        SELECT {', '.join(exprs)} FROM c CROSS JOIN src."{table}" AS t WHERE {where}
        ORDER BY c.k, t.rowid
        """
    )
    return cur.rowcount


def scale(src: Path, out: Path, *, copies: int | None = None, kernels: int | None = None,
          nvtx_ranges: int | None = None) -> dict[str, int]:
    """Write the scaled trace to `out`; returns rows per replicated table."""
    if out.exists():
        out.unlink()
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out)
    out.chmod(0o644)
    con = sqlite3.connect(str(out), uri=True, isolation_level=None)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.execute("PRAGMA cache_size = -262144")
    con.execute("ATTACH ? AS src", [src.resolve().as_uri() + "?mode=ro"])
    tables = present(con)
    shift, step = span_and_id_step(con, tables)
    cut = None
    if copies is None:
        target, extra, want = ((KERNEL, "1", kernels) if kernels is not None
                               else (NVTX, f"eventType IN ({NVTX_RANGE_KINDS})", nvtx_ranges))
        per_copy = con.execute(f'SELECT count(*) FROM src."{target}" WHERE {extra}').fetchone()[0]
        if not per_copy or want < per_copy:
            raise SystemExit(f"{src} has {per_copy} rows in {target}: ask for at least that many")
        whole, rest = divmod(want, per_copy)
        copies = whole + (1 if rest else 0)
        if rest:
            cut = (target, *cutoff(con, target, extra, rest))
    con.execute("BEGIN")
    rows = {}
    for t in tables:
        added = replicate(con, t, 1, copies - 1, shift, step, cut) if copies > 1 else 0
        rows[t] = con.execute(f'SELECT count(*) FROM src."{t}"').fetchone()[0] + added
    con.execute("COMMIT")
    con.close()
    return rows


TOP15 = f"""SELECT s.value, count(*), sum(k."end" - k.start) FROM {KERNEL} k
             JOIN StringIds s ON s.id = k.demangledName GROUP BY 1 ORDER BY 3 DESC, 1 LIMIT 15"""


def check(src: Path, out: Path, copies: int | None) -> None:
    """Load `out` with traceq and compare its kernel count and top-15 with SQLite's own sums
    over `out` and, for whole copies, with the source's top-15 times the copies."""
    from traceq.analysis.kernels.top import top_kernels
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    raw = sqlite3.connect(out.resolve().as_uri() + "?mode=ro", uri=True)
    expected_n = raw.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0]
    expected = raw.execute(TOP15).fetchall()
    raw.close()
    if copies is not None:
        source = sqlite3.connect(src.resolve().as_uri() + "?mode=ro", uri=True)
        times = [(name, n * copies, total * copies) for name, n, total in source.execute(TOP15)]
        source.close()
        assert times == expected, (times, expected)
    with tempfile.TemporaryDirectory(prefix="traceq-check-") as tmp:
        con = open_store(Path(tmp) / "s.duckdb", create=True)
        result = load_trace(con, out)
        got = top_kernels(con, result.trace_id, k=15).select("name", "instances", "total_ns").rows()
        con.close()
    assert result.kernel_count == expected_n, (result.kernel_count, expected_n)
    assert got == [tuple(r) for r in expected], (got, expected)
    print(f"check: {expected_n:,} kernels; traceq's top-15 equals SQLite's GROUP BY on the output"
          + (f" and the source's times {copies}" if copies is not None else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--copies", type=int, help="whole copies of the source's events")
    size.add_argument("--kernels", type=int, help="exactly this many kernels")
    size.add_argument("--nvtx-ranges", type=int, help="exactly this many NVTX ranges")
    parser.add_argument("--check", action="store_true", help="load OUT with traceq and verify it")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = scale(args.src, args.output, copies=args.copies, kernels=args.kernels,
                 nvtx_ranges=args.nvtx_ranges)
    size_mb = args.output.stat().st_size / 1e6
    print(f"wrote {args.output} ({size_mb:,.0f} MB) in {time.perf_counter() - started:.1f} s:")
    for t, n in rows.items():
        print(f"  {t:32} {n:>12,}")
    if args.check:
        check(args.src, args.output, args.copies)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
