#!/usr/bin/env bash
# The AMX check with llama.cpp beside it, run from a bundle that tools/amx_bundle.sh made (this
# file is its run.sh), on an Intel Xeon with AMX that has nothing of glmserve's or llama.cpp's
# build dependencies (a GPU host lent for a few minutes: issue 28's targets are defined there).
# Writes raw logs only (no Python needed); tools/amx_report.sh turns them into the tables.
#
#   bash run.sh [out-dir]      logs into out-dir (default: $OUT if set, else ./amx-check-logs)
#
# What runs, most important first, every step under a timeout and the whole under DEADLINE
# seconds (default 480: steps that would start later are skipped and say so):
#   1. host.txt (lscpu, flags, memory) and the AMX kernels' bit tests on the tile unit, the
#      software tile model's against it first (GLMSERVE_REQUIRE_AMX=1: a skip is a failure).
#      Without AMX the run stops here.
#   2. glmserve: cpu_bench on $PRESET (int8_amx, int8, int8_row_major, bf16_amx; prefill
#      2,048, decode batch 1 and 8 at contexts 0 and 4,096, --breakdown), each row beside the
#      same-run peaks; then linear_bench, attention_bench, int8_kernel_bench and amx_tile_bench
#      (the tile step fed from L2, L3 and memory) if time is left.
#      On CPU set A (2 cores).
#   3. Meanwhile on set C (the other cores): the preset's checkpoint (glm-run --save, the same
#      bytes as on the build machine), its GGUF BF16 (gguf_fill from the skeleton and manifest
#      that tools/gguf_manifest.py made from llama.cpp's converter output), Q8_0 (llama-quantize),
#      and the greedy conversion check (llama.cpp BF16 against glm-run bf16, 16 tokens).
#   4. llama.cpp on set B (2 other cores) once the GGUFs exist, in the targets' order: prefill
#      2,048 (Q8_0 repacked, BF16), decode batch 1 at 0 (Q8_0, BF16), batch 8 at 0 (Q8_0) and
#      at 4,096 (BF16, Q8_0).
# A and B are distinct physical cores (and C none of their siblings), so both engines are
# timed at the same moment under the same conditions; the ratios are what to read.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-${OUT:-$PWD/amx-check-logs}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="${WORKDIR:-$PWD/amx-work}"
mkdir -p "$work"
deadline="${DEADLINE:-480}"
preset="${PRESET:-glm-4.5-air:layers=3}"
prefill="${PREFILL:-2048}"  # prompt length of both engines' prefill rows
context="${CONTEXT:-4096}"  # the long context of the decode rows
# FORCE=1 runs every step on a CPU without AMX (a dry run of this script, with a bundle whose
# llama.cpp was built for that CPU and PREFILL / CONTEXT small enough for the emulation).
force="${FORCE:-0}"
start=$(date +%s)
summary="$out/summary.txt"
: >"$summary"
failed=0
note() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$summary"; }
fail() { failed=1; note "FAIL $*"; }
left() { echo $((deadline - ($(date +%s) - start))); }
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The bundle links the build machine's libstdc++ (GCC 12): a host with an older one gets the
# carried copy.
if ! "$here/bin/glm-run" --help >/dev/null 2>"$out/loader.txt" &&
  grep -q -e GLIBCXX -e CXXABI -e 'libstdc++' "$out/loader.txt"; then
  export LD_LIBRARY_PATH="$here/lib:$here/lib-fallback"
fi

{
  cat "$here/MANIFEST" 2>/dev/null | head -n 4
  echo "host: $(uname -n) $(uname -r), $(nproc) cpus"
  lscpu
  lscpu -p=CPU,CORE,SOCKET,NODE
  free -g
  df -h "$work"
  ldd --version | head -n 1
  grep -m 1 '^flags' /proc/cpuinfo
} >"$out/host.txt" 2>&1
note "host: $(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cpus"

flags="$(grep -m 1 '^flags' /proc/cpuinfo)"
amx=0
[[ " $flags " == *" amx_bf16 "* && " $flags " == *" amx_int8 "* && " $flags " == *" avx512f "* ]] && amx=1

# CPU sets: the first CPU of each physical core (node 0 first), A = two cores, B = the next two,
# C = every CPU on none of those four cores.
# Only CPUs this process may run on (a container's cpuset can be a slice of what lscpu lists).
allowed=" $(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status | tr ',' '\n' |
  awk -F- '{ if (NF == 2) { for (i = $1; i <= $2; i++) print i } else print $1 }' | tr '\n' ' ')"
