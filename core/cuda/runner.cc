// The CUDA backend's entry points (core/cuda/runner.h) in builds with GLMSERVE_CUDA on.
// Device presence is a run-time question: a driver-less machine or one without a GPU gets
// false here (never an abort), so one binary serves both.
#include "core/cuda/runner.h"

#include <cuda_runtime.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cuda/model.h"
#include "core/cuda/nccl_communicator.h"
#include "core/model/rank_group.h"
#include "core/model/weight_shard.h"

namespace glmserve {
namespace {

struct Probe {
  bool available = false;
  std::string description;
};

// Looked up once per process: initialising the driver is not free.
const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      p.description = absl::StrCat("no CUDA device: cudaGetDeviceCount failed with ",
                                   cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
      return p;
    }
    if (count == 0) {
      p.description = "no CUDA device: cudaGetDeviceCount found none";
      return p;
    }
    cudaDeviceProp prop;
    if (const cudaError_t pe = cudaGetDeviceProperties(&prop, 0); pe != cudaSuccess) {
      cudaGetLastError();
      p.description = absl::StrCat("no CUDA device: cudaGetDeviceProperties(0) failed with ",
                                   cudaGetErrorName(pe));
      return p;
    }
    // bf16 tensor-core GEMMs and the kernels' sm_80 / sm_90 builds need compute capability 8.0.
    if (prop.major < 8) {
      p.description =
          absl::StrCat("no CUDA device: GPU 0 (", prop.name, ") has compute capability ",
                       prop.major, ".", prop.minor, "; the CUDA backend needs 8.0 or newer");
      return p;
    }
    p.available = true;
    p.description = absl::StrCat("cuda:0 ", prop.name, " (compute capability ", prop.major, ".",
                                 prop.minor, ", ", prop.totalGlobalMem >> 20, " MiB)");
    return p;
  }();
  return probe;
}

// Rank `rank`'s CudaModel: its slice of `whole`, uploaded to options.device.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRank(const ModelWeights& whole,
                                                        const ParallelConfig& parallel, int rank,
                                                        const cuda::CudaModelOptions& options,
                                                        Communicator* comm) {
  const RankLayout layout = LayoutOf(whole.config, parallel, rank, WeightSplitUnit(whole));
  ASSIGN_OR_RETURN(ModelWeights mine, ShardWeights(whole, layout));
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaModel> model,
                   cuda::CudaModel::CreateRank(std::move(mine), options, layout, comm));
  return std::unique_ptr<ModelRunner>(std::move(model));
}

}  // namespace

bool CudaDeviceAvailable() { return GetProbe().available; }

std::string CudaDeviceDescription() { return GetProbe().description; }

