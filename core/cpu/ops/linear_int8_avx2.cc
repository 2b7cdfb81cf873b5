// The int8-weight Linear kernel on AVX2 (arithmetic: linear.h, "group-serial"; reference:
// Int8BlockGeneric in linear_int8.cc, which this kernel matches bit for bit). It serves every
// activation on x86-64 without AVX512-VNNI, and the decode-sized ones (fewer rows than
// kInt8VnniMinRows) where that kernel exists: its lanes lie along the activation rows, which a
// single row would leave 15/16 empty.
//
// Lanes lie along K here: one 8-wide register holds a group's 32 codes. A group's exact dot
// comes from vpmaddubsw on |x| (unsigned) and w with x's sign (signed), then vpmaddwd with ones:
// both sides lie in [-127, 127], so a pair's sum is at most 2 * 127 * 127 = 32258 and the 16-bit
// step cannot saturate; 8 int32 partial sums remain. The partial sums of 8 weight rows reduce
// together into one register of 8 dots (integer sums are exact, so the tree's order cannot
// matter), and the per-group step runs 8 outputs wide: one exact conversion, the scales' product
// (one rounding), one FMA, over the groups in order.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

constexpr int kChunk = 8;  // weight rows whose dots reduce into one register
// Activation rows per pass over the task's chunks: their codes (32 rows x K) stay in L2 while
// every chunk of the task meets them; a chunk (8 rows x K) stays in L1 or L2 for all of them.
constexpr int64_t kBlockRows = 32;

// The exact int32 dots of 4 byte products per lane: x . w over 32 bytes.
inline __m256i Dot4(__m256i x_abs, __m256i x, __m256i w) {
  const __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w, x));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// Lane c of the result: the sum of v[c]'s 8 lanes.
inline __m256i Reduce8(const __m256i* v) {
  // hadd works within 128-bit halves: b0 holds v0..v3's sums of lanes 0-3 (low half) and of
  // lanes 4-7 (high half), b1 the same for v4..v7.
  const __m256i b0 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b1 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                          _mm256_permute2x128_si256(b0, b1, 0x31));
}

// out[g][c] = the bf16 scale src[c][g] widened, for 8 rows c: 8 groups at a time as an 8 x 8
// transpose (a decode call prepares a task's scales once for one activation row, and one
// scalar widening per scale cost nearly as much as the dots).
void TransposeScales(const uint16_t* const* src, int64_t groups, float* out) {
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    __m256 r[8];
    for (int c = 0; c < 8; ++c) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[c] + g));
      r[c] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    // r[c] lane j is (c, g + j); after three rounds of pairing, t[j] lane c is.
    __m256 a[8], b[8];
    for (int c = 0; c < 8; c += 2) {
      a[c] = _mm256_unpacklo_ps(r[c], r[c + 1]);
      a[c + 1] = _mm256_unpackhi_ps(r[c], r[c + 1]);
    }
    for (int c = 0; c < 8; c += 4) {
      b[c] = _mm256_shuffle_ps(a[c], a[c + 2], 0x44);
      b[c + 1] = _mm256_shuffle_ps(a[c], a[c + 2], 0xEE);
      b[c + 2] = _mm256_shuffle_ps(a[c + 1], a[c + 3], 0x44);
      b[c + 3] = _mm256_shuffle_ps(a[c + 1], a[c + 3], 0xEE);
    }
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(out + (g + j) * 8, _mm256_permute2f128_ps(b[j], b[j + 4], 0x20));
      _mm256_storeu_ps(out + (g + j + 4) * 8, _mm256_permute2f128_ps(b[j], b[j + 4], 0x31));
    }
  }
  for (; g < groups; ++g) {
    for (int c = 0; c < 8; ++c) out[g * 8 + c] = Bf16ToFloat(src[c][g]);
  }
}

}  // namespace

