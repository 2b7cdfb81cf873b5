#!/usr/bin/env bash
# GPU check for glmserve's CUDA backend, for a fresh machine with an NVIDIA GPU, its driver and
# the CUDA toolkit (nvcc): installs the Debian build dependencies (tools/install_deps.sh),
# builds the CUDA targets, runs every GPU test (ctest, suites named Cuda*, with skipping turned
# into failure), then runs the GPU benchmark, which ends with one table. Sized to finish in
# under 8 minutes on an H200 with 16 cores.
#
#   tools/gpu_check.sh [build-dir]      (default: build-gpu in the repository)
#
# Exit status: that of the tests (the benchmark runs either way and reports its own errors).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build-gpu}"
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

step "build (-j$jobs)"
targets=(gpu_bench)
for t in "$root"/tests/core/cuda/*_test.cc; do
  targets+=("core_cuda_$(basename "$t" .cc)")
done
cmake --build "$build" -j "$jobs" --target "${targets[@]}" || exit 1

step "GPU tests"
# Every gtest suite of the CUDA backend is named Cuda*; parameterised ones carry a prefix
# ("Fixtures/CudaModelGolden.X/bf16"), hence no ^ anchor.
GLMSERVE_REQUIRE_CUDA=1 ctest --test-dir "$build" -R 'Cuda[A-Za-z0-9]*\.' \
  --output-on-failure --timeout 300 -j 8
tests_status=$?

step "benchmark"
timeout 300 "$build/bench/gpu_bench" --model=glm-4.5-air:layers=2 --batches=1,8,64 \
  --context=512 --decode_steps=32 --prefill_tokens=2048
bench_status=$?

step "done: tests exit $tests_status, benchmark exit $bench_status"
exit "$tests_status"