absl::StatusOr<GpuMemoryInfo> CudaMemoryInfo() {
  if (!CudaDeviceAvailable()) return absl::FailedPreconditionError(CudaDeviceDescription());
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemGetInfo: ", cudaGetErrorString(err)));
  }
  return GpuMemoryInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    ModelWeights weights, const LoadProgressCallback& upload_progress,
    Fp8TensorCores fp8_tensor_cores) {
  // Refused before the device probe, so the answer is the same with or without a GPU.
  if (std::string why = CudaUnsupportedReason(weights.config); !why.empty()) {
    return absl::UnimplementedError(why);
  }
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError(absl::StrCat("--device=cuda: ", CudaDeviceDescription()));
  }
  cuda::CudaModelOptions options;
  options.upload_progress = upload_progress;
  options.fp8_tensor_cores = fp8_tensor_cores != Fp8TensorCores::kOff;
  options.fp8_tensor_cores_required = fp8_tensor_cores == Fp8TensorCores::kOn;
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaModel> model,
                   cuda::CudaModel::Create(std::move(weights), options));
  return std::unique_ptr<ModelRunner>(std::move(model));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaTensorParallelRunner(
    ModelWeights weights, const ParallelConfig& parallel,
    const LoadProgressCallback& upload_progress, Fp8TensorCores fp8_tensor_cores,
    std::string* how) {
  if (std::string why = CudaUnsupportedReason(weights.config); !why.empty()) {
    return absl::UnimplementedError(why);
  }
  const int n = parallel.tensor_parallel;
  const int64_t unit = WeightSplitUnit(weights);
  RETURN_IF_ERROR(CheckParallelLayout(weights.config, parallel, unit));
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError(absl::StrCat("--device=cuda: ", CudaDeviceDescription()));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < n) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("--tensor_parallel=", n, " on CUDA needs ", n,
                                                      " GPUs (a rank per GPU); this host has ",
                                                      devices));
  }
  std::vector<int> ids(n);
  for (int r = 0; r < n; ++r) ids[r] = r;
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> comms, cuda::CreateNcclGroup(ids));
  if (how != nullptr) {
    *how = absl::StrCat(n, " CUDA ranks on GPUs 0..", n - 1, ", NCCL ", cuda::NcclVersion());
  }
  cuda::CudaModelOptions options;
  options.upload_progress = upload_progress;
  options.fp8_tensor_cores = fp8_tensor_cores != Fp8TensorCores::kOff;
  options.fp8_tensor_cores_required = fp8_tensor_cores == Fp8TensorCores::kOn;
  // Every rank reads its slice of the host weights (views of the mapped checkpoint) while it
  // uploads them; the whole model is released once every rank has taken its slice.
  auto whole = std::make_shared<const ModelWeights>(std::move(weights));
  RankGroupOptions group_options;  // one host thread per rank: it only enqueues
  ASSIGN_OR_RETURN(
      std::unique_ptr<RankGroup> group,
      RankGroup::Create(
          whole->config, parallel, group_options, std::move(comms),
          [&](int rank, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
            cuda::CudaModelOptions mine = options;
            mine.device = rank;
            if (rank != 0) mine.upload_progress = nullptr;  // one progress line
            return CreateRank(*whole, parallel, rank, mine, comm);
          }));
  return std::unique_ptr<ModelRunner>(std::move(group));
}

absl::StatusOr<std::string> NewCudaGroupId() {
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError(absl::StrCat("--device=cuda: ", CudaDeviceDescription()));
  }
  ASSIGN_OR_RETURN(const cuda::NcclGroupId id, cuda::NcclNewGroupId());
  return std::string(id.bytes, sizeof(id.bytes));
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> JoinCudaGroup(const std::string& id,
                                                                         int first_rank, int count,
                                                                         int size,
                                                                         int first_device) {
  cuda::NcclGroupId nid;
  if (id.size() != sizeof(nid.bytes)) {
    return absl::InvalidArgumentError("the leader's welcome holds no NCCL group id");
  }
  std::memcpy(nid.bytes, id.data(), sizeof(nid.bytes));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < first_device + count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        count, " CUDA ranks here need ", first_device + count, " GPUs; this host has ", devices));
  }
  // ncclCommInitRank blocks until every rank of the group has joined: this process's ranks
  // join together, a thread each.
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> made(count);
  std::vector<std::thread> joins;
  for (int i = 0; i < count; ++i) {
    joins.emplace_back([&, i] {
      made[i] = cuda::CreateNcclCommunicator(nid, first_rank + i, size, first_device + i, nullptr);
    });
  }
  for (std::thread& t : joins) t.join();
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& m : made) {
    RETURN_IF_ERROR(m.status());
    out.push_back(*std::move(m));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRank(const ModelWeights& whole,
                                                            const ParallelConfig& parallel,
                                                            int rank, int device,
                                                            Communicator* comm,
                                                            Fp8TensorCores fp8_tensor_cores) {
  cuda::CudaModelOptions options;
  options.device = device;
  options.fp8_tensor_cores = fp8_tensor_cores != Fp8TensorCores::kOff;
  options.fp8_tensor_cores_required = fp8_tensor_cores == Fp8TensorCores::kOn;
  return CreateRank(whole, parallel, rank, options, comm);
}

}  // namespace glmserve
