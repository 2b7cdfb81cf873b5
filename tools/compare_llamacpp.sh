#!/usr/bin/env bash
# Hand-run comparison of glmserve's CPU engine with llama.cpp on the same checkpoint (never
# run by CI; needs PyPI for the llama-cpp-python sdist and the converter's Python packages,
# or a local llama.cpp checkout). It:
#   1. writes the preset's seeded random bf16 weights as a Hugging Face checkpoint
#      (glm-run --save), plus the tokenizer files from $TOKENIZER_DIR (default: the
#      repository's GLM-structured models/glm-4.5-mini; the GGUF converter requires them);
#   2. builds llama.cpp (llama-bench, llama-batched-bench, llama-quantize and the library)
#      from $LLAMA_CPP_DIR or from the llama-cpp-python source package's vendored copy, with
#      $JOBS jobs and $LLAMA_CC / $LLAMA_CXX (clang when installed: see "AMX" below), and
#      tools/llama_greedy.cc against it;
#   3. converts the checkpoint to GGUF BF16 (tools/convert_glm_gguf.py around
#      convert_hf_to_gguf.py) and quantizes Q8_0;
#   4. checks the conversion: greedy tokens of glm-run (bf16 mode) and of llama.cpp (BF16) on
#      a short prompt, and how many agree;
#   5. runs both engines in interleaved rounds on the same threads and prints one table of
#      medians (tokens/s): prefill of each of $PROMPTS tokens, and decode of batch 1 and of
#      $BATCH sequences at each context of $CONTEXTS.
# Every step keeps its artefacts in $WORK and is skipped when they exist, so a rerun (say on
# an idle machine) only measures; TIMING_ONLY=1 also refuses to build anything missing.
#
#   WORK=$HOME/glm-cmp tools/compare_llamacpp.sh
#   WORK=$HOME/glm-cmp TIMING_ONLY=1 ROUNDS=5 MODES=exact,bf16,int8 tools/compare_llamacpp.sh
#   # issue 28's whole grid:
#   WORK=$HOME/glm-cmp PROMPTS=128,2048,8192 CONTEXTS=0,4096,16384 tools/compare_llamacpp.sh
# MODES: the glmserve modes (cpu_bench --modes) to measure; LLAMA_TYPES: BF16 and/or Q8_0.
#
# What each side measures. Prefill: one prompt of P tokens (glmserve: cpu_bench's prefill row,
# after a warm-up prefill, in forwards of at most $PREFILL_CHUNK tokens; llama.cpp:
# llama-bench pP). Decode batch 1 at context C: steps
# after C cached positions (cpu_bench --decode_context, synthetic keys and values; llama-bench
# -n 16 -d C, after a real prefill of C). Decode batch B at context C: glmserve decodes B
# sequences of C positions each; llama-batched-bench -pps decodes B sequences after one
# shared prompt of C tokens (a C-token prefill per round instead of B of them), which can
# only favour llama.cpp (the sequences read the same cached keys).
#
# AMX: ggml's AMX int8 path (Q8_0 weights in its "AMX" buffer, on CPUs that list amx_int8)
# died with SIGILL when llama.cpp was built with GCC 12: ggml's tile configuration lives on the
# stack and the compiler may drop its stores before _tile_loadconfig (llama.cpp pull request
# 26954, which also requests the tile-data permission on every thread). So the build here uses
# clang when installed. But ggml compiles its AMX code only under GCC's macro names
# (__AMX_INT8__, __AMX_TILE__), and clang 14 spells them __AMXINT8__ / __AMXTILE__: a plain
# clang 14 build has no AMX path at all (its Q8_0 prefill runs on llamafile's AVX-512 tinyBLAS,
# seen with perf on an AMX Xeon). On a CPU with AMX the clang build therefore defines GCC's
# names itself (LLAMA_AMX_DEFINES), which turns the AMX path on; the table's Q8_0 rows then
# say "Q8_0 AMX". Q8_0 runs repacked (LLAMA_Q8_REPACK=1, which also lets the AMX buffer take
# the weights) only with a clang build; with GCC it runs unrepacked unless LLAMA_Q8_REPACK=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-glm-4.5-air:layers=3}
PROMPTS=${PROMPTS:-128,2048}
CONTEXTS=${CONTEXTS:-0,4096}
BATCH=${BATCH:-8}
# glmserve runs a long prompt in forwards of at most this many tokens, as glm-server does by
# default (--max_batch_tokens); llama.cpp's prompt processing takes ubatches of 512.
PREFILL_CHUNK=${PREFILL_CHUNK:-2048}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
JOBS=${JOBS:-2}
MODES=${MODES:-exact,bf16,int8}
LLAMA_TYPES=${LLAMA_TYPES:-BF16,Q8_0}
WORK=${WORK:-/tmp/glmserve-vs-llamacpp}
BUILD_DIR=${BUILD_DIR:-build}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-}
TOKENIZER_DIR=${TOKENIZER_DIR:-models/glm-4.5-mini}
PROMPT=${PROMPT:-151331,151333,9703,1435,11,2061,374,264}
TIMING_ONLY=${TIMING_ONLY:-0}
if command -v clang > /dev/null && command -v clang++ > /dev/null; then
  LLAMA_CC=${LLAMA_CC:-clang}
  LLAMA_CXX=${LLAMA_CXX:-clang++}
