#!/usr/bin/env bash
# Record the traces of tools/record_conventions.py (its docstring says what each case holds and
# the profiler command lines) on a GPU machine with 2 GPUs (the FSDP cases are skipped on one),
# from the repository root. Output: $OUT/{kineto,nsys,jax,fsdp,logs}.tar.gz (nsys reports as
# their SQLite exports only). The nsys CLI inside Nsight Compute needs libdw, libelf and libbz2
# carried in .carry/lib (see tools/record_device.sh).
#
# Two lanes run at once: the Kineto cases on GPU 1, the single-GPU nsys cases on GPU 0; then the
# FSDP cases on both. Each case is independent (a failure prints FAILED NAME and the rest go on),
# each has its own log and a time limit, and the archives are rewritten after each lane so what
# was recorded comes back even if the command is stopped later.
#   OUT=/tmp/out tools/record_conventions.sh
set -uo pipefail
cd "$(dirname "$0")/.."
NCU_HOME=${NCU_HOME:-/opt/nvidia/nsight-compute/2025.3.1}
NSYS=$NCU_HOME/host/target-linux-x64/nsys
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export PATH=$NCU_HOME/host/linux-desktop-glibc_2_11_3-x64:$PATH
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-conventions.XXXX)
REC="python3 tools/record_conventions.py --out $WORK"
CASE_LIMIT=${CASE_LIMIT:-240}   # seconds for one case
FSDP_NSYS_AFTER=${FSDP_NSYS_AFTER:-400}  # skip nsys_fsdp_gpt when this many seconds have passed
START=$SECONDS
mkdir -p "$OUT"
log() { echo "[$(date +%T) +$((SECONDS - START))s] $*"; }

# py_case NAME: a Kineto case (python only)
py_case() {
    local name=$1
    log "start $name"
    TORCHINDUCTOR_CACHE_DIR=$WORK/inductor_$name timeout "$CASE_LIMIT" $REC --case "$name" \
        > "$WORK/$name.log" 2>&1 || { echo "FAILED $name"; tail -5 "$WORK/$name.log"; }
    log "done $name"
}

# nsys_case NAME CASE [nsys options]: nsys profile of `record_conventions.py --case CASE`, SQLite export
nsys_case() {
    local name=$1 case=$2; shift 2
    log "start $name"
    timeout "$CASE_LIMIT" "$NSYS" profile -t cuda,nvtx -s none --cpuctxsw=none -f true "$@" -o "$WORK/$name" \
        $REC --case "$case" > "$WORK/$name.log" 2>&1 || { echo "FAILED $name (profile)"; tail -5 "$WORK/$name.log"; }
    if [ -f "$WORK/$name.nsys-rep" ]; then
        timeout 120 "$NSYS" export --type sqlite -f true -o "$WORK/$name.sqlite" "$WORK/$name.nsys-rep" \
            >> "$WORK/$name.log" 2>&1 || echo "FAILED $name (export)"
        rm -f "$WORK/$name.nsys-rep"
    else
        echo "FAILED $name (no report)"
    fi
    log "done $name"
}

