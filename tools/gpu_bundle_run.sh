#!/usr/bin/env bash
# The GPU check, run from a bundle that tools/gpu_bundle.sh made (this file is its run.sh),
# on a GPU host that has the NVIDIA driver and CUDA (for cuBLAS) but nothing of glmserve's
# build dependencies. Every GPU test binary with GLMSERVE_REQUIRE_CUDA=1 (a skip is a
# failure), glm-run's CUDA runner against its CPU runner on golden checkpoints, gpu_bench, glm-server on the GPU under glm-client bench at concurrency 1, 16 and
# 64 (and 16, 64 again with --overlap_steps=false), and the CPU host benchmarks (sampler_bench, host_bench), each with a timeout; a few
# minutes in all.
#
#   bash run.sh [out-dir]            logs into out-dir (default: $OUT if set, else ./gpu-check-logs)
#   bash run.sh --no-gpu [out-dir]   self-test on a machine without a GPU: the GPU tests must
#                                    skip (none may fail), the GPU benchmark and server are
#                                    left out, the CPU benchmarks run in a quick form
#   bash run.sh --amx [out-dir]      only the host CPU's AMX kernels (docs/cpu_math.md): their
#                                    bit tests, then linear_bench, attention_bench and
#                                    cpu_bench on glm-4.5-air:layers=3 (int8_amx, int8,
#                                    bf16_amx; prefill 2,048, decode at 0 and 4k; a few
#                                    minutes); without AMX the tests skip and the benches run
#                                    in a quick form (AMX_QUICK=1: quick benches on AMX too)
# On a host whose CPU flags show AMX (amx_bf16, amx_int8 and avx512f), every mode sets
# GLMSERVE_REQUIRE_AMX=1: the AMX kernels' tests must then run on the tile unit, not skip.
#
# Environment: CUDA_HOME (default /usr/local/cuda; its lib64 holds libcublas), CUDNN_HOME
# (optional: where libcudnn.so.9 is, if not in the places below), STEP_TIMEOUT (seconds per
# step, default 300). The bundle's golden fixtures are passed to the tests as
# GLMSERVE_GOLDEN_DIR.
# cuDNN (GLM-4.5's fused attention, core/cuda/cudnn_attention.h) is not in the bundle: it is
# taken from the host when present (the loader's cache, CUDNN_HOME, CUDA_HOME's lib dirs, a
# Python environment's nvidia-cudnn package) and then required by the cuDNN tests
# (GLMSERVE_REQUIRE_CUDNN=1); without it they skip and summary.txt says so.
# Writes: summary.txt (one line per step), device.txt, environment.txt, tests/<binary>.log
# and .xml, gpu_bench.log, gpu_bench_attn_cuda_cores.log, gpu_bench_cudnn.log (with
# cuDNN), gpu_bench_glm5.log,
# gpu_bench_fp8.log, gpu_bench_fp8_kv.log, server.log, client_bench_c<N>.log, server_in_sequence.log,
# client_bench_in_sequence_c<N>.log,
# sampler_bench.log, host_bench.log, moe_routing_bench.log, mtp_bench.log, tp_bench.log (with
# 2 or more GPUs), glm_run_<case>.log. Exit status: 0 when every step passed.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gpu=1
amx_only=0
if [ "${1:-}" = "--no-gpu" ]; then
  gpu=0
  shift
elif [ "${1:-}" = "--amx" ]; then
  gpu=0
  amx_only=1
  shift
fi
out="${1:-${OUT:-$PWD/gpu-check-logs}}"
mkdir -p "$out/tests"
out="$(cd "$out" && pwd)"
timeout_s="${STEP_TIMEOUT:-300}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
start=$(date +%s)
failed=0
summary="$out/summary.txt"
: >"$summary"
note() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$summary"; }
fail() { failed=1; note "FAIL $*"; }

export LD_LIBRARY_PATH="$here/lib:$cuda_home/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GLMSERVE_GOLDEN_DIR="$here/golden"
export GLMSERVE_MODELS_DIR="$here/models"
if [ "$gpu" = 1 ]; then
  export GLMSERVE_REQUIRE_CUDA=1
else
  unset GLMSERVE_REQUIRE_CUDA
fi
amx=0
flags="$(grep -m 1 '^flags' /proc/cpuinfo 2>/dev/null)"
if [[ " $flags " == *" amx_bf16 "* && " $flags " == *" amx_int8 "* && " $flags " == *" avx512f "* ]]; then
  amx=1
  export GLMSERVE_REQUIRE_AMX=1