cpu_table() {  # lscpu -p=$1 rows of allowed CPUs (the first column is the CPU)
  lscpu -p="$1" | grep -v '^#' | while IFS= read -r row; do
    [[ "$allowed" == *" ${row%%,*} "* ]] && echo "$row"
  done
}
mapfile -t firsts < <(cpu_table CPU,CORE,NODE | sort -t, -k3,3n -k2,2n -k1,1n |
  awk -F, '!seen[$2]++ {print $1 "," $2}')
core_of() { echo "${firsts[$1]#*,}"; }
cpu_of() { echo "${firsts[$1]%,*}"; }
parallel=1
if [ "${#firsts[@]}" -lt 6 ]; then
  parallel=0
  set_a="$(cpu_of 0),$(cpu_of 1)"
  set_b="$set_a"
  set_c="$(cpu_table CPU | paste -sd,)"
else
  set_a="$(cpu_of 0),$(cpu_of 1)"
  set_b="$(cpu_of 2),$(cpu_of 3)"
  used=" $(core_of 0) $(core_of 1) $(core_of 2) $(core_of 3) "
  set_c="$(cpu_table CPU,CORE | awk -F, -v used="$used" \
    'index(used, " " $2 " ") == 0 {print $1}' | paste -sd,)"
fi
threads_c=$(echo "$set_c" | tr ',' '\n' | wc -l)
note "cpu sets: A (glmserve) $set_a, B (llama.cpp) $set_b, C (preparation) $set_c$(
  [ "$parallel" = 1 ] || echo ' (under 6 cores: the engines run one after the other)')"

run_step() {  # name timeout log command...
  local name="$1" limit="$2" log="$3"
  shift 3
  if [ "$(left)" -lt 20 ]; then
    note "skip $name: past the deadline"
    return 1
  fi
  [ "$limit" -gt "$(left)" ] && limit="$(left)"
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$log" 2>&1
  local status=$?
  if [ "$status" = 0 ]; then
    note "ok   $name ($(($(date +%s) - t0)) s)"
  else
    fail "$name: exit $status after $(($(date +%s) - t0)) s (see $(basename "$log"))"
  fi
  return "$status"
}

# 1. The bit tests.
if [ "$amx" = 1 ]; then export GLMSERVE_REQUIRE_AMX=1; else unset GLMSERVE_REQUIRE_AMX; fi
for t in core_cpu_ops_amx_tiles_test core_cpu_ops_linear_amx_test \
  core_cpu_ops_linear_int8_amx_test core_cpu_ops_attention_amx_test; do
  run_step "$t" 180 "$out/$t.log" taskset -c "$set_a" "$here/bin/$t"
  grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$out/$t.log" | sed 's/^/       /' | tee -a "$summary"
done
if [ "$amx" = 0 ] && [ "$force" != 1 ]; then
  note "no AMX on this CPU (amx_bf16, amx_int8, avx512f): nothing to measure; stop"
  exit "$failed"
fi

# 3. Preparation on C, in the background.
prepare() {
  local ckpt="$work/checkpoint" bf16="$work/model-bf16.gguf" q8="$work/model-q8_0.gguf"
  run_step "glm-run --save $preset" 240 "$out/save.log" taskset -c "$set_c" \
    "$here/bin/glm-run" --model="$preset" --dtype=bf16 --save="$ckpt" || return 1
  run_step "gguf_fill (BF16)" 120 "$out/gguf_fill.log" "$here/bin/gguf_fill" \
    "$here/gguf/skeleton.bin" "$here/gguf/manifest.txt" "$ckpt" "$bf16" || return 1
  run_step "llama-quantize Q8_0" 180 "$out/quantize.log" taskset -c "$set_c" \
    "$here/llama/llama-quantize" "$bf16" "$q8" Q8_0 "$threads_c" || return 1
  touch "$work/ready"
  local prompt=151331,151333,9703,1435,11,2061,374,264
  run_step "greedy llama.cpp BF16" 120 "$out/greedy_llama.log" taskset -c "$set_c" \
    "$here/llama/llama_greedy" "$bf16" "$prompt" 16 "$threads_c"
  run_step "greedy glm-run bf16" 180 "$out/greedy_glmserve.log" taskset -c "$set_c" \
    "$here/bin/glm-run" --model="$ckpt" --cpu_math=bf16 --threads="$threads_c" \
    --prompt="$prompt" --max_new_tokens=16
}
have_llama=1
if [ ! -x "$here/llama/llama-bench" ] || [ ! -f "$here/gguf/manifest.txt" ]; then
  have_llama=0
  note "no llama.cpp in this bundle (amx_bundle.sh without --llama-build): glmserve only"
elif [ "$parallel" = 1 ]; then
  prepare &
  prepare_pid=$!
else
  prepare
