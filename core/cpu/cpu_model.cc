#include "core/cpu/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/aligned_vector.h"
#include "core/base/op_times.h"
#include "core/base/status_macros.h"
#include "core/cpu/ops/attention_amx.h"
#include "core/cpu/ops/attention_bf16.h"
#include "core/cpu/ops/embedding.h"
#include "core/cpu/ops/ffn.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/norm.h"
#include "core/cpu/weight_align.h"

namespace glmserve {

CpuModel::CpuModel(ModelWeights weights, CpuMath math)
    : weights_(std::move(weights)),
      math_(math),
      rope_(weights_.config.head_dim, weights_.config.rotary_dim(), weights_.config.rope_theta),
      router_(RouterParamsOf(weights_.config)) {
  // The AMX kernel reads weights in place as tiles, which must sit on cache lines
  // (core/cpu/weight_align.h); a checkpoint's tensors usually do not.
  if (math_ == CpuMath::kBf16Amx) AlignLinearMatrices(&weights_);
  // A shared MTP head is the model's head as it is now (aligned or quantized at load).
  if (weights_.mtp && !weights_.mtp_head_stored) weights_.mtp->head = weights_.lm_head;
  const ModelConfig& c = weights_.config;
  if (!c.is_mla()) return;
  mla_shape_ = MlaShapeOf(c);
  index_shape_ = IndexerShapeOf(c);
  for (const LayerWeights& layer : weights_.layers) {
    absorbed_k_.push_back(AbsorbedKeyWeights(layer.mla.kv_b_proj, mla_shape_));
  }
  if (weights_.mtp) {  // the MTP layer's, at its cache layer's index
    absorbed_k_.push_back(AbsorbedKeyWeights(weights_.mtp->layer.mla.kv_b_proj, mla_shape_));
  }
}

CpuModel::CpuModel(ModelWeights weights, CpuMath math, const RankLayout& layout, Communicator* comm)
    : CpuModel(std::move(weights), math) {
  layout_ = layout;
  comm_ = comm;
}

void CpuModel::SumOverRanks(float* data, int64_t count) {
  if (comm_ == nullptr || !comm_status_.ok()) return;
  const ScopedOpTime timer(OpFamily::kCollective);
  comm_status_ = comm_->AllReduceSum(data, count);
}

void CpuModel::Embed(const int32_t* ids, int64_t t, float* out) {
  const Matrix& table = weights_.embed_tokens;
  if (comm_ == nullptr) {
    EmbedTokens(table, ids, t, out);
    return;
  }
  // This rank's rows are ids [vocab.begin, vocab.end()); every other id embeds as zeros, and
  // the sum over ranks (one non-zero term per element) is the embedding, exactly.
  const int64_t hidden = table.cols;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t id = ids[i] - layout_.vocab.begin;
    if (id >= 0 && id < layout_.vocab.count) {
      const int32_t local = static_cast<int32_t>(id);
      EmbedTokens(table, &local, 1, out + i * hidden);
    } else {
      std::fill_n(out + i * hidden, hidden, 0.0f);
    }
  }
  SumOverRanks(out, t * hidden);
}

std::string CpuModel::compute_description() const {
  if (comm_ != nullptr) {
    return absl::StrCat(SingleRankDescription(), "; tensor parallel rank ", layout_.rank, " of ",
                        layout_.size);
  }
  return SingleRankDescription();
}

