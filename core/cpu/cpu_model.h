// The GLM-4.5 decoder stack over a span of layers, run on a ragged batch with a paged KV
// cache:
//
//   h = embed(tokens)                       (span starts at layer 0; else h = hidden input)
//   for each layer l in the span:
//     h += Attn_l(RMSNorm_in(h))
//     h += FFN_l(RMSNorm_post(h))           (dense SwiGLU or MoE)
//   logits = RMSNorm_final(h) lm_head^T     (span ends at the last layer)
//
// In the run's last layer every row goes through attention (its K/V enter the cache), but
// o_proj and the FFN run only on the rows the step returns (its logits rows, or all rows
// when hidden states are returned): a 128-token prefill finishes one row, not 128.
//
// Not thread-safe: one engine thread owns a CpuModel and its KvCache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/base/aligned_vector.h"
#include "core/cpu/ops/attention.h"
#include "core/cpu/ops/dsa_indexer.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/mla.h"
#include "core/cpu/ops/moe.h"
#include "core/cpu/ops/rope.h"
#include "core/model/communicator.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"
#include "core/model/model_runner.h"
#include "core/model/parallel_layout.h"
#include "core/model/weights.h"

namespace glmserve {

class CpuModel final : public ModelRunner {
 public:
  // math: the arithmetic of the linear layers (core/cpu/ops/linear.h), fixed for the model's life.
  explicit CpuModel(ModelWeights weights, CpuMath math = CpuMath::kExact);

  // One rank of a tensor-parallel group (docs/parallel.md): `weights` are the rank's slice
  // (core/model/weight_shard.h, config with the rank's heads), and every partial output
  // (o_proj, the FFN, the vocabulary slices of the embedding and the head) is combined with the
  // other ranks through `comm` (rank order, core/model/communicator.h). The ranks run Forward
  // together on the same batch, each with its own cache (core/model/rank_group.h).
  CpuModel(ModelWeights weights, CpuMath math, const RankLayout& layout, Communicator* comm);

  CpuMath math() const { return math_; }
  std::string compute_description() const override;

  const ModelConfig& config() const override { return weights_.config; }
  const ModelWeights& weights() const { return weights_; }
  int64_t layer_begin() const override { return weights_.layer_begin; }
  int64_t layer_end() const override { return weights_.layer_end; }
  std::string device_name() const override { return "cpu"; }
  int64_t weight_bytes() const override { return weights_.ParameterBytes(); }
  int64_t kv_bytes_per_token() const override;
  // kFp32; kBf16 (FloatToBf16 of each key and value); kFp8E4M3 (e4m3 with a scale per token and
  // KV head, core/model/kv_fp8.h); kAuto: bf16 where this model's attention rounds K and V to
  // bf16 anyway (GLM-4.5 on bf16 weights in the bf16 and bf16_amx arithmetic, int8 included:
  // the same bits in half the bytes), fp32 elsewhere. FAILED_PRECONDITION for bf16 or FP8 on
  // GLM-5, whose latent cache stays fp32.
  absl::Status SetKvCacheDType(KvCacheDType dtype) override;
  // The format of the caches CreateCache makes: kFp32, kBf16 or kFp8E4M3 (kAuto resolved).
  KvCacheDType kv_cache_dtype() const;
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                       int64_t block_size) override;
  bool has_mtp() const override { return weights_.mtp.has_value(); }
  absl::Status EnableMtp() override;
  bool mtp_enabled() const override { return mtp_enabled_; }

  // The KV cache shape this model needs for `num_blocks` blocks of `block_size` tokens.
  KvCacheShape CacheShape(int64_t num_blocks, int64_t block_size = 16) const;

  // Runs one step. Every sequence's block table must already cover its new positions (see
  // KvCache::Reserve); keys and values of the new tokens are written into the cache.
  // Returns INVALID_ARGUMENT for a malformed batch (wrong input kind or size, token id out
  // of range, uncovered positions) without touching the cache.
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override;

