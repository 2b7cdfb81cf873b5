// cuDNN's backend API as glmserve uses it: the library loaded at run time (dlopen, as cuBLAS
// is: core/cuda/cublas_api.h), its descriptors owned, and a builder of operation graphs that
// finds an engine for the graph it is given. core/cuda/cudnn_attention.cc builds its SDPA graph
// with it. Only for builds with cuDNN's headers (GLM_HAVE_CUDNN: core/CMakeLists.txt).
#pragma once

#if defined(GLM_HAVE_CUDNN)
#include <cudnn_graph.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glmserve::cuda::cudnn {

// The functions this build calls, resolved from libcudnn.so.<major>.
struct CudnnApi {
  decltype(&cudnnGetVersion) get_version;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetLastErrorString) last_error;  // may be null
  decltype(&cudnnCreate) create;
  decltype(&cudnnDestroy) destroy;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnBackendCreateDescriptor) create_desc;
  decltype(&cudnnBackendDestroyDescriptor) destroy_desc;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendSetAttribute) set_attr;
  decltype(&cudnnBackendGetAttribute) get_attr;
  decltype(&cudnnBackendExecute) execute;
};

// Loads the library once (the loader's path, then GLMSERVE_CUDNN_PATH, then the toolkit's lib
// directories) and checks its version; every later call returns the first call's status.
absl::Status LoadCudnn();
// The loaded functions: only after LoadCudnn() returned OK.
const CudnnApi& Api();
// The loaded library's version, "9.10.2".
std::string VersionText();
// FAILED_PRECONDITION naming the call, cuDNN's message for `s` and its last error text.
absl::Status CudnnError(cudnnStatus_t s, const char* what);

#define GLM_CUDNN_TRY(call, what)                                          \
  do {                                                                     \
    const cudnnStatus_t glm_cudnn_status_ = (call);                        \
    if (glm_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                       \
      return ::glmserve::cuda::cudnn::CudnnError(glm_cudnn_status_, what); \
    }                                                                      \
  } while (false)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  ~Desc() {
    if (d_ != nullptr) Api().destroy_desc(d_);
  }
  static absl::StatusOr<Desc> Make(cudnnBackendDescriptorType_t type) {
    Desc d;
    GLM_CUDNN_TRY(Api().create_desc(type, &d.d_), "create descriptor");
    return d;
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// One attribute of a descriptor (count values of `type`); the others are its common forms.
absl::Status Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                 cudnnBackendAttributeType_t type, int64_t count, const void* value,
                 const char* what);
absl::Status SetDesc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value, const char* what);
absl::Status SetInt(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, int64_t value,
                    const char* what);
absl::Status SetType(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnDataType_t value, const char* what);

using Dims = std::vector<int64_t>;
// Virtual tensors take ids from here up; a graph's own tensors use ids below it.
inline constexpr int64_t kFirstVirtualUid = 100;

// Builds one operation graph and its execution plan; owns every descriptor it made.
class GraphBuilder {
 public:
  absl::StatusOr<cudnnBackendDescriptor_t> Tensor(int64_t uid, cudnnDataType_t type,
                                                  const Dims& dims, const Dims& strides,
                                                  bool is_virtual, bool by_value = false,
                                                  cudnnBackendDescriptor_t ragged = nullptr);
  absl::StatusOr<cudnnBackendDescriptor_t> Virtual(cudnnDataType_t type, const Dims& dims,
                                                   const Dims& strides);
  // A scalar passed by value at execution time.
  absl::StatusOr<cudnnBackendDescriptor_t> Scalar(int64_t uid, cudnnDataType_t type);

  // y = mode(x[, b][, t]); axis >= 0 sets the pointwise axis (GEN_INDEX).
  absl::Status Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                         cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                         cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis = -1);

  absl::Status Reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                         cudnnBackendDescriptor_t y);

  // c = a b, with the GEMM's M / N / K overridden per batch entry by the length tensors given.
  absl::Status Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m_override,
                      cudnnBackendDescriptor_t n_override, cudnnBackendDescriptor_t k_override,
                      bool padded);

  absl::Status PagedLoad(cudnnBackendDescriptor_t container, cudnnBackendDescriptor_t page_table,
                         cudnnBackendDescriptor_t seq_len, cudnnBackendDescriptor_t y);

  // The operation graph over every operation added, then the first engine configuration of
  // heuristics mode A whose execution plan finalizes.
  absl::Status Finish(cudnnHandle_t handle);

  cudnnBackendDescriptor_t plan() const { return plan_.get(); }
  int64_t workspace() const { return workspace_; }

 private:
  std::vector<Desc> keep_;  // tensors, pointwise / reduction / matmul descriptors
  std::vector<Desc> ops_;
  Desc graph_;
  std::vector<Desc> configs_;
  Desc plan_;
  int64_t workspace_ = 0;
  int64_t next_virtual_ = kFirstVirtualUid;
};

}  // namespace glmserve::cuda::cudnn

#endif  // GLM_HAVE_CUDNN
