// CudaModel: creation, validation, memory and the step driver. The per-layer work it enqueues
// is in layers.cc, CUDA graphs in model_graphs.cc, the logits and device sampling in
// model_logits.cc.
#include "core/cuda/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cuda/cublas_api.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels.h"
#include "core/cuda/runner.h"

namespace glmserve::cuda {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// GLM-5's tensor-core attention scratch (partial outputs per token, head and key split):
// GLM-5 needs 4.3 MB per token, so 256 MiB covers decode steps of up to 32 tokens.
constexpr int64_t kMlaTcScratchBytes = int64_t{256} << 20;

static_assert(kAttentionTileInts == kTileInts, "step_plan.h and kernels.h tile layouts differ");

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Carves aligned pieces out of one allocation: a first pass with base 0 sizes it.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* Take(int64_t count) {
    offset_ = RoundUp(offset_, 256);
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += std::max<int64_t>(count, 0) * static_cast<int64_t>(sizeof(T));
    return p;
  }
  int64_t size() const { return RoundUp(offset_, 256); }

 private:
  char* base_;
  int64_t offset_ = 0;
};

// The kernel switches' environment overrides (each "0" turns its path off; "1" turns on
// cuDNN attention, off by default): for comparing paths on one binary, e.g. the GPU check's
// prefill with attention on CUDA cores.
CudaModelOptions WithEnvironmentOverrides(CudaModelOptions options) {
  const auto off = [](const char* name) {
    const char* env = std::getenv(name);
    return env != nullptr && env[0] == '0';
  };
  if (const char* env = std::getenv("GLMSERVE_CUDNN_ATTN"); env != nullptr && env[0] == '1') {
    options.cudnn_attention = true;
  }
  if (off("GLMSERVE_CUDA_GRAPHS")) options.cuda_graphs = false;
  if (off("GLMSERVE_MLA_TC")) options.mla_tensor_cores = false;
  if (off("GLMSERVE_ATTN_TC")) options.attention_tensor_cores = false;
  if (off("GLMSERVE_CUDNN_ATTN")) options.cudnn_attention = false;
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(ModelWeights weights,
                                                             const CudaModelOptions& options) {
  std::unique_ptr<CudaModel> model = absl::WrapUnique(new CudaModel());
  RETURN_IF_ERROR(model->Init(std::move(weights), options));
  return model;
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::CreateRank(ModelWeights weights,
                                                                 const CudaModelOptions& options,
                                                                 const RankLayout& layout,
                                                                 Communicator* comm) {
  if (comm == nullptr || comm->size() != layout.size || comm->rank() != layout.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", layout.rank, " of ", layout.size, " needs that rank's communicator"));
  }
  // The routed experts' width this rank computes: kernels and buffers see the rank's width.
  const int64_t expert_width = layout.ExpertWidth(weights.config).count;
  if (weights.config.n_routed_experts > 0 && expert_width == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("routed experts of width ", weights.config.moe_intermediate_size,
                     " split over ", layout.size, " ranks leave rank ", layout.rank,
                     " none of it; serve them expert parallel (--expert_parallel)"));
  }
  weights.config.moe_intermediate_size = expert_width;
  std::unique_ptr<CudaModel> model = absl::WrapUnique(new CudaModel());
  model->layout_ = layout;
  model->comm_ = comm;
  RETURN_IF_ERROR(model->Init(std::move(weights), options));
  return model;
}

CudaModel::~CudaModel() {
  // Finish queued work before the buffers it uses go away (errors cannot be reported here).
  if (stream_) cudaStreamSynchronize(stream_.get());
}

absl::Status CudaModel::Init(ModelWeights weights, const CudaModelOptions& options) {
  if (std::string why = CudaUnsupportedReason(weights.config); !why.empty()) {
    return absl::UnimplementedError(why);
  }
  config_ = weights.config;
  if (comm_ == nullptr) layout_ = LayoutOf(config_, ParallelConfig{}, 0);  // all of it
  layer_begin_ = weights.layer_begin;
  layer_end_ = weights.layer_end;
  has_embedding_ = weights.has_embedding();
  has_head_ = weights.has_head();
  options_ = WithEnvironmentOverrides(options);
  const ModelConfig& c = config_;
  for (const LayerWeights& l : weights.layers) has_moe_ = has_moe_ || l.is_moe;
  if (weights.mtp) has_moe_ = has_moe_ || weights.mtp->layer.is_moe;
  is_mla_ = c.is_mla();
  // The config's word, not the weights': an FP8 preset's device-generated wq_b has no host data.
  for (const LayerWeights& l : weights.layers) {
    has_indexer_ |= is_mla_ && c.has_indexer(l.layer_index);
  }
  if (weights.mtp) has_indexer_ |= is_mla_;  // the MTP layer keeps its own indexer
  const int64_t group = is_mla_ ? 1 : c.num_attention_heads / c.num_key_value_heads;
  if (is_mla_) {
    // The indexer kernel stages one token's queries and head weights in 48 KiB of shared
    // memory (GLM-5: 32 x 128); the attention kernel its q and latent vectors.
    const int64_t index_smem = 4 * (c.index_n_heads * c.index_head_dim + c.index_n_heads);
    const int64_t mla_smem = 4 * (c.qk_head_dim() + 2 * c.kv_lora_rank);
    if (index_smem > 48 * 1024 || mla_smem > 48 * 1024) {
      return absl::UnimplementedError(
          absl::StrCat("CUDA backend: index_n_heads x (index_head_dim + 1) = ", index_smem / 4,
                       " or qk_head_dim + 2 kv_lora_rank = ", mla_smem / 4,
                       " exceeds the MLA kernels' 12288 shared-memory floats"));
    }
    // A shared indexer layer reads the selection of the full layer before it in the same
    // step (CreateModelRunner refuses such spans too; CudaModel::Create is public).
    if (!weights.layers.empty() && !c.has_indexer(weights.layers[0].layer_index)) {
      return absl::InvalidArgumentError(
          "the layer span starts at a 'shared' DSA indexer layer; start it at a 'full' layer");
    }
  } else if (c.head_dim > kMaxHeadDim || group > kMaxGqaGroup) {
    return absl::UnimplementedError(
        absl::StrCat("CUDA backend: head_dim ", c.head_dim, " (max ", kMaxHeadDim, ") or ", group,
                     " query heads per kv head (max ", kMaxGqaGroup, ") not supported"));
  }
  // The router row limits (rowmath::kMax*) are ValidateConfig's, for both backends.
  router_ = RouterParamsOf(c);
  // MLA tiles hold one token: its kernels run one block per (token, head).
  tile_tokens_ = is_mla_ ? 1 : AttentionTileTokens(group);

  GLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  cudaDeviceProp prop;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options_.device));
  device_name_ = absl::StrCat("cuda:", options_.device, " ", prop.name);
  sm_count_ = std::max(1, prop.multiProcessorCount);
  GLM_CUDA_RETURN_IF_ERROR(PrepareKernels());

  ASSIGN_OR_RETURN(Stream stream, CreateStream());
  stream_ = std::move(stream);
  ASSIGN_OR_RETURN(CublasHandle cublas, CreateCublas());
  cublas_ = std::move(cublas);
  ASSIGN_OR_RETURN(DeviceBuffer workspace, DeviceBuffer::Create(kCublasWorkspaceBytes));
  cublas_workspace_ = std::move(workspace);
  // Stream first: cublasSetStream resets the workspace to cuBLAS's own pool. A workspace of
  // our own keeps cuBLAS from allocating during graph capture.
  GLM_CUBLAS_RETURN_IF_ERROR(Cublas().set_stream(cublas_.get(), stream_.get()));
  if (comm_ != nullptr) comm_->SetStream(stream_.get());
  GLM_CUBLAS_RETURN_IF_ERROR(
      Cublas().set_workspace(cublas_.get(), cublas_workspace_.get(), kCublasWorkspaceBytes));
  if (is_mla_ || !options_.attention_tensor_cores || !options_.cudnn_attention) {
    cudnn_attn_status_ = is_mla_ ? "not used for MLA"
                                 : "off (the default; CudaModelOptions or "
                                   "GLMSERVE_CUDNN_ATTN=1 turn it on; GLMSERVE_ATTN_TC=0)";
  } else {
    AttentionShape shape;
    shape.heads = c.num_attention_heads;
    shape.kv_heads = c.num_key_value_heads;
    shape.head_dim = c.head_dim;
    shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    absl::StatusOr<std::unique_ptr<CudnnAttention>> cudnn =
        CudnnAttention::Create(shape, stream_.get());
    if (cudnn.ok()) {
      cudnn_attn_ = *std::move(cudnn);
    } else {
      cudnn_attn_status_ = std::string(cudnn.status().message());
      if (CudnnAttentionBuilt()) {  // a build without cuDNN says so in compute_description()
        std::fprintf(stderr, "glmserve: cuDNN attention unavailable, tensor-core kernel: %s\n",
                     cudnn_attn_status_.c_str());
      }
    }
  }

  DeviceSlice slice;
  if (tensor_parallel()) {
    slice.whole = false;
    slice.vocab_rows = layout_.vocab.count;
    slice.experts = layout_.experts;
  }
  ASSIGN_OR_RETURN(DeviceWeights uploaded,
                   UploadWeights(weights, stream_.get(), options_.upload_progress, slice));
  weights_ = std::move(uploaded);
  weights = ModelWeights{};  // release the host copies (file mappings, random buffers)

  // Buffers whose size does not depend on the step. The split scratch covers any split
  // choice of ChooseSplits: tiles * kv_heads * splits < 4 * SMs whenever splits > 1.
  // The MTP layer's block, when uploaded, is one more layer (DeviceWeights::layers).
  const int64_t device_layers = static_cast<int64_t>(weights_.layers.size());
  const int64_t offsets_count = has_moe_ ? device_layers * (c.n_routed_experts + 1) : 0;
  const int64_t scratch_floats =
      AttentionScratchFloats(2 * sm_count_, 1, group, c.head_dim, /*num_splits=*/2);
  if (is_mla_ && options_.mla_tensor_cores) {
    // Every token attends to at most index_topk keys when the span has an indexer (a shorter
    // context is dense), else to its whole context.
    mla_tc_layout_ =
        MlaTcLayoutFor(MlaShapeOf(c), has_indexer_ ? c.index_topk : c.max_position_embeddings);
    const MlaTcLayout& l = mla_tc_layout_;
    const int64_t per_token = l.q_cat_elems * 2 + 4 * (l.o_part_floats + l.ml_part_floats);
    // A power of two, so that every graph bucket up to it fits.
    const int64_t fit =
        std::min(kMaxMlaGraphTokens, kMlaTcScratchBytes / std::max<int64_t>(per_token, 1));
    mla_tc_tokens_ = l.supported && fit >= 1 ? 1 : 0;
    while (mla_tc_tokens_ > 0 && mla_tc_tokens_ * 2 <= fit) mla_tc_tokens_ *= 2;
  }
  const auto carve = [&](Carver& cv) {
    mla_tc_scratch_.q_cat = cv.Take<uint16_t>(mla_tc_tokens_ * mla_tc_layout_.q_cat_elems);
    mla_tc_scratch_.o_part = cv.Take<float>(mla_tc_tokens_ * mla_tc_layout_.o_part_floats);
    mla_tc_scratch_.ml_part = cv.Take<float>(mla_tc_tokens_ * mla_tc_layout_.ml_part_floats);
    attn_scratch_ = cv.Take<float>(scratch_floats);
    expert_offsets_ = cv.Take<int32_t>(offsets_count);
    head_x_ = cv.Take<uint16_t>(has_head_ ? kLogitChunk * c.hidden_size : 0);
    logits_ = cv.Take<float>(has_head_ ? kLogitChunk * c.vocab_size : 0);
    const bool split_head = has_head_ && tensor_parallel();
    head_part_ = cv.Take<float>(split_head ? kLogitChunk * layout_.vocab.count : 0);
    head_gather_ = cv.Take<float>(split_head && head_root() ? kLogitChunk * c.vocab_size : 0);
  };
  Carver sizer(nullptr);
  carve(sizer);
  ASSIGN_OR_RETURN(DeviceBuffer fixed, DeviceBuffer::Create(static_cast<size_t>(sizer.size())));
  fixed_memory_ = std::move(fixed);
  Carver carver(static_cast<char*>(fixed_memory_.get()));
  carve(carver);
  if (has_head_) {
    ASSIGN_OR_RETURN(PinnedBuffer host,
                     PinnedBuffer::Create(sizeof(float) * kLogitChunk * c.vocab_size));
    logits_host_ = std::move(host);
  }
  if (offsets_count > 0) {
    ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Create(sizeof(int32_t) * offsets_count));
    offsets_host_ = std::move(host);
  }
  RETURN_IF_ERROR(InitFp8TensorCores());
  return EnsureCapacity(256, 1024);
}

