#!/usr/bin/env bash
# Installs every build and test dependency of glmserve from Debian's packages.
# Idempotent: packages already present are left as they are. Used by .ci/run, the README
# quick start and the Dockerfile, so that all three build against the same libraries.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git ca-certificates
  # core: BLAS for fp32 GEMMs (OpenMP flavour, so it shares one thread pool with our
  # own kernels), Abseil for Status/flags, nlohmann-json for config.json and safetensors headers.
  libopenblas-openmp-dev libabsl-dev nlohmann-json3-dev libomp-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
