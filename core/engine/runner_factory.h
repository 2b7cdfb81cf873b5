// The runner factory: the one place that knows every backend (core/cpu and core/cuda), so the
// interface (core/model/model_runner.h) stays below both. The engine's front ends (glm-server,
// glm-run, the benchmarks) make their runner here and hand it to Engine::Create.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/cpu/ops/linear.h"
#include "core/model/checkpoint.h"
#include "core/model/model_runner.h"
#include "core/model/parallel_layout.h"
#include "core/model/weights.h"

namespace glmserve {

enum class DeviceKind { kAuto, kCpu, kCuda };
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name);

// kAuto picks CUDA when a usable GPU is present (run-time check), else the CPU; kCuda fails
// with FAILED_PRECONDITION when the build has no CUDA backend or no GPU is present.
// cpu_math: the CPU backend's linear arithmetic (core/cpu/ops/linear.h); the CUDA backend has its
// own and ignores it.
// upload_progress: called as the CUDA backend streams the weights to the device (the bytes
// copied so far; core/model/checkpoint.h's DescribeLoadProgress words it); ignored on the CPU.
// fp8_tensor_cores: the CUDA backend's FP8 GEMMs (glm-server --fp8_tensor_cores; docs/cuda.md
// "FP8 on tensor cores"); ignored on the CPU.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(
    ModelWeights weights, DeviceKind device, CpuMath cpu_math = CpuMath::kExact,
    const LoadProgressCallback& upload_progress = nullptr,
    Fp8TensorCores fp8_tensor_cores = Fp8TensorCores::kOff);

// A tensor-parallel group of CPU ranks (docs/parallel.md): each rank a thread with its slice of
// `weights` (core/model/weight_shard.h), `threads_per_rank` pool threads (0: the process's
// threads divided among the ranks) pinned to its CPUs (core/base/cpu_topology.h: a NUMA node
// each when there are as many nodes as ranks), sums through the in-process communicator.
// INVALID_ARGUMENT for a layout the model cannot take (CheckParallelLayout); `how`, when
// given, receives the pinning line for the startup summary.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuTensorParallelRunner(
    ModelWeights weights, const ParallelConfig& parallel, CpuMath cpu_math,
    int threads_per_rank = 0, std::string* how = nullptr);

}  // namespace glmserve
