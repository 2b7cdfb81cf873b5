#!/usr/bin/env bash
# Runs the CUDA backend's GPU tests (and a miniature gpu_bench) on the CPU, without a GPU or a
# CUDA toolkit: the real kernels (core/cuda/*.cu, launch syntax rewritten) and host code
# (core/cuda/*_cuda.cc) are compiled against fake cuda_runtime.h / cublas_v2.h (fake/), and
# every block runs its threads as cooperative fibers (emu_runtime.cc). See README.md.
#
#   tools/cuda_emu/run.sh [work-dir]        (default /tmp/glm-cuda-emu)
#
# Needs a CPU-only glm_core: configured and built here in <work-dir>/core-build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
emu="$root/tools/cuda_emu"
work="${1:-/tmp/glm-cuda-emu}"
jobs="${JOBS:-2}"
mkdir -p "$work/gen" "$work/obj"

cmake -S "$root" -B "$work/core-build" -DGLMSERVE_CUDA=OFF -DGLMSERVE_BUILD_TESTS=OFF \
  -DGLMSERVE_BUILD_BENCH=OFF >"$work/configure.log"
cmake --build "$work/core-build" --target glm_core -j "$jobs" >"$work/build.log"

cxx=(g++ -std=c++20 -O2 -g -fno-strict-aliasing -Wno-unknown-pragmas -ffp-contract=off -DNDEBUG
     -I"$emu/fake" -I"$root")
objs=()
compile() {  # source object [extra flags]
  # Rebuilt when the source, or any header of the emulator or of core/, is newer.
  if [ ! -f "$2" ] || [ "$1" -nt "$2" ] ||
     [ -n "$(find "$emu" "$root/core" -newer "$2" -name '*.h' -print -quit)" ]; then
    echo "compile $(basename "$1")"
    "${cxx[@]}" ${3:-} -c "$1" -o "$2"
  fi
  objs+=("$2")
}

# Kernels: `Kernel<<<grid, block, smem, stream>>>(args)` becomes an emulated launch, and the
# dynamic shared-memory array a per-block buffer.
for f in "$root"/core/cuda/*.cu; do
  out="$work/gen/$(basename "$f" .cu).cc"
  python3 - "$f" "$out.new" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s = re.sub(r'extern __shared__ (\w+) (\w+)\[\];', r'\1* \2 = ::emu::DynamicSmem<\1>();', s)
s = re.sub(r'(\w+)\s*<<<(.*?)>>>\s*\(',
           lambda m: '::emu::Launcher(' + m.group(2) + ').Run(' + m.group(1) + ', ', s, flags=re.S)
open(sys.argv[2], 'w').write('#include "emu_device.h"\n' + s)
PY
  cmp -s "$out.new" "$out" 2>/dev/null && rm "$out.new" || mv "$out.new" "$out"
done
compile "$emu/emu_runtime.cc" "$work/obj/emu_runtime.o"
for f in "$work"/gen/*.cc; do compile "$f" "$work/obj/kernel_$(basename "$f" .cc).o"; done
# The real backend dlopens libcublas; here the fake one is linked in (cublas_api_emu.cc).
for f in "$root"/core/cuda/*_cuda.cc; do
  [ "$(basename "$f")" = cublas_api_cuda.cc ] && continue
  compile "$f" "$work/obj/host_$(basename "$f" .cc).o"
done
compile "$emu/cublas_api_emu.cc" "$work/obj/host_cublas_api_emu.o"
compile "$root/tests/test_util.cc" "$work/obj/test_util.o" "-DGLMSERVE_GOLDEN_DIR=\"$root/tests/golden\""
backend=("${objs[@]}")

libdir=/usr/lib/x86_64-linux-gnu
# glm_core, then what it links (glm_dtype: the element types on their own, core/CMakeLists.txt).
libs=("$work/core-build/core/libglm_core.a" "$work/core-build/core/libglm_dtype.a"
      "$libdir"/libabsl_*.so "$libdir/libopenblas.so" "$libdir/libgtest_main.a" "$libdir/libgtest.a"
      -lpthread -latomic)
status=0
# The GPU tests, and the suites parameterised over every model runner (their CUDA cases run
# on the emulated device, their CPU cases as usual).
for src in cuda/cuda_runner_test cuda/kernels_cuda_test cuda/model_cuda_test \
  cuda/sampling_cuda_test runner_conformance_test golden_test; do
  t="$(basename "$src")"
  objs=()
  compile "$root/tests/core/$src.cc" "$work/obj/test_$t.o" "-DGTEST_HAS_PTHREAD=1"
  g++ -o "$work/$t" "${objs[@]}" "${backend[@]}" "${libs[@]}"
  echo "== $t"
  "$work/$t" --gtest_brief=1 || status=1
done
objs=()
compile "$root/bench/gpu_bench.cc" "$work/obj/gpu_bench.o"
g++ -o "$work/gpu_bench" "${objs[@]}" "${backend[@]}" "${libs[@]}"
echo "== gpu_bench (miniature; emulated timings mean nothing)"
"$work/gpu_bench" --model=tiny --gemm_size=64 --copy_mib=4 --batches=1,3,8 --context=20 \
  --decode_steps=4 --prefill_tokens=50 | tail -n 7 || status=1
exit "$status"
