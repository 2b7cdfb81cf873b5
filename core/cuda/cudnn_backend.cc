#include "core/cuda/cudnn_backend.h"

#if defined(GLM_HAVE_CUDNN)
#include <cudnn_version.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cuda/shared_library.h"

namespace glmserve::cuda::cudnn {
namespace {

CudnnApi api;
absl::Status load_status = absl::UnknownError("not loaded");
std::once_flag once;

// Paged cache loads with ragged Q/O and a bottom-right causal mask need 9.7; up to 9.9 decode
// steps (one query row) with a causal mask and paged head_dim > 128 are refused, and bf16 SDPA
// has known bugs in 9.10.0 and 9.10.1 (cudnn_frontend's support checks): 9.10.2 and newer.
constexpr size_t kMinCudnnVersion = 91002;

void Load() {
  const std::string soname = absl::StrCat("libcudnn.so.", CUDNN_MAJOR);
  // The loader's search path (LD_LIBRARY_PATH: a pip nvidia-cudnn package's lib directory, say),
  // then GLMSERVE_CUDNN_PATH (a directory), then the toolkit's lib directories (cuDNN installed
  // into the toolkit, as the NVIDIA images do).
  absl::StatusOr<void*> opened = OpenCudaLibrary(soname, GLM_CUDA_LIBRARY_DIR, "cuDNN");
  if (!opened.ok()) {
    std::vector<std::string> dirs;
    if (const char* dir = std::getenv("GLMSERVE_CUDNN_PATH"); dir != nullptr && dir[0] != '\0') {
      dirs.push_back(dir);
    }
    dirs.push_back(absl::StrCat(GLM_CUDA_LIBRARY_DIR, "/../lib"));
    dirs.push_back(absl::StrCat(GLM_CUDA_LIBRARY_DIR, "/../lib64"));
    for (const std::string& dir : dirs) {
      absl::StatusOr<void*> again = OpenCudaLibrary(soname, dir.c_str(), "cuDNN");
      if (again.ok()) {
        opened = again;
        break;
      }
    }
  }
  if (!opened.ok()) {
    load_status = opened.status();
    return;
  }
  void* library = *opened;
  Resolve(library, "cudnnGetLastErrorString", &api.last_error);  // optional
  const bool ok = Resolve(library, "cudnnGetVersion", &api.get_version) &&
                  Resolve(library, "cudnnGetErrorString", &api.error_string) &&
                  Resolve(library, "cudnnCreate", &api.create) &&
                  Resolve(library, "cudnnDestroy", &api.destroy) &&
                  Resolve(library, "cudnnSetStream", &api.set_stream) &&
                  Resolve(library, "cudnnBackendCreateDescriptor", &api.create_desc) &&
                  Resolve(library, "cudnnBackendDestroyDescriptor", &api.destroy_desc) &&
                  Resolve(library, "cudnnBackendFinalize", &api.finalize) &&
                  Resolve(library, "cudnnBackendSetAttribute", &api.set_attr) &&
                  Resolve(library, "cudnnBackendGetAttribute", &api.get_attr) &&
                  Resolve(library, "cudnnBackendExecute", &api.execute);
  if (!ok) {
    load_status =
        absl::FailedPreconditionError(absl::StrCat(soname, " lacks a function this build needs"));
    return;
  }
  const size_t version = api.get_version();
  if (version < kMinCudnnVersion) {
    load_status = absl::FailedPreconditionError(
        absl::StrCat("cuDNN ", version,
                     " is older than 9.10.2 (paged K/V with ragged Q, a bottom-right causal "
                     "mask in decode steps, no known bf16 SDPA bugs)"));
    return;
  }
  load_status = absl::OkStatus();
}

}  // namespace

absl::Status LoadCudnn() {
  std::call_once(once, Load);
  return load_status;
}

const CudnnApi& Api() { return api; }

std::string VersionText() {
  const size_t v = api.get_version();
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

absl::Status CudnnError(cudnnStatus_t s, const char* what) {
  std::string text = absl::StrCat("cuDNN ", what, ": ", api.error_string(s));
  if (api.last_error != nullptr) {
    char message[512] = {0};
    api.last_error(message, sizeof(message));
    if (message[0] != '\0') absl::StrAppend(&text, " (", message, ")");
  }
  return absl::FailedPreconditionError(text);
}

absl::Status Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                 cudnnBackendAttributeType_t type, int64_t count, const void* value,
                 const char* what) {
  GLM_CUDNN_TRY(api.set_attr(d, name, type, count, value), what);
  return absl::OkStatus();
}
absl::Status SetDesc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value, const char* what) {
  return Set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
}
absl::Status SetInt(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, int64_t value,
                    const char* what) {
  return Set(d, name, CUDNN_TYPE_INT64, 1, &value, what);
}
absl::Status SetType(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnDataType_t value, const char* what) {
  return Set(d, name, CUDNN_TYPE_DATA_TYPE, 1, &value, what);
}

