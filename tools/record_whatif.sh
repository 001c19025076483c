#!/usr/bin/env bash
# Record the what-if validation pairs of issue 37 (docs/whatif.md) under Nsight Systems on a GPU
# machine, from the repository root, into $OUT/whatif.tar.gz:
# - AlexNet FP32 training at batch 64, 128 and 256 (tools/record_training.py, layer ranges): the
#   batch B -> 2B prediction with per-kernel scaling fitted on a third batch;
# - the eager -> CUDA graphs pair is tools/record_planted.sh's `smallkernels` plant recorded
#   eager and with GRAPH=1 (a launch-bound step).
#   OUT=/tmp/out tools/record_whatif.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/nsys_env.sh
DEST=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-whatif.XXXX)
mkdir -p "$WORK/whatif" "$DEST"
for batch in 64 128 256; do
    name=alexnet_b${batch}_fp32
    echo "[$(date +%T)] $name"
    timeout 300 "$NSYS" profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi \
        --capture-range-end=stop -f true -o "$WORK/$name" \
        python3 tools/record_training.py --model alexnet --batch "$batch" --iterations 6 --warmup 3 \
        > "$WORK/whatif/$name.log" 2>&1 || { echo "FAILED $name"; tail -5 "$WORK/whatif/$name.log"; continue; }
    timeout 120 "$NSYS" export --type sqlite -f true -o "$WORK/whatif/$name.sqlite" "$WORK/$name.nsys-rep" \
        >> "$WORK/whatif/$name.log" 2>&1 || echo "FAILED $name (export)"
    tar czf "$DEST/whatif.tar.gz" -C "$WORK" whatif
done