else
  unset GLMSERVE_REQUIRE_AMX
fi
# cuDNN from the host, if it has one: its directory goes on LD_LIBRARY_PATH and into
# GLMSERVE_CUDNN_PATH (the loader's explicit search path).
cudnn_dir=""
cudnn_candidates=()
[ -n "${CUDNN_HOME:-}" ] && cudnn_candidates+=("$CUDNN_HOME/lib" "$CUDNN_HOME/lib64" "$CUDNN_HOME")
cudnn_candidates+=("$cuda_home/lib64" "$cuda_home/lib" /usr/lib/x86_64-linux-gnu /usr/lib64)
for py in python3 python; do
  if command -v "$py" >/dev/null 2>&1; then
    pkg="$("$py" -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)"
    [ -n "$pkg" ] && cudnn_candidates+=("$pkg")
  fi
done
for d in /usr/local/lib/python3*/dist-packages/nvidia/cudnn/lib /usr/lib/python3*/site-packages/nvidia/cudnn/lib; do
  [ -d "$d" ] && cudnn_candidates+=("$d")
done
for d in "${cudnn_candidates[@]}"; do
  if [ -e "$d/libcudnn.so.9" ]; then
    cudnn_dir="$d"
    break
  fi
done
if [ -z "$cudnn_dir" ] && ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 '; then
  cudnn_dir="$(dirname "$(ldconfig -p | sed -n 's/.*libcudnn\.so\.9 .*=> //p' | head -n 1)")"
fi
if [ -n "$cudnn_dir" ]; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cudnn_dir"
  export GLMSERVE_CUDNN_PATH="$cudnn_dir"
  [ "$gpu" = 1 ] && export GLMSERVE_REQUIRE_CUDNN=1
  cudnn_file="$(readlink -f "$cudnn_dir/libcudnn.so.9" 2>/dev/null)"
  cudnn_note="cuDNN: $(basename "${cudnn_file:-libcudnn.so.9}") in $cudnn_dir (the cuDNN attention tests must run)"
else
  unset GLMSERVE_REQUIRE_CUDNN
  cudnn_note="cuDNN: not found on this host (CUDNN_HOME, $cuda_home/lib*, the loader's cache, Python's nvidia-cudnn): the cuDNN attention tests skip, attention runs on the tensor-core kernel"
fi
{
  echo "bundle: $here"
  head -n 4 "$here/MANIFEST" 2>/dev/null
  echo "host: $(uname -n) $(uname -r), $(nproc) cores"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "GLMSERVE_GOLDEN_DIR=$GLMSERVE_GOLDEN_DIR"
  echo "GLMSERVE_REQUIRE_CUDA=${GLMSERVE_REQUIRE_CUDA:-}"
  echo "GLMSERVE_CUDNN_PATH=${GLMSERVE_CUDNN_PATH:-}"
  echo "GLMSERVE_REQUIRE_CUDNN=${GLMSERVE_REQUIRE_CUDNN:-}"
  echo "GLMSERVE_REQUIRE_AMX=${GLMSERVE_REQUIRE_AMX:-}"
  echo "cpu: $(grep -m 1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')"
} >"$out/environment.txt"
note "start: $([ "$gpu" = 1 ] && echo "GPU check" || { [ "$amx_only" = 1 ] && echo "the host CPU's AMX kernels"; } || echo "self-test without a GPU"), logs in $out"
note "$cudnn_note"
if [ "$amx" = 1 ]; then
  note "CPU: AMX (bf16, int8) and AVX-512: the AMX kernels' tests must run on the tile unit"
else
  note "CPU: no AMX (or no AVX-512): the AMX kernels' hardware tests skip, their emulation runs"
fi

# Every binary must find its libraries before anything runs.
missing="$(ldd "$here"/bin/* 2>/dev/null | grep 'not found' | sort -u)"
if [ -n "$missing" ]; then
  fail "libraries not found (install the CUDA toolkit or set CUDA_HOME):"
  echo "$missing" | tee -a "$summary"
  exit 1
fi

# A gtest binary's outcome: "passed N, skipped N, failed N".
counts() {
  local log="$1"
  local passed skipped failed_n
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$log" | tail -n 1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?,.*/\1/p' "$log" | tail -n 1)
  failed_n=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\?,.*/\1/p' "$log" | tail -n 1)
  echo "passed ${passed:-0}, skipped ${skipped:-0}, failed ${failed_n:-0}"
}