void CudaModel::set_mla_tensor_cores(bool on) {
  cudaStreamSynchronize(stream_.get());  // no captured graph is in flight when dropped
  graphs_.clear();
  options_.mla_tensor_cores = on;
}

std::string CudaModel::compute_description() const {
  std::string text = "bf16 activations, fp32 accumulation";
  if (fp8_max_cols_ > 0) {
    absl::StrAppend(&text, "; FP8 weights, tensor cores ",
                    fp8_tensor_cores_ ? (fp8_tc_ != nullptr ? "on" : "unavailable") : "off", " (",
                    fp8_tc_status_, "): FP8 GEMMs on tensor cores ", fp8_tc_gemms_,
                    ", on CUDA cores ", fp8_fallback_gemms_);
  }
  if (is_mla_) {
    absl::StrAppend(&text, "; MLA attention on tensor cores for steps of up to ", mla_tc_tokens(),
                    " tokens");
  } else {
    absl::StrAppend(
        &text, "; attention on ",
        options_.attention_tensor_cores ? "tensor cores (bf16 KV cache)" : "CUDA cores");
    if (cudnn_attn_ != nullptr && !cudnn_attn_->disabled()) {
      absl::StrAppend(&text, ", cuDNN fused SDPA for steps outside CUDA graphs (",
                      cudnn_attn_->status(), "; ", cudnn_attn_->layer_calls(), " layer calls)");
    } else {
      absl::StrAppend(&text, "; cuDNN attention ", cudnn_attention_status());
    }
  }
  absl::StrAppend(&text, "; CUDA graphs ", options_.cuda_graphs ? "on" : "off");
  if (tensor_parallel()) {
    absl::StrAppend(&text, "; tensor-parallel rank ", layout_.rank, " of ", layout_.size,
                    " (collectives on the model's stream)");
  }
  return text;
}

