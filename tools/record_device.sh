#!/usr/bin/env bash
# Record the team's second-round ground truth on a GPU machine (one H100 or H200 with PyTorch,
# Nsight Compute 2025.3.1 and the Nsight Systems CLI that ships inside it), from the repository
# root. Everything it writes goes to $OUT (default ./recorded) as tar.gz files.
#
#   tools/record_device.sh traces   # nsys: AlexNet AMP, ResNet-50 AMP (emit_nvtx), a CUDA-graph
#                                   # AlexNet, a badly written loop; nsys stats reports on those
#                                   # and on the bundled samples; a Kineto JSON of AlexNet AMP
#   tools/record_device.sh kineto   # Kineto JSON of AlexNet (FP32, AMP) and ResNet-50 (AMP) with
#                                   # layer ranges and iterations, and PyTorch's FLOPs per op
#   tools/record_device.sh multigpu  # every GPU of the machine: ResNet-50 DDP and a transformer
#                                   # under FSDP, nsys (a report per rank) and Kineto (a JSON per
#                                   # rank), nsys stats of each rank (tools/record_multigpu.py)
#   tools/record_device.sh traffic [MODEL...]  # AlexNet, VGG-16, ResNet-50 training, FP32 and AMP: an nsys
#                                   # trace, Nsight Compute memory counters of every convolution
#                                   # and GEMM kernel of one step (--nvtx: each carries its layer),
#                                   # and each layer's shapes
#
# The nsys CLI inside Nsight Compute needs libdw.so.1, libelf.so.1 and libbz2.so.1.0 to turn a
# capture into a report; they are carried in .carry/lib (Debian bookworm's libdw1, libelf1,
# libbz2-1.0, unpacked with dpkg -x). The workload is tools/record_training.py (its docstring says
# what each option records).
set -euo pipefail
cd "$(dirname "$0")/.."
NCU_HOME=${NCU_HOME:-/opt/nvidia/nsight-compute/2025.3.1}
NSYS=$NCU_HOME/host/target-linux-x64/nsys
NCU=${NCU:-$(command -v ncu || echo "$NCU_HOME/ncu")}
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export PATH=$NCU_HOME/host/linux-desktop-glibc_2_11_3-x64:$PATH
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-record.XXXX)
TRAIN="python3 tools/record_training.py"
REPORTS=cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,nvtx_sum,nvtx_gpu_proj_sum,cuda_kern_exec_sum
mkdir -p "$OUT"

log() { echo "[$(date +%T)] $*"; }

# capture NAME [nsys options --] training options: an nsys report and its SQLite export
capture() {
    local name=$1; shift
    local extra=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do extra+=("$1"); shift; done
    shift
    log "capture $name: $*"
    "$NSYS" profile -t cuda,nvtx --cuda-memory-usage=true -s none --cpuctxsw=none \
        --capture-range=cudaProfilerApi --capture-range-end=stop -f true "${extra[@]}" \
        -o "$WORK/$name" $TRAIN "$@" > "$WORK/$name.log" 2>&1 || true
    [ -f "$WORK/$name.nsys-rep" ] || { cat "$WORK/$name.log"; return 1; }
    "$NSYS" export --type sqlite -f true -o "$WORK/$name.sqlite" "$WORK/$name.nsys-rep" >> "$WORK/$name.log" 2>&1
    rm -f "$WORK/$name.nsys-rep"
}

# stats FILE.sqlite: every report of $REPORTS as CSV beside it (FILE_<report>.csv)
stats() {
    local db=$1
    log "nsys stats $(basename "$db")"
    "$NSYS" stats -f csv --force-export=false --report "$REPORTS" -o "${db%.sqlite}" "$db" \
        > "${db%.sqlite}.stats.log" 2>&1 || cat "${db%.sqlite}.stats.log"
}

# pack NAME 'PATTERN'...: the files of $WORK matching the (quoted) patterns into $OUT/NAME.tar.gz
pack() {
    local name=$1; shift
    (cd "$WORK" && shopt -s nullglob && files=($*) && tar czf "$OUT/$name.tar.gz" "${files[@]}")
    log "$name.tar.gz: $(du -h "$OUT/$name.tar.gz" | cut -f1)"
}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
"$NSYS" --version
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cudnn", torch.backends.cudnn.version())'

