#!/usr/bin/env bash
# Hand-run comparison of glmserve's CPU engine with llama.cpp on the same checkpoint (never
# run by CI; needs network access for the llama-cpp-python sdist and Python packages, or a
# local llama.cpp checkout). It:
#   1. writes the preset's seeded random bf16 weights as a Hugging Face checkpoint
#      (glm-run --save), plus the GLM tokenizer files from $TOKENIZER_DIR, which the GGUF
#      converter requires (tokenizer.json, tokenizer_config.json from zai-org/GLM-4.5-Air);
#   2. builds llama.cpp (llama-bench, llama-batched-bench, llama-quantize) from $LLAMA_CPP_DIR
#      or from the llama-cpp-python source package's vendored copy (pip download);
#   3. converts the checkpoint to GGUF BF16 with convert_hf_to_gguf.py and quantizes Q8_0;
#   4. runs both engines in interleaved rounds on the same threads and prints one table of
#      medians: prefill 128 tokens, decode batch 1, decode batch 8 (tokens/s).
#
#   TOKENIZER_DIR=/models/GLM-4.5-Air tools/compare_llamacpp.sh
#   PRESET=glm-4.5-air:layers=2 THREADS=2 ROUNDS=3 LLAMA_CPP_DIR=~/llama.cpp WORK=/tmp/cmp \
#     TOKENIZER_DIR=/models/GLM-4.5-Air tools/compare_llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-glm-4.5-air:layers=2}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-/tmp/glmserve-vs-llamacpp}
BUILD_DIR=${BUILD_DIR:-build}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-}
TOKENIZER_DIR=${TOKENIZER_DIR:?set TOKENIZER_DIR to a directory with the GLM tokenizer files}
mkdir -p "$WORK"

# 1. The checkpoint.
ckpt="$WORK/checkpoint"
if [ ! -f "$ckpt/config.json" ]; then
  "$BUILD_DIR/tools/glm-run" --model="$PRESET" --dtype=bf16 --save="$ckpt"
fi
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  if [ -f "$TOKENIZER_DIR/$f" ]; then cp "$TOKENIZER_DIR/$f" "$ckpt/"; fi
done

# 2. llama.cpp.
if [ -z "$LLAMA_CPP_DIR" ]; then
  if [ ! -d "$WORK/llama-cpp-python" ]; then
    python3 -m pip download --no-deps --no-binary :all: -d "$WORK/sdist" llama-cpp-python
    mkdir -p "$WORK/llama-cpp-python"
    tar -xzf "$WORK"/sdist/llama_cpp_python-*.tar.gz -C "$WORK/llama-cpp-python" --strip-components=1
  fi
  LLAMA_CPP_DIR="$WORK/llama-cpp-python/vendor/llama.cpp"
fi
lbuild="$WORK/llama-build"
if [ ! -x "$lbuild/bin/llama-bench" ]; then
  cmake -S "$LLAMA_CPP_DIR" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DGGML_OPENMP=ON
  cmake --build "$lbuild" -j "$(nproc)" --target llama-bench llama-batched-bench llama-quantize
fi

# 3. GGUF files.
if [ ! -d "$WORK/venv" ]; then
  python3 -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q -r "$LLAMA_CPP_DIR/requirements/requirements-convert_hf_to_gguf.txt"
fi
bf16="$WORK/model-bf16.gguf"
q8="$WORK/model-q8_0.gguf"
[ -f "$bf16" ] || "$WORK/venv/bin/python" "$LLAMA_CPP_DIR/convert_hf_to_gguf.py" "$ckpt" \
  --outtype bf16 --outfile "$bf16"
[ -f "$q8" ] || "$lbuild/bin/llama-quantize" "$bf16" "$q8" Q8_0

# 4. Interleaved rounds. Each measurement appends "engine<TAB>phase<TAB>tokens/s" to results.
results="$WORK/results.tsv"
: > "$results"
glmserve_round() {
  local mode=$1
  "$BUILD_DIR/bench/cpu_bench" --preset="$PRESET" --threads="$THREADS" --modes="$mode" |
    awk -F'|' -v m="glmserve $mode" '
      $3 ~ /prefill/        { gsub(/ /, "", $5); print m "\tprefill 128\t" $5 }
      $3 ~ /decode batch 1/ { gsub(/ /, "", $5); print m "\tdecode batch 1\t" $5 }
      $3 ~ /decode batch 8/ { gsub(/ /, "", $5); print m "\tdecode batch 8\t" $5 }' >> "$results"
}
llama_round() {
  local name=$1 gguf=$2
  # llama-bench: pp128 (prefill) and tg16 (decode batch 1); markdown table, t/s in the last column.
  "$lbuild/bin/llama-bench" -m "$gguf" -t "$THREADS" -p 128 -n 16 -r 1 -o csv |
    awk -F',' -v m="llama.cpp $name" 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i ~ /avg_ts/) c = i; next }
      { gsub(/"/, ""); if ($0 ~ /,128,0,/) print m "\tprefill 128\t" $c; else print m "\tdecode batch 1\t" $c }' >> "$results"
  # llama-batched-bench: 8 parallel sequences of 16 prompt + 16 generated tokens; S_TG t/s.
  "$lbuild/bin/llama-batched-bench" -m "$gguf" -t "$THREADS" -c 4096 -npp 16 -ntg 16 -npl 8 \
    --output-format jsonl 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        print("llama.cpp '"$name"'\tdecode batch 8\t%.2f" % json.loads(line)["speed_tg"])' >> "$results"
}
for round in $(seq "$ROUNDS"); do
  echo "round $round of $ROUNDS" >&2
  glmserve_round exact
  llama_round BF16 "$bf16"
  glmserve_round bf16
  llama_round Q8_0 "$q8"
  glmserve_round int8
done

# Medians per engine and phase.
python3 - "$results" "$PRESET" "$THREADS" "$ROUNDS" <<'PY'
import statistics, sys
path, preset, threads, rounds = sys.argv[1:]
rows = {}
for line in open(path):
    engine, phase, value = line.rstrip("\n").split("\t")
    rows.setdefault(engine, {}).setdefault(phase, []).append(float(value))
phases = ["prefill 128", "decode batch 1", "decode batch 8"]
print(f"{preset}, {threads} threads, medians of {rounds} interleaved rounds, tokens/s\n")
print("| engine | " + " | ".join(phases) + " |")
print("|---|" + "---|" * len(phases))
for engine, by_phase in rows.items():
    cells = [f"{statistics.median(by_phase[p]):.1f}" if p in by_phase else "-" for p in phases]
    print(f"| {engine} | " + " | ".join(cells) + " |")
PY
