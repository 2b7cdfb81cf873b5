// Partial rotary position embedding, NeoX ("rotate_half") layout.
//
// Only the first rotary_dim channels of each head rotate; with r = rotary_dim, channel i
// pairs with i + r/2 (i < r/2) at angle position * theta^(-2i/r). Channels past r pass
// through. Angles are formed in fp32 as the reference does (fp32 inv_freq times fp32
// position), so long positions round the same way.
#pragma once

#include <cstdint>
#include <vector>

namespace glmserve {

class RotaryEmbedding {
 public:
  RotaryEmbedding(int64_t head_dim, int64_t rotary_dim, double theta);

  // x: [tokens, heads, head_dim]; positions: [tokens].
  void Apply(float* x, int64_t tokens, int64_t heads, const int32_t* positions) const;

  // The DeepSeek / GLM-5 form: channel pairs (2i, 2i + 1) of the rotary_dim channels rotate
  // at angle position * inv_freq[i], and the result is written DE-interleaved: out[i] =
  // x[2i] cos - x[2i+1] sin, out[i + r/2] = x[2i+1] cos + x[2i] sin (what the reference's
  // apply_rotary_pos_emb_interleave returns; q and k both get this layout, so their dot
  // product is the rotated pairs' dot product). The rotary channels of row (t, h) start at
  // x + (t * heads + h) * stride + offset; nothing else is touched.
  void ApplyInterleaved(float* x, int64_t tokens, int64_t heads, int64_t stride, int64_t offset,
                        const int32_t* positions) const;

  int64_t rotary_dim() const { return rotary_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  int64_t head_dim_;
  int64_t rotary_dim_;
  std::vector<float> inv_freq_;  // [rotary_dim / 2]
};

}  // namespace glmserve
