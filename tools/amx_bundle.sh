#!/usr/bin/env bash
# Packs the AMX check (issue 28's targets: glmserve's AMX modes against llama.cpp on the same
# Xeon) into one folder for a host that can build nothing: a CPU build of glmserve's AMX tests,
# cpu_bench, linear_bench, attention_bench, int8_kernel_bench, amx_tile_bench and glm-run;
# optionally llama.cpp's benchmarks built for Sapphire Rapids and the GGUF skeleton that
# rebuilds the preset's GGUF there.
#
#   tools/amx_bundle.sh [--build-dir DIR] [--out DIR] [--llama-build DIR --llama-src DIR
#                       --gguf DIR] [--archive]
#
#   --build-dir    a glmserve build (default: build; CUDA not needed), its targets built here
#   --out          the bundle (default: .amxbundle, ignored by git)
#   --llama-build  a static llama.cpp build (BUILD_SHARED_LIBS=OFF) for the AMX host, e.g.
#                  clang, GGML_NATIVE=OFF and GGML_AVX512{,_VBMI,_VNNI,_BF16}=ON,
#                  GGML_AMX_{TILE,INT8,BF16}=ON, and with clang 14 also CMAKE_{C,CXX}_FLAGS=
#                  "-D__AMX_INT8__=1 -D__AMX_TILE__=1 -D__AMX_BF16__=1" (ggml tests GCC's macro
#                  names; without them it has no AMX code: docs/performance.md, "Against
#                  llama.cpp"); check with nm that ggml_backend_amx_buffer_type is there;
#                  its llama-bench, llama-batched-bench and llama-quantize go in, and
#                  tools/llama_greedy.cc is linked against its libraries
#   --llama-src    the llama.cpp source tree of that build (headers for llama_greedy)
#   --gguf         the folder tools/gguf_manifest.py wrote (skeleton.bin, manifest.txt) for
#                  the preset's GGUF BF16
#   --archive      also write OUT.tar.xz (the device machine's copy takes 64 MiB)
# On the host: bash .amxbundle/run.sh [out-dir] (tools/amx_bundle_run.sh), then here
# tools/amx_report.sh out-dir for the tables.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
out="$root/.amxbundle"
llama_build="" llama_src="" gguf="" archive=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --llama-build) llama_build="$2"; shift 2 ;;
    --llama-src) llama_src="$2"; shift 2 ;;
    --gguf) gguf="$2"; shift 2 ;;
    --archive) archive=1; shift ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "amx_bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

targets=(core_cpu_ops_amx_tiles_test core_cpu_ops_linear_amx_test
  core_cpu_ops_linear_int8_amx_test core_cpu_ops_attention_amx_test cpu_bench linear_bench attention_bench int8_kernel_bench
  amx_tile_bench glm-run)
cmake --build "$build" -j "${JOBS:-2}" --target "${targets[@]}"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/lib-fallback"
for t in "${targets[@]}"; do
  case "$t" in
    core_*) cp "$build/tests/$t" "$out/bin/" ;;
    *_bench) cp "$build/bench/$t" "$out/bin/" ;;
    glm-run) cp "$build/tools/$t" "$out/bin/" ;;
  esac
done
c++ -O2 -std=c++17 -static-libstdc++ -static-libgcc "$root/tools/gguf_fill.cc" \
  -o "$out/bin/gguf_fill"

if [ -n "$llama_build" ]; then
  [ -n "$llama_src" ] && [ -n "$gguf" ] || { echo "amx_bundle: --llama-build needs --llama-src and --gguf" >&2; exit 2; }
  mkdir -p "$out/llama" "$out/gguf"
  for b in llama-bench llama-batched-bench llama-quantize; do
    cp "$llama_build/bin/$b" "$out/llama/"
  done
  libs=()
  for a in src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a ggml/src/libggml-base.a; do
    libs+=("$llama_build/$a")
  done
  "${CXX:-clang++}" -O2 -std=c++17 -I"$llama_src/include" -I"$llama_src/ggml/include" \
    "$root/tools/llama_greedy.cc" -o "$out/llama/llama_greedy" "${libs[@]}" -fopenmp=libomp \
    -lpthread
  cp "$gguf/skeleton.bin" "$gguf/manifest.txt" "$out/gguf/"
fi

# Shared libraries the binaries resolve here, except the C runtime and loader; libstdc++ and
# libgcc_s go to lib-fallback (run.sh uses them only if the host's are older).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.)'
binaries=("$out"/bin/*)
[ -d "$out/llama" ] && binaries+=("$out"/llama/*)
ldd "${binaries[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  sort -u | while read -r soname path; do
    if [[ "$soname" =~ $skip ]]; then continue; fi
    if [[ "$soname" =~ ^(libstdc\+\+|libgcc_s) ]]; then
      cp -L "$path" "$out/lib-fallback/$soname"
    else
      cp -L "$path" "$out/lib/$soname"
    fi
  done
cp "$root/tools/amx_bundle_run.sh" "$out/run.sh"
{
  echo "glmserve AMX bundle"
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(
    git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "llama.cpp: ${llama_build:+$(git -C "$llama_src" describe --always 2>/dev/null || basename "$(dirname "$(dirname "$llama_src")")")}"
  (cd "$out" && find . -type f -printf '  %p %s\n' | sort)
} >"$out/MANIFEST"
echo "amx_bundle: $out ($(du -sh "$out" | cut -f1))"
if [ "$archive" = 1 ]; then
  tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T2 -6 >"$out.tar.xz"
  echo "amx_bundle: $out.tar.xz ($(($(stat -c %s "$out.tar.xz") / 1000000)) MB)"
fi
