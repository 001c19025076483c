"""Load a `traceq export` file in Perfetto's trace processor and count what it imported.

    python tools/perfetto_check.py alexnet.json.gz [--shell PATH]

Needs Perfetto's `trace_processor_shell` (from Perfetto's releases: it is not on PyPI; the
`perfetto` wheel downloads it at first use, which this script never lets it do). Give it with
--shell or $PERFETTO_TP, or put it on PATH; without it the script says so in one line and exits 0.
Prints slices per category, flows, async slices, instants and the import errors Perfetto
recorded (`stats` with severity 'error' or 'data_loss'); exits 1 when there are any.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

QUERIES = {
    "slices per category": "SELECT category, count(*) AS n FROM slice GROUP BY category ORDER BY category",
    "flows": "SELECT count(*) AS n FROM flow",
    "instants": "SELECT count(*) AS n FROM slice WHERE dur = 0",
    "tracks": "SELECT count(*) AS n FROM track",
    "import problems": ("SELECT name, idx, severity, value FROM stats WHERE value > 0 "
                        "AND severity IN ('error', 'data_loss') ORDER BY name"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--shell", type=Path, default=os.environ.get("PERFETTO_TP"))
    args = parser.parse_args()
    shell = args.shell or shutil.which("trace_processor_shell") or shutil.which("trace_processor")
    if shell is None or not Path(shell).exists():
        print("perfetto_check: Perfetto's trace_processor_shell is not installed (--shell, $PERFETTO_TP or PATH): "
              "skipped")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        trace = args.trace
        if trace.suffix == ".gz":  # older trace processors read plain JSON only
            trace = Path(folder) / trace.stem
            with gzip.open(args.trace, "rb") as src, trace.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        problems = ""
        for title, query in QUERIES.items():
            done = subprocess.run([str(shell), "-Q", query, str(trace)], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"perfetto_check: trace_processor failed: {done.stderr.strip()[-500:]}")
                return 1
            print(f"== {title}\n{done.stdout.strip()}")
            if title == "import problems":
                problems = done.stdout.strip()
    return 1 if len(problems.splitlines()) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
