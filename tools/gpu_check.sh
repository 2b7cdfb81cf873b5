#!/usr/bin/env bash
# GPU check for glmserve's CUDA backend on a machine with an NVIDIA GPU, its driver and the
# CUDA toolkit (nvcc) that can also build glmserve (Debian 12): installs the Debian build
# dependencies (tools/install_deps.sh), builds and packs the check (tools/gpu_bundle.sh), then
# runs the pack's run.sh: every GPU test with skipping turned into failure, gpu_bench,
# glm-server on the GPU under glm-client bench, and the CPU host benchmarks. A few minutes on
# an H200 with 16 cores.
#
# A bare GPU host (driver and CUDA, no package registry, no -dev packages) cannot build: pack
# on a build machine with tools/gpu_bundle.sh, carry .gpubundle/ there and run
# `bash .gpubundle/run.sh [log-dir]` (docs/cuda.md).
#
#   tools/gpu_check.sh [build-dir] [log-dir]   (defaults: build-gpu, <build-dir>/gpu-check-logs)
#
# Exit status: that of run.sh (0 when every test and benchmark step passed).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build-gpu}"
logs="${2:-$build/gpu-check-logs}"
jobs="$(nproc)"
start=$(date +%s)
step() { echo "== [$(($(date +%s) - start)) s] $*"; }

step "device"
if ! nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader; then
  echo "gpu_check: nvidia-smi failed: no usable NVIDIA GPU or driver" >&2
  exit 1
fi
command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "gpu_check: nvcc not found: install the CUDA toolkit (or put it on PATH)" >&2
  exit 1
fi
nvcc --version | tail -n 2

step "dependencies"
"$root/tools/install_deps.sh" || exit 1

step "configure ($build)"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DGLMSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
grep -q "glmserve: CUDA backend ON" "$build/configure.log" ||
  { echo "gpu_check: the CUDA backend was not enabled" >&2; cat "$build/configure.log"; exit 1; }

step "build and pack (-j$jobs)"
JOBS="$jobs" "$root/tools/gpu_bundle.sh" --build-dir "$build" --out "$build/gpubundle" || exit 1

step "run"
bash "$build/gpubundle/run.sh" "$logs"
status=$?
step "done: run.sh exit $status (logs in $logs)"
exit "$status"
