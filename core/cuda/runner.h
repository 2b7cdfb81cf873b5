// The CUDA backend's entry points. Declared for every build; without the CUDA backend
// (GLMSERVE_CUDA off) they report that no GPU path exists, so callers need no #ifdefs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/communicator.h"
#include "core/model/config.h"
#include "core/model/gpu_memory_plan.h"
#include "core/model/model_runner.h"
#include "core/model/parallel_layout.h"

namespace glmserve {

// True when this build has the CUDA backend and a usable GPU is present at run time.
bool CudaDeviceAvailable();
// Why CudaDeviceAvailable() is false ("built without CUDA", "no CUDA device: ..."), or the
// device's name when it is true.
std::string CudaDeviceDescription();

// The first GPU's free and total memory (cudaMemGetInfo); FAILED_PRECONDITION without one.
// For the memory planner (core/model/gpu_memory_plan.h).
absl::StatusOr<GpuMemoryInfo> CudaMemoryInfo();

// Why the CUDA backend cannot run `config` ("" when it can). Every architecture the loader
// accepts has device kernels (GLM-5 since issue 15); kept as the one place a future
// architecture without kernels is refused, before any device probe.
inline std::string CudaUnsupportedReason(const ModelConfig& config) {
  (void)config;
  return "";
}

// A ModelRunner on the first GPU; FAILED_PRECONDITION when none is usable, UNIMPLEMENTED
// for a model the backend has no kernels for (CudaUnsupportedReason). `upload_progress`
// follows the weights' copy to the device (CudaModelOptions::upload_progress);
// fp8_tensor_cores: CudaModelOptions::fp8_tensor_cores (kOn: fp8_tensor_cores_required).
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    ModelWeights weights, const LoadProgressCallback& upload_progress = nullptr,
    Fp8TensorCores fp8_tensor_cores = Fp8TensorCores::kOff);

// A tensor-parallel group of CUDA ranks in this process (docs/parallel.md): rank r on GPU r,
// each with its slice of `weights` (core/model/weight_shard.h), summing and gathering through
// NCCL (loaded at run time; core/cuda/nccl_communicator.h), behind one ModelRunner
// (core/model/rank_group.h) that samples on rank 0's device. FAILED_PRECONDITION without
// NCCL or with fewer GPUs than ranks; INVALID_ARGUMENT for a layout the model cannot take.
// `how` (may be null) gets a line for the log.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaTensorParallelRunner(
    ModelWeights weights, const ParallelConfig& parallel,
    const LoadProgressCallback& upload_progress = nullptr,
    Fp8TensorCores fp8_tensor_cores = Fp8TensorCores::kOff, std::string* how = nullptr);

// The pieces of a CUDA group spanning processes (core/engine/multi_node.h):
// NCCL's unique id for the group, as bytes for the leader's welcome;
absl::StatusOr<std::string> NewCudaGroupId();
// ranks [first_rank, first_rank + count) of `size` in this process, rank first_rank + i on GPU
// first_device + i, joined to the group `id` names (blocks until every rank has joined);
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> JoinCudaGroup(const std::string& id,
                                                                         int first_rank, int count,
                                                                         int size,
                                                                         int first_device);
// and rank `rank`'s CudaModel on GPU `device`, from its slice of `whole`.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRank(const ModelWeights& whole,
                                                            const ParallelConfig& parallel,
                                                            int rank, int device,
                                                            Communicator* comm,
                                                            Fp8TensorCores fp8_tensor_cores);

}  // namespace glmserve