run_test() {  # binary
  local bin="$1" name log status result
  name="$(basename "$bin")"
  log="$out/tests/$name.log"
  timeout "$timeout_s" "$bin" --gtest_output="xml:$out/tests/$name.xml" >"$log" 2>&1
  status=$?
  result="$(counts "$log")"
  # Under GLMSERVE_REQUIRE_CUDA=1 a test that finds no GPU fails rather than skips, so the
  # exit status says it all; without it (--no-gpu) they skip and the binary passes.
  if [ "$status" != 0 ]; then
    fail "$name: exit $status ($result; see tests/$name.log)"
  else
    note "ok   $name: $result"
  fi
}

run_step() {  # name log command...
  local name="$1" log="$2"
  shift 2
  timeout "$timeout_s" "$@" >"$log" 2>&1
  local status=$?
  if [ "$status" = 0 ]; then note "ok   $name"; else fail "$name: exit $status (see $(basename "$log"))"; fi
}

# --amx: the host CPU's AMX kernels alone (no GPU needed), then stop.
if [ "$amx_only" = 1 ]; then
  for t in core_cpu_ops_amx_tiles_test core_cpu_ops_linear_amx_test \
    core_cpu_ops_linear_int8_amx_test core_cpu_ops_attention_amx_test; do
    run_test "$here/bin/$t"
  done
  # AMX_QUICK=1: the quick benchmarks even on an AMX CPU (the bundle's own test: the full ones
  # take minutes and ~20 GB); the tests still run on the tile unit.
  if [ "$amx" = 1 ] && [ "${AMX_QUICK:-0}" != 1 ]; then
    # The GEMMs alone (q_proj's shape at m = 2,048; 16 experts at 128 rows), then the model's
    # prefill and decode, every row against the same-run TDPBSSD / TDPBF16PS / VNNI peaks.
    run_step linear_bench "$out/linear_bench.log" "$here/bin/linear_bench" --threads=2 \
      --modes=int8_amx,int8,bf16_amx --tokens=2048 --experts=16 --rounds=3
    # The attention alone: one Air layer's prefill of 2,048 and decode batch 8 at 4k and 16k,
    # the tile path (bf16_amx) beside the fp32 one.
    run_step attention_bench "$out/attention_bench.log" "$here/bin/attention_bench" \
      --threads=2 --modes=amx,fp32 --tokens=2048 --decode_contexts=4096,16384 --decode_batch=8
    timeout_s=$((timeout_s * 2)) run_step cpu_bench "$out/cpu_bench.log" "$here/bin/cpu_bench" \
      --preset=glm-4.5-air:layers=3 --threads=2 --modes=int8_amx,int8,bf16_amx \
      --prefill_tokens=2048 --decode_steps=2 --decode_context=0,4096 --breakdown
  else
    run_step "linear_bench (quick)" "$out/linear_bench.log" "$here/bin/linear_bench" \
      --threads=2 --modes=int8_amx --tokens=16 --experts=2 --rounds=1
    run_step "attention_bench (quick)" "$out/attention_bench.log" "$here/bin/attention_bench" \
      --threads=2 --modes=amx,fp32 --tokens=64 --decode_contexts=256 --rounds=1
  fi
  note "done: $([ "$failed" = 0 ] && echo "every step passed" || echo "FAILED steps above")"
  exit "$failed"
fi

if nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
  >"$out/device.txt" 2>&1; then
  note "device: $(head -n 1 "$out/device.txt")"
elif [ "$gpu" = 1 ]; then
  fail "nvidia-smi: no usable GPU or driver ($(head -n 1 "$out/device.txt"))"
else
  note "device: none (as expected with --no-gpu)"
fi

for bin in "$here"/bin/core_*_test; do
  run_test "$bin"
done

