#include "core/cuda/cudnn_attention.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

#if defined(GLM_HAVE_CUDNN)
#include <cudnn_graph.h>
#include <cudnn_version.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "absl/memory/memory.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_attention_plan.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/shared_library.h"
#endif

namespace glmserve::cuda {

void CudnnAttention::Disable(const std::string& why) {
  if (disabled_) return;
  disabled_ = true;
  why_off_ = why;
  std::fprintf(stderr,
               "glmserve: cuDNN attention off, attention on the tensor-core kernel instead: %s\n",
               why.c_str());
}

#if !defined(GLM_HAVE_CUDNN)

// Built without cuDNN's headers, or for the CUDA emulation (tools/cuda_emu), where cuDNN
// cannot run: the interface stays, the path never runs.
struct CudnnAttention::Impl {};

bool CudnnAttentionBuilt() { return false; }

absl::Status CudnnAttentionOpsForTest(const AttentionShape&, int64_t, int64_t,
                                      const CudnnPlanKey&) {
  return absl::FailedPreconditionError("cuDNN not available in this build");
}

absl::StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(const AttentionShape&,
                                                                       cudaStream_t) {
  return absl::FailedPreconditionError(
      "cuDNN not available in this build (configured without cuDNN's headers, or the CUDA "
      "emulation)");
}

CudnnAttention::~CudnnAttention() = default;

absl::StatusOr<bool> CudnnAttention::Enqueue(const StepPlan&, const float*, const uint16_t*,
                                             int64_t, const AttentionShape&, uint16_t*) {
  return false;
}

std::string CudnnAttention::status() const { return "cuDNN not available in this build"; }

absl::Status CudnnAttention::SelfCheckForTest(int64_t) {
  return absl::FailedPreconditionError("cuDNN not available in this build");
}

#else  // GLM_HAVE_CUDNN

namespace {

// ---- the library, loaded once --------------------------------------------------------------

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

absl::Status LoadCudnn() {
  std::call_once(once, Load);
  return load_status;
}

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

#define GLM_CUDNN_TRY(call, what)                    \
  do {                                               \
    const cudnnStatus_t glm_cudnn_status_ = (call);  \
    if (glm_cudnn_status_ != CUDNN_STATUS_SUCCESS) { \
      return CudnnError(glm_cudnn_status_, what);    \
    }                                                \
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
    if (d_ != nullptr) api.destroy_desc(d_);
  }
  static absl::StatusOr<Desc> Make(cudnnBackendDescriptorType_t type) {
    Desc d;
    GLM_CUDNN_TRY(api.create_desc(type, &d.d_), "create descriptor");
    return d;
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

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

// The non-virtual tensors' ids, the variant pack's keys.
enum Uid : int64_t {
  kQ = 1,
  kKContainer,
  kVContainer,
  kO,
  kSeqLenQ,
  kSeqLenKv,
  kPageTableK,
  kPageTableV,
  kRaggedQ,
  kRaggedO,
  kScale,
  kNegInf,
  kFirstVirtual = 100,
};

using Dims = std::vector<int64_t>;

// Builds one SDPA operation graph; owns every descriptor it made.
class GraphBuilder {
 public:
  absl::StatusOr<cudnnBackendDescriptor_t> Tensor(int64_t uid, cudnnDataType_t type,
                                                  const Dims& dims, const Dims& strides,
                                                  bool is_virtual, bool by_value = false,
                                                  cudnnBackendDescriptor_t ragged = nullptr) {
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
  absl::StatusOr<cudnnBackendDescriptor_t> Virtual(cudnnDataType_t type, const Dims& dims,
                                                   const Dims& strides) {
    return Tensor(next_virtual_++, type, dims, strides, /*is_virtual=*/true);
  }
  // A scalar passed by value at execution time.
  absl::StatusOr<cudnnBackendDescriptor_t> Scalar(int64_t uid, cudnnDataType_t type) {
    return Tensor(uid, type, {1, 1, 1, 1}, {1, 1, 1, 1}, false, /*by_value=*/true);
  }

  // y = mode(x[, b][, t]); axis >= 0 sets the pointwise axis (GEN_INDEX).
  absl::Status Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                         cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                         cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                         int64_t axis = -1) {
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

  absl::Status Reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                         cudnnBackendDescriptor_t y) {
    ASSIGN_OR_RETURN(Desc r, Desc::Make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
    RETURN_IF_ERROR(Set(r.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                        1, &mode, "reduction mode"));
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

  // c = a b, with the GEMM's M / N / K overridden per batch entry by the length tensors given.
  absl::Status Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m_override,
                      cudnnBackendDescriptor_t n_override, cudnnBackendDescriptor_t k_override,
                      bool padded) {
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

  absl::Status PagedLoad(cudnnBackendDescriptor_t container, cudnnBackendDescriptor_t page_table,
                         cudnnBackendDescriptor_t seq_len, cudnnBackendDescriptor_t y) {
    ASSIGN_OR_RETURN(Desc op, Desc::Make(CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR));
    RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC,
                            container, "paged container"));
    RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC,
                            page_table, "page table"));
    RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC, seq_len,
                            "paged seq len"));
    RETURN_IF_ERROR(SetDesc(op.get(), CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC, y, "paged y"));
    GLM_CUDNN_TRY(api.finalize(op.get()), "finalize paged cache load");
    ops_.push_back(std::move(op));
    return absl::OkStatus();
  }

  // The operation graph over every operation added, then the first engine configuration of
  // heuristics mode A whose execution plan finalizes.
  absl::Status Finish(cudnnHandle_t handle) {
    ASSIGN_OR_RETURN(graph_, Desc::Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const Desc& op : ops_) ops.push_back(op.get());
    RETURN_IF_ERROR(Set(graph_.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        static_cast<int64_t>(ops.size()), ops.data(), "graph ops"));
    RETURN_IF_ERROR(Set(graph_.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                        &handle, "graph handle"));
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

  cudnnBackendDescriptor_t plan() const { return plan_.get(); }
  int64_t workspace() const { return workspace_; }

 private:
  std::vector<Desc> keep_;  // tensors, pointwise / reduction / matmul descriptors
  std::vector<Desc> ops_;
  Desc graph_;
  std::vector<Desc> configs_;
  Desc plan_;
  int64_t workspace_ = 0;
  int64_t next_virtual_ = kFirstVirtual;
};

