#!/usr/bin/env bash
# Records tools/record_multigpu_plants.py on every GPU of the machine under nsys (one report per
# rank, %q{RANK}), three runs: base (exposed all-reduce), no_sync (no communication) and
# straggler (rank 1 sleeps 10 ms before each forward); exports each rank to SQLite and packs each
# run's exports into $OUT/mgplants_<run>.tar.gz. Run from the repository root on the GPU machine
# (carry .carry/lib: see tools/nsys_env.sh).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/.."
source tools/nsys_env.sh
OUT=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-plants.XXXX)
GPUS=$(nvidia-smi -L | wc -l)
mkdir -p "$OUT"
for spec in "base" "nosync --no-sync" "straggler --straggle-ms 10"; do
    set -- $spec
    tag=mgplants_${1}_${GPUS}gpu; shift
    echo "[$(date +%T)] nsys $tag $*"
    torchrun --nproc_per_node "$GPUS" --no-python "$NSYS" profile -t cuda,nvtx -s none \
        --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop -f true \
        -o "$WORK/${tag}_rank%q{RANK}" python3 "$HERE/record_multigpu_plants.py" "$@" \
        > "$WORK/$tag.log" 2>&1 || tail -30 "$WORK/$tag.log"
    for rep in "$WORK/${tag}"_rank*.nsys-rep; do
        "$NSYS" export --type sqlite -f true -o "${rep%.nsys-rep}.sqlite" "$rep" >> "$WORK/$tag.log" 2>&1
        rm -f "$rep"
    done
    tail -5 "$WORK/$tag.log"
    (cd "$WORK" && tar czf "$OUT/$tag.tar.gz" "${tag}"_rank*.sqlite "$tag.log")
    ls -la "$OUT/$tag.tar.gz"
done
