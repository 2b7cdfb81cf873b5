#include "core/cpu/ops/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/base/dtype.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/lane_sum.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax.h"

namespace glmserve {
namespace {

// Where each batch row sits: its sequence and position.
struct RowIndex {
  std::vector<int32_t> seq;  // [T]
  std::vector<int64_t> pos;  // [T]
  int64_t max_context = 0;
};

RowIndex IndexRows(absl::Span<const SequenceSlice> batch) {
  RowIndex r;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int64_t t = 0; t < batch[i].num_tokens; ++t) {
      r.seq.push_back(static_cast<int32_t>(i));
      r.pos.push_back(batch[i].start_position + t);
    }
    r.max_context = std::max(r.max_context, batch[i].start_position + batch[i].num_tokens);
  }
  return r;
}

}  // namespace

void WriteLatentRows(const float* latent, const float* k_rot, const float* index_key,
                     absl::Span<const SequenceSlice> batch, const MlaShape& shape, int64_t layer,
                     KvCache* cache) {
  const int64_t bs = cache->shape().block_size, width = cache->kv_dim();
  const int64_t r = shape.latent_dim, dr = shape.rope_dim, di = shape.index_dim;
  int64_t row = 0;
  for (const SequenceSlice& s : batch) {
    for (int64_t t = 0; t < s.num_tokens; ++t, ++row) {
      const int64_t pos = s.start_position + t;
      float* dst = cache->keys(layer, (*s.blocks)[pos / bs]) + (pos % bs) * width;
      std::copy_n(latent + row * r, r, dst);
      std::copy_n(k_rot + row * dr, dr, dst + shape.rope_offset());
      if (index_key != nullptr) std::copy_n(index_key + row * di, di, dst + shape.index_offset());
    }
  }
}

Matrix AbsorbedKey::Head(int64_t h, const MlaShape& shape) const {
  const int64_t per_head = shape.latent_dim * shape.nope_dim * DTypeSize(dtype);
  return Matrix{dtype, shape.latent_dim, shape.nope_dim, bytes.data() + h * per_head};
}

AbsorbedKey AbsorbedKeyWeights(const Matrix& kv_b_proj, const MlaShape& shape) {
  const int64_t h_count = shape.heads, dn = shape.nope_dim, r = shape.latent_dim;
  const int64_t per_head = dn + shape.v_dim;
  if (kv_b_proj.format == WeightFormat::kFp8Scaled) {
    // FP8 kv_b_proj (GLM-5-FP8): W_uk^T is widened to fp32 here, each element the same fp32
    // product e4m3 x scale (one rounding) the FP8 kernels form in registers, so AbsorbQuery
    // computes exactly what it would from the dequantized checkpoint. W_uv stays FP8
    // (ExpandValues reads its rows through Matrix::RowSlice).
    AbsorbedKey out;
    out.dtype = DType::kF32;
    out.bytes.resize(h_count * r * dn * sizeof(float));
    float* dst = reinterpret_cast<float*>(out.bytes.data());
    const uint8_t* codes = static_cast<const uint8_t*>(kv_b_proj.data);
    for (int64_t h = 0; h < h_count; ++h) {
      for (int64_t i = 0; i < dn; ++i) {
        const int64_t row = h * per_head + i;
        const float* scales = kv_b_proj.Fp8RowScales(row);
        for (int64_t c = 0; c < r; ++c) {
          dst[(h * r + c) * dn + i] =
              E4m3ToFloat(codes[row * r + c]) * scales[c / kv_b_proj.scale_block_cols];
        }
      }
    }
    return out;
  }
  const int64_t size = DTypeSize(kv_b_proj.dtype);
  AbsorbedKey out;
  out.dtype = kv_b_proj.dtype;
  out.bytes.resize(h_count * r * dn * size);
  const char* src = static_cast<const char*>(kv_b_proj.data);
  for (int64_t h = 0; h < h_count; ++h) {
    char* dst = out.bytes.data() + h * r * dn * size;
    for (int64_t i = 0; i < dn; ++i) {  // W_uk[h] row i is kv_b_proj row h * (dn + dv) + i
      const char* row = src + (h * per_head + i) * r * size;
      for (int64_t c = 0; c < r; ++c) std::memcpy(dst + (c * dn + i) * size, row + c * size, size);
    }
  }
  return out;
}

