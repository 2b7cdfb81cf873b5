#include "core/engine/runner_factory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/cpu_topology.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/cpu/cpu_model.h"
#include "core/cuda/runner.h"
#include "core/model/communicator.h"
#include "core/model/rank_group.h"
#include "core/model/weight_shard.h"

namespace glmserve {

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name) {
  if (name == "auto") return DeviceKind::kAuto;
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("device '", name, "' is not one of auto, cpu, cuda"));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(
    ModelWeights weights, DeviceKind device, CpuMath cpu_math,
    const LoadProgressCallback& upload_progress, Fp8TensorCores fp8_tensor_cores) {
  // GLM-5: a shared indexer layer reuses the top-k of the full layer before it, so a served
  // span must start at a full layer (refused here, at start-up, rather than at every step).
  const ModelConfig& c = weights.config;
  if (c.is_mla() && weights.layer_begin < weights.layer_end &&
      !c.has_indexer(weights.layer_begin)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the layer span starts at layer ", weights.layer_begin,
        ", a 'shared' DSA indexer layer whose top-k comes from an earlier layer; start the "
        "span at a 'full' layer (indexer_types in config.json)"));
  }
  // FP8 checkpoints, GLM-4.5's and GLM-5's, run on both backends (docs/fp8.md); int8 weights
  // quantized at load only on the CPU.
  const bool int8 = weights.linear_format == WeightFormat::kInt8Groups;
  if (int8 && device == DeviceKind::kCuda) {
    return absl::FailedPreconditionError(
        "int8 weights (quantized at load) run on the CPU backend only: use --device=cpu");
  }
  // --device=auto takes the GPU only for a model the CUDA backend runs (int8 weights stay on
  // the CPU).
  const bool cuda_runs_it = CudaUnsupportedReason(weights.config).empty() && !int8;
  const bool to_cuda = device == DeviceKind::kCuda ||
                       (device == DeviceKind::kAuto && cuda_runs_it && CudaDeviceAvailable());
  if (!weights.device_generated_fp8.empty() && !to_cuda) {
    // Their codes exist only once the CUDA uploader generates them.
    return absl::FailedPreconditionError(
        "the FP8 preset's codes are generated on the CUDA device (RandomWeightOptions::"
        "fp8_codes_on_device): run it with --device=cuda");
  }
  if (to_cuda) return CreateCudaRunner(std::move(weights), upload_progress, fp8_tensor_cores);
  return std::unique_ptr<ModelRunner>(std::make_unique<CpuModel>(std::move(weights), cpu_math));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuTensorParallelRunner(
    ModelWeights weights, const ParallelConfig& parallel, CpuMath cpu_math, int threads_per_rank,
    std::string* how) {
  const int64_t unit = WeightSplitUnit(weights);
  RETURN_IF_ERROR(CheckParallelLayout(weights.config, parallel, unit));
  const int n = parallel.tensor_parallel;
  RankGroupOptions options;
  options.rank_cpus = RankCpuSets(n, how);
  options.threads_per_rank =
      threads_per_rank > 0 ? threads_per_rank : std::max(1, NumThreads() / n);
  // The whole model's views stay alive in every rank's weights (shared storage); the group
  // keeps this copy only until each rank has taken its slice.
  auto whole = std::make_shared<const ModelWeights>(std::move(weights));
  ASSIGN_OR_RETURN(
      std::unique_ptr<RankGroup> group,
      RankGroup::Create(
          whole->config, parallel, options, CreateThreadGroup(n),
          [&](int rank, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
            const RankLayout layout = LayoutOf(whole->config, parallel, rank, unit);
            ASSIGN_OR_RETURN(ModelWeights mine, ShardWeights(*whole, layout));
            return std::unique_ptr<ModelRunner>(
                std::make_unique<CpuModel>(std::move(mine), cpu_math, layout, comm));
          }));
  return std::unique_ptr<ModelRunner>(std::move(group));
}

}  // namespace glmserve
