#!/usr/bin/env bash
# The GPU readiness check, one call: `kiln doctor --gpu` from a prebuilt, stripped binary
# with the `cuda` feature. On a machine with an NVIDIA GPU and driver it
#   1. finds libcuda and libnvrtc (LD_LIBRARY_PATH, CUDA_HOME/CUDA_PATH, /usr/local/cuda*,
#      /usr/local/nvidia, the system library directories, `ldconfig -p`, and the nvidia/*/lib
#      directories of Python site-packages, where PyTorch's pip wheels put libnvrtc), and
#      lists every file name and directory it tried;
#   2. creates the CUDA device;
#   3. checks cuda-bf16 (1e-2 relative) and cuda-f32 (1e-3) against the f32 CPU forward;
#   4. runs `bench infer` on fused, cuda-f32 and cuda-bf16 (batches 1, 1024, 65536);
#   5. trains configs/tiny.yaml in bf16 on the GPU and reports samples/s and steps/s.
# Everything goes to one JSON document ($OUT/gpu_check.json when OUT is set, else stdout);
# the exit code is the check's (0 only when every step passed; 1 with a one-line reason).
#
# Prepare the binary here (CUDA 13 image: build NVRTC's name for CUDA 13 into cudarc), then
# carry it with the working tree (a stripped release binary is well under the 64 MiB limit):
#   CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda
#   mkdir -p bin && strip -o bin/kiln-cuda target/release/kiln
# On the GPU machine:
#   benches/gpu_check.sh             # KILN=bin/kiln-cuda by default
# Dry run on a machine without a GPU: the same binary says which step cannot run, in one
# line, and exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."

KILN=${KILN:-bin/kiln-cuda}
if [ ! -x "$KILN" ]; then
    echo "gpu_check: $KILN is not an executable (build it as the header says, or set KILN)" >&2
    exit 2
fi
out=${OUT:-}
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >&2 || true
else
    echo "gpu_check: nvidia-smi not found (the check itself looks for the driver library)" >&2
fi
if [ -n "$out" ]; then
    mkdir -p "$out"
    "$KILN" doctor --gpu --gpu-config configs/tiny.yaml >"$out/gpu_check.json"
    rc=$?
    echo "gpu_check: exit $rc; report in $out/gpu_check.json" >&2
else
    "$KILN" doctor --gpu --gpu-config configs/tiny.yaml
    rc=$?
fi
exit $rc
