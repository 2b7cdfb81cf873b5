# syntax=docker/dockerfile:1
# glm-server container image, multi-stage.
#
#   docker build -t glmserve:0.1.0-cuda .                           # CUDA image (default)
#   docker build --build-arg VARIANT=cpu -t glmserve:0.1.0-cpu .    # CPU-only image, Debian 12
#   docker run --rm -p 50051:50051 -p 9090:9090 glmserve:0.1.0-cpu  # the embedded glm-4.5-kjv
#   docker run --rm --gpus all -v /models:/models:ro -p 50051:50051 -p 9090:9090 \
#       glmserve:0.1.0-cuda --model=/models/GLM-4.5-Air --device=cuda
#
# The build stage runs the same scripts as CI (.ci/run -> tools/test.sh -> tools/build.sh ->
# tools/install_deps.sh), so every CI run exercises this file's build steps; the runtime stage
# installs only the shared libraries the binaries load (tools/runtime_packages.sh, also run by
# CI). tests/deploy/check_dockerfile.py checks this file statically (no Docker engine in CI).
#
# Distributions: the CUDA variant builds on NVIDIA's CUDA devel image for Ubuntu 24.04, whose
# archive has every package tools/install_deps.sh names under its Debian 12 name (gRPC 1.51,
# Abseil 20220623, protobuf 3.21, prometheus-cpp 1.0 in universe); NVIDIA publishes no Debian
# CUDA image. The CPU variant builds on Debian 12 itself, the distribution CI runs on.
# Each runtime stage is the same distribution release as its build stage.

# cuda: the CUDA backend (GPU detected at run time; falls back to the CPU without one).
# cpu: no CUDA toolkit, no CUDA libraries.
ARG VARIANT=cuda
# CUDA 13.0 is what CI compiles the CUDA backend with; it needs an NVIDIA driver >= 580.
# For older drivers build with a 12.x tag, e.g. --build-arg CUDA_VERSION=12.8.1 (untested here).
ARG CUDA_VERSION=13.0.1
ARG UBUNTU_VERSION=24.04
ARG DEBIAN_VERSION=bookworm

# ---- toolchains -----------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS toolchain-cuda
# sm_80 (A100) and sm_90 (H100, H200); add e.g. 100 for B200.
ARG CUDA_ARCHITECTURES="80;90"
ENV GLMSERVE_CMAKE_ARGS="-DGLMSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"

FROM debian:${DEBIAN_VERSION} AS toolchain-cpu
ENV GLMSERVE_CMAKE_ARGS="-DGLMSERVE_CUDA=OFF"

# ---- build ----------------------------------------------------------------------------------
FROM toolchain-${VARIANT} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when the package list changes.
COPY tools/install_deps.sh tools/install_deps.sh
RUN bash tools/install_deps.sh
COPY . .
# JOBS: parallel compile jobs (default: every core of the build machine).
ARG JOBS=""
# tools/build.sh is CI's build (install_deps.sh, then the same cmake configure and build);
# here without the tests and benchmarks, and only the shipped binaries.
RUN BUILD_DIR=/build JOBS="${JOBS:-$(nproc)}" TARGETS="glm-server glm-client glm-run" \
    bash tools/build.sh ${GLMSERVE_CMAKE_ARGS} -DGLMSERVE_BUILD_TESTS=OFF -DGLMSERVE_BUILD_BENCH=OFF
# The shipped models where glm-server looks for them (BIN/../share/glmserve/models): the
# embedded default glm-4.5-kjv (a small trained checkpoint, docs/default_model.md) and
# glm-4.5-mini's tokenizer.
RUN mkdir -p /out/bin /out/share/glmserve/models/glm-4.5-kjv /out/share/glmserve/models/glm-4.5-mini \
    && cp models/glm-4.5-kjv/*.json models/glm-4.5-kjv/model.safetensors \
          /out/share/glmserve/models/glm-4.5-kjv/ \
    && cp models/glm-4.5-mini/tokenizer.json models/glm-4.5-mini/tokenizer_config.json \
          models/glm-4.5-mini/generation_config.json /out/share/glmserve/models/glm-4.5-mini/ \
    && cp /build/server/glm-server /build/client/glm-client /build/tools/glm-run /out/bin/ \
    && strip /out/bin/* \
    && bash tools/runtime_packages.sh /out/bin/* > /out/runtime-packages.txt \
    && cat /out/runtime-packages.txt

# ---- runtime bases ----------------------------------------------------------------------------
# The CUDA runtime image carries cudart and cuBLAS; the driver comes from the host (NVIDIA
# container toolkit / device plugin).
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS runtime-cuda
FROM debian:${DEBIAN_VERSION}-slim AS runtime-cpu

# ---- runtime --------------------------------------------------------------------------------
FROM runtime-${VARIANT} AS runtime
ARG VARIANT
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive xargs -a /tmp/runtime-packages.txt \
       apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
# A fixed numeric non-root user, so that Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 glm \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin glm
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/share/ /usr/local/share/
LABEL org.opencontainers.image.title="glmserve" \
      org.opencontainers.image.description="gRPC inference server for the GLM-4.5 MoE family (${VARIANT})"
USER 10001:10001
# gRPC (--port) and Prometheus /metrics (--metrics_port): glm-server's defaults.
EXPOSE 50051 9090
# Ready = weights loaded and a warm-up request run (grpc.health.v1, service "readiness").
# The start period is the startupProbe's 30 minutes (docs/operations.md: reading 213.7 GB at
# 200 MB/s takes 18), so a slow load is not reported unhealthy.
# Docker only; Kubernetes uses its own gRPC probes (deploy/).
HEALTHCHECK --interval=15s --timeout=10s --start-period=1800s --retries=3 \
    CMD ["/usr/local/bin/glm-client", "--target=127.0.0.1:50051", "--service=readiness", "--max_attempts=1", "health"]
# A container listens on every interface (glm-server's own default is loopback only). SIGTERM
# drains (readiness NOT_SERVING, calls in flight get --drain_grace, default 30 s).
ENTRYPOINT ["/usr/local/bin/glm-server", "--address=0.0.0.0"]
# No arguments: the embedded default model (glm-4.5-mini, seeded random weights) on the GPU
# when one is usable, else the CPU. Pass e.g. --model=/models/GLM-4.5-Air to serve a checkpoint.
CMD []