// Every shape fact a plan depends on besides the bucketed key.
struct GraphShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, block_size = 0, num_blocks = 0;
};

// The SDPA forward graph (the composite form cuDNN's fused attention engines match):
// K' = paged_load(K), S = (Q K'^T) * scale, padding mask (row < seq_q and col < seq_kv),
// bottom-right causal mask (col <= row + seq_kv - seq_q), P = softmax(S) in bf16,
// V' = paged_load(V), O = P V'.
absl::Status BuildGraph(GraphBuilder& g, const GraphShape& s, const CudnnPlanKey& key,
                        cudnnHandle_t handle) {
  const int64_t b = key.batch, hq = s.heads, hk = s.kv_heads, d = s.head_dim;
  const int64_t sq = key.max_q, pages = key.max_pages, skv = pages * s.block_size;
  const int64_t bs = s.block_size;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf16 = CUDNN_DATA_BFLOAT16, i32 = CUDNN_DATA_INT32,
                        boolean = CUDNN_DATA_BOOLEAN;
  const Dims lens_dims = {b, 1, 1, 1}, lens_strides = {1, 1, 1, 1};
  ASSIGN_OR_RETURN(auto seq_q, g.Tensor(kSeqLenQ, i32, lens_dims, lens_strides, false));
  ASSIGN_OR_RETURN(auto seq_kv, g.Tensor(kSeqLenKv, i32, lens_dims, lens_strides, false));
  ASSIGN_OR_RETURN(auto ragged_q, g.Tensor(kRaggedQ, i32, {b + 1, 1, 1, 1}, lens_strides, false));
  ASSIGN_OR_RETURN(auto ragged_o, g.Tensor(kRaggedO, i32, {b + 1, 1, 1, 1}, lens_strides, false));
  const Dims pt_dims = {b, 1, pages, 1}, pt_strides = {pages, pages, 1, 1};
  ASSIGN_OR_RETURN(auto page_k, g.Tensor(kPageTableK, i32, pt_dims, pt_strides, false));
  ASSIGN_OR_RETURN(auto page_v, g.Tensor(kPageTableV, i32, pt_dims, pt_strides, false));
  // Packed rows [tokens, heads, head_dim]: BSHD strides, batch offsets from the ragged tensor.
  const Dims q_dims = {b, hq, sq, d}, q_strides = {sq * hq * d, d, hq * d, 1};
  ASSIGN_OR_RETURN(auto q, g.Tensor(kQ, bf16, q_dims, q_strides, false, false, ragged_q));
  ASSIGN_OR_RETURN(auto o, g.Tensor(kO, bf16, q_dims, q_strides, false, false, ragged_o));
  // The cache layer: per block K rows then V rows, [block_size, kv_heads, head_dim] each.
  const Dims c_dims = {s.num_blocks, hk, bs, d}, c_strides = {2 * bs * hk * d, d, hk * d, 1};
  ASSIGN_OR_RETURN(auto k_container, g.Tensor(kKContainer, bf16, c_dims, c_strides, false));
  ASSIGN_OR_RETURN(auto v_container, g.Tensor(kVContainer, bf16, c_dims, c_strides, false));
  ASSIGN_OR_RETURN(auto scale, g.Scalar(kScale, f32));
  ASSIGN_OR_RETURN(auto neg_inf, g.Scalar(kNegInf, f32));

  // K as K^T [b, hk, d, skv].
  ASSIGN_OR_RETURN(auto kt, g.Virtual(bf16, {b, hk, d, skv}, {d * skv * hk, d * skv, 1, d}));
  RETURN_IF_ERROR(g.PagedLoad(k_container, page_k, seq_kv, kt));
  const Dims s_dims = {b, hq, sq, skv}, s_strides = {hq * sq * skv, sq * skv, skv, 1};
  ASSIGN_OR_RETURN(auto s0, g.Virtual(f32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Matmul(q, kt, s0, seq_q, seq_kv, nullptr, /*padded=*/true));
  ASSIGN_OR_RETURN(auto s1, g.Virtual(f32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, s0, scale, nullptr, s1));

  // Padding mask.
  ASSIGN_OR_RETURN(auto row, g.Virtual(i32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s1, nullptr, nullptr, row, 2));
  ASSIGN_OR_RETURN(auto col, g.Virtual(i32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s1, nullptr, nullptr, col, 3));
  ASSIGN_OR_RETURN(auto row_in, g.Virtual(boolean, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_CMP_LT, boolean, row, seq_q, nullptr, row_in));
  ASSIGN_OR_RETURN(auto col_in, g.Virtual(boolean, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_CMP_LT, boolean, col, seq_kv, nullptr, col_in));
  ASSIGN_OR_RETURN(auto inside, g.Virtual(boolean, s_dims, s_strides));
  RETURN_IF_ERROR(
      g.Pointwise(CUDNN_POINTWISE_LOGICAL_AND, boolean, row_in, col_in, nullptr, inside));
  ASSIGN_OR_RETURN(auto s2, g.Virtual(f32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, s1, neg_inf, inside, s2));

  // Bottom-right causal mask: keep col <= row + seq_kv - seq_q.
  ASSIGN_OR_RETURN(auto row2, g.Virtual(i32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, s2, nullptr, nullptr, row2, 2));
  ASSIGN_OR_RETURN(auto col2, g.Virtual(i32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, s2, nullptr, nullptr, col2, 3));
  ASSIGN_OR_RETURN(auto shifted, g.Virtual(i32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_ADD, i32, row2, seq_kv, nullptr, shifted, 3));
  ASSIGN_OR_RETURN(auto diagonal, g.Virtual(i32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, i32, shifted, seq_q, nullptr, diagonal, 3));
  ASSIGN_OR_RETURN(auto causal, g.Virtual(boolean, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_CMP_GE, boolean, diagonal, col2, nullptr, causal));
  ASSIGN_OR_RETURN(auto s3, g.Virtual(f32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, s2, neg_inf, causal, s3));

  // Softmax without stats (inference).
  const Dims r_dims = {b, hq, sq, 1}, r_strides = {hq * sq, sq, 1, 1};
  ASSIGN_OR_RETURN(auto max, g.Virtual(f32, r_dims, r_strides));
  RETURN_IF_ERROR(g.Reduction(CUDNN_REDUCE_TENSOR_MAX, s3, max));
  ASSIGN_OR_RETURN(auto centred, g.Virtual(f32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, f32, s3, max, nullptr, centred));
  ASSIGN_OR_RETURN(auto e, g.Virtual(f32, s_dims, s_strides));
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_EXP, f32, centred, nullptr, nullptr, e));
  ASSIGN_OR_RETURN(auto sum, g.Virtual(f32, r_dims, r_strides));
  RETURN_IF_ERROR(g.Reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum));
  ASSIGN_OR_RETURN(auto p, g.Virtual(bf16, s_dims, s_strides));  // P in the inputs' type
  RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_DIV, f32, e, sum, nullptr, p));

  ASSIGN_OR_RETURN(auto vl, g.Virtual(bf16, {b, hk, skv, d}, {d * skv * hk, d * skv, d, 1}));
  RETURN_IF_ERROR(g.PagedLoad(v_container, page_v, seq_kv, vl));
  RETURN_IF_ERROR(g.Matmul(p, vl, o, seq_q, nullptr, seq_kv, /*padded=*/false));
  return handle == nullptr ? absl::OkStatus() : g.Finish(handle);  // null: the ops only
}

}  // namespace