# glm-run's CUDA runner against its CPU runner on golden checkpoints, the way a user checks a
# new checkpoint (docs/cuda.md, "Checking a checkpoint"): the CPU run writes its logits and
# hidden states, the CUDA run compares with them under the runner's bf16 bound (3e-2). Every
# weight form the CUDA runner serves: bf16, FP8 per-channel and block-scaled (CUDA cores and
# FP8 tensor cores), GLM-5, the FP8 KV cache. Without a GPU the CUDA half must refuse cleanly.
glm_run_check() {  # name fixture "options for both" "CUDA-only options"
  local name="$1" dir="$here/golden/$2" both="$3" cuda_only="$4"
  local log="$out/glm_run_$name.log" prompt greedy_len
  prompt=$(sed -n 's/.*"prompt": *\[\([0-9, ]*\)\].*/\1/p' "$dir/expected.json" | tr -d ' ')
  local args=(--model="$dir" --prompt="$prompt" --max_new_tokens=4)
  # shellcheck disable=SC2086  # the option strings are word lists
  if ! timeout "$timeout_s" "$here/bin/glm-run" "${args[@]}" $both --device=cpu \
    --logits_out="$out/glm_run_$name.cpu_logits.npy" \
    --hidden_out="$out/glm_run_$name.cpu_hidden.npy" >"$log" 2>&1; then
    fail "glm-run $name: the CPU run failed (see $(basename "$log"))"
    return
  fi
  # shellcheck disable=SC2086
  timeout "$timeout_s" "$here/bin/glm-run" "${args[@]}" $both $cuda_only --device=cuda \
    --compare_logits="$out/glm_run_$name.cpu_logits.npy" \
    --compare_hidden="$out/glm_run_$name.cpu_hidden.npy" --max_relative_error=3e-2 >>"$log" 2>&1
  local status=$?
  if [ "$gpu" = 1 ]; then
    if [ "$status" = 0 ]; then
      note "ok   glm-run $name: $(grep '^compare   logits' "$log" | sed 's/ vs [^:]*:/:/')"
    else
      fail "glm-run $name --device=cuda: exit $status (see $(basename "$log"))"
    fi
  elif [ "$status" = 1 ] && grep -q -- '--device=cuda: ' "$log"; then
    note "ok   glm-run $name: CPU run, --device=cuda refused without a GPU"
  else
    fail "glm-run $name without a GPU: exit $status (see $(basename "$log"))"
  fi
}
glm_run_check bf16 bf16 "" ""
glm_run_check fp8_channel fp8_channel_fp32 "" ""
glm_run_check fp8_block fp8_block_fp32 "" ""
glm_run_check fp8_block_tensor_cores fp8_block_fp32 "" "--fp8_tensor_cores=on"
glm_run_check glm5 glm5_bf16 "" ""
glm_run_check kv_fp8 bf16 "--kv_cache_dtype=fp8_e4m3" ""

