// The driver of the int8-weight kernels whose lanes lie along K (arithmetic: linear.h,
// "group-serial"; reference: Int8BlockGeneric). Two instruction sets instantiate it with their
// own exact group dots: linear_int8_avx2.cc (vpmaddubsw) and linear_int8_avx512vnni.cc
// (vpdpbusd, for activations of fewer than kInt8VnniMinRows rows).
//
// Decode reads every weight once, so what bounds it is how the weights stream from memory. Each
// weight row's group dots are therefore computed one row after another: a task's rows lie one
// after another in memory, so its weights are read in order, one stream. (The kernel this
// replaced read 8 rows in lockstep, 8 short streams; on a Zen 4 VM one thread read 1,408-wide
// rows at 10 GB/s that way and at 21-23 in order: docs/performance.md.) The exact int32 dots of a
// chunk of 8 rows wait in a small buffer; then each 8 x 8 block of them is transposed so that one
// register holds a group's dots of the 8 rows, and the per-group step runs 8 outputs wide: one
// exact conversion, the scales' product (one rounding) and one FMA, over the groups in order.
//
// Everything here has internal linkage (an unnamed namespace, in a header on purpose): each
// including file compiles it for its own instruction set, and one copy must never stand in for
// the other at link time.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

constexpr int kRowsChunk = 8;  // weight rows whose per-group steps share one register
// Activation rows per pass over the task's chunks: their codes stay in L2 while every chunk
// of the task meets them; a chunk (8 rows x K) stays in L1 or L2 for all of them.
constexpr int64_t kRowsBlock = 32;
// The dots' row stride is the group count rounded up to this: whole 8 x 8 blocks for the
// transposes, whole 16-group vectors for the VNNI dots.
constexpr int64_t kRowsGroupPad = 16;

// r[c] lane j becomes r[j] lane c (any 32-bit lanes: the shuffles only move bits).
inline void Transpose8x8(__m256* r) {
  // Three rounds of pairing: 2 x 2 blocks of lanes, then 4 x 4, then the 128-bit halves.
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
    r[j] = _mm256_permute2f128_ps(b[j], b[j + 4], 0x20);
    r[j + 4] = _mm256_permute2f128_ps(b[j], b[j + 4], 0x31);
  }
}

// out[g][c] = the bf16 scale src[c][g] widened, for 8 rows c: 8 groups at a time as an 8 x 8
// transpose (a decode call prepares a task's scales once for one activation row, and one
// scalar widening per scale cost nearly as much as the dots).
inline void TransposeScales(const uint16_t* const* src, int64_t groups, float* out) {
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    __m256 r[8];
    for (int c = 0; c < 8; ++c) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[c] + g));
      r[c] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    Transpose8x8(r);
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + (g + j) * 8, r[j]);
  }
  for (; g < groups; ++g) {
    for (int c = 0; c < 8; ++c) out[g * 8 + c] = Bf16ToFloat(src[c][g]);
  }
}

// The exact dot of the codes [begin, end) of one row: the tail group, when K is not a multiple
// of 32 (integer sums are exact, so any order gives the same d).
inline int32_t ScalarDot(const int8_t* x, const int8_t* w, int64_t begin, int64_t end) {
  int32_t d = 0;
  for (int64_t t = begin; t < end; ++t) d += int32_t{x[t]} * w[t];
  return d;
}

// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job. `dots` provides
//   void Prepare(int64_t slot, const int8_t* xq, int64_t kp): whatever it needs per activation
//     row, kept in slot [0, kRowsBlock) until the next block of activation rows;
//   void Row(int64_t slot, const int8_t* xq, const int8_t* w, int64_t k, int32_t* out): the
//     exact dots of the groups of one weight row w [k] with that activation row, out
//     [ceil(k / 32)] (it may write zeros up to the next multiple of kRowsGroupPad).
template <typename RowDots>
void Int8BlockRows(const Int8Job& job, int64_t nb, RowDots& dots) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t n_rows = w.rows, k = w.cols, kp = x.kp, groups = w.scale_cols();
  const int64_t x_groups = kp / kInt8Group;
  const int64_t chunks = (nn + kRowsChunk - 1) / kRowsChunk;
  const int64_t ld = (groups + kRowsGroupPad - 1) / kRowsGroupPad * kRowsGroupPad;
  // Per chunk, each group's 8 scales widened (0 for rows past the task); the dots of one
  // activation row with the chunk's rows, [kRowsChunk][ld] (0 past the last group and for rows
  // past the task).
  thread_local std::vector<float> scale;
  thread_local std::vector<int32_t> d;
  thread_local std::vector<uint16_t> zero_scales;
  scale.resize(static_cast<size_t>(chunks * ld * kRowsChunk));
  d.assign(static_cast<size_t>(kRowsChunk * ld), 0);
  if (static_cast<int64_t>(zero_scales.size()) < groups) zero_scales.assign(groups, 0);
  const int8_t* q = static_cast<const int8_t*>(w.data);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint16_t* src[kRowsChunk];
    for (int c = 0; c < kRowsChunk; ++c) {
      const int64_t r = chunk * kRowsChunk + c;
      src[c] = r < nn ? w.group_scales + (n0 + r) * groups : zero_scales.data();
    }
    TransposeScales(src, groups, scale.data() + chunk * ld * kRowsChunk);
  }
  for (int64_t m0 = 0; m0 < x.m; m0 += kRowsBlock) {
    const int64_t m1 = std::min(x.m, m0 + kRowsBlock);
    for (int64_t i = m0; i < m1; ++i) dots.Prepare(i - m0, x.q.data() + i * kp, kp);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t c0 = chunk * kRowsChunk, nc = std::min<int64_t>(kRowsChunk, nn - c0);
      const float* ws = scale.data() + chunk * ld * kRowsChunk;
      for (int64_t i = m0; i < m1; ++i) {
        const int8_t* xq = x.q.data() + i * kp;
        const float* xs = x.group_scale.data() + i * x_groups;
        for (int64_t c = 0; c < nc; ++c) {
          dots.Row(i - m0, xq, q + (n0 + c0 + c) * k, k, d.data() + c * ld);
        }
        __m256 acc = _mm256_setzero_ps();
        for (int64_t g = 0; g < groups; g += 8) {
          __m256 t[8];
          for (int c = 0; c < kRowsChunk; ++c) {
            t[c] = _mm256_castsi256_ps(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d.data() + c * ld + g)));
          }
          Transpose8x8(t);  // t[j] lane c: row c's dot of group g + j
          const int64_t steps = std::min<int64_t>(8, groups - g);
          for (int64_t j = 0; j < steps; ++j) {
            const __m256 s =
                _mm256_mul_ps(_mm256_set1_ps(xs[g + j]), _mm256_loadu_ps(ws + (g + j) * 8));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_castps_si256(t[j])), s, acc);
          }
        }
        float* y = job.y + i * n_rows + n0 + c0;
        if (nc == kRowsChunk) {
          if (job.bias != nullptr) acc = _mm256_add_ps(acc, _mm256_loadu_ps(job.bias + n0 + c0));
          _mm256_storeu_ps(y, acc);
        } else {
          alignas(32) float out[kRowsChunk];
          _mm256_store_ps(out, acc);
          for (int64_t c = 0; c < nc; ++c) {
            y[c] = job.bias != nullptr ? out[c] + job.bias[n0 + c0 + c] : out[c];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace glmserve::internal