int64_t CudaModel::kv_bytes_per_token() const {
  if (kv_fp8_) {  // a code per value, a 4-byte scale per token, kind and KV head
    return cache_layers() * 2 * config_.num_key_value_heads * (config_.head_dim + 4);
  }
  // bf16: K and V rows (GLM-4.5) or the latent row (GLM-5).
  return cache_layers() * config_.cache_values_per_token_layer() * 2;
}

absl::Status CudaModel::EnableMtp() {
  if (!has_mtp()) {
    return absl::FailedPreconditionError(
        "the model has no MTP layer on the device (none in the checkpoint, a layer span, or an "
        "FP8 eh_proj or head): serve with --mtp_draft_tokens=0");
  }
  mtp_enabled_ = true;
  return absl::OkStatus();
}

absl::Status CudaModel::SetKvCacheDType(KvCacheDType dtype) {
  if (dtype == KvCacheDType::kFp32) {
    return absl::FailedPreconditionError(
        "--kv_cache_dtype=fp32 is the CPU backend's; the CUDA backend's cache is bf16 (auto, "
        "bf16) or fp8_e4m3 (docs/kv_cache.md)");
  }
  if (dtype == KvCacheDType::kFp8E4M3 && is_mla_) {
    return absl::FailedPreconditionError(
        "--kv_cache_dtype=fp8_e4m3 covers GLM-4.5's keys and values; GLM-5's latent cache "
        "(glm_moe_dsa) stays bf16 on the CUDA backend (docs/kv_cache.md)");
  }
  kv_fp8_ = dtype == KvCacheDType::kFp8E4M3;
  return absl::OkStatus();
}

