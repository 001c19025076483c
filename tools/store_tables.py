"""Every table of the stores that files load into, kept as digests, to compare two versions of a
reader (run on demand, not a test: issue 35 checked the streaming AMD and XPlane readers with it).

    python tools/store_tables.py dump before.json FILE...   # with the old code
    python tools/store_tables.py dump after.json FILE...    # with the new code
    python tools/store_tables.py compare before.json after.json

Each file is loaded alone into a new store (`traceq.api.loading.load_trace`, as `traceq load`
does); every table's rows are read ordered by all their columns, less the columns that say when
and how fast the load ran and by which code (`traces.loaded_at`, `load_seconds`,
`traceq_version`, `source_path`; `attributions.seconds`, `fingerprint`),
and kept as the row count and a SHA-256 of the rows' text. `compare` names each table whose
rows differ, per file in both, and exits 1 when one does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

VARYING = {"loaded_at", "load_seconds", "traceq_version", "source_path", "seconds", "fingerprint"}


def tables_of(path: Path) -> dict[str, list[object]]:
    """{table: [rows, digest]} of the store `path` loads into."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    with tempfile.TemporaryDirectory(prefix="traceq-tables-") as folder:
        con = open_store(Path(folder) / "store.duckdb", create=True)
        load_trace(con, path)
        out: dict[str, list[object]] = {}
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY table_name").fetchall()]
        for table in names:
            columns = [r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
                                                 "ORDER BY column_index", [table]).fetchall() if r[0] not in VARYING]
            if not columns:
                continue
            listed = ", ".join(f'"{c}"' for c in columns)
            rows = con.execute(f'SELECT {listed} FROM "{table}" ORDER BY ALL').fetchall()
            digest = hashlib.sha256()
            for row in rows:
                digest.update(repr(row).encode() + b"\n")
            out[table] = [len(rows), digest.hexdigest()]
        con.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump")
    dump.add_argument("output", type=Path)
    dump.add_argument("files", type=Path, nargs="+")
    compare = sub.add_parser("compare")
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "dump":
        from traceq.errors import TraceqError

        result = {}
        for path in args.files:
            try:
                result[path.name] = tables_of(path)
            except TraceqError as e:  # a file refused: its one line is what is compared
                result[path.name] = {"error": [0, f"{type(e).__name__}: {e}"]}
            print(f"{path.name}: {len(result[path.name])} tables", flush=True)
        args.output.write_text(json.dumps(result, indent=1, sort_keys=True))
        return
    before, after = json.loads(args.before.read_text()), json.loads(args.after.read_text())
    differ = 0
    for name in sorted(set(before) & set(after)):
        a, b = before.get(name, {}), after.get(name, {})
        changed = [t for t in sorted(set(a) | set(b)) if a.get(t) != b.get(t)]
        differ += bool(changed)
        status = "equal" if not changed else "DIFFER: " + ", ".join(
            f"{t} ({a.get(t, ['-'])[0]} -> {b.get(t, ['-'])[0]} rows)" for t in changed)
        print(f"{name}: {len(a)} tables {status}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
