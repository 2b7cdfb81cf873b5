#!/usr/bin/env bash
# Builds everything and runs every test: the command the README gives and .ci/run calls.
#   tools/test.sh            # install deps if missing, configure, build, ctest
# BUILD_DIR (default: build) and JOBS (default: nproc) may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

bash tools/install_deps.sh
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