bool CudnnAttentionBuilt() { return true; }

absl::Status CudnnAttentionOpsForTest(const AttentionShape& shape, int64_t block_size,
                                      int64_t num_blocks, const CudnnPlanKey& key) {
  RETURN_IF_ERROR(LoadCudnn());
  GraphBuilder g;
  return BuildGraph(g, {shape.heads, shape.kv_heads, shape.head_dim, block_size, num_blocks}, key,
                    nullptr);
}

struct CudnnAttention::Impl {
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  AttentionShape shape;
  std::string version;
  bool self_checked = false;
  // Plans for the current cache geometry (block size, blocks), by bucketed shape.
  GraphShape geometry;
  std::map<CudnnPlanKey, std::unique_ptr<GraphBuilder>> plans;
  // The prepared step: its tiles and tables (a later call with the same ones reuses it).
  bool prepared = false;
  std::vector<int32_t> tiles, block_tables;
  int64_t tokens = 0;
  CudnnAttentionBatch batch;
  GraphBuilder* plan = nullptr;
  // Device data: the step's int32 metadata, packed bf16 q, the plan's workspace.
  DeviceBuffer meta, q_bf16, workspace;
  PinnedBuffer meta_host;
  Event meta_copied;  // the last metadata copy out of meta_host
  bool meta_copy_pending = false;

