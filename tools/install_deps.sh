#!/usr/bin/env bash
# Installs every build and test dependency of glmserve from Debian's packages.
# Idempotent: packages already present are left as they are. Used by .ci/run (through
# tools/test.sh and tools/build.sh), the README quick start and the Dockerfile's build stage,
# so that all three build against the same libraries. The names are Debian 12's; Ubuntu 24.04
# (the CUDA image's distribution) has every one of them under the same name.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git ca-certificates
  # core: Abseil for Status/flags, nlohmann-json for config.json and safetensors headers;
  # OpenBLAS only for the benchmark's GEMM-peak reference (the engine has its own kernels).
  libabsl-dev nlohmann-json3-dev libopenblas-openmp-dev
  # server and client: gRPC (callback API, health, reflection) with protobuf and the code
  # generators, prometheus-cpp (its core: the registry and the text serializer of /metrics)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc prometheus-cpp-dev
  # the HTTP server of the OpenAI-compatible endpoint and /metrics: Boost.Beast on Boost.Asio
  # (header-only, nothing at run time)
  libboost-dev
  # tests and benchmarks (openssl: throwaway CA and certificates for the TLS tests; libcurl:
  # the real HTTP client of the OpenAI endpoint's tests)
  libgtest-dev libgmock-dev libbenchmark-dev openssl libcurl4-openssl-dev
  # deployment tests (tests/deploy): promtool and a real Prometheus server, curl and jq to
  # query it, python3 with PyYAML to parse the manifests, dashboards and rules
  prometheus curl jq python3 python3-yaml
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

# The prometheus package is here for its binaries only (the tests start their own server on a
# free loopback port). On a machine with systemd, the package enables and starts a system
# service on :9090, glm-server's default metrics port: stop what this script just installed.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ] &&
    systemctl is-active --quiet prometheus 2>/dev/null; then
  echo "install_deps: stopping and disabling the prometheus system service (tests run their own)"
  $SUDO systemctl disable --now prometheus || true
fi
