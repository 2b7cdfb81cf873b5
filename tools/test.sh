#!/usr/bin/env bash
# Builds everything and runs every test: the command the README gives and .ci/run calls.
#   tools/test.sh            # install deps if missing, configure, build, ctest, the engine-alone
#                            # build with the CUDA emulation tests, the engine's threads
#                            # under ThreadSanitizer, 30 s per fuzzer
# BUILD_DIR (default: build) and JOBS (default: nproc) may be set in the environment.
# The build is tools/build.sh, the same script the Dockerfile's build stage runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

TARGETS="" BUILD_DIR="$BUILD_DIR" JOBS="$JOBS" bash tools/build.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
# The engine on its own (GLMSERVE_BUILD_SERVER=OFF, with gRPC, protobuf, prometheus-cpp and
# BLAS made unfindable: core/ must configure and build with Abseil and nlohmann-json alone),
# which is also the build the CUDA emulation needs: the CUDA backend's GPU tests on the CPU
# (tools/cuda_emu, ctest label cuda_emu). EMU=0 skips it.
if [ "${EMU:-1}" != 0 ]; then
  EMU_DIR="${BUILD_DIR}-emu"
  cmake -S . -B "$EMU_DIR" -DCMAKE_BUILD_TYPE=Release -DGLMSERVE_CUDA=OFF -DGLMSERVE_CUDA_EMU=ON \
    -DGLMSERVE_BUILD_SERVER=OFF -DGLMSERVE_BUILD_BENCH=OFF -DCMAKE_DISABLE_FIND_PACKAGE_gRPC=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON
  cmake --build "$EMU_DIR" -j "$JOBS" --target glm-run cuda_emu_all
  ctest --test-dir "$EMU_DIR" -L cuda_emu --output-on-failure -j "$JOBS"
fi
# The engine's threads under ThreadSanitizer (its own build in ${BUILD_DIR}-tsan, the engine
# alone as above): the step executor and overlapped steps, event delivery, the thread pool,
# the tensor-parallel rank group and its communicators (in-process and over TCP), the step
# channel to worker processes, a leader and a worker assembling a group. TSAN=0 skips it.
if [ "${TSAN:-1}" != 0 ]; then
  TSAN_DIR="${BUILD_DIR}-tsan"
  cmake -S . -B "$TSAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGLMSERVE_CUDA=OFF \
    -DGLMSERVE_BUILD_SERVER=OFF -DGLMSERVE_BUILD_BENCH=OFF -DCMAKE_DISABLE_FIND_PACKAGE_gRPC=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread"
  TSAN_TESTS="core_base_parallel_test core_engine_event_delivery_test
    core_engine_device_sampling_test core_engine_overlap_test core_engine_engine_test
    core_model_communicator_test core_model_rank_group_test core_model_socket_communicator_test
    core_model_remote_ranks_test core_engine_multi_node_test"
  # shellcheck disable=SC2086
  cmake --build "$TSAN_DIR" -j "$JOBS" --target $TSAN_TESTS
  for t in $TSAN_TESTS; do
    filter='*'
    # The engine suite's overlapped mode and its thread-heavy cases (its other math modes
    # exercise the kernels, not the threads).
    [ "$t" = core_engine_engine_test ] && filter='*overlap*:EngineTest.*'
    # Its forked-process cases: ThreadSanitizer does not follow a threaded program's fork.
    [ "$t" = core_model_socket_communicator_test ] && filter='-*Process*'
    echo "== $t (ThreadSanitizer)"
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      "$TSAN_DIR/tests/$t" --gtest_filter="$filter" --gtest_brief=1
  done
fi
# Every fuzz target for a short fixed time under libFuzzer + ASan + UBSan (its own clang build
# in build-fuzz/); FUZZ_SECONDS=0 skips it, tools/fuzz.sh 600 is a long run.
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  JOBS="$JOBS" bash tools/fuzz.sh "$FUZZ_SECONDS"
fi
