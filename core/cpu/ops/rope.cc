#include "core/cpu/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/base/parallel.h"
#include "core/model/rope_freq.h"
#include "core/model/row_math.h"

namespace glmserve {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t rotary_dim, double theta)
    : head_dim_(head_dim), rotary_dim_(rotary_dim), inv_freq_(RopeInvFreq(rotary_dim, theta)) {}

void RotaryEmbedding::Apply(float* x, int64_t tokens, int64_t heads,
                            const int32_t* positions) const {
  const int64_t half = rotary_dim_ / 2;
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, heads * head_dim_));
  ParallelFor(tokens, grain, [&](int64_t token_begin, int64_t token_end) {
    for (int64_t t = token_begin; t < token_end; ++t) {
      float cos_v[512], sin_v[512];  // rotary_dim / 2 <= 512 for any sane head_dim
      float* cs = cos_v;
      float* sn = sin_v;
      std::vector<float> heap;
      if (half > 512) {
        heap.resize(2 * half);
        cs = heap.data();
        sn = heap.data() + half;
      }
      for (int64_t i = 0; i < half; ++i)
        rowmath::RopeCosSin(positions[t], inv_freq_[i], &cs[i], &sn[i]);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * head_dim_;
        for (int64_t i = 0; i < half; ++i) {
          rowmath::RotatePair(v[i], v[i + half], cs[i], sn[i], &v[i], &v[i + half]);
        }
      }
    }
  });
}

void RotaryEmbedding::ApplyInterleaved(float* x, int64_t tokens, int64_t heads, int64_t stride,
                                       int64_t offset, const int32_t* positions) const {
  const int64_t half = rotary_dim_ / 2;
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, heads * stride));
  ParallelFor(tokens, grain, [&](int64_t token_begin, int64_t token_end) {
    std::vector<float> cs(half), sn(half), tmp(rotary_dim_);
    for (int64_t t = token_begin; t < token_end; ++t) {
      for (int64_t i = 0; i < half; ++i)
        rowmath::RopeCosSin(positions[t], inv_freq_[i], &cs[i], &sn[i]);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * stride + offset;
        // The pair (2i, 2i + 1) rotates; its results go to i and i + half.
        for (int64_t i = 0; i < half; ++i) {
          rowmath::RotatePair(v[2 * i], v[2 * i + 1], cs[i], sn[i], &tmp[i], &tmp[i + half]);
        }
        std::copy_n(tmp.data(), rotary_dim_, v);
      }
    }
  });
}

}  // namespace glmserve
