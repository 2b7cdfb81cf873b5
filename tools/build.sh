#!/usr/bin/env bash
# Installs the dependencies (tools/install_deps.sh), configures and builds: the one build
# recipe that CI (tools/test.sh), the quick start (tools/quickstart.sh) and the Dockerfile's
# build stage all run, so that CI exercises the container build's steps.
#   tools/build.sh [extra cmake -D options]
#   BUILD_DIR=build  JOBS=$(nproc)  TARGETS="glm-server glm-client"   (environment, optional)
# TARGETS empty (the default): build everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
TARGETS=${TARGETS:-}

bash tools/install_deps.sh
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
if [ -n "$TARGETS" ]; then
  # shellcheck disable=SC2086  # TARGETS is a space-separated list of target names
  cmake --build "$BUILD_DIR" -j "$JOBS" --target $TARGETS
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