# pack NAME PATTERN...: files of $WORK matching the patterns into $OUT/NAME.tar.gz
pack() {
    local name=$1; shift
    (cd "$WORK" && shopt -s nullglob && files=($*) && [ ${#files[@]} -gt 0 ] && tar czf "$OUT/$name.tar.gz" "${files[@]}")
    [ -f "$OUT/$name.tar.gz" ] && log "$name.tar.gz $(stat -c %s "$OUT/$name.tar.gz") bytes"
}
pack_all() {
    pack kineto 'kineto_resnet18_*.json.gz' 'kineto_resnet18_*.truth.json' 'kineto_gpt_*.json.gz' 'kineto_gpt_*.truth.json'
    pack nsys 'nsys_gpt_*.sqlite' 'nsys_gpt_*.truth.json' 'nsys_resnet18_*.sqlite' 'nsys_resnet18_*.truth.json'
    pack jax 'nsys_jax_*.sqlite' 'nsys_jax_*.truth.json'
    pack fsdp 'kineto_fsdp_*.json.gz' 'kineto_fsdp_*.truth.json' 'nsys_fsdp_*.sqlite' 'nsys_fsdp_*.truth.json'
    pack logs '*.log'
}

nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
"$NSYS" --version
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, torch.cuda.device_count(), "GPUs")'
GPUS=$(nvidia-smi -L | wc -l)
SECOND_GPU=$([ "$GPUS" -ge 2 ] && echo 1 || echo 0)

(   # lane A: Kineto
    export CUDA_VISIBLE_DEVICES=$SECOND_GPU
    for c in kineto_resnet18_plain kineto_gpt_plain kineto_gpt_modules kineto_gpt_compile kineto_gpt_compile_cold; do
        py_case $c
    done
) > "$WORK/laneA.log" 2>&1 &
LANE_A=$!
(   # lane B: nsys, one GPU
    export CUDA_VISIBLE_DEVICES=0
    CAP=(--capture-range=cudaProfilerApi --capture-range-end=stop)
    nsys_case nsys_gpt_cudagraph_infer nsys_gpt_cudagraph_infer "${CAP[@]}" --cuda-graph-trace=node
    nsys_case nsys_gpt_cudagraph_infer_graphmode nsys_gpt_cudagraph_infer_graphmode "${CAP[@]}" --cuda-graph-trace=graph
    nsys_case nsys_gpt_train_step nsys_gpt_train_step "${CAP[@]}"
    nsys_case nsys_resnet18_emit_nvtx nsys_resnet18_emit_nvtx "${CAP[@]}"
    nsys_case nsys_jax_mlp nsys_jax_mlp
) > "$WORK/laneB.log" 2>&1 &
LANE_B=$!
wait $LANE_A; log "lane A over"; cat "$WORK/laneA.log"; pack_all
wait $LANE_B; log "lane B over"; cat "$WORK/laneB.log"; pack_all

if [ "$GPUS" -ge 2 ]; then
    log "start kineto_fsdp_gpt"
    timeout "$CASE_LIMIT" torchrun --nproc_per_node 2 tools/record_conventions.py --case kineto_fsdp_gpt --out "$WORK" \
        > "$WORK/kineto_fsdp_gpt.log" 2>&1 || { echo "FAILED kineto_fsdp_gpt"; tail -8 "$WORK/kineto_fsdp_gpt.log"; }
    log "done kineto_fsdp_gpt"
    pack_all
    if [ $((SECONDS - START)) -lt "$FSDP_NSYS_AFTER" ]; then
        log "start nsys_fsdp_gpt"
        timeout 150 torchrun --nproc_per_node 2 --no-python "$NSYS" profile -t cuda,nvtx -s none \
            --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop -f true \
            -o "$WORK/nsys_fsdp_gpt_rank%q{RANK}" python3 tools/record_conventions.py --case nsys_fsdp_gpt --out "$WORK" \
            > "$WORK/nsys_fsdp_gpt.log" 2>&1 || { echo "FAILED nsys_fsdp_gpt"; tail -8 "$WORK/nsys_fsdp_gpt.log"; }
        for rep in "$WORK"/nsys_fsdp_gpt_rank*.nsys-rep; do
            [ -f "$rep" ] || continue
            timeout 120 "$NSYS" export --type sqlite -f true -o "${rep%.nsys-rep}.sqlite" "$rep" \
                >> "$WORK/nsys_fsdp_gpt.log" 2>&1 || echo "FAILED nsys_fsdp_gpt export $rep"
            rm -f "$rep"
        done
        log "done nsys_fsdp_gpt"
    else
        echo "SKIPPED nsys_fsdp_gpt (time)"
    fi
else
    echo "SKIPPED kineto_fsdp_gpt nsys_fsdp_gpt (one GPU)"
fi
rm -rf "$WORK"/inductor_*
ls -la "$WORK"
pack_all
# what comes back from the device is at most 16 MiB a file
for f in "$OUT"/*.tar.gz; do
    if [ "$(stat -c %s "$f")" -gt 15000000 ]; then split -b 15000000 -d "$f" "$f.part" && rm "$f"; fi
done
ls -la "$OUT"
log "all over"
