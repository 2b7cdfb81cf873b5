#!/usr/bin/env bash
# Builds glmserve and runs the embedded default model (glm-4.5-mini: GLM-4.5's architecture
# and vocabulary with seeded random weights) on a prompt, printing the greedy continuation.
#   tools/quickstart.sh [extra glm-run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash tools/install_deps.sh
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)" --target glm-run
"$BUILD_DIR"/tools/glm-run "$@"