  ~Impl() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    plans.clear();
    if (handle != nullptr) api.destroy(handle);
  }
};

absl::StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(const AttentionShape& shape,
                                                                       cudaStream_t stream) {
  RETURN_IF_ERROR(LoadCudnn());
  int device = 0, major = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 8) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuDNN's fused attention needs compute capability 8.0+ (this GPU: ", major, ".x)"));
  }
  if (shape.head_dim % 8 != 0 || shape.head_dim > 256) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuDNN's fused attention needs head_dim a multiple of 8 up to 256 (", shape.head_dim, ")"));
  }
  auto self = absl::WrapUnique(new CudnnAttention());
  self->impl_ = std::make_unique<Impl>();
  Impl& m = *self->impl_;
  m.stream = stream;
  m.shape = shape;
  m.version = VersionText();
  GLM_CUDNN_TRY(api.create(&m.handle), "create handle");
  GLM_CUDNN_TRY(api.set_stream(m.handle, stream), "set stream");
  ASSIGN_OR_RETURN(m.meta_copied, CreateEvent(/*timing=*/false));
  return self;
}

CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::status() const {
  if (disabled_) return absl::StrCat("off: ", why_off_);
  if (!impl_->self_checked) return absl::StrCat("cuDNN ", impl_->version, ", not used yet");
  return absl::StrCat("cuDNN ", impl_->version, ", self-checked against the tensor-core kernel");
}

namespace {

// Grows `buffer` to at least `bytes` (waiting for the stream first: queued work may use it).
absl::Status Grow(DeviceBuffer* buffer, size_t bytes, cudaStream_t stream) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  buffer->Reset();
  ASSIGN_OR_RETURN(*buffer, DeviceBuffer::Create(std::max<size_t>(bytes, 256)));
  return absl::OkStatus();
}