Fp8KvLayer CudaModel::Fp8Layer(KvCache* cache, int64_t layer) {
  uint8_t* base = static_cast<uint8_t*>(cache->storage());
  const int64_t offset = cache->ElementOffset(layer, 0, 0);  // codes: one byte per value
  float* scales = reinterpret_cast<float*>(base + Fp8KvScalesOffset(cache->shape()));
  return Fp8KvLayer{base + offset, scales + offset / cache->shape().head_dim};
}

absl::StatusOr<std::unique_ptr<KvCache>> CudaModel::CreateCache(int64_t num_blocks,
                                                                int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError("KV cache needs a positive block count and block size");
  }
  if (num_blocks * block_size > int64_t{1} << 30) {
    return absl::InvalidArgumentError("CUDA KV cache: at most 2^30 token slots (int32 slot ids)");
  }
  KvCacheShape shape = CacheShapeFor(config_, cache_layers(), num_blocks, block_size);
  shape.fp8 = kv_fp8_;
  // bf16, or FP8: a byte per value, then (aligned) a 4-byte scale per head_dim values. The
  // checked byte count bounds every product below (the scales are 4 / head_dim of the codes).
  ASSIGN_OR_RETURN(int64_t checked_bytes, KvCacheBytes(shape, kv_fp8_ ? 1 : 2));
  if (kv_fp8_) checked_bytes = Fp8KvScalesOffset(shape) + checked_bytes / shape.head_dim * 4;
  GLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  void* storage = nullptr;
  const size_t bytes = static_cast<size_t>(checked_bytes);
  if (cudaMalloc(&storage, bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a ", bytes, "-byte KV cache on ", device_name_));
  }
  // Zeros, so that never-written slots hold finite values. On the model's stream: a plain
  // cudaMemset runs on the legacy stream, which a non-blocking stream does not wait for.
  cudaError_t e = cudaMemsetAsync(storage, 0, bytes, stream_.get());
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_.get());
  if (e != cudaSuccess) {
    cudaFree(storage);
    return CudaError(e, "cudaMemsetAsync(kv cache)", __FILE__, __LINE__);
  }
  return std::make_unique<KvCache>(shape, storage, kv_fp8_ ? DType::kF8E4M3 : DType::kBF16,
                                   [](void* p) { cudaFree(p); });
}

