#!/usr/bin/env bash
# A small Nsight Systems report exported three ways (sqlite, arrow, parquetdir): the test material
# of the Arrow/Parquet reader (ingest/nsys_arrow.py, tests/test_nsys_arrow.py). The workload: 40
# matmuls and element-wise ops on one GPU inside `step N` NVTX ranges (tools/record_conventions.py
# needs more; this is a dozen lines of torch). Needs libdw, libelf and libbz2 in .carry/lib.
#   OUT=/tmp/out tools/record_nsys_exports.sh
set -uo pipefail
cd "$(dirname "$0")/.."
NCU_HOME=${NCU_HOME:-/opt/nvidia/nsight-compute/2025.3.1}
NSYS=$NCU_HOME/host/target-linux-x64/nsys
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export PATH=$NCU_HOME/host/linux-desktop-glibc_2_11_3-x64:$PATH
OUT=${OUT:-$PWD/recorded}
WORK=$(mktemp -d /tmp/traceq-exports.XXXX)
cat > "$WORK/tiny.py" <<'PY'
import torch
x = torch.randn(1024, 1024, device="cuda")
w = torch.randn(1024, 1024, device="cuda")
torch.cuda.synchronize()
for step in range(4):
    torch.cuda.nvtx.range_push(f"step {step}")
    for _ in range(10):
        x = torch.relu(x @ w) * 0.01
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("done", float(x.sum()))
PY
"$NSYS" profile -t cuda,nvtx -s none --cpuctxsw=none -f true -o "$WORK/tiny_torch" python3 "$WORK/tiny.py" > "$WORK/log.txt" 2>&1
for kind in sqlite arrow parquetdir; do
    "$NSYS" export --type $kind -f true -o "$WORK/tiny_torch.$kind" "$WORK/tiny_torch.nsys-rep" >> "$WORK/log.txt" 2>&1 || echo "FAILED $kind"
done
rm -f "$WORK"/*.nsys-rep "$WORK"/*.qdstrm
(cd "$WORK" && ls -la && du -sh tiny_torch.* && tar czf "$OUT/exports.tar.gz" tiny_torch.* log.txt)