case "${1:-}" in
traces)
    capture alexnet_b256_amp -- --model alexnet --batch 256 --amp fp16 --nvtx layers --iterations 4
    capture resnet50_b32_amp_ops -- --model resnet50 --batch 32 --amp fp16 --nvtx ops --iterations 5
    capture alexnet_b64_graph --cuda-graph-trace=node -- --model alexnet --batch 64 --graph --iterations 4
    capture badloop_mlp -- --model badloop --batch 512 --iterations 8
    log "kineto alexnet_b256_amp_kineto.json"
    $TRAIN --model alexnet --batch 256 --amp fp16 --nvtx layers --iterations 2 --kineto "$WORK/alexnet_b256_amp_kineto.json" > "$WORK/kineto.log" 2>&1
    for s in alexnet_b256_cudnn alexnet_b256_nocudnn alexnet_b128_cudnn lenet_b256_cudnn ddp_resnet18_2gpu alexnet_b64_nocache; do
        cp "sample_traces/$s.sqlite" "$WORK/sample_$s.sqlite"
    done
    for db in "$WORK"/*.sqlite; do stats "$db"; done
    rm -f "$WORK"/sample_*.sqlite
    pack nsys_stats '*.csv' '*.log'
    pack traces '*.sqlite' '*.json'
    ;;
traffic)
    METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,l1tex__t_bytes.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_static,launch__shared_mem_per_block_dynamic,launch__waves_per_multiprocessor,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
    KERNELS='regex:(gemm|xmma|cutlass|nvjet|conv|wgrad|dgrad|fprop|winograd|fft)'
    shift
    for model in ${@:-alexnet vgg16 resnet50}; do
        batch=$([ $model = alexnet ] && echo 256 || echo 32)
        for amp in none fp16; do
            tag=${model}_b${batch}_$([ $amp = none ] && echo fp32 || echo amp)
            capture "$tag" -- --model $model --batch "$batch" --amp $amp --nvtx layers --iterations 2 --warmup 2 \
                --shapes "$WORK/${tag}_shapes.json"
            log "ncu $tag"
            "$NCU" --profile-from-start off --nvtx --clock-control none --csv --page raw \
                --metrics "$METRICS" --kernel-name-base demangled --kernel-name "$KERNELS" \
                $TRAIN --model $model --batch "$batch" --amp $amp --nvtx layers --iterations 1 --warmup 2 \
                > "$WORK/${tag}_ncu.csv" 2> "$WORK/${tag}_ncu.log" || tail -5 "$WORK/${tag}_ncu.log"
            log "$tag: $(grep -c '^"' "$WORK/${tag}_ncu.csv" || true) ncu rows"
        done
    done
    pack "traffic_$(echo "${*:-all}" | tr " " _)" '*.sqlite' '*.csv' '*.json' '*.log'
    ;;
kineto)
    # Kineto JSON with layer ranges (record_function, so user_annotation events), ProfilerStep#N
    # iterations, shapes, memory events, and PyTorch's own FLOP count per op beside each
    for spec in "alexnet 256 none fp32" "alexnet 256 fp16 amp" "resnet50 32 fp16 amp"; do
        set -- $spec
        tag=${1}_b${2}_${4}_layers_kineto
        log "kineto $tag"
        $TRAIN --model "$1" --batch "$2" --amp "$3" --nvtx layers --iterations 2 --warmup 2 \
            --kineto "$WORK/$tag.json" > "$WORK/$tag.log" 2>&1 || tail -5 "$WORK/$tag.log"
    done
    pack kineto '*.json' '*.log'
    ;;
smoke)
    capture smoke -- --model alexnet --batch 32 --iterations 1 --warmup 1
    stats "$WORK/smoke.sqlite"
    "$NCU" --profile-from-start off --clock-control none --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,l1tex__t_bytes.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,launch__grid_size \
        --kernel-name 'regex:(gemm|xmma|conv)' -c 3 $TRAIN --model alexnet --batch 32 --iterations 1 --warmup 1 | tail -4
    ls -la "$WORK"
    ;;
multigpu)
    # Every GPU of the machine (one process each, torchrun): ResNet-50 under DDP and a small
    # transformer under FSDP, each recorded twice: nsys, one report per rank (%q{RANK}), NCCL's
    # own NVTX ranges on; then torch.profiler, one Kineto JSON per rank. nsys stats beside each.
    GPUS=$(nvidia-smi -L | wc -l)
    MULTI="tools/record_multigpu.py"
    for spec in "resnet50 32 ddp" "transformer 8 fsdp"; do
        set -- $spec
        tag=${3}_${1}_${GPUS}gpu
        log "nsys $tag"
        torchrun --nproc_per_node "$GPUS" --no-python "$NSYS" profile -t cuda,nvtx,osrt -s none \
            --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop -f true \
            -o "$WORK/${tag}_rank%q{RANK}" python3 $MULTI --model "$1" --batch "$2" \
            > "$WORK/$tag.log" 2>&1 || tail -20 "$WORK/$tag.log"
        for rep in "$WORK/${tag}"_rank*.nsys-rep; do
            "$NSYS" export --type sqlite -f true -o "${rep%.nsys-rep}.sqlite" "$rep" >> "$WORK/$tag.log" 2>&1
            rm -f "$rep"
            stats "${rep%.nsys-rep}.sqlite"
        done
        log "kineto $tag"
        torchrun --nproc_per_node "$GPUS" $MULTI --model "$1" --batch "$2" --kineto "$WORK/${tag}_kineto" \
            > "$WORK/${tag}_kineto.log" 2>&1 || tail -20 "$WORK/${tag}_kineto.log"
        gzip -f "$WORK/${tag}"_kineto_rank*.json
        ls -la "$WORK"
        pack "$tag" "${tag}_*" "$tag.log"
        # what comes back from the device is at most 16 MiB a file
        if [ "$(stat -c %s "$OUT/$tag.tar.gz")" -gt 15000000 ]; then
            split -b 15000000 -d "$OUT/$tag.tar.gz" "$OUT/$tag.tar.gz.part" && rm "$OUT/$tag.tar.gz"
        fi
    done
    ;;
*)
    echo "usage: $0 traces|kineto|traffic|multigpu|smoke" >&2; exit 2 ;;
esac