// The self-check's reference: LaunchPagedAttentionTc on the same inputs. Both read q in fp32
// (cuDNN after its bf16 conversion), the cache layer and the step's tiles.
struct CheckCase {
  std::vector<float> q;         // [tokens, heads * head_dim] (q_stride = heads * head_dim)
  std::vector<uint16_t> cache;  // [blocks, 2, block_size, kv_heads * head_dim]
  StepPlan plan;
  int64_t blocks = 0;
};

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

CheckCase MakeCheckCase(const AttentionShape& shape, int64_t block_size, int tile_tokens) {
  CheckCase c;
  std::mt19937 rng(2718);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // A prefill chunk of 13 tokens at positions 21..33 (context across several blocks), a decode
  // row at position 40 and a one-token prompt: 3 sequences, so the batch bucket (4) has an
  // empty entry too.
  const int64_t per_seq_blocks = (41 + block_size - 1) / block_size;
  c.blocks = 3 * per_seq_blocks + 1;
  BlockTable tables[3];
  for (int s = 0; s < 3; ++s) {
    for (int64_t i = 0; i < per_seq_blocks; ++i) {
      // Scattered, descending ids: the page table must be followed, not assumed contiguous.
      tables[s].push_back(static_cast<int32_t>(c.blocks - 1 - (i * 3 + s)));
    }
  }
  ForwardBatch batch;
  batch.sequences = {{13, 21, &tables[0]}, {1, 40, &tables[1]}, {1, 0, &tables[2]}};
  BuildStepPlan(batch, LogitsRows::kLast, block_size, tile_tokens, StepPadding{}, false, &c.plan);
  const int64_t row = shape.heads * shape.head_dim;
  c.q.resize(c.plan.tokens * row);
  for (float& v : c.q) v = u(rng) * 2.0f;  // scores of a few units: a peaked softmax
  c.cache.resize(c.blocks * 2 * block_size * shape.kv_heads * shape.head_dim);
  for (uint16_t& v : c.cache) v = ToBf16(u(rng));
  return c;
}

}  // namespace

