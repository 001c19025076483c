#!/usr/bin/env bash
# Record tools/record_gpt_ncu.py on a GPU machine, from the repository root: the GPT's step as a
# Kineto trace, then the same step under Nsight Compute (DRAM bytes read and written and the
# duration of every kernel, caches flushed before each as ncu does by default, clocks not
# locked), into $OUT/gpt_ncu.tar.gz (gpt_ncu_step.json.gz, gpt_ncu_step.truth.json,
# gpt_ncu_step_ncu.csv, the logs). sample_traces/conventions/ holds the trace, sample_traces/ncu/gpt_ncu_step_raw.csv.gz the CSV; tests/test_roofline.py
# compares traceq's bytes per kernel with ncu's.
#   OUT=/tmp/out tools/record_gpt_ncu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
NCU_HOME=${NCU_HOME:-/opt/nvidia/nsight-compute/2025.3.1}
NCU=${NCU:-$(command -v ncu || echo "$NCU_HOME/ncu")}
DEST=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-gpt-ncu.XXXX)
mkdir -p "$DEST"
python3 tools/record_gpt_ncu.py --mode trace --out "$WORK" > "$WORK/trace.log" 2>&1 || { echo "FAILED trace"; tail -5 "$WORK/trace.log"; }
timeout 400 "$NCU" --profile-from-start off --clock-control none --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    python3 tools/record_gpt_ncu.py --mode ncu --out "$WORK" \
    > "$WORK/gpt_ncu_step_ncu.csv" 2> "$WORK/ncu.log" || { echo "FAILED ncu"; tail -5 "$WORK/ncu.log"; }
echo "ncu rows: $(grep -c '^"' "$WORK/gpt_ncu_step_ncu.csv")"
tar czf "$DEST/gpt_ncu.tar.gz" -C "$WORK" .