if [ "$gpu" = 1 ]; then
  run_step gpu_bench "$out/gpu_bench.log" "$here/bin/gpu_bench" --model=glm-4.5-air:layers=2 \
    --batches=1,8,64 --context=512 --decode_steps=32 --prefill_tokens=2048
  # The same prefill with attention on CUDA cores (attention.cu) instead of tensor cores
  # (attention_tc.cu, the default): the ratio of the two prefill rows is what the tensor-core
  # kernel buys (docs/cuda.md, "Attention on tensor cores").
  run_step gpu_bench_attn_cuda_cores "$out/gpu_bench_attn_cuda_cores.log" env GLMSERVE_ATTN_TC=0 \
    "$here/bin/gpu_bench" --model=glm-4.5-air:layers=2 --batches=1 --context=512 --decode_steps=8 \
    --prefill_tokens=2048
  # The same prefill with cuDNN's fused SDPA (off by default since it faulted on an H200,
  # docs/cuda.md): the ratio of the two prefill rows is what cuDNN buys over attention_tc.cu.
  if [ -n "$cudnn_dir" ]; then
    run_step gpu_bench_cudnn "$out/gpu_bench_cudnn.log" env GLMSERVE_CUDNN_ATTN=1 \
      "$here/bin/gpu_bench" --model=glm-4.5-air:layers=2 --batches=1 --context=512 \
      --decode_steps=8 --prefill_tokens=2048
  else
    note "skip gpu_bench_cudnn: no cuDNN on this host"
  fi
  # GLM-5's MLA + DSA kernels (plain ones, never timed on hardware): a context past
  # index_topk (2048), so decode runs the indexer's selection.
  run_step gpu_bench_glm5 "$out/gpu_bench_glm5.log" "$here/bin/gpu_bench" \
    --model=glm-5:layers=2 --batches=1,8 --context=3000 --decode_steps=8 --prefill_tokens=1024
  # The whole GLM-4.5-Air in FP8 (issue 14; docs/fp8.md): all 46 layers, codes generated on
  # the device, CUDA-core FP8 kernels (never timed on hardware).
  run_step gpu_bench_fp8 "$out/gpu_bench_fp8.log" "$here/bin/gpu_bench" \
    --model=glm-4.5-air-fp8 --batches=1,8,64 --context=256 --decode_steps=16 --prefill_tokens=2048
  # The same with the FP8 KV cache on the device (--kv_cache_dtype=fp8_e4m3, docs/kv_cache.md),
  # at a longer context where the cache's bytes matter.
  run_step gpu_bench_fp8_kv "$out/gpu_bench_fp8_kv.log" "$here/bin/gpu_bench" \
    --model=glm-4.5-air-fp8 --kv_cache_dtype=fp8_e4m3 --batches=1,8,64 --context=2048 \
    --decode_steps=16 --prefill_tokens=2048

  # glm-server on the GPU, glm-client bench against it (the issue-9 serving figures): with
  # the defaults (steps overlapped, docs/engine.md), then with the steps in sequence.
  serve_and_bench() {  # <log suffix> <concurrencies> [glm-server flags...]
    local suffix="$1" levels="$2"
    shift 2
    local port=$((20000 + ($$ % 20000))) metrics
    metrics=$((port + 1))
    "$here/bin/glm-server" --device=cuda --model=glm-4.5-air:layers=2 --port="$port" \
      --metrics_port="$metrics" --max_running=64 "$@" >"$out/server$suffix.log" 2>&1 &
    local server=$!
    if timeout "$timeout_s" "$here/bin/glm-client" --target="127.0.0.1:$port" health \
      --service=readiness --wait=240s >>"$out/server$suffix.log" 2>&1; then
      note "ok   glm-server$suffix ready on port $port"
      for c in $levels; do
        run_step "glm-client bench$suffix, concurrency $c" "$out/client_bench${suffix}_c$c.log" \
          "$here/bin/glm-client" --target="127.0.0.1:$port" bench --rpc=generate \
          --concurrency="$c" --duration=10s --prompt_len=128 --max_new_tokens=64 \
          --metrics="127.0.0.1:$metrics"
      done
    else
      fail "glm-server$suffix did not become ready (see server$suffix.log)"
    fi
    kill -TERM "$server" 2>/dev/null
    wait "$server" 2>/dev/null
  }
  serve_and_bench "" "1 16 64"
  serve_and_bench "_in_sequence" "16 64" --overlap_steps=false

  run_step sampler_bench "$out/sampler_bench.log" "$here/bin/sampler_bench"
  # 16 and 64 streams, both runner forms (rows; tokens as device sampling returns them).
  run_step host_bench "$out/host_bench.log" "$here/bin/host_bench" --streams=16,64
  # The MoE steps on the GPU with a trained router beside random ones (docs/quality.md).
  run_step moe_routing_bench "$out/moe_routing_bench.log" "$here/bin/moe_routing_bench" \
    --device=cuda --model="$here/models/glm-4.5-kjv" --text="$here/golden/kjv/heldout.txt" \
    --presets=glm-4.5-mini,glm-4.5-air:layers=2
  # Speculative decoding with the trained MTP layer on the GPU (docs/mtp.md).
  run_step mtp_bench "$out/mtp_bench.log" "$here/bin/mtp_bench" --device=cuda \
    --model="$here/models/glm-4.5-kjv" --text="$here/golden/kjv/heldout.txt"
  # Several GPUs: CUDA ranks over NCCL against one GPU, decode and prefill per GPU
  # (docs/parallel.md; tensor_parallel_cuda_test's cases ran above with enough GPUs).
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${gpus:-0}" -ge 2 ]; then
    sizes=1
    for n in 2 4 8; do [ "$n" -le "$gpus" ] && sizes="$sizes,$n"; done
    run_step tp_bench "$out/tp_bench.log" "$here/bin/tp_bench" --device=cuda \
      --preset=glm-4.5-air:layers=8 --tensor_parallel="$sizes" --rounds=3 --decode_steps=16 \
      --prefill_tokens=2048
  else
    note "skip tp_bench: ${gpus:-0} GPU(s); the multi-GPU figures need 2 or more"
  fi
else
  # The CPU benchmarks in a quick form: they run, and their tables come out.
  run_step "sampler_bench (quick)" "$out/sampler_bench.log" "$here/bin/sampler_bench" --draws=3 \
    --rows=2
  run_step "host_bench (quick)" "$out/host_bench.log" "$here/bin/host_bench" --streams=1,4 \
    --max_new_tokens=4 --prompt_tokens=8 --modes=greedy --rounds=1
fi

note "done: $([ "$failed" = 0 ] && echo "every step passed" || echo "FAILED steps above")"
exit "$failed"