void AbsorbQuery(const float* q, int64_t tokens, const AbsorbedKey& absorbed, const MlaShape& shape,
                 float* q_lat) {
  const int64_t h_count = shape.heads, dn = shape.nope_dim, r = shape.latent_dim;
  const int64_t qk = shape.qk_dim();
  // q_nope regrouped per head: [H, T, dn], so that each head is one Linear of T rows.
  std::vector<float> nope(h_count * tokens * dn);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < h_count; ++h) {
      std::copy_n(q + (t * h_count + h) * qk, dn, nope.data() + (h * tokens + t) * dn);
    }
  }
  std::vector<Matrix> mats(h_count);
  std::vector<LinearJob> jobs(h_count);
  for (int64_t h = 0; h < h_count; ++h) {
    mats[h] = absorbed.Head(h, shape);
    jobs[h] = {nope.data() + h * tokens * dn, tokens, &mats[h], nullptr, q_lat + h * tokens * r};
  }
  LinearMany(jobs);
}

void LatentAttention(const float* q_lat, const float* q, absl::Span<const SequenceSlice> batch,
                     const KvCache& cache, int64_t layer, const TopkSelection& selection,
                     const MlaShape& shape, float* out_lat) {
  const int64_t bs = cache.shape().block_size, width = cache.kv_dim();
  const int64_t h_count = shape.heads, r = shape.latent_dim, dr = shape.rope_dim;
  const int64_t qk = shape.qk_dim();
  const RowIndex rows = IndexRows(batch);
  const int64_t total = static_cast<int64_t>(rows.seq.size());

  ParallelFor(total * h_count, 2, [&](int64_t item_begin, int64_t item_end) {
    thread_local std::vector<float> probs;
    thread_local std::vector<const float*> keys;
    probs.resize(rows.max_context);
    keys.resize(rows.max_context);
    for (int64_t item = item_begin; item < item_end; ++item) {
      const int64_t t = item / h_count, h = item % h_count;
      const SequenceSlice& s = batch[rows.seq[t]];
      // The attended positions, ascending: all causal ones or the indexer's list.
      const int32_t count = selection.count[t];
      const int64_t n = count < 0 ? rows.pos[t] + 1 : count;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = count < 0 ? i : selection.positions[selection.offset[t] + i];
        keys[i] = cache.keys(layer, (*s.blocks)[p / bs]) + (p % bs) * width;
      }
      const float* ql = q_lat + (h * total + t) * r;
      const float* qr = q + (t * h_count + h) * qk + shape.nope_dim;
      for (int64_t i = 0; i < n; ++i) {
        probs[i] = (LaneDot(ql, keys[i], r) + LaneDot(qr, keys[i] + shape.rope_offset(), dr)) *
                   shape.scale;
      }
      SoftmaxInPlace(probs.data(), n);
      float* o = out_lat + (h * total + t) * r;
      std::fill_n(o, r, 0.f);
      for (int64_t i = 0; i < n; ++i) {
        const float w = probs[i];
        const float* lv = keys[i];
        for (int64_t d = 0; d < r; ++d) o[d] += w * lv[d];
      }
    }
  });
}

void ExpandValues(const float* out_lat, int64_t tokens, const Matrix& kv_b_proj,
                  const MlaShape& shape, float* out) {
  const int64_t h_count = shape.heads, dn = shape.nope_dim, dv = shape.v_dim;
  const int64_t r = shape.latent_dim;
  std::vector<Matrix> mats(h_count);
  std::vector<LinearJob> jobs(h_count);
  std::vector<float> per_head(h_count * tokens * dv);  // [H, T, dv]
  for (int64_t h = 0; h < h_count; ++h) {
    mats[h] = kv_b_proj.RowSlice(h * (dn + dv) + dn, dv);  // W_uv[h]: [dv, R]
    jobs[h] = {out_lat + h * tokens * r, tokens, &mats[h], nullptr,
               per_head.data() + h * tokens * dv};
  }
  LinearMany(jobs);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < h_count; ++h) {
      std::copy_n(per_head.data() + (h * tokens + t) * dv, dv, out + (t * h_count + h) * dv);
    }
  }
}

}  // namespace glmserve
