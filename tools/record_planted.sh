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
#   OUT=/tmp/out NCU=1 KINETO=1 tools/record_planted.sh uncoalesced
#       # also: two planted steps under Nsight Compute (NAME_ncu_raw.csv: the SpeedOfLight and
#       # Occupancy sections, DRAM/L2/L1 bytes, global sectors against their ideal, L2 activity),
#       # and the plant under torch.profiler (kineto/NAME.json, kineto/NAME.truth.json)
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/nsys_env.sh
DEST=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-planted.XXXX)
OUT=$WORK/planted
mkdir -p "$OUT" "$DEST"
PLANTS=("$@")
[ ${#PLANTS[@]} -gt 0 ] || PLANTS=(base pageable sync smallkernels fp32 layout dataloader churn recompile uncoalesced)
extra=() suffix="" flags=()
NCU_METRICS=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,l1tex__t_bytes.sum,\
memory_l2_theoretical_sectors_global,memory_l2_theoretical_sectors_global_ideal,lts__cycles_active.sum,\
lts__cycles_elapsed.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_st.sum
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
    if [ -n "${NCU:-}" ]; then
        NCU_BIN=${NCU_BIN:-/opt/nvidia/nsight-compute/2025.3.1/ncu}
        timeout 500 "$NCU_BIN" --profile-from-start off --clock-control none --csv --page raw \
            --section SpeedOfLight --section Occupancy --metrics "$NCU_METRICS" \
            python3 tools/record_planted.py --plant "$plant" --only-planted --traced 2 --measure 2 \
            --truth "$WORK/$name.ncu.truth.json" > "$OUT/${name}_ncu_raw.csv" 2> "$OUT/$name.ncu.log" \
            || { echo "FAILED $name (ncu)"; tail -5 "$OUT/$name.ncu.log"; }
        echo "ncu rows: $(grep -c '^"[0-9]' "$OUT/${name}_ncu_raw.csv")"
    fi
    if [ -n "${KINETO:-}" ]; then
        mkdir -p "$OUT/kineto"
        timeout 300 python3 tools/record_planted.py --plant "$plant" --kineto "$OUT/kineto/$name.json" \
            --truth "$OUT/kineto/$name.truth.json" > "$OUT/kineto/$name.log" 2>&1 \
            && gzip -f "$OUT/kineto/$name.json" || { echo "FAILED $name (kineto)"; tail -5 "$OUT/kineto/$name.log"; }
    fi
    tar czf "$DEST/planted$suffix.tar.gz" -C "$WORK" planted   # after each plant: what is done comes back
done
