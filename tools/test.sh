#!/usr/bin/env bash
# Builds everything and runs every test: the command the README gives and .ci/run calls.
#   tools/test.sh            # install deps if missing, configure, build, ctest, 30 s per fuzzer
# BUILD_DIR (default: build) and JOBS (default: nproc) may be set in the environment.
# The build is tools/build.sh, the same script the Dockerfile's build stage runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

TARGETS="" BUILD_DIR="$BUILD_DIR" JOBS="$JOBS" bash tools/build.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
# Every fuzz target for a short fixed time under libFuzzer + ASan + UBSan (its own clang build
# in build-fuzz/); FUZZ_SECONDS=0 skips it, tools/fuzz.sh 600 is a long run.
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  JOBS="$JOBS" bash tools/fuzz.sh "$FUZZ_SECONDS"
fi
