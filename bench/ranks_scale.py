"""Make an N-rank Kineto job from a real one, and measure `traceq overlap`, `comm` and `ranks`
on it as N grows (run on demand).

    python bench/ranks_scale.py make ../shared/realtraces/kineto_json/facebookresearch__param__dlrm_kineto__worker*.json.gz \
        --ranks 64 -o /tmp/traceq-bench/dlrm64
    python bench/ranks_scale.py measure ../shared/realtraces/kineto_json/facebookresearch__param__dlrm_kineto__worker*.json.gz \
        --ranks 8 16 32 64 -o /tmp/traceq-bench/ranks

Making: rank r of the N-rank job is a copy of source rank r mod S (S source files, one per
rank), its `distributedInfo` saying rank r of N. Each copy is the source's text with that one
field rewritten (the events untouched), so the copies are the sources' events byte for byte:
rank r's numbers must equal rank (r mod S)'s (tests/test_multigpu.py checks that on 64 ranks).
Measuring, for each n: the n-rank job made, then, each in its own process, `traceq load --run`
into a new store and `traceq overlap`, `comm` and `ranks` on it, with wall time and peak RSS
(ru_maxrss of the child): memory flat in n is the claim.
"""

from __future__ import annotations

import argparse
import gzip
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

_INFO = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*\}')


def rank_of(text: bytes) -> int:
    """The rank a Kineto trace's text says it is (its distributedInfo)."""
    info = _INFO.search(text)
    found = re.search(rb'"rank"\s*:\s*(\d+)', info.group(0)) if info else None
    if found is None:
        raise SystemExit("a source trace lacks distributedInfo.rank")
    return int(found.group(1))


def make(sources: list[Path], ranks: int, out: Path) -> list[Path]:
    """Write ranks files rank0000.json.gz ... to `out`; returns their paths, by rank."""
    texts = {}
    for path in sources:
        text = gzip.decompress(path.read_bytes()) if path.read_bytes()[:2] == b"\x1f\x8b" else path.read_bytes()
        texts[rank_of(text)] = text
    if sorted(texts) != list(range(len(texts))):
        raise SystemExit(f"the sources are ranks {sorted(texts)}, not 0..{len(texts) - 1}")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        text = texts[r % len(texts)]
        info = _INFO.search(text).group(0)
        new = re.sub(rb'"world_size"\s*:\s*\d+', f'"world_size": {ranks}'.encode(),
                     re.sub(rb'"rank"\s*:\s*\d+', f'"rank": {r}'.encode(), info))
        path = out / f"rank{r:04d}.json.gz"
        path.write_bytes(gzip.compress(text.replace(info, new, 1), compresslevel=1, mtime=0))
        paths.append(path)
    return paths


def _child(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `python -m traceq` child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "traceq", *args], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024


def measure(sources: list[Path], counts: list[int], folder: Path) -> None:
    """For each n of `counts`: make an n-rank job in `folder`, load it, time the commands."""
    print("| ranks | load s | load MiB | overlap s | overlap MiB | comm s | comm MiB | ranks s | ranks MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in counts:
        files = make(sources, n, folder / f"job{n}")
        store = folder / f"ranks{n}.duckdb"
        store.unlink(missing_ok=True)
        cells = []
        for args in (["load", *map(str, files), "--run", "job"], ["overlap", "job", "-f", "csv"],
                     ["comm", "job", "-f", "csv"], ["ranks", "job", "-f", "csv"]):
            wall, rss = _child([*args, "--db", str(store)])
            cells += [f"{wall:.2f}", f"{rss:.0f}"]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make")
    m.add_argument("sources", nargs="+", type=Path)
    m.add_argument("--ranks", type=int, required=True)
    m.add_argument("-o", "--out", type=Path, required=True)
    s = sub.add_parser("measure")
    s.add_argument("sources", nargs="+", type=Path)
    s.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    s.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    if args.what == "make":
        make(args.sources, args.ranks, args.out)
    else:
        measure(args.sources, args.ranks, args.out)


if __name__ == "__main__":
    main()
