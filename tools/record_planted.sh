#!/usr/bin/env bash
# Record tools/record_planted.py's loops under Nsight Systems on a GPU machine, from the
# repository root: per plant, the SQLite exports of its base-loop capture (NAME.base.sqlite) and
# its planted capture (NAME.sqlite), the truth file and the log, packed into
# $OUT/planted<suffix>.tar.gz (sample_traces/planted/ holds them; tests/test_advice_catalogue.py
# checks advise on them).
#
#   OUT=/tmp/out tools/record_planted.sh [PLANT...]     # default: every plant
#   OUT=/tmp/out GRAPH=1 tools/record_planted.sh smallkernels   # the step as a CUDA graph
#   OUT=/tmp/out METRICS=1 tools/record_planted.sh base         # with GPU metrics sampled
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/nsys_env.sh
DEST=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-planted.XXXX)
OUT=$WORK/planted
mkdir -p "$OUT" "$DEST"
PLANTS=("$@")
[ ${#PLANTS[@]} -gt 0 ] || PLANTS=(base pageable sync smallkernels fp32 layout dataloader churn recompile)
extra=() suffix="" flags=()
[ -n "${GRAPH:-}" ] && { flags+=(--graph); suffix+="_graph"; }
[ -n "${METRICS:-}" ] && { extra+=(--gpu-metrics-devices=0 --gpu-metrics-frequency=${METRICS_HZ:-20000}); suffix+="_metrics"; }
for plant in "${PLANTS[@]}"; do
    name=$plant$suffix
    echo "[$(date +%T)] $name"
    timeout 300 "$NSYS" profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi \
        --capture-range-end=repeat:2 -f true "${extra[@]}" -o "$WORK/$name" \
        python3 tools/record_planted.py --plant "$plant" "${flags[@]}" --truth "$OUT/$name.truth.json" \
        > "$OUT/$name.log" 2>&1 || { echo "FAILED $name"; tail -5 "$OUT/$name.log"; continue; }
    reports=($(ls -tr "$WORK/$name"*.nsys-rep))   # the base loop's capture, then the plant's
    [ ${#reports[@]} -eq 2 ] || { echo "FAILED $name: ${#reports[@]} reports"; continue; }
    timeout 120 "$NSYS" export --type sqlite -f true -o "$OUT/$name.base.sqlite" "${reports[0]}" \
        >> "$OUT/$name.log" 2>&1 || echo "FAILED $name (export base)"
    timeout 120 "$NSYS" export --type sqlite -f true -o "$OUT/$name.sqlite" "${reports[1]}" \
        >> "$OUT/$name.log" 2>&1 || echo "FAILED $name (export)"
    grep '^{"plant"' "$OUT/$name.log"
    tar czf "$DEST/planted$suffix.tar.gz" -C "$WORK" planted   # after each plant: what is done comes back
done
