#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz) with clang's libFuzzer + ASan + UBSan and runs each for
# a fixed time, starting from its seed corpus in the repository. A crash, leak or sanitizer
# report fails the run and leaves the reproducer in $FUZZ_DIR/<target>/crash-*.
#   tools/fuzz.sh                 # 30 s per target (what tools/test.sh runs in CI)
#   tools/fuzz.sh 600             # a longer run: 10 minutes per target
#   tools/fuzz.sh 60 config_json  # one target
# BUILD_DIR (default: build-fuzz), JOBS (default: nproc), FUZZ_DIR (default: $BUILD_DIR/runs).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-30}
shift || true
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
FUZZ_DIR=${FUZZ_DIR:-$BUILD_DIR/runs}
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(safetensors_header config_json shard_index tensor_codec request_convert text api_request)
fi
# clang with its libFuzzer runtime (Debian's and Ubuntu's versionless package names).
for p in clang libclang-rt-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "fuzz.sh: installing clang libclang-rt-dev"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      clang libclang-rt-dev
    break
  fi
done
ROOT=$(pwd)

CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGLMSERVE_FUZZ=ON -DGLMSERVE_CUDA=OFF -DGLMSERVE_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]/#/fuzz_}"

status=0
for t in "${TARGETS[@]}"; do
  # Mutations go to a scratch corpus; the repository's seeds are read, never written.
  work="$FUZZ_DIR/$t"
  rm -rf "$work" && mkdir -p "$work/corpus"
  echo "== fuzz_$t for ${SECONDS_PER_TARGET}s"
  binary=$(cd "$BUILD_DIR" && pwd)/tests/fuzz/fuzz_$t
  if ! (cd "$work" && "$binary" -max_total_time="$SECONDS_PER_TARGET" \
        -max_len=65536 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        corpus "$ROOT/tests/fuzz/corpus/$t" > log.txt 2>&1); then
    echo "fuzz_$t FAILED; reproducer and log in $work:" >&2
    tail -n 40 "$work/log.txt" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$work/log.txt" | tr '\n' ' '
    echo
  fi
done
exit $status
