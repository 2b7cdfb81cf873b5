#include "core/cuda/nccl_communicator.h"

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/cuda/kernels.h"
#include "core/cuda/nccl_api.h"

namespace glmserve::cuda {

#if GLM_HAVE_NCCL_H
namespace {

absl::Status NcclError(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", Nccl().error_string(r)));
}

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), device_(device), stream_(stream) {}
  ~NcclCommunicator() override {
    // An aborted communicator is gone already (ncclCommAbort frees it).
    if (!aborted_) Nccl().comm_destroy(comm_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void SetStream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  // The gathered partials' scratch for sums of up to max_count, allocated now (not during a
  // CUDA graph's capture, which forbids it).
  absl::Status Prepare(int64_t max_count) override { return Reserve(max_count * size_); }

  absl::Status AllReduceSum(float* data, int64_t count) override {
    if (absl::Status s = health(); !s.ok()) return s;
    if (size_ == 1 || count == 0) return absl::OkStatus();
    if (absl::Status s = Reserve(count * size_); !s.ok()) return s;
    absl::Status s = NcclError(
        Nccl().all_gather(data, scratch_, count, ncclFloat32, comm_, stream_), "ncclAllGather");
    if (s.ok()) {
      s = CudaError(LaunchRankOrderSum(scratch_, size_, count, data, stream_),
                    "the rank-order sum");
    }
    return Fail(s);
  }

  absl::Status AllGather(const float* in, absl::Span<const int64_t> counts, float* out) override {
    if (absl::Status s = health(); !s.ok()) return s;
    if (static_cast<int>(counts.size()) != size_) {
      return absl::InvalidArgumentError("AllGather needs one count per rank");
    }
    absl::Status s = NcclError(Nccl().group_start(), "ncclGroupStart");
    int64_t at = 0;
    for (int r = 0; r < size_ && s.ok(); ++r) {
      s = NcclError(Nccl().broadcast(r == rank_ ? in : out + at, out + at, counts[r], ncclFloat32,
                                     r, comm_, stream_),
                    "ncclBroadcast");
      at += counts[r];
    }
    const absl::Status end = NcclError(Nccl().group_end(), "ncclGroupEnd");
    return Fail(s.ok() ? end : s);
  }

  absl::Status Gather(const float* in, absl::Span<const int64_t> counts, float* out,
                      int root) override {
    if (absl::Status s = health(); !s.ok()) return s;
    if (static_cast<int>(counts.size()) != size_ || root < 0 || root >= size_) {
      return absl::InvalidArgumentError("Gather needs one count per rank and a rank as root");
    }
    // Point to point inside one group call: every other rank sends its block to the root,
    // which receives each at its offset and copies its own.
    absl::Status s = NcclError(Nccl().group_start(), "ncclGroupStart");
    int64_t at = 0;
    for (int r = 0; r < size_ && s.ok(); ++r) {
      if (rank_ == root && r != root && counts[r] > 0) {
        s = NcclError(Nccl().recv(out + at, counts[r], ncclFloat32, r, comm_, stream_), "ncclRecv");
      } else if (rank_ == r && r != root && counts[r] > 0) {
        s = NcclError(Nccl().send(in, counts[r], ncclFloat32, root, comm_, stream_), "ncclSend");
      } else if (rank_ == root && r == root && counts[r] > 0) {
        s = CudaError(cudaMemcpyAsync(out + at, in, counts[r] * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpyAsync");
      }
      at += counts[r];
    }
    const absl::Status end = NcclError(Nccl().group_end(), "ncclGroupEnd");
    return Fail(s.ok() ? end : s);
  }

  // Also from another thread while this rank waits in a collective: ncclCommAbort is what
  // releases it (its pending operations fail), and the other ranks' with it. Once: the
  // handle is freed by the first.
  void Abort(const absl::Status& why) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_.ok()) failure_ = why;
      if (aborted_) return;
      aborted_ = true;
    }
    Nccl().comm_abort(comm_);
  }

  absl::Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the tensor-parallel group failed: ", failure_.ToString()));
    }
    // Not aborted (failure_ would be set): the handle is live.
    ncclResult_t async = ncclSuccess;
    if (Nccl().comm_get_async_error(comm_, &async) == ncclSuccess && async != ncclSuccess) {
      return NcclError(async, "NCCL (asynchronous)");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Reserve(int64_t floats) {
    if (floats <= scratch_floats_) return absl::OkStatus();
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_floats_ = 0;
    cudaSetDevice(device_);
    if (absl::Status s = CudaError(cudaMalloc(&scratch_, floats * sizeof(float)), "cudaMalloc");
        !s.ok()) {
      return s;
    }
    scratch_floats_ = floats;
    return absl::OkStatus();
  }
  absl::Status Fail(absl::Status s) {
    if (!s.ok()) Abort(s);
    return s;
  }

  ncclComm_t comm_;
  const int rank_, size_, device_;
  cudaStream_t stream_;
  float* scratch_ = nullptr;  // [size, count] the gathered partials
  int64_t scratch_floats_ = 0;
  mutable std::mutex mu_;
  absl::Status failure_;  // guarded by mu_
  bool aborted_ = false;  // guarded by mu_: comm_ was aborted (and freed)
};

}  // namespace

absl::StatusOr<NcclGroupId> NcclNewGroupId() {
  if (absl::Status s = LoadNccl(); !s.ok()) return s;
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclGroupId));
  ncclUniqueId id;
  if (absl::Status s = NcclError(Nccl().get_unique_id(&id), "ncclGetUniqueId"); !s.ok()) return s;
  NcclGroupId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

std::string NcclVersion() {
  if (absl::Status s = LoadNccl(); !s.ok()) return std::string(s.message());
  int v = 0;
  if (Nccl().get_version(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  return absl::StrCat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclGroupId& id,
                                                                     int rank, int size, int device,
                                                                     cudaStream_t stream) {
  if (absl::Status s = LoadNccl(); !s.ok()) return s;
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", size));
  }
  if (absl::Status s = CudaError(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes, sizeof(id.bytes));
  ncclComm_t comm = nullptr;
  if (absl::Status s = NcclError(Nccl().comm_init_rank(&comm, size, nid, rank), "ncclCommInitRank");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(comm, rank, size, device, stream));
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    absl::Span<const int> devices) {
  if (absl::Status s = LoadNccl(); !s.ok()) return s;
  if (devices.empty()) return absl::InvalidArgumentError("an NCCL group of no devices");
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(n, nullptr);
  if (absl::Status s =
          NcclError(Nccl().comm_init_all(comms.data(), n, devices.data()), "ncclCommInitAll");
      !s.ok()) {
    return s;
  }
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < n; ++r) {
    group.push_back(std::make_unique<NcclCommunicator>(comms[r], r, n, devices[r], nullptr));
  }
  return group;
}

#else  // a CUDA toolkit without nccl.h: LoadNccl says so

absl::StatusOr<NcclGroupId> NcclNewGroupId() { return LoadNccl(); }
std::string NcclVersion() { return std::string(LoadNccl().message()); }
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclGroupId&, int, int,
                                                                     int, cudaStream_t) {
  return LoadNccl();
}
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(absl::Span<const int>) {
  return LoadNccl();
}

#endif

}  // namespace glmserve::cuda
