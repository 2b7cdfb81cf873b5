#include "core/cuda/cudnn_attention.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

#if defined(GLM_HAVE_CUDNN)
#include <cudnn_graph.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "absl/memory/memory.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_attention_plan.h"
#include "core/cuda/cudnn_backend.h"
#include "core/cuda/device_memory.h"
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

using cudnn::Api;
using cudnn::CudnnError;
using cudnn::Desc;
using cudnn::Dims;
using cudnn::GraphBuilder;
using cudnn::LoadCudnn;
using cudnn::Set;
using cudnn::VersionText;

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
};
static_assert(kNegInf < cudnn::kFirstVirtualUid, "the graph's own ids lie below the virtual ones");

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
    if (handle != nullptr) Api().destroy(handle);
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
  GLM_CUDNN_TRY(Api().create(&m.handle), "create handle");
  GLM_CUDNN_TRY(Api().set_stream(m.handle, stream), "set stream");
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
  float neg_inf = Api().get_version() < 91000 ? std::numeric_limits<float>::lowest()
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
  if (const cudnnStatus_t s = Api().finalize(pack.get()); s != CUDNN_STATUS_SUCCESS) {
    Disable(std::string(CudnnError(s, "finalize variant pack").message()));
    return false;
  }
  if (const cudnnStatus_t s = Api().execute(m.handle, m.plan->plan(), pack.get());
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
