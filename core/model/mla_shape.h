// GLM-5's attention shapes, one field list for both backends: the CPU ops (core/cpu/ops/mla.h,
// dsa_indexer.h) and the CUDA kernels (core/cuda/kernels.h, which take them by value), both
// made from the config by MlaShapeOf / IndexerShapeOf. See docs/glm5.md.
//
// The latent cache's row per token and layer (KvCacheShape::latent):
//   [ latent (R) | k_rot (dr) | index key (Di, full indexer layers' models only) ]
//
// No standard-library containers here: nvcc compiles this header for the kernels.
#pragma once

#include <cstdint>

#include "core/model/row_math.h"  // GLM_HD

namespace glmserve {

struct ModelConfig;

// Multi-head latent attention's widths.
struct MlaShape {
  int64_t heads = 0;       // H, num_attention_heads
  int64_t nope_dim = 0;    // dn, qk_nope_head_dim
  int64_t rope_dim = 0;    // dr, qk_rope_head_dim
  int64_t v_dim = 0;       // dv, v_head_dim
  int64_t latent_dim = 0;  // R, kv_lora_rank
  int64_t index_dim = 0;   // Di, index_head_dim (0: no indexer key in the row)
  float scale = 0.f;       // qk_head_dim^-0.5
  // Tokens per cache block: how the device kernels address a slot's row (the CPU cache
  // addresses rows itself; 0 there).
  int64_t block_size = 0;

  GLM_HD int64_t qk_dim() const { return nope_dim + rope_dim; }
  // Offsets in a cache row and its width.
  GLM_HD int64_t rope_offset() const { return latent_dim; }
  GLM_HD int64_t index_offset() const { return latent_dim + rope_dim; }
  GLM_HD int64_t row_width() const { return latent_dim + rope_dim + index_dim; }
};

// The DSA indexer's widths (its key sits at MlaShape::index_offset() of a cache row).
struct IndexerShape {
  int64_t heads = 0;     // Hi, index_n_heads
  int64_t head_dim = 0;  // Di, index_head_dim
  int64_t rope_dim = 0;  // dr, qk_rope_head_dim (the rotary dims at the front of each head)
  int64_t topk = 0;      // index_topk
};

// From the config (block_size: the cache's, for the device kernels; 0 on the CPU).
MlaShape MlaShapeOf(const ModelConfig& c, int64_t block_size = 0);
IndexerShape IndexerShapeOf(const ModelConfig& c);

}  // namespace glmserve
