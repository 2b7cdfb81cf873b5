#!/usr/bin/env bash
# tools/runtime_packages.sh, which the Dockerfile's runtime stage relies on, resolves every
# shared library of the built glm-server and glm-client to an installed package, and the list
# has the libraries the server needs (gRPC, protobuf, Abseil, prometheus-cpp). And no binary
# needs a CUDA library at load time (a CUDA build links the runtime statically and loads the
# driver and cuBLAS itself), so the same binaries start on CPU-only hosts.
# Usage: runtime_packages_test.sh REPO_ROOT BINARY...
set -euo pipefail
root=$1
shift
command -v dpkg-query >/dev/null || { echo "SKIP: not a dpkg-based system"; exit 77; }
if command -v readelf >/dev/null; then
  for binary in "$@"; do
    if readelf -d "$binary" | grep NEEDED | grep -Ei 'libcud|libcublas|libnv'; then
      echo "FAIL: $binary needs a CUDA library at load time"
      exit 1
    fi
  done
else
  echo "FAIL: readelf (binutils) not found"
  exit 1
fi
packages=$(bash "$root/tools/runtime_packages.sh" "$@")
echo "$packages"
for want in '^libgrpc\+\+' '^libprotobuf[0-9]' '^libabsl' '^libprometheus-cpp-core' '^libc6$'; do
  grep -Eq "$want" <<<"$packages" || { echo "FAIL: no package matching $want"; exit 1; }
done
# /metrics and the OpenAI endpoint are served by the event-driven server (Boost, header-only):
# neither civetweb nor prometheus-cpp's pull exposer is loaded any more.
if grep -Eq '^libcivetweb|^libprometheus-cpp-pull' <<<"$packages"; then
  echo "FAIL: civetweb or prometheus-cpp-pull in the runtime list"
  exit 1
fi
if grep -Eq -- '-dev$|^cmake$|^g\+\+' <<<"$packages"; then
  echo "FAIL: a build-only package in the runtime list"
  exit 1
fi
echo "runtime_packages: $(wc -l <<<"$packages") packages"
