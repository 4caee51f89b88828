#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU: builds with CUDA and runs
# every CUDA kernel against its CPU reference (tests/unit/cuda_test.c).
# Without a GPU it says so and exits 0. Benchmarks join it with the CUDA issue.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu/run.sh: no NVIDIA GPU here; skipped"
    exit 0
fi
nvidia-smi -L
cmake -S "$ROOT" -B "$ROOT/build-gpu" -DLLMSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$ROOT/build-gpu" -j "$(nproc)" --target cuda_test kernels_test nccl_test
"$ROOT/build-gpu/tests/cuda_test"
"$ROOT/build-gpu/tests/nccl_test"
"$ROOT/build-gpu/tests/kernels_test"