absl::StatusOr<cudnnBackendDescriptor_t> GraphBuilder::Tensor(int64_t uid, cudnnDataType_t type,
                                                              const Dims& dims, const Dims& strides,
                                                              bool is_virtual, bool by_value,
                                                              cudnnBackendDescriptor_t ragged) {
  ASSIGN_OR_RETURN(Desc t, Desc::Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  const cudnnBackendDescriptor_t d = t.get();
  RETURN_IF_ERROR(SetType(d, CUDNN_ATTR_TENSOR_DATA_TYPE, type, "tensor type"));
  RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64,
                      static_cast<int64_t>(dims.size()), dims.data(), "tensor dims"));
  RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
                      static_cast<int64_t>(strides.size()), strides.data(), "tensor strides"));
  RETURN_IF_ERROR(SetInt(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, uid, "tensor uid"));
  RETURN_IF_ERROR(SetInt(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16, "tensor alignment"));
  const bool v = is_virtual;
  RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "virtual"));
  if (by_value) {
    const bool b = true;
    RETURN_IF_ERROR(Set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &b, "by value"));
  }
  if (ragged != nullptr) {
    RETURN_IF_ERROR(SetDesc(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, ragged, "ragged offset"));
  }
  GLM_CUDNN_TRY(api.finalize(d), "finalize tensor");
  keep_.push_back(std::move(t));
  return d;
}

absl::StatusOr<cudnnBackendDescriptor_t> GraphBuilder::Virtual(cudnnDataType_t type,
                                                               const Dims& dims,
                                                               const Dims& strides) {
  return Tensor(next_virtual_++, type, dims, strides, /*is_virtual=*/true);
}

absl::StatusOr<cudnnBackendDescriptor_t> GraphBuilder::Scalar(int64_t uid, cudnnDataType_t type) {
  return Tensor(uid, type, {1, 1, 1, 1}, {1, 1, 1, 1}, false, /*by_value=*/true);
}

