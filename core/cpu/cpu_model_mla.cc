// CpuModel::MlaBlock: GLM-5's attention sub-block (docs/glm5.md has the math, core/cpu/ops/mla.h
// and core/cpu/ops/dsa_indexer.h the kernels).
#include <algorithm>

#include "core/cpu/cpu_model.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/norm.h"

namespace glmserve {

void CpuModel::MlaBlock(const LayerWeights& layer, int64_t span_layer, const ForwardBatch& batch,
                        const std::vector<int32_t>& positions, KvCache* cache) {
  const ModelConfig& c = config();
  const MlaWeights& m = layer.mla;
  const int64_t t = static_cast<int64_t>(positions.size());
  const int64_t q_rank = c.q_lora_rank, r = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  const int64_t heads = c.num_attention_heads, qk = c.qk_head_dim();
  // q_a_layernorm and kv_a_layernorm are GlmMoeDsaRMSNorm(width) with the class default
  // eps 1e-6, not rms_norm_eps.
  constexpr float kLatentEps = 1e-6f;

  const LinearJob down[] = {{x_.data(), t, &m.q_a_proj, nullptr, q_resid_.data()},
                            {x_.data(), t, &m.kv_a_proj, nullptr, kv_a_.data()}};
  LinearMany(down);
  RmsNorm(q_resid_.data(), m.q_a_norm.data(), t, q_rank, kLatentEps, q_resid_.data());
  Linear(q_resid_.data(), t, m.q_b_proj, nullptr, q_.data());  // [T, H, dn + dr]
  rope_.ApplyInterleaved(q_.data(), t, heads, qk, c.qk_nope_head_dim, positions.data());

  for (int64_t i = 0; i < t; ++i) {  // split [latent | k_rot] per token
    std::copy_n(kv_a_.data() + i * (r + dr), r, latent_.data() + i * r);
    std::copy_n(kv_a_.data() + i * (r + dr) + r, dr, k_rot_.data() + i * dr);
  }
  RmsNorm(latent_.data(), m.kv_a_norm.data(), t, r, kLatentEps, latent_.data());
  rope_.ApplyInterleaved(k_rot_.data(), t, 1, dr, 0, positions.data());

  const bool full = !m.indexer.empty();
  if (full) {
    IndexerProject(x_.data(), q_resid_.data(), t, m.indexer, index_shape_, rope_, positions.data(),
                   iq_.data(), ik_.data(), iw_.data());
  }
  WriteLatentRows(latent_.data(), k_rot_.data(), full ? ik_.data() : nullptr, batch.sequences,
                  mla_shape_, span_layer, cache);
  // A shared layer keeps selection_ from the full layer before it (CheckBatch makes every
  // run start at a full layer).
  if (full) {
    IndexerSelect(iq_.data(), iw_.data(), batch.sequences, *cache, span_layer, mla_shape_,
                  index_shape_, &selection_);
  }
  AbsorbQuery(q_.data(), t, absorbed_k_[span_layer], mla_shape_, q_lat_.data());
  LatentAttention(q_lat_.data(), q_.data(), batch.sequences, *cache, span_layer, selection_,
                  mla_shape_, out_lat_.data());
  ExpandValues(out_lat_.data(), t, m.kv_b_proj, mla_shape_, attn_.data());
}

}  // namespace glmserve
