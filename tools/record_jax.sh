#!/usr/bin/env bash
# JAX recordings on one GPU, from the repository root (issues 33 and 35): the jitted MLP training
# step of tools/record_conventions.py (`--case nsys_jax_mlp`), STEPS=10 steps after compiling,
#   nsys_jax_mlp_node   nsys --cuda-graph-trace=node: XLA's command buffers (CUDA graphs) kernel by kernel
#   nsys_jax_mlp_graph  nsys's default graph-level trace: one record per graph execution
#   nsys_jax_mlp_nocb   as _node with XLA_FLAGS=--xla_gpu_enable_command_buffer= : every op launched
#                       by its own thunk, the ground truth for which op a command buffer's kernel ran
# ONLY="nocb" records that one alone.
#   xplane_jax_mlp      jax.profiler.trace (an .xplane.pb), no nsys
# The node report is also exported as parquetdir and arrow (nsys export --type). The nsys CLI
# inside Nsight Compute needs libdw, libelf and libbz2 carried in .carry/lib. Output: $OUT/jax.tar.gz.
#   OUT=/tmp/out tools/record_jax.sh
set -uo pipefail
cd "$(dirname "$0")/.."
NCU_HOME=${NCU_HOME:-/opt/nvidia/nsight-compute/2025.3.1}
NSYS=$NCU_HOME/host/target-linux-x64/nsys
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export PATH=$NCU_HOME/host/linux-desktop-glibc_2_11_3-x64:$PATH
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false STEPS=${STEPS:-10}
OUT=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-jax.XXXX)
REC="python3 tools/record_conventions.py --out $WORK"
mkdir -p "$OUT"
"$NSYS" --version
for mode in ${ONLY:-node graph nocb}; do
    name=nsys_jax_mlp_$mode
    trace=$([ "$mode" = graph ] && echo graph || echo node)
    flags=$([ "$mode" = nocb ] && echo "--xla_gpu_enable_command_buffer=" || echo "${XLA_FLAGS:-}")
    XLA_FLAGS=$flags timeout 150 "$NSYS" profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-graph-trace=$trace -f true \
        -o "$WORK/$name" $REC --case nsys_jax_mlp > "$WORK/$name.log" 2>&1 || echo "FAILED $name"
    mv "$WORK/nsys_jax_mlp.truth.json" "$WORK/$name.truth.json" 2>/dev/null
    timeout 90 "$NSYS" export --type sqlite -f true -o "$WORK/$name.sqlite" "$WORK/$name.nsys-rep" >> "$WORK/$name.log" 2>&1 \
        || echo "FAILED $name export"
done
[ -f "$WORK/nsys_jax_mlp_node.nsys-rep" ] && timeout 90 "$NSYS" export --type parquetdir -f true -o "$WORK/nsys_jax_mlp_node_parquet" "$WORK/nsys_jax_mlp_node.nsys-rep" \
    >> "$WORK/nsys_jax_mlp_node.log" 2>&1 || echo "FAILED parquetdir"
[ -f "$WORK/nsys_jax_mlp_node.nsys-rep" ] && timeout 90 "$NSYS" export --type arrow -f true -o "$WORK/nsys_jax_mlp_node_arrow" "$WORK/nsys_jax_mlp_node.nsys-rep" \
    >> "$WORK/nsys_jax_mlp_node.log" 2>&1 || echo "FAILED arrow"
if [ -z "${ONLY:-}" ]; then
    timeout 150 $REC --case xplane_jax_mlp > "$WORK/xplane_jax_mlp.log" 2>&1 || echo "FAILED xplane_jax_mlp"
fi
find "$WORK" -name '*.xplane.pb' -exec cp {} "$WORK/xplane_jax_mlp.xplane.pb" \;
rm -f "$WORK"/*.nsys-rep
(cd "$WORK" && ls -la && shopt -s nullglob && tar czf "$OUT/jax.tar.gz" --exclude='*.qdstrm' nsys_jax_* xplane_jax_mlp.* *.log)
ls -la "$OUT"