else
  LLAMA_CC=${LLAMA_CC:-cc}
  LLAMA_CXX=${LLAMA_CXX:-c++}
fi
for list in "$PROMPTS" "$CONTEXTS"; do
  if ! [[ "$list" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    echo "PROMPTS and CONTEXTS are comma-separated counts (got '$list')" >&2
    exit 2
  fi
done
mkdir -p "$WORK"
need() {  # $1 exists, or (TIMING_ONLY=1) stop
  if [ -e "$1" ]; then return 0; fi
  if [ "$TIMING_ONLY" = 1 ]; then
    echo "TIMING_ONLY=1 but $1 is missing: run once without it" >&2
    exit 1
  fi
  return 1
}

# 1. The checkpoint.
ckpt="$WORK/checkpoint"
if ! need "$ckpt/model.safetensors"; then
  "$BUILD_DIR/tools/glm-run" --model="$PRESET" --dtype=bf16 --save="$ckpt"
fi
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  if [ -f "$TOKENIZER_DIR/$f" ]; then cp "$TOKENIZER_DIR/$f" "$ckpt/"; fi
done

# 2. llama.cpp.
if [ -z "$LLAMA_CPP_DIR" ]; then
  if ! need "$WORK/llama-cpp-python/vendor/llama.cpp"; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" download --no-deps --no-binary :all: -d "$WORK/sdist" llama-cpp-python
    mkdir -p "$WORK/llama-cpp-python"
    tar -xzf "$WORK"/sdist/llama_cpp_python-*.tar.gz -C "$WORK/llama-cpp-python" \
      --strip-components=1
  fi
  LLAMA_CPP_DIR="$WORK/llama-cpp-python/vendor/llama.cpp"
fi
lbuild="$WORK/llama-build"
# GCC's names for the AMX macros, for clang (see "AMX" above), where the CPU has AMX.
# Set LLAMA_AMX_DEFINES (even empty) to choose them yourself.
if [ -z "${LLAMA_AMX_DEFINES+set}" ]; then
  LLAMA_AMX_DEFINES=""
  if [[ "$LLAMA_CC" == *clang* ]] && grep -q -w amx_int8 /proc/cpuinfo 2> /dev/null; then
    LLAMA_AMX_DEFINES="-D__AMX_INT8__=1 -D__AMX_TILE__=1 -D__AMX_BF16__=1"
  fi
fi
if ! need "$lbuild/bin/llama-batched-bench"; then
  CC=$LLAMA_CC CXX=$LLAMA_CXX cmake -S "$LLAMA_CPP_DIR" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$LLAMA_AMX_DEFINES" -DCMAKE_CXX_FLAGS="$LLAMA_AMX_DEFINES" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF
  cmake --build "$lbuild" -j "$JOBS" --target llama-bench llama-batched-bench llama-quantize
fi
greedy_bin="$WORK/llama_greedy"
if ! need "$greedy_bin"; then
  c++ -O2 -std=c++17 -I"$LLAMA_CPP_DIR/include" -I"$LLAMA_CPP_DIR/ggml/include" \
    tools/llama_greedy.cc -o "$greedy_bin" -L"$lbuild/bin" -lllama -lggml -lggml-base \
    -Wl,-rpath,"$lbuild/bin"
fi

# 3. GGUF files. The converter's own requirements name PyTorch's CPU index, which may be
# unreachable: the same pins are installed from PyPI.
if ! need "$WORK/venv/bin/python" || ! "$WORK/venv/bin/python" -c 'import torch, transformers' \
  2>/dev/null; then
  [ -x "$WORK/venv/bin/python" ] || python3 -m venv "$WORK/venv"
  grep -hv -e '^-r' -e '^--extra-index-url' -e '^#' -e '^$' \
    "$LLAMA_CPP_DIR/requirements/requirements-convert_hf_to_gguf.txt" \
    "$LLAMA_CPP_DIR/requirements/requirements-convert_legacy_llama.txt" > "$WORK/requirements.txt"
  "$WORK/venv/bin/pip" install -q -r "$WORK/requirements.txt"
fi
bf16="$WORK/model-bf16.gguf"
q8="$WORK/model-q8_0.gguf"
if ! need "$bf16"; then
  "$WORK/venv/bin/python" tools/convert_glm_gguf.py "$LLAMA_CPP_DIR" "$ckpt" --no-mtp --outtype bf16 \
    --outfile "$bf16"
fi
need "$q8" || "$lbuild/bin/llama-quantize" "$bf16" "$q8" Q8_0

# 4. The conversion check: greedy ids from the same prompt ids, llama.cpp BF16 against
# glmserve's bf16 mode (the same rounding of activations) and its exact mode. A random
# checkpoint's top logits can be near-tied (glm-4.5-mini's are: its own two modes part after
# one token), so a short identical prefix there is not by itself a conversion error; the
# default Air preset agreed 16 of 16.
glm_greedy() {
  "$BUILD_DIR/tools/glm-run" --model="$ckpt" --cpu_math="$1" --threads="$THREADS" \
    --prompt="$PROMPT" --max_new_tokens=16 | awk '$1 == "greedy" { print $2 }'
}
llama_greedy=$("$greedy_bin" "$bf16" "$PROMPT" 16 "$THREADS" 2>/dev/null)
python3 - "$llama_greedy" "$(glm_greedy bf16)" "$(glm_greedy exact)" <<'PY' | tee "$WORK/greedy.txt"
import sys
ref = sys.argv[1].split(",")
print(f"greedy llama.cpp BF16:  {','.join(ref)}")
for name, ids in (("bf16", sys.argv[2]), ("exact", sys.argv[3])):
    a = ids.split(",")
    same = sum(x == y for x, y in zip(a, ref))
    prefix = next((i for i, (x, y) in enumerate(zip(a, ref)) if x != y), min(len(a), len(ref)))
    print(f"greedy glmserve {name}: {','.join(a)}")
    print(f"  agreement with llama.cpp BF16: {same}/{len(a)} positions, identical prefix "
          f"{prefix}/{len(a)}")
PY

# 5. Interleaved rounds: each round runs cpu_bench once over all MODES, PROMPTS and CONTEXTS
# (one weight generation), then llama.cpp for each type. Each measurement appends
# "engine<TAB>phase<TAB>tokens/s" with the phases "prefill P", "decode 1 @C", "decode B @C".
results="$WORK/results.tsv"
: > "$results"
glmserve_round() {
  "$BUILD_DIR/bench/cpu_bench" --preset="$PRESET" --threads="$THREADS" --modes="$MODES" \
    --prefill_tokens="$PROMPTS" --prefill_chunk="$PREFILL_CHUNK" --decode_context="$CONTEXTS" \
    --decode_batch="$BATCH" |
    tee -a "$WORK/cpu_bench.log" | python3 -c '
import sys
contexts = sys.argv[1].split(",")
decodes = {}  # mode -> decode rows seen: batch 1 and batch B for each context, in order
for line in sys.stdin:
    cells = [c.strip() for c in line.split("|")[1:-1]]
    if len(cells) < 4 or "roofline" in cells[1]:
        continue
    mode, phase, tps = cells[0].split(" (")[0], cells[1], cells[3]
    if phase.startswith("prefill "):
        print(f"glmserve {mode}\t{phase}\t{tps}")
    elif phase.startswith("decode batch "):
        k = decodes.get(mode, 0)
        decodes[mode] = k + 1
        batch = phase.split(",")[0].split()[-1]
        print(f"glmserve {mode}\tdecode {batch} @{contexts[k // 2]}\t{tps}")
' "$CONTEXTS" >> "$results"
}
# Repacked Q8_0 only from a clang build unless asked (see "AMX" above).
if grep -q "CMAKE_CXX_COMPILER:[A-Z]*=.*clang" "$lbuild/CMakeCache.txt" 2> /dev/null; then
  LLAMA_Q8_REPACK=${LLAMA_Q8_REPACK:-1}
else
  LLAMA_Q8_REPACK=${LLAMA_Q8_REPACK:-0}
fi
llama_round() {
  local name=$1 gguf=$2 repack=1
  [ "$name" = Q8_0 ] && repack=$LLAMA_Q8_REPACK
  local label="llama.cpp $name"
  [ "$name" = Q8_0 ] && [ "$repack" = 1 ] && label="llama.cpp Q8_0 repacked"
  # The AMX path compiled in (its buffer type's symbol is in the binary) and the CPU has AMX.
  if [ "$name" = Q8_0 ] && [ "$repack" = 1 ] && grep -q -w amx_int8 /proc/cpuinfo &&
    grep -q -a ggml_backend_amx_buffer_type "$lbuild"/bin/llama-bench "$lbuild"/bin/libggml-cpu*.so \
      2> /dev/null; then
    label="llama.cpp Q8_0 AMX"
  fi
  local no_repack=()
  [ "$repack" = 1 ] || no_repack=(--no-repack)
  # llama-bench, CSV: each prompt length; then 16 decoded tokens after each context.
  {
    "$lbuild/bin/llama-bench" -m "$gguf" -t "$THREADS" -p "$PROMPTS" -n 0 -r 1 \
      --repack "$repack" -o csv 2> /dev/null
    "$lbuild/bin/llama-bench" -m "$gguf" -t "$THREADS" -p 0 -n 16 -d "$CONTEXTS" -r 1 \
      --repack "$repack" -o csv 2> /dev/null | tail -n +2
  } | python3 -c 'import csv, sys
for row in csv.DictReader(sys.stdin):
    if int(row["n_gen"]) == 0:
        phase = "prefill %s" % row["n_prompt"]
    else:
        phase = "decode 1 @%s" % row["n_depth"]
    print("'"$label"'\t%s\t%.2f" % (phase, float(row["avg_ts"])))' >> "$results"
  # llama-batched-bench: BATCH sequences after one shared prompt of C tokens (at least 1),
  # 16 generated tokens each; S_TG t/s. Its cache is split evenly among the sequences: each
  # needs room for the prompt and its tokens.
  local c
  for c in ${CONTEXTS//,/ }; do
    local npp=$((c > 0 ? c : 1))
    "$lbuild/bin/llama-batched-bench" -m "$gguf" -t "$THREADS" -c $((BATCH * (npp + 32))) \
      -npp "$npp" -ntg 16 -npl "$BATCH" -pps "${no_repack[@]}" --output-format jsonl \
      2> /dev/null | python3 -c 'import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        print("'"$label"'\tdecode '"$BATCH"' @'"$c"'\t%.2f" % json.loads(line)["speed_tg"])' \
      >> "$results"
  done
}
for round in $(seq "$ROUNDS"); do
  echo "round $round of $ROUNDS" >&2
  glmserve_round
  for t in ${LLAMA_TYPES//,/ }; do
    case $t in
      BF16) llama_round BF16 "$bf16" ;;
      Q8_0) llama_round Q8_0 "$q8" ;;
      *) echo "LLAMA_TYPES: '$t' is not BF16 or Q8_0" >&2; exit 1 ;;
    esac
  done
done

# Medians per engine and phase.
python3 - "$results" "$PRESET" "$THREADS" "$ROUNDS" "$(cat /proc/loadavg)" "$PROMPTS" \
  "$CONTEXTS" "$BATCH" <<'PY'
import statistics, sys
path, preset, threads, rounds, load, prompts, contexts, batch = sys.argv[1:]
rows = {}
for line in open(path):
    engine, phase, value = line.rstrip("\n").split("\t")
    rows.setdefault(engine, {}).setdefault(phase, []).append(float(value))
phases = [f"prefill {p}" for p in prompts.split(",")]
for c in contexts.split(","):
    phases += [f"decode 1 @{c}", f"decode {batch} @{c}"]
print(f"{preset}, {threads} threads, medians of {rounds} interleaved rounds, tokens/s "
      f"(load average at the end: {load.split()[0]})\n")
print("| engine | " + " | ".join(phases) + " |")
print("|---|" + "---|" * len(phases))
for engine, by_phase in rows.items():
    cells = [f"{statistics.median(by_phase[p]):.1f}" if p in by_phase else "-" for p in phases]
    print(f"| {engine} | " + " | ".join(cells) + " |")
PY