std::string CpuModel::SingleRankDescription() const {
  // Only bf16 matrices take the bf16 arithmetic (linear.h); say so when the weights are not.
  const bool bf16_weights = weights_.weight_dtype == DType::kBF16;
  if (weights_.linear_format == WeightFormat::kInt8Groups) {
    // Int8 matrices run their own arithmetic in every mode (linear.h); the unquantized rest (a
    // tied head) runs math_.
    return absl::StrCat("cpu math ", CpuMathName(math_), ", kernel ", LinearKernelName(math_),
                        ", weights int8 (groups of ", kInt8Group, ", quantized at load from ",
                        std::string(DTypeName(weights_.weight_dtype)), ")",
                        weights_.int8_layout == Int8Layout::kRows16 ? " in 16-row blocks" : "",
                        ", activations int8 per group (kernel ", LinearInt8KernelName(), ")");
  }
  if (weights_.linear_format == WeightFormat::kFp8Scaled) {
    // FP8 matrices always run the exact arithmetic (linear.h); the unquantized rest as math_.
    return absl::StrCat("cpu math ", CpuMathName(math_), ", kernel ", LinearKernelName(math_),
                        ", FP8 e4m3 weights widened exactly (kernel ",
                        LinearKernelName(CpuMath::kExact), ")");
  }
  return absl::StrCat(
      "cpu math ", CpuMathName(math_), ", kernel ", LinearKernelName(math_),
      math_ != CpuMath::kExact && !bf16_weights ? " (weights are not bf16: exact arithmetic)" : "");
}

absl::Status CpuModel::EnableMtp() {
  if (!weights_.mtp) {
    return absl::FailedPreconditionError(
        "the model has no MTP layer (a checkpoint without model.layers.<num_hidden_layers>.*, "
        "or a layer span): serve with --mtp_draft_tokens=0");
  }
  mtp_enabled_ = true;
  return absl::OkStatus();
}

KvCacheShape CpuModel::CacheShape(int64_t num_blocks, int64_t block_size) const {
  const int64_t layers = num_span_layers() + (mtp_enabled_ ? 1 : 0);
  KvCacheShape shape = CacheShapeFor(config(), layers, num_blocks, block_size);
  shape.fp8 = kv_cache_dtype() == KvCacheDType::kFp8E4M3;
  shape.bf16 = kv_cache_dtype() == KvCacheDType::kBf16;
  return shape;
}

int64_t CpuModel::kv_bytes_per_token() const {
  const int64_t layers = num_span_layers() + (mtp_enabled_ ? 1 : 0);
  const ModelConfig& c = config();
  switch (kv_cache_dtype()) {
    case KvCacheDType::kFp8E4M3:  // a code per value, a 4-byte scale per token, kind and KV head
      return layers * 2 * c.num_key_value_heads * (c.head_dim + 4);
    case KvCacheDType::kBf16:
      return layers * c.cache_values_per_token_layer() * int64_t{2};
    default:
      return layers * c.cache_values_per_token_layer() * static_cast<int64_t>(sizeof(float));
  }
}

KvCacheDType CpuModel::kv_cache_dtype() const {
  if (kv_dtype_ != KvCacheDType::kAuto) return kv_dtype_;
  // The bf16 attentions (AttentionBlock) round every key and value with FloatToBf16 before
  // use, which is what a bf16 cache stores: the same bits in half the bytes.
  const bool bf16_attention =
      !config().is_mla() && weights_.weight_dtype == DType::kBF16 && math_ != CpuMath::kExact;
  return bf16_attention ? KvCacheDType::kBf16 : KvCacheDType::kFp32;
}

absl::Status CpuModel::SetKvCacheDType(KvCacheDType dtype) {
  if ((dtype == KvCacheDType::kFp8E4M3 || dtype == KvCacheDType::kBf16) && config().is_mla()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--kv_cache_dtype=", KvCacheDTypeName(dtype),
        " covers GLM-4.5's keys and values; GLM-5's latent cache (glm_moe_dsa) stays fp32 on the "
        "CPU (docs/kv_cache.md)"));
  }
  kv_dtype_ = dtype;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCache>> CpuModel::CreateCache(int64_t num_blocks,
                                                               int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError("KV cache needs a positive block count and block size");
  }
  return KvCache::CreateHost(CacheShape(num_blocks, block_size));
}

