#!/usr/bin/env bash
# The installed packages: `cmake --install` into a temporary prefix, then a consumer outside
# the repository built twice, with find_package(glmserve) (glmserve::client) and with
# pkg-config (glmserve-client), each run. Neither may link the engine or a CUDA library.
# Usage: consumer_test.sh BUILD_DIR CONSUMER_SOURCE_DIR
set -euo pipefail
build=$1
source=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/glm-server bin/glm-client bin/glm-run lib/cmake/glmserve/glmserveConfig.cmake \
         lib/pkgconfig/glmserve-client.pc include/glmserve/client/client.h \
         include/glmserve/glmserve/v1/glmserve.pb.h share/glmserve/proto/glmserve/v1/glmserve.proto; do
  # GNUInstallDirs may choose lib64 or a multiarch libdir: accept any lib*/ spelling.
  found=$(cd "$prefix" && compgen -G "${f/#lib\//lib*/}" || true)
  [ -n "$found" ] || { echo "FAIL: the install lacks $f"; exit 1; }
done
# protoc-gen-go refuses a .proto without an import path.
grep -q '^option go_package = ' "$prefix/share/glmserve/proto/glmserve/v1/glmserve.proto" ||
  { echo "FAIL: glmserve.proto has no go_package option"; exit 1; }
libdir=$(dirname "$(dirname "$(cd "$prefix" && compgen -G 'lib*/cmake/glmserve' | head -1)")")
targets=$(cat "$prefix/$libdir"/cmake/glmserve/glmserveTargets*.cmake)
if grep -Eq 'glm_core|CUDA::|cudart|nlohmann' <<<"$targets"; then
  echo "FAIL: the exported client targets reference the engine or CUDA"
  exit 1
fi

cmake -S "$source" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/cmake-build" -j 2 >/dev/null
"$tmp/cmake-build/consumer"

export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
pkg-config --exact-version="$(pkg-config --modversion glmserve-client)" glmserve-client
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
g++ -std=c++20 -o "$tmp/pc-consumer" "$source/main.cc" $(pkg-config --cflags --libs glmserve-client)
"$tmp/pc-consumer"

for b in "$tmp/cmake-build/consumer" "$tmp/pc-consumer"; do
  if readelf -d "$b" | grep NEEDED | grep -Ei 'libcud|libcublas|libopenblas'; then
    echo "FAIL: $b links a CUDA or BLAS library"
    exit 1
  fi
done
echo "packaging: find_package and pkg-config consumers built and ran"
