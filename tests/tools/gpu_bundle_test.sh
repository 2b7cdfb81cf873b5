#!/usr/bin/env bash
# tools/gpu_bundle.sh and the bundle's run.sh, on this machine (no GPU needed): the bundle is
# packed from the build directory, every binary in it resolves its libraries from the bundle,
# the GPU tests find the bundle's golden fixtures through GLMSERVE_GOLDEN_DIR (a pruned copy,
# so that the compiled-in source path cannot be what they read), and run.sh --no-gpu passes
# with the GPU tests skipped rather than failed.
#   gpu_bundle_test.sh <repo-root> <build-dir>
set -euo pipefail
root="$1"
build="$2"
work="$(mktemp -d /tmp/gpu_bundle_test.XXXXXX)"
trap 'rm -rf "$work"' EXIT
die() { echo "gpu_bundle_test: $*" >&2; exit 1; }

bash "$root/tools/gpu_bundle.sh" --no-build --build-dir "$build" --out "$work/bundle" >"$work/pack.log" 2>&1 ||
  { cat "$work/pack.log"; die "packing failed"; }
bundle="$work/bundle"
for f in run.sh MANIFEST bin/gpu_bench bin/glm-server bin/glm-client bin/glm-run \
  bin/host_bench bin/sampler_bench bin/core_cuda_model_cuda_test bin/core_engine_runner_conformance_test \
  bin/core_engine_golden_test golden/README.md; do
  [ -e "$bundle/$f" ] || die "the bundle lacks $f"
done
ls "$bundle/lib" | grep -q '^libgrpc++\.so' || die "the bundle lacks libgrpc++"
if ls "$bundle/lib" | grep -Eq '^(libc|libstdc\+\+|libm|libcuda)\.so'; then
  die "the bundle carries a C/C++ runtime or driver library: $(ls "$bundle/lib")"
fi
# The binaries resolve every library with the bundle's lib/ first and no build tree in sight.
unresolved="$(LD_LIBRARY_PATH="$bundle/lib" ldd "$bundle"/bin/* | grep 'not found' || true)"
[ -z "$unresolved" ] || die "unresolved libraries: $unresolved"

# Keep two golden fixtures under new names: the golden suite must list exactly those.
mkdir "$work/golden"
cp -r "$bundle/golden/bf16" "$work/golden/carried_bf16"
cp -r "$bundle/golden/sharded_fp32" "$work/golden/carried_sharded"
rm -rf "$bundle/golden"
mv "$work/golden" "$bundle/golden"
listed="$(LD_LIBRARY_PATH="$bundle/lib" GLMSERVE_GOLDEN_DIR="$bundle/golden" \
  "$bundle/bin/core_engine_golden_test" --gtest_list_tests |
  sed -n 's|^  LogitsHiddenStatesAndGreedyMatchTransformers/cuda_\([a-z0-9_]*\).*|\1|p' |
  sort | tr '\n' ' ')"
[ "$listed" = "carried_bf16 carried_sharded " ] ||
  die "the golden suite listed '$listed', not the bundle's two fixtures"
# run.sh's glm-run checks read these fixtures by name.
for f in bf16 fp8_channel_fp32 fp8_block_fp32 glm5_bf16; do
  cp -r "$root/tests/golden/$f" "$bundle/golden/$f"
done

# The run script, without a GPU: the GPU tests skip (or, with a GPU, run), nothing fails.
OUT="$work/logs" bash "$bundle/run.sh" --no-gpu >"$work/run.log" 2>&1 ||
  { cat "$work/run.log"; die "run.sh --no-gpu failed"; }
grep -q "done: every step passed" "$work/logs/summary.txt" || die "no success line in summary"
for t in core_cuda_model_cuda_test core_engine_runner_conformance_test core_engine_golden_test; do
  grep -q "ok   $t" "$work/logs/summary.txt" || die "$t not run"
done
# Whether the host's cuDNN was found (and so whether the cuDNN attention tests must run) is said.
grep -Eq '^\[[0-9]+ s\] cuDNN: ' "$work/logs/summary.txt" || die "run.sh did not say whether it found cuDNN"
grep -q "core_cuda_cudnn_attention_cuda_test" "$work/logs/summary.txt" || die "the cuDNN attention tests did not run"
grep -q "GLMSERVE_GOLDEN_DIR=$bundle/golden" "$work/logs/environment.txt" ||
  die "run.sh did not point the tests at the bundle's fixtures"
for c in bf16 fp8_channel fp8_block fp8_block_tensor_cores glm5 kv_fp8; do
  grep -q "ok   glm-run $c: CPU run, --device=cuda refused without a GPU" "$work/logs/summary.txt" ||
    die "glm-run check $c not run"
done
grep -q '^| greedy | rows | 4 |' "$work/logs/host_bench.log" &&
  grep -q '^| greedy | tokens | 4 |' "$work/logs/host_bench.log" || die "host_bench printed no table"
grep -q '^| greedy |' "$work/logs/sampler_bench.log" || die "sampler_bench printed no table"
# run.sh --amx: the host CPU's AMX kernels alone; without AMX their hardware tests skip, with
# AMX they run on the tile unit; the benchmarks in their quick form either way (AMX_QUICK=1:
# the full ones take minutes and ~20 GB), on the tile unit or the emulation.
OUT="$work/logs_amx" AMX_QUICK=1 bash "$bundle/run.sh" --amx >"$work/run_amx.log" 2>&1 ||
  { cat "$work/run_amx.log"; die "run.sh --amx failed"; }
grep -q "done: every step passed" "$work/logs_amx/summary.txt" || die "no success line in --amx"
for t in core_cpu_ops_linear_amx_test core_cpu_ops_linear_int8_amx_test \
  core_cpu_ops_attention_amx_test; do
  grep -q "ok   $t" "$work/logs_amx/summary.txt" || die "$t not run by --amx"
done
grep -q '^| int8_amx (' "$work/logs_amx/linear_bench.log" || die "linear_bench printed no int8_amx row"
grep -Eq '^\| amx \((generic_)?amx_bf16\), fp32 \| prefill 64' "$work/logs_amx/attention_bench.log" &&
  grep -q '^| fp32 (.*), fp32 | decode batch 1 at context 256' "$work/logs_amx/attention_bench.log" ||
  die "attention_bench printed no amx prefill or fp32 decode row"
if grep -q "core_cuda_" "$work/logs_amx/summary.txt"; then die "--amx ran the GPU tests"; fi
# run.sh itself fails a failing step: a test binary that exits non-zero.
printf '#!/bin/sh\necho "[  FAILED  ] 1 test, listed below:"\nexit 1\n' >"$bundle/bin/core_cuda_zz_broken_test"
chmod +x "$bundle/bin/core_cuda_zz_broken_test"
if OUT="$work/logs2" bash "$bundle/run.sh" --no-gpu >"$work/run2.log" 2>&1; then
  die "run.sh passed although a test binary failed"
fi
grep -q "FAIL core_cuda_zz_broken_test: exit 1 (passed 0, skipped 0, failed 1" "$work/logs2/summary.txt" ||
  die "the failing binary is not reported: $(cat "$work/logs2/summary.txt")"
echo "gpu_bundle_test: ok ($(du -sh "$bundle" | cut -f1) bundle)"