 private:
  std::string SingleRankDescription() const;
  absl::Status CheckBatch(const ForwardBatch& batch, const KvCache& cache, int64_t run_begin,
                          int64_t run_end) const;
  // The attention sub-blocks up to o_proj: write every new token's K/V (or latent row) into
  // the cache and leave the attention output in attn_ [T, heads * v_dim]; Forward applies
  // o_proj (on the rows it still needs). `kept` (ascending rows; null: all): attention only for
  // those rows, their outputs in attn_'s first rows (the run's last layer, whose other rows
  // nobody reads).
  void AttentionBlock(const LayerWeights& layer, int64_t span_layer, const ForwardBatch& batch,
                      const std::vector<int32_t>& positions, KvCache* cache,
                      const std::vector<int64_t>* kept = nullptr);
  // GLM-5's latent attention (model_mla.cc): the DSA indexer on "full" layers, the selection
  // kept in selection_ for the "shared" layers after it.
  void MlaBlock(const LayerWeights& layer, int64_t span_layer, const ForwardBatch& batch,
                const std::vector<int32_t>& positions, KvCache* cache);
  void FfnBlock(const LayerWeights& layer, int64_t tokens, int32_t* choices = nullptr);
  // One decoder layer on h_: every row's K/V into cache layer `cache_layer`, attention, then
  // o_proj and the FFN. With `prune` (the run's last layer, other rows unread) attention (on
  // GQA models; GLM-5's latent attention runs every row) and what follows run on `rows`
  // alone, which move to the front of h_ (rows and live updated). Returns false when no row
  // is left to compute.
  bool DecoderLayer(const LayerWeights& layer, int64_t cache_layer, const ForwardBatch& batch,
                    const std::vector<int32_t>& positions, KvCache* cache, bool prune,
                    std::vector<int64_t>* rows, int64_t* live,
                    std::vector<std::vector<int32_t>>* expert_choices);
  // The MTP layer's step (ForwardOptions::mtp, cpu_model_mtp.cc).
  absl::Status ForwardMtp(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                          ForwardResult* result);
  // Sizes the run buffers for t tokens.
  void ResizeBuffers(int64_t t);
  // out [t, hidden] = the embeddings of ids (this rank's vocabulary slice, summed over ranks).
  void Embed(const int32_t* ids, int64_t t, float* out);
  // Tensor parallel: data [count] summed over the ranks. The first failure is kept in
  // comm_status_ (Forward returns it); later calls of the step do nothing.
  void SumOverRanks(float* data, int64_t count);
  // Logits (and head inputs) from h_ [rows, hidden]: norm `norm`, then `head`.
  void Head(const std::vector<int64_t>& rows, int64_t t, const std::vector<float>& norm,
            const Matrix& head, bool head_input, ForwardResult* result);

  ModelWeights weights_;
  CpuMath math_;
  KvCacheDType kv_dtype_ = KvCacheDType::kAuto;  // SetKvCacheDType
  bool mtp_enabled_ = false;  // EnableMtp(): caches hold one more layer, the MTP layer's
  // Tensor parallel (the second constructor); comm_ is null for a model on its own.
  RankLayout layout_;
  Communicator* comm_ = nullptr;
  absl::Status comm_status_;
  std::vector<float> gather_;  // [ranks' vocab slices] the head's gathered logits
  RotaryEmbedding rope_;
  RouterParams router_;

  // Run state, resized per step. Shapes for T = total tokens of the step. On cache lines: the
  // kernels read them as whole vectors, and a buffer this size from malloc sits 16 bytes off a
  // line, so every 64-byte load would split in two (docs/performance.md, session 37).
  AlignedVector<float> h_;     // [T, hidden] residual stream
  AlignedVector<float> x_;     // [T, hidden] normed input of the current sub-block
  AlignedVector<float> q_;     // [T, heads * head_dim]
  AlignedVector<float> k_;     // [T, kv_heads * head_dim]
  AlignedVector<float> v_;     // [T, kv_heads * head_dim]
  AlignedVector<float> attn_;  // [T, heads * head_dim]
  AlignedVector<float> out_;   // [T, hidden] sub-block output before the residual add
  AlignedVector<float> cat_;   // [T, 2 hidden] MTP input: enorm(embedding) | hnorm(h)

  // GLM-5 (is_mla) only. Shapes for T tokens; H heads, Q q_lora_rank, R kv_lora_rank.
  MlaShape mla_shape_;
  IndexerShape index_shape_;
  std::vector<AbsorbedKey> absorbed_k_;  // per span layer: W_uk^T [H, R, dn] (AbsorbedKeyWeights)
  AlignedVector<float> q_resid_;         // [T, Q]        q_a_layernorm(q_a_proj x)
  AlignedVector<float> kv_a_;            // [T, R + dr]   kv_a_proj_with_mqa x
  AlignedVector<float> latent_;          // [T, R]        kv_a_layernorm of the latent part
  AlignedVector<float> k_rot_;           // [T, dr]       rotary key after RoPE
  AlignedVector<float> q_lat_;           // [H, T, R]     absorbed queries
  AlignedVector<float> out_lat_;         // [H, T, R]     attention output in latent space
  AlignedVector<float> iq_;              // [T, Hi, Di]   indexer queries
  AlignedVector<float> ik_;              // [T, Di]       indexer keys
  AlignedVector<float> iw_;              // [T, Hi]       indexer head weights
  TopkSelection selection_;  // the last full layer's top-k, for the shared layers after it
};

}  // namespace glmserve
