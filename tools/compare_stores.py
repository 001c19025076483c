"""Load trace files with two revisions of traceq and compare the stores table by table (on demand).

    python tools/compare_stores.py --before /tmp/old FILE... [--on-disk]

`--before` is a folder holding another checkout of traceq as `traceq/` (e.g. `git archive MAIN |
tar -x -C /tmp/old/traceq`): its loads run with it first on PYTHONPATH, the others with this
checkout's. Each side loads every file into a store of its own (`api.loading.load_trace`, as
`traceq load` does, attribution kept), in one process per side. Every table is then compared
row for row in the order the store holds its rows (`rowid`), but for the tables that hold the
load's own time or path (`traces`, `traceq_meta`, `attributions`); a table whose rows differ only
in their order says so (a query without ORDER BY, as `SELECT DISTINCT`, may store them in any). `--on-disk`: both sides stage
the JSON on disk one batch after the other, as a trace of more than 256 MiB of JSON is read
(Kineto and the other JSON readers). Prints one line per file; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_LOAD = """
import sys
from pathlib import Path
from traceq.api.loading import load_trace
from traceq.store import open_store
if sys.argv[1] == "1":
    from traceq.ingest import json_stage, kineto
    json_stage.STAGE_THREADS = 1
    kineto.MEMORY_STAGING_BYTES = 0
folder = Path(sys.argv[2])
for i, path in enumerate(sys.argv[3:]):
    con = open_store(folder / f"{i}.duckdb", create=True)
    try:
        load_trace(con, Path(path))
    except Exception as e:  # a refused file: the other side must refuse it too
        (folder / f"{i}.error").write_text(type(e).__name__ + ": " + str(e).replace(str(folder), "DIR"))
    con.close()
"""

_SKIP = {"traces", "traceq_meta", "attributions"}
"""Tables holding the load's own time, path or duration."""


def _load(files: list[Path], folder: Path, before: Path | None, on_disk: bool) -> None:
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = str(before) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", _LOAD, "1" if on_disk else "0", str(folder), *map(str, files)],
                   check=True, env=env)


def _differences(a: Path, b: Path) -> list[str]:
    import duckdb

    if a.with_suffix(".error").exists() or b.with_suffix(".error").exists():
        ea, eb = (p.with_suffix(".error").read_text() if p.with_suffix(".error").exists() else None for p in (a, b))
        return [] if ea == eb else [f"refused: {ea!r} against {eb!r}"]
    con = duckdb.connect()
    con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'a' "
                                        "ORDER BY table_name").fetchall()]
    found = []
    for table in tables:
        if table in _SKIP:
            continue
        rows = [con.execute(f'SELECT * FROM {side}."{table}" ORDER BY rowid').fetchall() for side in ("a", "b")]
        if rows[0] != rows[1]:
            same = sorted(rows[0], key=repr) == sorted(rows[1], key=repr)
            found.append(f"{table}: {len(rows[0])} rows against {len(rows[1])}" + (", the same in another order"
                                                                                   if same else ""))
    con.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--before", type=Path, required=True, help="a folder holding the other checkout as traceq/")
    parser.add_argument("--on-disk", action="store_true", help="stage on disk, one batch after the other")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="traceq-compare-") as scratch:
        old, new = Path(scratch) / "before", Path(scratch) / "after"
        old.mkdir()
        new.mkdir()
        _load(args.files, old, args.before, args.on_disk)
        _load(args.files, new, None, args.on_disk)
        bad = 0
        for i, path in enumerate(args.files):
            found = _differences(old / f"{i}.duckdb", new / f"{i}.duckdb")
            bad += bool(found)
            print(f"{path.name}: {'equal' if not found else 'DIFFERENT: ' + '; '.join(found)}", flush=True)
    print(f"{len(args.files) - bad} of {len(args.files)} equal")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