absl::Status GraphBuilder::Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                                     cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                     cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                     int64_t axis) {
  ASSIGN_OR_RETURN(Desc pw, Desc::Make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  RETURN_IF_ERROR(Set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode,
                      "pointwise mode"));
  RETURN_IF_ERROR(SetType(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, compute, "pointwise prec"));
  if (axis >= 0) RETURN_IF_ERROR(SetInt(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, axis, "axis"));
  GLM_CUDNN_TRY(api.finalize(pw.get()), "finalize pointwise");
  ASSIGN_OR_RETURN(Desc op, Desc::Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
  RETURN_IF_ERROR(
      SetDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get(), "pw desc"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pw x"));
  if (b != nullptr) {
    RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pw b"));
  }
  if (t != nullptr) {
    RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pw t"));
  }
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pw y"));
  GLM_CUDNN_TRY(api.finalize(op.get()), "finalize pointwise operation");
  keep_.push_back(std::move(pw));
  ops_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status GraphBuilder::Reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t y) {
  ASSIGN_OR_RETURN(Desc r, Desc::Make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
  RETURN_IF_ERROR(Set(r.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
                      &mode, "reduction mode"));
  RETURN_IF_ERROR(SetType(r.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT, "red type"));
  GLM_CUDNN_TRY(api.finalize(r.get()), "finalize reduction");
  ASSIGN_OR_RETURN(Desc op, Desc::Make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.get(), "red desc"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "red x"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "red y"));
  GLM_CUDNN_TRY(api.finalize(op.get()), "finalize reduction operation");
  keep_.push_back(std::move(r));
  ops_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status GraphBuilder::Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                  cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m_override,
                                  cudnnBackendDescriptor_t n_override,
                                  cudnnBackendDescriptor_t k_override, bool padded) {
  ASSIGN_OR_RETURN(Desc mm, Desc::Make(CUDNN_BACKEND_MATMUL_DESCRIPTOR));
  RETURN_IF_ERROR(SetType(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT, "mm type"));
  if (padded) {
    const double zero = 0.0;
    RETURN_IF_ERROR(
        Set(mm.get(), CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &zero, "padding"));
  }
  GLM_CUDNN_TRY(api.finalize(mm.get()), "finalize matmul");
  ASSIGN_OR_RETURN(Desc op, Desc::Make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get(), "mm desc"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "mm a"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "mm b"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "mm c"));
  if (m_override != nullptr) {
    RETURN_IF_ERROR(
        SetDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override, "m"));
  }
  if (n_override != nullptr) {
    RETURN_IF_ERROR(
        SetDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override, "n"));
  }
  if (k_override != nullptr) {
    RETURN_IF_ERROR(
        SetDesc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override, "k"));
  }
  GLM_CUDNN_TRY(api.finalize(op.get()), "finalize matmul operation");
  keep_.push_back(std::move(mm));
  ops_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status GraphBuilder::PagedLoad(cudnnBackendDescriptor_t container,
                                     cudnnBackendDescriptor_t page_table,
                                     cudnnBackendDescriptor_t seq_len, cudnnBackendDescriptor_t y) {
  ASSIGN_OR_RETURN(Desc op, Desc::Make(CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC, container,
                          "paged container"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC,
                          page_table, "page table"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC, seq_len,
                          "paged seq len"));
  RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC, y, "paged y"));
  GLM_CUDNN_TRY(api.finalize(op.get()), "finalize paged cache load");
  ops_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status GraphBuilder::Finish(cudnnHandle_t handle) {
  ASSIGN_OR_RETURN(graph_, Desc::Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Desc& op : ops_) ops.push_back(op.get());
  RETURN_IF_ERROR(Set(graph_.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      static_cast<int64_t>(ops.size()), ops.data(), "graph ops"));
  RETURN_IF_ERROR(Set(graph_.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
                      "graph handle"));
  GLM_CUDNN_TRY(api.finalize(graph_.get()), "finalize operation graph");

  ASSIGN_OR_RETURN(Desc heur, Desc::Make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
  RETURN_IF_ERROR(
      SetDesc(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph_.get(), "heur graph"));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  RETURN_IF_ERROR(
      Set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heur mode"));
  GLM_CUDNN_TRY(api.finalize(heur.get()), "finalize heuristics (no engine for this graph)");
  constexpr int kMaxConfigs = 8;
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < kMaxConfigs; ++i) {
    ASSIGN_OR_RETURN(Desc c, Desc::Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(c.get());
    configs.push_back(std::move(c));
  }
  int64_t count = 0;
  GLM_CUDNN_TRY(api.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &count, raw.data()),
                "heuristics results");
  if (count <= 0) {
    return absl::FailedPreconditionError("cuDNN heuristics found no engine for the SDPA graph");
  }
  absl::Status last = absl::OkStatus();
  for (int64_t i = 0; i < std::min<int64_t>(count, kMaxConfigs); ++i) {
    absl::StatusOr<Desc> plan = Desc::Make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (!plan.ok()) return plan.status();
    last = Set(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
               "plan handle");
    if (last.ok()) {
      last = SetDesc(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i], "plan cfg");
    }
    if (last.ok()) {
      const cudnnStatus_t s = api.finalize(plan->get());
      last =
          s == CUDNN_STATUS_SUCCESS ? absl::OkStatus() : CudnnError(s, "finalize execution plan");
    }
    if (!last.ok()) continue;
    int64_t workspace = 0, got = 0;
    GLM_CUDNN_TRY(api.get_attr(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               CUDNN_TYPE_INT64, 1, &got, &workspace),
                  "workspace size");
    plan_ = *std::move(plan);
    workspace_ = workspace;
    configs_ = std::move(configs);
    return absl::OkStatus();
  }
  return last;
}

}  // namespace glmserve::cuda::cudnn

#endif  // GLM_HAVE_CUDNN