absl::Status CpuModel::CheckBatch(const ForwardBatch& batch, const KvCache& cache,
                                  int64_t run_begin, int64_t run_end) const {
  if (!cache.host_fp32() && !cache.host_fp8() && !cache.host_bf16()) {
    return absl::InvalidArgumentError("KV cache was not created by the CPU backend");
  }
  if (!cache.host_fp32() && config().is_mla()) {  // the latent kernels read fp32 rows
    return absl::InvalidArgumentError(absl::StrCat("an ", cache.host_fp8() ? "FP8" : "bf16",
                                                   " KV cache cannot hold GLM-5's latent rows"));
  }
  if (cache.shape().num_layers != num_span_layers() + (mtp_enabled_ ? 1 : 0)) {
    return absl::InvalidArgumentError("KV cache shape does not match the model");
  }
  // A shared indexer layer reuses the top-k of the full layer before it, which must run in
  // the same step (ValidateRunSpan has checked the span itself).
  if (config().is_mla() && !config().has_indexer(run_begin)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", run_begin,
                     " is a 'shared' DSA indexer layer: a run must start at a 'full' "
                     "layer, whose top-k the shared layers after it reuse"));
  }
  return ValidateForwardBatch(batch, config(), cache.shape(), /*token_input=*/run_begin == 0);
}

namespace {

// Moves row rows[r] of a row-major [*, width] buffer to row r, for r = 0, 1, ...; rows ascend,
// so every move reads a row no earlier move has written.
void KeepRows(const std::vector<int64_t>& rows, int64_t width, float* data) {
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r] != static_cast<int64_t>(r)) {
      std::copy_n(data + rows[r] * width, width, data + static_cast<int64_t>(r) * width);
    }
  }
}

// The batch's rows `rows` (ascending) as slices of their sequences: a run of consecutive rows
// of one sequence is one slice (its positions consecutive), so attention over the slices gives
// each row what it gets in the whole batch (a row's attention depends only on its own query,
// its position and its sequence's cache: attention.h).
std::vector<SequenceSlice> SlicesOfRows(absl::Span<const SequenceSlice> sequences,
                                        const std::vector<int64_t>& rows) {
  std::vector<SequenceSlice> slices;
  size_t s = 0, last_s = 0;
  int64_t row0 = 0, last_row = -1;  // sequences[s] holds batch rows [row0, row0 + num_tokens)
  for (const int64_t r : rows) {
    while (r >= row0 + sequences[s].num_tokens) row0 += sequences[s++].num_tokens;
    if (!slices.empty() && s == last_s && r == last_row + 1) {
      ++slices.back().num_tokens;
    } else {
      slices.push_back({1, sequences[s].start_position + (r - row0), sequences[s].blocks});
    }
    last_s = s;
    last_row = r;
  }
  return slices;
}

}  // namespace