// The engine asks for logits per sequence (a decode wants its last row, a prefill chunk
// mid-prompt none). The step plan computes one policy for the whole batch, so compute the
// union (all rows if any sequence wants all, else each sequence's last row) and keep the
// requested rows, in batch order. The head rows a chunk did not need cost little next to
// the step.
absl::Status CudaModel::ForwardSelectingLogits(const ForwardBatch& batch, KvCache* cache,
                                               const ForwardOptions& options,
                                               ForwardResult* result) {
  ASSIGN_OR_RETURN(const bool any, StepWantsLogits(batch, options));
  RETURN_IF_ERROR(ValidateSampleRequests(batch, options, config_.vocab_size));
  bool any_all = false;
  for (LogitsRows r : options.sequence_logits) any_all |= r == LogitsRows::kAll;
  ForwardOptions whole = options;
  whole.sequence_logits.clear();
  whole.logits = any_all ? LogitsRows::kAll : (any ? LogitsRows::kLast : LogitsRows::kNone);
  const std::vector<int64_t> computed = ReturnedLogitRows(batch, whole);
  const std::vector<int64_t> wanted =
      any ? ReturnedLogitRows(batch, options) : std::vector<int64_t>{};
  if (!options.sample.empty()) {
    // One request per computed row: the wanted rows' own, nothing for the others.
    whole.sample.assign(computed.size(), RowSampleRequest{false, {}, false});
    size_t source = 0;
    for (size_t i = 0; i < wanted.size(); ++i) {
      while (computed[source] != wanted[i]) ++source;
      whole.sample[source] = options.sample[i];
    }
  }
  RETURN_IF_ERROR(Forward(batch, cache, whole, result));
  // A rank other than a group's rank 0 sent its head slices to rank 0 and holds no logits or
  // tokens to select from.
  if (!any || !head_root()) return absl::OkStatus();
  if (!options.sample.empty()) {
    // The logits hold the kept rows only, in order already; tokens and flags are per
    // computed row: keep the wanted ones.
    std::vector<int32_t> tokens, top_ids;
    std::vector<uint8_t> finite;
    std::vector<float> logprobs, top_logprobs;
    const bool with_logprobs = !result->token_logprobs.empty();
    const int64_t k = samplemath::kMaxRowTopLogprobs;
    size_t source = 0;
    for (int64_t row : wanted) {
      while (computed[source] != row) ++source;
      tokens.push_back(result->tokens[source]);
      finite.push_back(result->row_finite[source]);
      if (!with_logprobs) continue;
      logprobs.push_back(result->token_logprobs[source]);
      top_ids.insert(top_ids.end(), result->top_ids.begin() + source * k,
                     result->top_ids.begin() + (source + 1) * k);
      top_logprobs.insert(top_logprobs.end(), result->top_logprobs.begin() + source * k,
                          result->top_logprobs.begin() + (source + 1) * k);
    }
    result->tokens = std::move(tokens);
    result->row_finite = std::move(finite);
    result->token_logprobs = std::move(logprobs);
    result->top_ids = std::move(top_ids);
    result->top_logprobs = std::move(top_logprobs);
    return absl::OkStatus();
  }
  // Compact in place: both row lists ascend and every wanted row was computed, so a kept row
  // only moves towards the front (its destination never passes its source): no second
  // buffer and, when every computed row is wanted (a decode-only step), no copy at all.
  const int64_t vocab = config_.vocab_size;
  float* logits = result->logits.data();
  size_t source = 0;
  int64_t kept = 0;
  for (int64_t row : wanted) {
    while (computed[source] != row) ++source;
    if (static_cast<int64_t>(source) != kept) {
      std::memmove(logits + kept * vocab, logits + source * vocab, sizeof(float) * vocab);
    }
    ++kept;
  }
  result->logits.resize(kept * vocab);  // shrinks: no fill, capacity kept
  return absl::OkStatus();
}

absl::Status CudaModel::CheckBatch(const ForwardBatch& batch, const KvCache& cache) const {
  if (cache.host_fp32() || cache.host_fp8() ||
      (cache.dtype() != DType::kBF16 && cache.dtype() != DType::kF8E4M3) ||
      cache.shape().fp8 != (cache.dtype() == DType::kF8E4M3)) {
    return absl::InvalidArgumentError("KV cache was not created by the CUDA backend");
  }
  if (cache.shape().fp8 && is_mla_) {  // the latent kernels read bf16 rows
    return absl::InvalidArgumentError("an FP8 KV cache cannot hold GLM-5's latent rows");
  }
  if (cache.shape().num_layers != cache_layers()) {
    return absl::InvalidArgumentError("KV cache shape does not match the model");
  }
  return ValidateForwardBatch(batch, config_, cache.shape(), /*token_input=*/has_embedding_);
}

