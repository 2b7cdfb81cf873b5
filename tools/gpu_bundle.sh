#!/usr/bin/env bash
# Builds the GPU check on this (build) machine and packs what a bare GPU host needs to run it
# into one folder: a GPU node typically has the NVIDIA driver, CUDA and cuBLAS but no package
# registry and none of the Debian -dev packages, so it cannot build glmserve itself
# (docs/cuda.md, "Running the GPU check").
#
#   tools/gpu_bundle.sh [--build-dir DIR] [--out DIR] [--no-build] [--archive]
#
#   --build-dir  a CUDA-enabled build (default: build; configured here if missing)
#   --out        the bundle (default: .gpubundle in the repository, ignored by git)
#   --no-build   package what the build directory already holds
#   --archive    also write DIR.tar.xz, what travels to a GPU host whose copy is size-limited
#                (the device machine takes 64 MiB): xz -9 on one thread, whose 64 MiB window
#                finds the engine's code and kernels repeated in every statically linked
#                binary (about 40 MB for a 280 MB folder; xz -6's 8 MiB window gives 74 MB).
#                Fails if the archive exceeds 60 MB. On the host: tar -xJf DIR.tar.xz first.
#
# The bundle: bin/ (the GPU test binaries, gpu_bench, glm-server, glm-client, glm-run, the
# CPU host benchmarks and the AMX kernels' tests and benches), lib/ (every shared library they link that is not part of the C/C++
# runtime or the NVIDIA driver), golden/ (tests/golden), run.sh (tools/gpu_bundle_run.sh)
# and MANIFEST. On the GPU host: `bash .gpubundle/run.sh [out-dir]` (see run.sh).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
out="$root/.gpubundle"
do_build=1
archive=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$(cd "$2" 2>/dev/null && pwd || echo "$2")"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --archive) archive=1; shift ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

tests=()
for t in "$root"/tests/core/cuda/*_test.cc; do
  tests+=("core_cuda_$(basename "$t" .cc)")
done
# The suites parameterised over every model runner: on a GPU host their CUDA cases run.
tests+=(core_engine_runner_conformance_test core_engine_golden_test)
# The embedded default model on the GPU: perplexity and greedy agreement against the CPU.
tests+=(models_glm45_kjv_cuda_test)
# The host CPU's AMX kernels (bf16, int8, attention): GPU hosts are often Intel Xeons with AMX,
# the only machines that can measure them (run.sh --amx; their tests also run in every mode).
tests+=(core_cpu_ops_amx_tiles_test core_cpu_ops_linear_amx_test core_cpu_ops_linear_int8_amx_test
  core_cpu_ops_attention_amx_test)
benches=(gpu_bench sampler_bench host_bench moe_routing_bench mtp_bench tp_bench cpu_bench
  linear_bench attention_bench)
tools=(glm-server glm-client glm-run)

if [ "$do_build" = 1 ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DGLMSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release
  fi
  cmake --build "$build" -j "${JOBS:-2}" --target "${tests[@]}" "${benches[@]}" "${tools[@]}"
fi
if ! grep -q '^GLMSERVE_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu_bundle: $build is not a CUDA-enabled build (GLMSERVE_CUDA=ON, needs nvcc)" >&2
  exit 1
fi

# Where each target's binary lives in the build tree.
binary() {
  case "$1" in
    core_* | models_*) echo "$build/tests/$1" ;;
    *_bench) echo "$build/bench/$1" ;;
    glm-server) echo "$build/server/$1" ;;
    glm-client) echo "$build/client/$1" ;;
    glm-run) echo "$build/tools/$1" ;;
  esac
}

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for name in "${tests[@]}" "${benches[@]}" "${tools[@]}"; do
  src="$(binary "$name")"
  [ -x "$src" ] || { echo "gpu_bundle: $src is missing: build it (or drop --no-build)" >&2; exit 1; }
  cp "$src" "$out/bin/"
done

# Shared libraries: what ldd resolves for the binaries, except the C/C++ runtime (the host
# has its own, and mixing loaders breaks) and the driver's libcuda / libnvidia-* (they must
# match the host's kernel module). cuBLAS is not linked (core/cuda/cublas_api.h loads it at
# run time from the host's CUDA), so it is not carried either; nor is cuDNN (dlopen'ed by
# core/cuda/cudnn_attention.cc, hundreds of MB): run.sh finds the host's, or skips its tests.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+\.|libgcc_s\.|libcuda\.|libnvidia-)'
ldd "$out"/bin/* 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    if [[ "$soname" =~ $skip ]]; then continue; fi
    cp -L "$path" "$out/lib/$soname"
  done
if ldd "$out"/bin/* 2>/dev/null | grep -q 'not found'; then
  echo "gpu_bundle: some libraries do not resolve on this machine:" >&2
  ldd "$out"/bin/* | grep 'not found' | sort -u >&2
  exit 1
fi

cp -r "$root/tests/golden" "$out/golden"
mkdir -p "$out/models" && cp -r "$root/models/glm-4.5-kjv" "$out/models/"
cp "$root/tools/gpu_bundle_run.sh" "$out/run.sh"
chmod +x "$out/run.sh"
{
  echo "glmserve GPU bundle"
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(
    git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1 || echo unknown)"
  echo "tests: ${tests[*]}"
  echo "files:"
  (cd "$out" && find bin lib -type f -printf '  %p %s\n' | sort)
} >"$out/MANIFEST"
echo "gpu_bundle: $out ($(du -sh "$out" | cut -f1)); on the GPU host: bash $(basename "$out")/run.sh [out-dir]"
if [ "$archive" = 1 ]; then
  tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T1 -9 >"$out.tar.xz"
  bytes="$(stat -c %s "$out.tar.xz")"
  echo "gpu_bundle: $out.tar.xz ($((bytes / 1000000)) MB); on the GPU host: tar -xJf $(basename "$out").tar.xz && bash $(basename "$out")/run.sh [out-dir]"
  if [ "$bytes" -gt 60000000 ]; then
    echo "gpu_bundle: the archive exceeds 60 MB: too large for the device machine's copy" >&2
    exit 1
  fi
fi