void Int8BlockAvx2(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t n_rows = w.rows, k = w.cols, kp = x.kp, groups = w.scale_cols();
  const int64_t full = k / kInt8Group, x_groups = kp / kInt8Group;
  const int64_t chunks = (nn + kChunk - 1) / kChunk;
  // Per chunk: each group's 8 scales widened (0 for rows past the task), and the rows' tail
  // groups zero-padded; rows past the task read zeros.
  thread_local std::vector<float> scale;
  thread_local std::vector<int8_t> tail, zeros;
  thread_local std::vector<uint16_t> zero_scales;
  scale.resize(static_cast<size_t>(chunks * groups * kChunk));
  tail.assign(static_cast<size_t>(chunks * kChunk * kInt8Group), 0);
  if (static_cast<int64_t>(zeros.size()) < groups * kInt8Group) {
    zeros.assign(static_cast<size_t>(groups * kInt8Group), 0);
    zero_scales.assign(static_cast<size_t>(groups), 0);
  }
  const int8_t* q = static_cast<const int8_t*>(w.data);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint16_t* src[kChunk];
    for (int c = 0; c < kChunk; ++c) {
      const int64_t r = chunk * kChunk + c;
      src[c] = r < nn ? w.group_scales + (n0 + r) * groups : zero_scales.data();
    }
    TransposeScales(src, groups, scale.data() + chunk * groups * kChunk);
  }
  for (int64_t r = 0; r < nn && full < groups; ++r) {
    std::memcpy(tail.data() + r * kInt8Group, q + (n0 + r) * k + full * kInt8Group,
                static_cast<size_t>(k - full * kInt8Group));
  }
  for (int64_t m0 = 0; m0 < x.m; m0 += kBlockRows) {
    const int64_t m1 = std::min(x.m, m0 + kBlockRows);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t c0 = chunk * kChunk, nc = std::min<int64_t>(kChunk, nn - c0);
      const int8_t* rows[kChunk];
      for (int c = 0; c < kChunk; ++c) {
        rows[c] = c < nc ? q + (n0 + c0 + c) * k : zeros.data();
      }
      const float* ws = scale.data() + chunk * groups * kChunk;
      for (int64_t i = m0; i < m1; ++i) {
        const int8_t* xq = x.q.data() + i * kp;
        const float* xs = x.group_scale.data() + i * x_groups;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t g = 0; g < groups; ++g) {
          const __m256i xv =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * kInt8Group));
          const __m256i xa = _mm256_abs_epi8(xv);
          __m256i v[kChunk];
          for (int c = 0; c < kChunk; ++c) {
            const int8_t* wp = g < full ? rows[c] + g * kInt8Group
                               : c < nc ? tail.data() + (c0 + c) * kInt8Group
                                        : zeros.data();
            v[c] = Dot4(xa, xv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp)));
          }
          const __m256 s = _mm256_mul_ps(_mm256_set1_ps(xs[g]), _mm256_loadu_ps(ws + g * kChunk));
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Reduce8(v)), s, acc);
        }
        float* y = job.y + i * n_rows + n0 + c0;
        if (nc == kChunk) {
          if (job.bias != nullptr) acc = _mm256_add_ps(acc, _mm256_loadu_ps(job.bias + n0 + c0));
          _mm256_storeu_ps(y, acc);
        } else {
          alignas(32) float out[kChunk];
          _mm256_store_ps(out, acc);
          for (int64_t c = 0; c < nc; ++c) {
            y[c] = job.bias != nullptr ? out[c] + job.bias[n0 + c0 + c] : out[c];
          }
        }
      }
    }
  }
}

// QuantizeGroupInt8's operations, eight elements at a time: the same amax (max is exact, so its
// order does not matter), the same scalar scale, and per element the same IEEE division, the
// same round to nearest even (vroundps in the default mode, as nearbyint) and the same clamp.
// A non-finite element makes the scale NaN and the codes zero; so does a zero group. A last
// group of fewer than 32 takes the scalar code.
void QuantizeRowInt8Avx2(const float* x, int64_t k, int8_t* q, float* group_scale) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 max_finite = _mm256_set1_ps(FLT_MAX);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  int64_t g = 0;
  for (; (g + 1) * kInt8Group <= k; ++g) {
    const float* v = x + g * kInt8Group;
    __m256 e[4];
    __m256 amax = _mm256_setzero_ps();
    __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int j = 0; j < 4; ++j) {
      e[j] = _mm256_loadu_ps(v + 8 * j);
      const __m256 a = _mm256_and_ps(e[j], abs_mask);
      finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, max_finite, _CMP_LE_OQ));  // NaN: false
      amax = _mm256_max_ps(amax, a);
    }
    int8_t* out = q + g * kInt8Group;
    if (_mm256_movemask_ps(finite) != 0xFF) {
      group_scale[g] = std::numeric_limits<float>::quiet_NaN();
      std::memset(out, 0, kInt8Group);
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float scale = _mm_cvtss_f32(m4) / 127.0f;
    group_scale[g] = scale;
    if (!(scale > 0)) {
      std::memset(out, 0, kInt8Group);
      continue;
    }
    const __m256 s = _mm256_set1_ps(scale);
    __m256i i32[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r =
          _mm256_round_ps(_mm256_div_ps(e[j], s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      i32[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));  // exact integers
    }
    // The packs work within 128-bit halves: their bytes come out in runs of four as
    // 0.lo 1.lo 2.lo 3.lo 0.hi 1.hi 2.hi 3.hi (i32[j]'s lanes 0-3, then 4-7); the permutation
    // puts the runs back in order.
    const __m256i w01 = _mm256_packs_epi32(i32[0], i32[1]),
                  w23 = _mm256_packs_epi32(i32[2], i32[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), b);
  }
  if (g * kInt8Group < k) {
    group_scale[g] = QuantizeGroupInt8(x + g * kInt8Group, k - g * kInt8Group, q + g * kInt8Group);
  }
}

}  // namespace glmserve::internal