absl::Status CudaModel::EnsureCapacity(int64_t tokens, int64_t block_table_entries) {
  const ModelConfig& c = config_;
  const bool grow_tokens = tokens > token_cap_;
  const bool grow_meta = grow_tokens || block_table_entries > meta_layout_.block_table_cap;
  if (!grow_tokens && !grow_meta) return absl::OkStatus();
  // Reallocation moves buffers that queued work and captured graphs point to.
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  graphs_.clear();
  last_step_valid_ = false;
  if (grow_tokens) {
    const int64_t t = RoundUp(std::max<int64_t>(tokens, 1), 256);
    // The group's sums (the residual's rows) allocate nothing once a graph captures them.
    if (tensor_parallel()) RETURN_IF_ERROR(comm_->Prepare(t * c.hidden_size));
    const int64_t p = t * c.num_experts_per_tok;
    const int64_t hidden = c.hidden_size;
    int64_t gu_rows_width = 0;  // max over FFN kinds of rows * width
    for (const DeviceLayer& l : weights_.layers) {
      if (!l.is_moe) gu_rows_width = std::max(gu_rows_width, t * l.dense.width);
      if (l.is_moe) gu_rows_width = std::max(gu_rows_width, p * c.moe_intermediate_size);
      if (l.shared.present()) gu_rows_width = std::max(gu_rows_width, t * l.shared.width);
    }
    const auto carve = [&](Carver& cv) {
      a_.h = cv.Take<float>(t * hidden);
      a_.delta = cv.Take<float>(t * hidden);
      a_.x = cv.Take<uint16_t>(t * hidden);
      a_.x32 = cv.Take<float>(has_moe_ || has_indexer_ ? t * hidden : 0);
      a_.qkv = cv.Take<float>(is_mla_ ? 0 : t * (c.q_dim() + 2 * c.kv_dim()));
      a_.attn = cv.Take<uint16_t>(t * (is_mla_ ? c.num_attention_heads * c.v_head_dim : c.q_dim()));
      a_.gate_up = cv.Take<float>(2 * gu_rows_width);
      a_.act = cv.Take<uint16_t>(gu_rows_width);
      const int64_t moe_p = has_moe_ ? p : 0;
      a_.router_logits = cv.Take<float>(has_moe_ ? t * c.n_routed_experts : 0);
      a_.topk_ids = cv.Take<int32_t>(moe_p);
      a_.topk_w = cv.Take<float>(moe_p);
      a_.sorted = cv.Take<int32_t>(moe_p);
      a_.pair_pos = cv.Take<int32_t>(moe_p);
      a_.xp = cv.Take<uint16_t>(moe_p * hidden);
      a_.yp = cv.Take<float>(moe_p * hidden);
      const int64_t mla_t = is_mla_ ? t : 0, idx_t = has_indexer_ ? t : 0;
      a_.q_a = cv.Take<float>(mla_t * c.q_lora_rank);
      a_.q_resid = cv.Take<uint16_t>(mla_t * c.q_lora_rank);
      a_.mla_q = cv.Take<float>(mla_t * c.num_attention_heads * c.qk_head_dim());
      a_.kv_a = cv.Take<float>(mla_t * (c.kv_lora_rank + c.qk_rope_head_dim));
      a_.iq = cv.Take<float>(idx_t * c.index_n_heads * c.index_head_dim);
      a_.ik = cv.Take<float>(idx_t * c.index_head_dim);
      a_.iw = cv.Take<float>(idx_t * c.index_n_heads);
      a_.sel_count = cv.Take<int32_t>(idx_t);
      a_.sel_pos = cv.Take<int32_t>(idx_t * c.index_topk);
    };
    arena_memory_.Reset();  // free first: old and new need not fit together
    Carver sizer(nullptr);
    carve(sizer);
    absl::StatusOr<DeviceBuffer> memory = DeviceBuffer::Create(static_cast<size_t>(sizer.size()));
    if (!memory.ok()) {
      token_cap_ = 0;
      return memory.status();
    }
    arena_memory_ = *std::move(memory);
    Carver carver(static_cast<char*>(arena_memory_.get()));
    carve(carver);
    token_cap_ = t;
    RETURN_IF_ERROR(EnsureFp8Scratch(t));
  }
  MetaLayout layout;
  layout.token_cap = token_cap_;
  layout.block_table_cap = std::max(meta_layout_.block_table_cap,
                                    RoundUp(std::max<int64_t>(block_table_entries, 1), 1024));
  meta_device_.Reset();
  ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::Create(sizeof(int32_t) * layout.total()));
  ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Create(sizeof(int32_t) * layout.total()));
  meta_device_ = std::move(device);
  meta_host_ = std::move(host);
  meta_layout_ = layout;
  return absl::OkStatus();
}

absl::Status CudaModel::UploadPlan() {
  // The pinned buffer may still feed the previous step's copy if that step failed half-way;
  // after a completed step this returns at once.
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  const int64_t used = WriteMeta(plan_, meta_layout_, meta_host_.as<int32_t>());
  GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta_device_.get(), meta_host_.get(),
                                           sizeof(int32_t) * used, cudaMemcpyHostToDevice,
                                           stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaModel::CopyHidden(int64_t rows, std::vector<float>* out) {
  const size_t bytes = sizeof(float) * rows * config_.hidden_size;
  if (io_host_.bytes() < bytes) {
    ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Create(bytes));
    io_host_ = std::move(host);
  }
  GLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(io_host_.get(), a_.h, bytes, cudaMemcpyDeviceToHost, stream_.get()));
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  out->assign(io_host_.as<float>(), io_host_.as<float>() + rows * config_.hidden_size);
  return absl::OkStatus();
}

