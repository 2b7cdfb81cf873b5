#!/usr/bin/env bash
# Hand-run comparison of glmserve's CPU engine with llama.cpp on the same checkpoint (never
# run by CI; needs PyPI for the llama-cpp-python sdist and the converter's Python packages,
# or a local llama.cpp checkout). It:
#   1. writes the preset's seeded random bf16 weights as a Hugging Face checkpoint
#      (glm-run --save), plus the tokenizer files from $TOKENIZER_DIR (default: the
#      repository's GLM-structured models/glm-4.5-mini; the GGUF converter requires them);
#   2. builds llama.cpp (llama-bench, llama-batched-bench, llama-quantize and the library)
#      from $LLAMA_CPP_DIR or from the llama-cpp-python source package's vendored copy, with
#      $JOBS jobs, and tools/llama_greedy.cc against it;
#   3. converts the checkpoint to GGUF BF16 (tools/convert_glm_gguf.py around
#      convert_hf_to_gguf.py) and quantizes Q8_0;
#   4. checks the conversion: greedy tokens of glm-run (bf16 mode) and of llama.cpp (BF16) on
#      a short prompt, and how many agree;
#   5. runs both engines in interleaved rounds on the same threads and prints one table of
#      medians: prefill 128 tokens, decode batch 1, decode batch 8 (tokens/s).
# Every step keeps its artefacts in $WORK and is skipped when they exist, so a rerun (say on
# an idle machine) only measures; TIMING_ONLY=1 also refuses to build anything missing.
#
#   WORK=$HOME/glm-cmp tools/compare_llamacpp.sh
#   WORK=$HOME/glm-cmp TIMING_ONLY=1 ROUNDS=5 MODES=exact,bf16,int8 tools/compare_llamacpp.sh
# MODES: the glmserve modes (cpu_bench --modes) to measure; LLAMA_TYPES: BF16 and/or Q8_0.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-glm-4.5-air:layers=2}
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
if ! need "$lbuild/bin/llama-batched-bench"; then
  cmake -S "$LLAMA_CPP_DIR" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
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

# 4. The conversion check: greedy ids from the same prompt ids.
glm_greedy=$("$BUILD_DIR/tools/glm-run" --model="$ckpt" --cpu_math=bf16 --threads="$THREADS" \
  --prompt="$PROMPT" --max_new_tokens=16 | awk '$1 == "greedy" { print $2 }')
llama_greedy=$("$greedy_bin" "$bf16" "$PROMPT" 16 "$THREADS" 2>/dev/null)
python3 - "$glm_greedy" "$llama_greedy" <<'PY' | tee "$WORK/greedy.txt"
import sys
a, b = (s.split(",") for s in sys.argv[1:3])
same = sum(x == y for x, y in zip(a, b))
prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"greedy glmserve bf16: {','.join(a)}\ngreedy llama.cpp BF16: {','.join(b)}")
print(f"agreement: {same}/{len(a)} positions, identical prefix {prefix}/{len(a)}")
PY

# 5. Interleaved rounds: each round runs cpu_bench once over all MODES (one weight generation),
# then llama.cpp for each type. Each measurement appends "engine<TAB>phase<TAB>tokens/s".
results="$WORK/results.tsv"
: > "$results"
glmserve_round() {
  "$BUILD_DIR/bench/cpu_bench" --preset="$PRESET" --threads="$THREADS" --modes="$MODES" |
    tee -a "$WORK/cpu_bench.log" |
    awk -F'|' '$3 ~ /prefill|decode batch/ && $3 !~ /roofline/ {
      mode = $2; phase = $3; tps = $5
      gsub(/^ +| +$/, "", mode); gsub(/^ +| +$/, "", phase); gsub(/ /, "", tps)
      sub(/prefill [0-9]+/, "prefill 128", phase)
      print "glmserve " mode "\t" phase "\t" tps }' >> "$results"
}
# Q8_0 with weight repacking takes ggml's AMX int8 path for prefill on CPUs that list
# amx_int8, which died with SIGILL on the development VM: Q8_0 runs unrepacked unless
# LLAMA_Q8_REPACK=1.
LLAMA_Q8_REPACK=${LLAMA_Q8_REPACK:-0}
llama_round() {
  local name=$1 gguf=$2 repack=1
  [ "$name" = Q8_0 ] && repack=$LLAMA_Q8_REPACK
  local no_repack=()
  [ "$repack" = 1 ] || no_repack=(--no-repack)
  # llama-bench: pp128 (prefill) and tg16 (decode batch 1), CSV.
  "$lbuild/bin/llama-bench" -m "$gguf" -t "$THREADS" -p 128 -n 16 -r 1 --repack "$repack" \
    -o csv 2>/dev/null |
    python3 -c 'import csv, sys
for row in csv.DictReader(sys.stdin):
    phase = "prefill 128" if int(row["n_gen"]) == 0 else "decode batch 1"
    print("llama.cpp '"$name"'\t%s\t%.2f" % (phase, float(row["avg_ts"])))' >> "$results"
  # llama-batched-bench: 8 parallel sequences of 16 prompt + 16 generated tokens; S_TG t/s.
  "$lbuild/bin/llama-batched-bench" -m "$gguf" -t "$THREADS" -c 4096 -npp 16 -ntg 16 -npl 8 \
    "${no_repack[@]}" --output-format jsonl 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        print("llama.cpp '"$name"'\tdecode batch 8\t%.2f" % json.loads(line)["speed_tg"])' >> "$results"
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
python3 - "$results" "$PRESET" "$THREADS" "$ROUNDS" "$(cat /proc/loadavg)" <<'PY'
import statistics, sys
path, preset, threads, rounds, load = sys.argv[1:]
rows = {}
for line in open(path):
    engine, phase, value = line.rstrip("\n").split("\t")
    rows.setdefault(engine, {}).setdefault(phase, []).append(float(value))
phases = ["prefill 128", "decode batch 1", "decode batch 8"]
print(f"{preset}, {threads} threads, medians of {rounds} interleaved rounds, tokens/s "
      f"(load average at the end: {load.split()[0]})\n")
print("| engine | " + " | ".join(phases) + " |")
print("|---|" + "---|" * len(phases))
for engine, by_phase in rows.items():
    cells = [f"{statistics.median(by_phase[p]):.1f}" if p in by_phase else "-" for p in phases]
    print(f"| {engine} | " + " | ".join(cells) + " |")
PY