fi

# 4. llama.cpp on B.
llama() {
  local bf16="$work/model-bf16.gguf" q8="$work/model-q8_0.gguf" bench="$here/llama/llama-bench"
  local batched="$here/llama/llama-batched-bench"
  while [ ! -e "$work/ready" ]; do
    if [ "$parallel" = 1 ] && ! kill -0 "$prepare_pid" 2>/dev/null && [ ! -e "$work/ready" ]; then
      note "skip llama.cpp: the GGUF files were not made"
      return 1
    fi
    [ "$(left)" -lt 20 ] && return 1
    sleep 2
  done
  run_step "llama.cpp Q8_0 prefill $prefill" 150 "$out/llama_q8_prefill.log" taskset -c "$set_b" \
    "$bench" -m "$q8" -t 2 -p "$prefill" -n 0 -r 1 --repack 1 -o md
  run_step "llama.cpp BF16 prefill $prefill" 150 "$out/llama_bf16_prefill.log" taskset -c "$set_b" \
    "$bench" -m "$bf16" -t 2 -p "$prefill" -n 0 -r 1 -o md
  run_step "llama.cpp Q8_0 decode 1 @0" 60 "$out/llama_q8_tg.log" taskset -c "$set_b" \
    "$bench" -m "$q8" -t 2 -p 0 -n 16 -r 1 --repack 1 -o md
  run_step "llama.cpp BF16 decode 1 @0" 60 "$out/llama_bf16_tg.log" taskset -c "$set_b" \
    "$bench" -m "$bf16" -t 2 -p 0 -n 16 -r 1 -o md
  run_step "llama.cpp Q8_0 decode 8 @0" 90 "$out/llama_q8_b8.log" taskset -c "$set_b" \
    "$batched" -m "$q8" -t 2 -c 512 -npp 1 -ntg 16 -npl 8 -pps
  run_step "llama.cpp BF16 decode 8 @$context" 180 "$out/llama_bf16_b8_ctx.log" \
    taskset -c "$set_b" "$batched" -m "$bf16" -t 2 -c $((8 * (context + 32))) -npp "$context" \
    -ntg 16 -npl 8 -pps
  run_step "llama.cpp Q8_0 decode 8 @$context" 150 "$out/llama_q8_b8_ctx.log" \
    taskset -c "$set_b" "$batched" -m "$q8" -t 2 -c $((8 * (context + 32))) -npp "$context" \
    -ntg 16 -npl 8 -pps
}
if [ "$parallel" = 1 ] && [ "$have_llama" = 1 ]; then
  llama &
  llama_pid=$!
fi

# 2. glmserve on A.
run_step "cpu_bench" 300 "$out/cpu_bench.log" taskset -c "$set_a" "$here/bin/cpu_bench" \
  --preset="$preset" --threads=2 --modes=int8_amx,int8,int8_row_major,bf16_amx \
  --prefill_tokens="$prefill" \
  --decode_steps=2 --decode_batch=8 --decode_context=0,"$context" --breakdown
run_step linear_bench 90 "$out/linear_bench.log" taskset -c "$set_a" "$here/bin/linear_bench" \
  --threads=2 --modes=int8_amx,int8,bf16_amx --tokens="$prefill" --experts=16 --rounds=2
run_step attention_bench 90 "$out/attention_bench.log" taskset -c "$set_a" \
  "$here/bin/attention_bench" --threads=2 --modes=amx,fp32 --tokens="$prefill" \
  --decode_contexts="$context" --decode_batch=8 --rounds=2
# One thread, each int8 kernel on both layouts: where AMX's kRows16 path should start
# (kInt8AmxRows16MinRows) against VNNI's decode kernel.
run_step int8_kernel_bench 90 "$out/int8_kernel_bench.log" taskset -c "${set_a%%,*}" \
  "$here/bin/int8_kernel_bench" --rows=1,4,8,12,16,32,64,256 --n=4096 --k=4096 --reps=3
# One thread: the bf16 GEMM's tile step fed from each level (issue 28's first target's ceilings).
run_step amx_tile_bench 60 "$out/amx_tile_bench.log" taskset -c "${set_a%%,*}" \
  "$here/bin/amx_tile_bench" --slices=100

if [ "$have_llama" = 0 ]; then
  :
elif [ "$parallel" = 1 ]; then
  wait "$llama_pid"
  wait "$prepare_pid"
else
  llama
fi
# Steps of the background jobs cannot set $failed: their FAIL lines in the summary count too.
grep -q '] FAIL ' "$summary" && failed=1
note "done: $([ "$failed" = 0 ] && echo "every step passed" || echo "FAILED steps above")"
exit "$failed"