absl::Status CudnnAttention::SelfCheckForTest(int64_t block_size) {
  Impl& m = *impl_;
  if (disabled_) return absl::FailedPreconditionError(why_off_);
  const AttentionShape& sh = m.shape;
  const int tile_tokens = AttentionTileTokens(sh.heads / sh.kv_heads);
  CheckCase c = MakeCheckCase(sh, block_size, tile_tokens);
  const int64_t row = sh.heads * sh.head_dim;
  const int64_t tokens = c.plan.tokens;
  MetaLayout layout;
  layout.token_cap = tokens;
  layout.block_table_cap = static_cast<int64_t>(c.plan.block_tables.size());
  std::vector<int32_t> meta(layout.total());
  WriteMeta(c.plan, layout, meta.data());
  ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::Create(sizeof(float) * c.q.size()));
  ASSIGN_OR_RETURN(DeviceBuffer cache, DeviceBuffer::Create(2 * c.cache.size()));
  ASSIGN_OR_RETURN(DeviceBuffer dmeta, DeviceBuffer::Create(4 * meta.size()));
  ASSIGN_OR_RETURN(DeviceBuffer out_ref, DeviceBuffer::Create(2 * tokens * row));
  ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Create(2 * tokens * row));
  RETURN_IF_ERROR(CopyToDevice(q.get(), c.q.data(), sizeof(float) * c.q.size()));
  RETURN_IF_ERROR(CopyToDevice(cache.get(), c.cache.data(), 2 * c.cache.size()));
  RETURN_IF_ERROR(CopyToDevice(dmeta.get(), meta.data(), 4 * meta.size()));
  RETURN_IF_ERROR(FillDevice(out_ref.get(), 0xff, 2 * tokens * row));  // NaN poison
  RETURN_IF_ERROR(FillDevice(out.get(), 0xff, 2 * tokens * row));
  AttentionShape shape = sh;
  shape.block_size = block_size;
  shape.q_stride = row;
  // The copies and fills above ran on the legacy stream, which a non-blocking stream does not
  // wait for: finish them first (once per device).
  RETURN_IF_ERROR(SynchronizeDevice());
  const int32_t* d = dmeta.as<int32_t>();
  GLM_CUDA_RETURN_IF_ERROR(
      LaunchPagedAttentionTc(q.as<float>(), d + layout.tiles(), static_cast<int>(c.plan.num_tiles),
                             d + layout.block_tables(), cache.as<uint16_t>(), shape,
                             /*num_splits=*/1, nullptr, out_ref.as<uint16_t>(), m.stream));
  const bool checked = self_check_;
  self_check_ = false;  // the check's own Enqueue must not recurse into it
  m.self_checked = true;
  absl::StatusOr<bool> ran =
      Enqueue(c.plan, q.as<float>(), cache.as<uint16_t>(), c.blocks, shape, out.as<uint16_t>());
  self_check_ = checked;
  m.prepared = false;  // the model's next step uploads its own metadata
  if (!ran.ok()) return ran.status();
  if (!*ran) {
    m.self_checked = false;
    return absl::FailedPreconditionError(disabled_ ? why_off_ : "the check's step was refused");
  }
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));
  std::vector<uint16_t> got(tokens * row), want(tokens * row);
  RETURN_IF_ERROR(CopyToHost(got.data(), out.get(), 2 * got.size()));
  RETURN_IF_ERROR(CopyToHost(want.data(), out_ref.get(), 2 * want.size()));
  const auto f = [](uint16_t v) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  };
  float worst = 0;
  int64_t at = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = f(got[i]), w = f(want[i]);
    const float err = std::fabs(g - w) - kCudnnCheckRel * std::fabs(w);
    if (!(err <= kCudnnCheckAbs)) {  // NaN too
      if (at < 0 || !(err <= worst)) {
        worst = err;
        at = static_cast<int64_t>(i);
      }
    }
  }
  if (at >= 0) {
    m.self_checked = false;
    return absl::InternalError(absl::StrCat(
        "self-check mismatch against the tensor-core kernel: output ", at, " (token ", at / row,
        ", head ", (at % row) / sh.head_dim, ") is ", f(got[at]), ", the kernel's ", f(want[at]),
        " (tolerance ", kCudnnCheckAbs, " + ", kCudnnCheckRel, " x |kernel|)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CudnnAttention::Enqueue(const StepPlan& plan, const float* q,
                                             const uint16_t* cache_layer, int64_t num_blocks,
                                             const AttentionShape& shape, uint16_t* out) {
  if (disabled_) return false;
  Impl& m = *impl_;
  // Never inside a CUDA-graph capture (a replay would reuse this step's uploaded metadata).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(m.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return false;
  if (shape.heads != m.shape.heads || shape.kv_heads != m.shape.kv_heads ||
      shape.head_dim != m.shape.head_dim) {
    return false;
  }
  if (self_check_ && !m.self_checked) {
    // The first use on this device: one small attention through both paths (waits once).
    if (absl::Status s = SelfCheckForTest(shape.block_size); !s.ok()) {
      Disable(std::string(s.message()));
      return false;
    }
  }
  const int64_t row = shape.heads * shape.head_dim;
  const GraphShape geometry{shape.heads, shape.kv_heads, shape.head_dim, shape.block_size,
                            num_blocks};
  if (geometry.block_size != m.geometry.block_size ||
      geometry.num_blocks != m.geometry.num_blocks) {
    GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));  // no queued plan is running
    m.plans.clear();
    m.geometry = geometry;
    m.prepared = false;
  }
  // The step's metadata: once per step (the first layer), reused while the tiles and tables
  // stay the same.
  if (!m.prepared || m.tokens != plan.tokens || m.tiles != plan.tiles ||
      m.block_tables != plan.block_tables) {
    m.prepared = false;
    std::string why;
    if (!BuildCudnnAttentionBatch(plan, shape.block_size, row, &m.batch, &why)) return false;
    auto it = m.plans.find(m.batch.key);
    if (it == m.plans.end()) {
      auto g = std::make_unique<GraphBuilder>();
      if (absl::Status s = BuildGraph(*g, geometry, m.batch.key, m.handle); !s.ok()) {
        Disable(absl::StrCat("building the SDPA plan for ", m.batch.key.batch, " sequences x ",
                             m.batch.key.max_q, " query rows x ", m.batch.key.max_pages,
                             " pages of ", shape.block_size, " keys: ", s.message()));
        return false;
      }
      ++plans_built_;
      it = m.plans.emplace(m.batch.key, std::move(g)).first;
    }
    m.plan = it->second.get();
    const size_t meta_bytes = sizeof(int32_t) * m.batch.total_ints();
    RETURN_IF_ERROR(Grow(&m.meta, meta_bytes, m.stream));
    RETURN_IF_ERROR(Grow(&m.q_bf16, 2 * static_cast<size_t>(plan.tokens * row), m.stream));
    RETURN_IF_ERROR(Grow(&m.workspace, static_cast<size_t>(m.plan->workspace()), m.stream));
    if (m.meta_copy_pending) {
      // The previous copy out of the pinned buffer (long done after a finished step).
      GLM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(m.meta_copied.get()));
      m.meta_copy_pending = false;
    }
    if (m.meta_host.bytes() < meta_bytes) {
      ASSIGN_OR_RETURN(m.meta_host, PinnedBuffer::Create(std::max<size_t>(meta_bytes, 4096)));
    }
    m.batch.Write(m.meta_host.as<int32_t>());
    GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.meta.get(), m.meta_host.get(), meta_bytes,
                                             cudaMemcpyHostToDevice, m.stream));
    GLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.meta_copied.get(), m.stream));
    m.meta_copy_pending = true;
    m.tiles = plan.tiles;
    m.block_tables = plan.block_tables;
    m.tokens = plan.tokens;
    m.prepared = true;
  }
  GLM_CUDA_RETURN_IF_ERROR(
      LaunchRowsToBf16(q, plan.tokens, row, shape.q_stride, m.q_bf16.as<uint16_t>(), m.stream));
  const int32_t* meta = m.meta.as<int32_t>();
  const int32_t* ragged = meta + m.batch.ragged_offset();
  const int32_t* pages = meta + m.batch.page_table_offset();
  const uint16_t* v_layer = cache_layer + shape.block_size * shape.kv_heads * shape.head_dim;
  float scale = shape.scale;
  float neg_inf = api.get_version() < 91000 ? std::numeric_limits<float>::lowest()
                                            : -std::numeric_limits<float>::infinity();
  const int64_t uids[] = {kQ,          kKContainer, kVContainer, kO,       kSeqLenQ, kSeqLenKv,
                          kPageTableK, kPageTableV, kRaggedQ,    kRaggedO, kScale,   kNegInf};
  void* pointers[] = {m.q_bf16.get(),
                      const_cast<uint16_t*>(cache_layer),
                      const_cast<uint16_t*>(v_layer),
                      out,
                      const_cast<int32_t*>(meta + m.batch.seq_len_q_offset()),
                      const_cast<int32_t*>(meta + m.batch.seq_len_kv_offset()),
                      const_cast<int32_t*>(pages),
                      const_cast<int32_t*>(pages),
                      const_cast<int32_t*>(ragged),
                      const_cast<int32_t*>(ragged),
                      &scale,
                      &neg_inf};
  ASSIGN_OR_RETURN(Desc pack, Desc::Make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  RETURN_IF_ERROR(Set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 12, uids,
                      "variant uids"));
  RETURN_IF_ERROR(Set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 12,
                      pointers, "variant pointers"));
  void* workspace = m.workspace.get();
  RETURN_IF_ERROR(Set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                      &workspace, "variant workspace"));
  if (const cudnnStatus_t s = api.finalize(pack.get()); s != CUDNN_STATUS_SUCCESS) {
    Disable(std::string(CudnnError(s, "finalize variant pack").message()));
    return false;
  }
  if (const cudnnStatus_t s = api.execute(m.handle, m.plan->plan(), pack.get());
      s != CUDNN_STATUS_SUCCESS) {
    // Nothing was enqueued for this call: the caller's kernel runs it instead.
    Disable(std::string(CudnnError(s, "execute").message()));
    return false;
  }
  ++layer_calls_;
  return true;
}

#endif  // GLM_HAVE_CUDNN

}  // namespace glmserve::cuda
