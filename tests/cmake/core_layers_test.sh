#!/usr/bin/env bash
# The layering of core/ is enforced (cmake/core_layers.cmake): the tree as it is passes, and a
# deliberately wrong include (core/text including the engine, core/cpu including core/cuda, a
# file at core/'s top) fails the check on its own, the configure and the build.
#   core_layers_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
check() { cmake -DGLM_LAYERS_ROOT="$1" -P "$1/cmake/core_layers.cmake"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# A copy of what configuring the engine alone reads.
copy() {
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  cp -r "$src/CMakeLists.txt" "$src/cmake" "$src/core" "$src/tools" "$work/tree/"
}
# expect_violation NAME FILE INCLUDE: the check fails naming FILE and INCLUDE.
expect_violation() {
  local name=$1 file=$2 include=$3
  copy
  echo "#include \"$include\"" >>"$work/tree/$file"
  if check "$work/tree" >"$work/out.txt" 2>&1; then fail "$name: the check passed"; fi
  grep -q "$file includes $include" "$work/out.txt" || { cat "$work/out.txt"; fail "$name: not named"; }
  echo "ok: $name refused"
}

check "$src" || fail "the tree as it is violates its layering"
echo "ok: the tree passes"
expect_violation "text -> engine" core/text/unicode.h core/engine/engine.h
expect_violation "cpu -> cuda" core/cpu/ops/norm.cc core/cuda/runner.h
expect_violation "model -> cpu" core/model/weights.h core/cpu/ops/linear.h
expect_violation "base -> model" core/base/parallel.cc core/model/config.h
expect_violation "core -> server" core/engine/engine.cc server/status.h
copy
touch "$work/tree/core/stray.h"
if check "$work/tree" >"$work/out.txt" 2>&1; then fail "a file at core/'s top passed"; fi
grep -q "core/stray.h: every core file lives in a layer's folder" "$work/out.txt" ||
  { cat "$work/out.txt"; fail "core/stray.h not named"; }
echo "ok: a top-level core/ file refused"

# The same through CMake: the engine alone configures; then a wrong include fails the build
# (the check is a build step of every core library) and the next configure.
copy
opts=(-DGLMSERVE_BUILD_SERVER=OFF -DGLMSERVE_BUILD_TESTS=OFF -DGLMSERVE_BUILD_BENCH=OFF
      -DGLMSERVE_CUDA=OFF -DCMAKE_CUDA_COMPILER=NOTFOUND)
cmake -S "$work/tree" -B "$work/build" "${opts[@]}" >"$work/out.txt" 2>&1 ||
  { cat "$work/out.txt"; fail "the clean copy does not configure"; }
cmake --build "$work/build" --target glm_core_layers >"$work/out.txt" 2>&1 ||
  { cat "$work/out.txt"; fail "the clean copy fails the build's check"; }
echo '#include "core/cuda/runner.h"' >>"$work/tree/core/cpu/ops/norm.cc"
if cmake --build "$work/build" --target glm_core_layers >"$work/out.txt" 2>&1; then
  fail "the build passed with core/cpu including core/cuda"
fi
grep -q "core/cpu/ops/norm.cc includes core/cuda/runner.h" "$work/out.txt" ||
  { cat "$work/out.txt"; fail "the build's failure does not name the include"; }
echo "ok: the build fails"
if cmake -S "$work/tree" -B "$work/build" "${opts[@]}" >"$work/out.txt" 2>&1; then
  fail "the configure passed with core/cpu including core/cuda"
fi
grep -q "core/ layering violated" "$work/out.txt" || { cat "$work/out.txt"; fail "configure"; }
echo "ok: the configure fails"
