# Sourced by the recording scripts (from the repository root): the Nsight Systems CLI that ships
# inside Nsight Compute on the GPU machines, and what it needs to make reports. libdw.so.1,
# libelf.so.1 and libbz2.so.1.0 are carried in .carry/lib (Debian bookworm's libdw1, libelf1,
# libbz2-1.0, unpacked with `apt-get download` + `dpkg -x`).
NCU_HOME=${NCU_HOME:-/opt/nvidia/nsight-compute/2025.3.1}
NSYS=${NSYS:-$NCU_HOME/host/target-linux-x64/nsys}
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export PATH=$NCU_HOME/host/linux-desktop-glibc_2_11_3-x64:$PATH
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