void CpuModel::AttentionBlock(const LayerWeights& layer, int64_t span_layer,
                              const ForwardBatch& batch, const std::vector<int32_t>& positions,
                              KvCache* cache, const std::vector<int64_t>* kept) {
  const ModelConfig& c = config();
  const AttentionWeights& a = layer.attn;
  const int64_t t = static_cast<int64_t>(positions.size());
  const auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  std::optional<ScopedOpTime> timer(std::in_place, OpFamily::kQkv);
  const LinearJob qkv[] = {{x_.data(), t, &a.q_proj, bias(a.q_bias), q_.data()},
                           {x_.data(), t, &a.k_proj, bias(a.k_bias), k_.data()},
                           {x_.data(), t, &a.v_proj, bias(a.v_bias), v_.data()}};
  LinearMany(qkv, math_);
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (!a.q_norm.empty()) {  // QK-norm per head, before RoPE; values are not normalised
    RmsNorm(q_.data(), a.q_norm.data(), t * c.num_attention_heads, c.head_dim, eps, q_.data());
    RmsNorm(k_.data(), a.k_norm.data(), t * c.num_key_value_heads, c.head_dim, eps, k_.data());
  }
  rope_.Apply(q_.data(), t, c.num_attention_heads, positions.data());
  rope_.Apply(k_.data(), t, c.num_key_value_heads, positions.data());
  WriteKv(k_.data(), v_.data(), batch.sequences, span_layer, cache);
  timer.emplace(OpFamily::kAttention);
  // Every row's keys and values are in the cache now; the rows nobody reads need no attention
  // (a long prompt's last chunk in a 3-layer bench spent a third of its attention on them).
  std::vector<SequenceSlice> kept_slices;
  absl::Span<const SequenceSlice> slices = batch.sequences;
  if (kept != nullptr) {
    if (kept->empty()) return;
    KeepRows(*kept, c.q_dim(), q_.data());
    kept_slices = SlicesOfRows(batch.sequences, *kept);
    slices = kept_slices;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // The bf16 modes on bf16 weights (int8 weights quantized from them included) run attention
  // in bf16, as the reference's bf16 forward does: bf16_amx on the tile unit (attention_amx.h),
  // bf16 on vdpbf16ps (attention_bf16.h), from an fp32 or a bf16 cache alike; every other case
  // (and the FP8 cache) the fp32 path.
  const bool bf16_attention =
      weights_.weight_dtype == DType::kBF16 && (cache->host_fp32() || cache->host_bf16());
  if (bf16_attention && math_ == CpuMath::kBf16Amx) {
    PagedAttentionAmx(q_.data(), slices, *cache, span_layer, c.num_attention_heads, scale,
                      attn_.data());
  } else if (bf16_attention && math_ == CpuMath::kBf16) {
    PagedAttentionBf16(q_.data(), slices, *cache, span_layer, c.num_attention_heads, scale,
                       attn_.data());
  } else {
    PagedAttention(q_.data(), slices, *cache, span_layer, c.num_attention_heads, scale,
                   attn_.data());
  }
}

void CpuModel::FfnBlock(const LayerWeights& layer, int64_t tokens, int32_t* choices) {
  if (layer.is_moe) {  // MoeFfn times its own parts
    MoeFfn(x_.data(), tokens, layer.moe, router_, out_.data(), math_, choices);
  } else if (layer.dense.gate.empty()) {
    // A tensor-parallel rank past the FFN's last scale block holds none of it (zero width,
    // docs/parallel.md) and adds zeros to the sum.
    std::fill_n(out_.data(), tokens * config().hidden_size, 0.f);
  } else {
    const ScopedOpTime timer(OpFamily::kDenseFfn);
    SwiGluFfn(x_.data(), tokens, layer.dense, out_.data(), math_);
  }
}

void CpuModel::ResizeBuffers(int64_t t) {
  const ModelConfig& c = config();
  const int64_t hidden = c.hidden_size;
  // Grow only: a vector keeps its capacity when it shrinks anyway, and a resize back up
  // zero-fills the regrown part (about 0.3 GB when a 2,048-token prompt follows a decode step
  // on GLM-4.5-Air). So a buffer may hold more rows than the step: every width comes from the
  // config, and the results copy the step's t rows (Forward, ForwardMtp).
  const auto grow = [t](AlignedVector<float>& v, int64_t per_token) {
    if (static_cast<int64_t>(v.size()) < t * per_token) v.resize(t * per_token);
  };
  grow(h_, hidden);
  grow(x_, hidden);
  grow(out_, hidden);
  if (c.is_mla()) {
    const int64_t h = c.num_attention_heads, r = c.kv_lora_rank, dr = c.qk_rope_head_dim;
    grow(q_, h * c.qk_head_dim());
    grow(attn_, h * c.v_head_dim);
    grow(q_resid_, c.q_lora_rank);
    grow(kv_a_, r + dr);
    grow(latent_, r);
    grow(k_rot_, dr);
    grow(q_lat_, h * r);
    grow(out_lat_, h * r);
    grow(iq_, c.index_n_heads * c.index_head_dim);
    grow(ik_, c.index_head_dim);
    grow(iw_, c.index_n_heads);
  } else {
    grow(q_, c.q_dim());
    grow(k_, c.kv_dim());
    grow(v_, c.kv_dim());
    grow(attn_, c.q_dim());
  }
}

bool CpuModel::DecoderLayer(const LayerWeights& layer, int64_t cache_layer,
                            const ForwardBatch& batch, const std::vector<int32_t>& positions,
                            KvCache* cache, bool prune, std::vector<int64_t>* rows, int64_t* live,
                            std::vector<std::vector<int32_t>>* expert_choices) {
  const ModelConfig& c = config();
  const int64_t t = static_cast<int64_t>(positions.size());
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  {
    const ScopedOpTime timer(OpFamily::kEmbedNorm);
    RmsNorm(h_.data(), layer.input_norm.data(), t, hidden, eps, x_.data());
  }
  const bool pruned = prune && static_cast<int64_t>(rows->size()) < t;
  if (c.is_mla()) {
    MlaBlock(layer, cache_layer, batch, positions, cache);
  } else {
    AttentionBlock(layer, cache_layer, batch, positions, cache, pruned ? rows : nullptr);
  }
  if (pruned) {
    *live = static_cast<int64_t>(rows->size());
    if (*live == 0) return false;
    if (c.is_mla()) {  // GQA attention computed the kept rows alone, already in place
      KeepRows(*rows, c.num_attention_heads * c.v_head_dim, attn_.data());
    }
    KeepRows(*rows, hidden, h_.data());
    for (int64_t r = 0; r < *live; ++r) (*rows)[r] = r;
  }
  const int64_t n = *live;
  {
    // o_proj; GLM-5's latent attention runs its linears in the exact arithmetic.
    const ScopedOpTime timer(OpFamily::kOProj);
    if (c.is_mla()) {
      Linear(attn_.data(), n, layer.mla.o_proj, nullptr, out_.data());
    } else {
      Linear(attn_.data(), n, layer.attn.o_proj, nullptr, out_.data(), math_);
    }
  }
  SumOverRanks(out_.data(), n * hidden);  // a rank's heads give a partial sum
  {
    const ScopedOpTime timer(OpFamily::kEmbedNorm);
    for (int64_t j = 0; j < n * hidden; ++j) h_[j] += out_[j];
    RmsNorm(h_.data(), layer.post_attention_norm.data(), n, hidden, eps, x_.data());
  }
  int32_t* choices = nullptr;
  if (layer.is_moe && expert_choices != nullptr) {
    choices = expert_choices->emplace_back(n * c.num_experts_per_tok).data();
  }
  FfnBlock(layer, n, choices);
  SumOverRanks(out_.data(), n * hidden);  // a rank's width slice or experts: a partial sum
  const ScopedOpTime timer(OpFamily::kEmbedNorm);
  for (int64_t j = 0; j < n * hidden; ++j) h_[j] += out_[j];
  return true;
}

void CpuModel::Head(const std::vector<int64_t>& rows, int64_t t, const std::vector<float>& norm,
                    const Matrix& head, bool head_input, ForwardResult* result) {
  const ModelConfig& c = config();
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const ScopedOpTime timer(OpFamily::kHead);
  result->logits.clear();
  result->head_input.clear();
  if (head_input) {  // every row is live: rows index h_ directly
    result->head_input.resize(t * hidden);
    RmsNorm(h_.data(), norm.data(), t, hidden, eps, result->head_input.data());
  }
  // Only the rows whose logits are wanted go through the head.
  if (rows.empty()) return;
  const int64_t n = static_cast<int64_t>(rows.size());
  AlignedVector<float> normed(n * hidden);  // on cache lines, as the kernels read it
  for (int64_t r = 0; r < n; ++r) {
    if (head_input) {
      std::copy_n(result->head_input.data() + rows[r] * hidden, hidden, normed.data() + r * hidden);
    } else {
      RmsNorm(h_.data() + rows[r] * hidden, norm.data(), 1, hidden, eps,
              normed.data() + r * hidden);
    }
  }
  if (comm_ == nullptr) {
    result->logits.resize(n * c.vocab_size);
    Linear(normed.data(), n, head, nullptr, result->logits.data(), math_);
    return;
  }
  // This rank's vocabulary slice [n, head.rows], gathered on rank 0 only (the engine reads
  // rank 0's result; the other ranks return no logits): the slices one after another, which
  // the copy below interleaves into rows.
  std::vector<int64_t> counts(layout_.size);
  int64_t total = 0;
  for (int r = 0; r < layout_.size; ++r) {
    counts[r] = n * SplitRange(c.vocab_size, 1, r, layout_.size).count;
    total += counts[r];
  }
  std::vector<float> part(n * head.rows);
  Linear(normed.data(), n, head, nullptr, part.data(), math_);
  if (!comm_status_.ok()) return;
  const bool root = layout_.rank == 0;
  if (root) gather_.resize(total);
  {
    const ScopedOpTime collective(OpFamily::kCollective);
    comm_status_ = comm_->Gather(part.data(), counts, root ? gather_.data() : nullptr, 0);
  }
  if (!root) return;
  result->logits.resize(n * c.vocab_size);
  int64_t at = 0, column = 0;
  for (int r = 0; r < layout_.size; ++r) {
    const int64_t width = counts[r] / std::max<int64_t>(n, 1);
    for (int64_t row = 0; row < n; ++row) {
      std::copy_n(gather_.data() + at + row * width, width,
                  result->logits.data() + row * c.vocab_size + column);
    }
    at += counts[r];
    column += width;
  }
}

absl::Status CpuModel::Forward(const ForwardBatch& batch, KvCache* cache,
                               const ForwardOptions& options, ForwardResult* result) {
  if (!options.sample.empty()) {
    return absl::UnimplementedError(
        "the CPU runner returns logits rows; the engine samples them (samples_tokens() is false)");
  }
  if (options.mtp) return ForwardMtp(batch, cache, options, result);
  const int64_t run_begin = options.layer_begin < 0 ? layer_begin() : options.layer_begin;
  const int64_t run_end = options.layer_end < 0 ? layer_end() : options.layer_end;
  ASSIGN_OR_RETURN(const bool wants_logits, StepWantsLogits(batch, options));
  RETURN_IF_ERROR(ValidateRunSpan(run_begin, run_end, layer_begin(), layer_end(),
                                  config().num_hidden_layers, wants_logits));
  if (options.return_head_input && run_end != config().num_hidden_layers) {
    return absl::InvalidArgumentError("head inputs need a run that ends at the last layer");
  }
  RETURN_IF_ERROR(CheckBatch(batch, *cache, run_begin, run_end));
  if (comm_ != nullptr) comm_status_ = comm_->health();
  const int64_t t = batch.total_tokens(), hidden = config().hidden_size;
  ResizeBuffers(t);
  const std::vector<int32_t> positions = BatchPositions(batch);

  if (run_begin == 0) {
    const ScopedOpTime timer(OpFamily::kEmbedNorm);
    Embed(batch.token_ids.data(), t, h_.data());
  } else {
    std::copy(batch.hidden_in.begin(), batch.hidden_in.end(), h_.begin());
  }
  // h_ may be longer than this step's rows (ResizeBuffers grows only): results take t rows.
  const auto stream = [&] { return std::vector<float>(h_.begin(), h_.begin() + t * hidden); };
  result->layer_hidden.clear();
  if (options.return_layer_hidden) result->layer_hidden.push_back(stream());

  // Which rows of the run's output anyone reads: all when hidden states (or head inputs) are
  // returned, else the logits rows (none for a prefill chunk mid-prompt). The run's last layer
  // needs every row only for its K/V, which go into the cache; attention and all after it run
  // on the read rows alone (the other rows' outputs of a prefill are never seen). Each row's
  // arithmetic does not depend on the others (linear.h, attention.h), so no bit changes.
  std::vector<int64_t> rows = ReturnedLogitRows(batch, options);
  const bool all_rows_read = options.return_hidden || options.return_layer_hidden ||
                             options.return_expert_choices || options.return_head_input;
  result->expert_choices.clear();
  std::vector<std::vector<int32_t>>* choices =
      options.return_expert_choices ? &result->expert_choices : nullptr;
  const int64_t last = run_end - layer_begin() - 1;
  int64_t live = t;  // rows of h_ still computed
  for (int64_t i = run_begin - layer_begin(); i <= last; ++i) {
    const bool prune = i == last && !all_rows_read;
    if (!DecoderLayer(weights_.layers[i], i, batch, positions, cache, prune, &rows, &live,
                      choices)) {
      break;
    }
    if (options.return_layer_hidden) result->layer_hidden.push_back(stream());
  }

  if (options.return_hidden) {
    result->hidden.assign(h_.begin(), h_.begin() + t * hidden);
  } else {
    result->hidden.clear();
  }
  Head(rows, t, weights_.final_norm, weights_.lm_head, options.return_head_input, result);
  return comm_status_;
}

}  // namespace glmserve
