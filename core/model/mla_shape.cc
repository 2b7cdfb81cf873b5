#include "core/model/mla_shape.h"

#include <cmath>

#include "core/model/config.h"

namespace glmserve {

MlaShape MlaShapeOf(const ModelConfig& c, int64_t block_size) {
  MlaShape s;
  s.heads = c.num_attention_heads;
  s.nope_dim = c.qk_nope_head_dim;
  s.rope_dim = c.qk_rope_head_dim;
  s.v_dim = c.v_head_dim;
  s.latent_dim = c.kv_lora_rank;
  s.index_dim = c.cache_values_per_token_layer() - c.kv_lora_rank - c.qk_rope_head_dim;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim()));
  s.block_size = block_size;
  return s;
}

IndexerShape IndexerShapeOf(const ModelConfig& c) {
  IndexerShape s;
  s.heads = c.index_n_heads;
  s.head_dim = c.index_head_dim;
  s.rope_dim = c.qk_rope_head_dim;
  s.topk = c.index_topk;
  return s;
}

}  // namespace glmserve