absl::Status CudaModel::CopyHeadInput(const float* norm, int64_t rows, std::vector<float>* out) {
  const ModelConfig& c = config_;
  GLM_CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(a_.h, nullptr, norm, rows, c.hidden_size,
                                            static_cast<float>(c.rms_norm_eps), nullptr, a_.x,
                                            a_.x32, stream_.get()));
  const size_t bytes = sizeof(float) * rows * c.hidden_size;
  if (io_host_.bytes() < bytes) {
    ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Create(bytes));
    io_host_ = std::move(host);
  }
  GLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(io_host_.get(), a_.x32, bytes, cudaMemcpyDeviceToHost, stream_.get()));
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  out->assign(io_host_.as<float>(), io_host_.as<float>() + rows * c.hidden_size);
  return absl::OkStatus();
}

absl::Status CudaModel::UploadHiddenIn(absl::Span<const float> hidden_in, int64_t rows) {
  const ModelConfig& c = config_;
  const size_t bytes = sizeof(float) * rows * c.hidden_size;
  if (io_host_.bytes() < bytes) {
    ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Create(bytes));
    io_host_ = std::move(host);
  }
  std::memcpy(io_host_.get(), hidden_in.data(), bytes);
  GLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(a_.h, io_host_.get(), bytes, cudaMemcpyHostToDevice, stream_.get()));
  if (plan_.tokens > rows) {  // padding rows: finite inputs
    GLM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a_.h + rows * c.hidden_size, 0,
                                             sizeof(float) * (plan_.tokens - rows) * c.hidden_size,
                                             stream_.get()));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::EnsureIndexScores(bool graph) {
  // A graph replays one score stride: max_position_embeddings, which CheckBatch holds every
  // context to (GLM-5: 64 tiles x 202752 x 4 bytes, 52 MB). Eager steps take their longest.
  const ModelConfig& c = config_;
  index_stride_ = graph && has_indexer_ ? c.max_position_embeddings : plan_.max_kv_len;
  if (has_indexer_ && (graph || plan_.max_kv_len > c.index_topk)) {
    const size_t need = sizeof(float) * std::min(plan_.num_tiles, kIndexerTiles) *
                        static_cast<size_t>(index_stride_);
    if (index_scores_.bytes() < need) {
      // Captured graphs point at the old buffer (UploadPlan waited: nothing queued reads it).
      graphs_.clear();
      index_scores_.Reset();
      ASSIGN_OR_RETURN(DeviceBuffer scores, DeviceBuffer::Create(need));
      index_scores_ = std::move(scores);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(const ForwardBatch& batch, KvCache* cache,
                                const ForwardOptions& options, ForwardResult* result) {
  if (cache == nullptr) return absl::InvalidArgumentError("no KV cache");
  if ((options.layer_begin >= 0 && options.layer_begin != layer_begin_) ||
      (options.layer_end >= 0 && options.layer_end != layer_end_)) {
    return absl::UnimplementedError(
        "the CUDA backend runs only its whole span of layers; a sub-span call needs a server "
        "started with that span (--layers) or the CPU backend");
  }
  if (options.return_expert_choices) {
    return absl::UnimplementedError(
        "expert choices are the CPU runner's measurement (bench/moe_routing_bench): use "
        "--device=cpu for them");
  }
  if (!options.sequence_logits.empty())
    return ForwardSelectingLogits(batch, cache, options, result);
  if (!options.sample.empty() && (options.mtp || !has_head_)) {
    return absl::InvalidArgumentError("device sampling needs a step of the model's own head");
  }
  RETURN_IF_ERROR(ValidateSampleRequests(batch, options, config_.vocab_size));
  if (options.mtp) return ForwardMtp(batch, cache, options, result);
  if (options.return_head_input && !has_head_) {
    return absl::InvalidArgumentError("head inputs need a run that ends at the last layer");
  }
  RETURN_IF_ERROR(CheckBatch(batch, *cache));
  RETURN_IF_ERROR(ValidateRunSpan(layer_begin_, layer_end_, layer_begin_, layer_end_,
                                  config_.num_hidden_layers, options.logits != LogitsRows::kNone));
  GLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  StepPadding pad;
  const bool graph = GraphPadding(batch, options, &pad);
  const int64_t real = batch.total_tokens();
  BuildStepPlan(batch, options.logits, cache->shape().block_size, tile_tokens_,
                graph ? pad : StepPadding{}, has_embedding_, &plan_);
  RETURN_IF_ERROR(EnsureCapacity(plan_.tokens, static_cast<int64_t>(plan_.block_tables.size())));
  num_splits_ = ChooseSplits(plan_.num_tiles, plan_.max_kv_len, graph);
  RETURN_IF_ERROR(UploadPlan());  // waits for the previous step: buffers may be replaced
  RETURN_IF_ERROR(EnsureIndexScores(graph));
  last_step_valid_ = false;
  if (!has_embedding_) RETURN_IF_ERROR(UploadHiddenIn(batch.hidden_in, real));
  result->logits.clear();
  result->tokens.clear();
  result->row_finite.clear();
  result->token_logprobs.clear();
  result->top_ids.clear();
  result->top_logprobs.clear();
  result->hidden.clear();
  result->layer_hidden.clear();
  result->head_input.clear();
  step_head_norm_ = weights_.final_norm;
  step_head_ = weights_.lm_head;
  const bool want_logits = options.logits != LogitsRows::kNone;

  // A graph's last layer finishes its padded logits rows (the count it was captured with).
  head_rows_ =
      FinishOnlyHeadRows(options, graph ? plan_.logit_rows : plan_.real_logit_rows, plan_.tokens)
          ? (graph ? plan_.logit_rows : plan_.real_logit_rows)
          : -1;
  if (graph) {
    RETURN_IF_ERROR(RunGraph(cache, want_logits));
    if (real > static_cast<int64_t>(batch.sequences.size())) ++mixed_graph_launches_;
  } else {
    if (has_embedding_) RETURN_IF_ERROR(EnqueueEmbedding());
    if (options.return_layer_hidden) {
      RETURN_IF_ERROR(CopyHidden(real, &result->layer_hidden.emplace_back()));
    }
    bool pending = false;
    for (int64_t i = 0; i < layer_end_ - layer_begin_; ++i) {
      RETURN_IF_ERROR(EnqueueLayer(i, cache, &pending));
      if (options.return_layer_hidden) {
        RETURN_IF_ERROR(EnqueueResolve(&pending));
        RETURN_IF_ERROR(CopyHidden(real, &result->layer_hidden.emplace_back()));
      }
    }
    RETURN_IF_ERROR(EnqueueResolve(&pending));
    if (options.return_hidden) RETURN_IF_ERROR(CopyHidden(real, &result->hidden));
  }
  if (want_logits) {
    RETURN_IF_ERROR(ReadLogits(graph, options.sample.empty() ? nullptr : &options.sample,
                               options.penalised_ids, result));
  }
  // After the logits: the head input's norm reuses the normed-input buffers.
  if (options.return_head_input) {
    RETURN_IF_ERROR(CopyHeadInput(weights_.final_norm, real, &result->head_input));
  }
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  GLM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  last_step_valid_ = true;
  return absl::OkStatus();
}

bool CudaModel::FinishOnlyHeadRows(const ForwardOptions& options, int64_t logit_rows,
                                   int64_t tokens) const {
  // GLM-5's attention ends in its own kernels (not done there yet). head_h() lives in the qkv
  // buffer: it must hold hidden floats per row.
  const ModelConfig& c = config_;
  return has_head_ && !is_mla_ && !options.return_hidden && !options.return_layer_hidden &&
         !options.return_head_input && logit_rows < tokens &&
         c.hidden_size <= c.q_dim() + 2 * c.kv_dim();
}

absl::StatusOr<int64_t> CudaModel::LastStepActiveExperts() {
  if (!has_moe_) return 0;
  if (!last_step_valid_) return absl::FailedPreconditionError("no completed Forward step");
  const int64_t e_plus = config_.n_routed_experts + 1;
  const int64_t layers = layer_end_ - layer_begin_;
  GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(offsets_host_.get(), expert_offsets_,
                                           sizeof(int32_t) * layers * e_plus,
                                           cudaMemcpyDeviceToHost, stream_.get()));
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  int64_t active = 0;
  for (int64_t l = 0; l < layers; ++l) {
    if (!weights_.layers[l].is_moe) continue;
    const int32_t* off = offsets_host_.as<int32_t>() + l * e_plus;
    for (int64_t e = 0; e + 1 < e_plus; ++e) active += off[e + 1] > off[e] ? 1 : 0;
  }
  return active;
}

absl::Status CudaModel::RunFfnForTest(int64_t layer, absl::Span<const float> x, int64_t tokens,
                                      bool device_moe, std::vector<float>* y) {
  const int64_t hidden = config_.hidden_size;
  if (layer < 0 || layer >= layer_end_ - layer_begin_ ||
      static_cast<int64_t>(x.size()) != tokens * hidden || tokens <= 0) {
    return absl::InvalidArgumentError("RunFfnForTest: bad layer or input size");
  }
  GLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  RETURN_IF_ERROR(EnsureCapacity(tokens, 0));
  last_step_valid_ = false;
  float* x32 = has_moe_ ? a_.x32 : a_.delta;  // delta is only written after x is consumed
  GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x32, x.data(), sizeof(float) * x.size(),
                                           cudaMemcpyHostToDevice, stream_.get()));
  GLM_CUDA_RETURN_IF_ERROR(LaunchFloatToBf16(x32, tokens * hidden, a_.x, stream_.get()));
  const DeviceLayer& l = weights_.layers[layer];
  if (l.is_moe) {
    RETURN_IF_ERROR(EnqueueMoe(layer, tokens, device_moe));
  } else {
    RETURN_IF_ERROR(EnqueueDenseFfn(l.dense, tokens));
  }
  y->resize(tokens * hidden);
  GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y->data(), a_.delta, sizeof(float) * y->size(),
                                           cudaMemcpyDeviceToHost, stream_.get()));
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
