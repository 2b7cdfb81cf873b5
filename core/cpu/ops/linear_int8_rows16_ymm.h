// The driver of the 256-bit int8-weight kernels for Int8Layout::kRows16 weights (arithmetic:
// linear.h, "group-serial"; reference: Int8BlockGeneric): linear_int8_rows16_avx2.cc (AVX2:
// vpmaddubsw) and linear_int8_rows16_avxvnni.cc (AVX-VNNI: vpdpbusd) instantiate it with their
// own exact group dots, for every number of activation rows (decode and prefill) on CPUs
// without AVX-512.
//
// In kRows16 a block's group is 8 words of 16 rows x 4 codes (64 bytes a word): the first 32
// bytes of a word hold 4 codes of rows 0-7, the second rows 8-15. A 4-product step of such a
// half against 4 activation codes broadcast adds to 8 rows' group dots at once, with no
// reduction across lanes: lane r of a dot is block row r (or 8 + r). Then per group the exact
// conversion, the scales' product (one rounding) and one FMA, the groups in order, as every
// int8 kernel does.
//
// Everything here has internal linkage (an unnamed namespace, in a header on purpose): each
// including file compiles it for its own instruction set, and one copy must never stand in for
// the other at link time.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/base/aligned_vector.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

// Activation rows per pass over a block: their dots and sums (2 rows x 2 halves x 2) take 8 of
// AVX2's 16 registers, the weights, the broadcast codes and the constants the rest.
constexpr int kYmmRows = 2;
// Groups per K range of a prefill (Int8Rows16Ymm).
constexpr int64_t kYmmRangeGroups = 16;
// How far ahead each group's weights are asked for: 8 groups, 4 KiB. As in VNNI's decode kernel:
// alone, the hardware prefetcher left a decode step's weights arriving at 0.72-0.74 of the read
// ceiling (docs/performance.md, "Int8 weights on AVX2 in 16-row blocks").
constexpr int64_t kYmmPrefetchGroups = 8;

// The activation rows of one pass: codes [kp], group scales and group code sums [groups].
struct YmmRows {
  const int8_t* q[kYmmRows];
  const float* scale[kYmmRows];
  const int32_t* sum[kYmmRows];
};

inline __m256i Broadcast4(const int8_t* codes) {
  int32_t word;
  std::memcpy(&word, codes, sizeof(word));
  return _mm256_set1_epi32(word);
}

// 8 bf16 scales widened (a bf16 is the high half of its fp32).
inline __m256 WidenScales(const uint16_t* s) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Groups [g0, g1) of one block's 16 rows (codes [groups][512], scales [groups][16]) against R
// activation rows: acc [R][16] (lane r: block row r), from zero (first) or as left by the
// groups before, before the bias. Dots::Group<R>(unit, x, g, d) writes group g's exact int32
// dots d[i][h] (activation row i, rows 8 h .. 8 h + 7) from the group's 512 bytes at `unit`.
template <class Dots, int R>
void YmmBlockSums(const int8_t* q, const uint16_t* scales, int64_t g0, int64_t g1, const YmmRows& x,
                  bool first, float* acc) {
  __m256 f[R][2];
  for (int i = 0; i < R; ++i) {
    for (int h = 0; h < 2; ++h) {
      f[i][h] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc + 16 * i + 8 * h);
    }
  }
  for (int64_t g = g0; g < g1; ++g) {
    const int8_t* unit = q + g * kInt8BlockGroupBytes;
    // (Past the block's end, the next block's, which the task or its neighbour reads next; a
    // prefetch never faults.)
    for (int64_t line = 0; line < kInt8BlockGroupBytes; line += 64) {
      _mm_prefetch(
          reinterpret_cast<const char*>(unit + kYmmPrefetchGroups * kInt8BlockGroupBytes + line),
          _MM_HINT_T0);
    }
    __m256i d[R][2];
    Dots::template Group<R>(unit, x, g, d);
    const __m256 ws[2] = {WidenScales(scales + g * kInt8BlockRows),
                          WidenScales(scales + g * kInt8BlockRows + 8)};
    for (int i = 0; i < R; ++i) {
      const __m256 x_scale = _mm256_set1_ps(x.scale[i][g]);
      for (int h = 0; h < 2; ++h) {
        f[i][h] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[i][h]), _mm256_mul_ps(x_scale, ws[h]), f[i][h]);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int h = 0; h < 2; ++h) _mm256_store_ps(acc + 16 * i + 8 * h, f[i][h]);
  }
}

// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job (kGroups operands). Dots also says
// whether it reads the activation's group code sums (kReadsSums).
template <class Dots>
void Int8Rows16Ymm(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t n_rows = w.rows, groups = w.scale_cols(), x_groups = x.kp / kInt8Group;
  const int64_t i_begin = job.row_begin, m = job.RowEnd() - i_begin;
  // The blocks holding the task's rows (a RowSlice that starts inside a block shares its
  // first and last blocks with the neighbouring tasks, which compute them again).
  const int64_t b0 = w.int8_block(n0), b1 = w.int8_block(n0 + nn - 1) + 1;
  const int8_t* q = static_cast<const int8_t*>(w.data);
  using SumsFn =
      void (*)(const int8_t*, const uint16_t*, int64_t, int64_t, const YmmRows&, bool, float*);
  constexpr SumsFn kSums[kYmmRows] = {YmmBlockSums<Dots, 1>, YmmBlockSums<Dots, 2>};
  // Sums per block and activation row, [b1 - b0][m][16], waiting between K ranges.
  thread_local AlignedVector<float> acc;
  acc.resize((b1 - b0) * m * kInt8BlockRows);
  // A prefill takes K in ranges: the blocks' range (8 KiB each) stays in L1 while every
  // activation row meets it, where all of K (64 KiB a block at K = 4,096) came from L2 for each
  // pair of rows. Decode reads each block once, whole, one block after the next.
  const int64_t range = m > kYmmRows ? kYmmRangeGroups : groups;
  for (int64_t g0 = 0; g0 < groups; g0 += range) {
    const int64_t g1 = std::min(groups, g0 + range);
    for (int64_t i0 = 0; i0 < m; i0 += kYmmRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kYmmRows, m - i0));
      YmmRows act{};
      for (int i = 0; i < rows; ++i) {
        const int64_t row = i_begin + i0 + i;
        act.q[i] = x.q.data() + row * x.kp;
        act.scale[i] = x.group_scale.data() + row * x_groups;
        act.sum[i] = Dots::kReadsSums ? x.group_sum.data() + row * x_groups : nullptr;
      }
      for (int64_t b = b0; b < b1; ++b) {
        kSums[rows - 1](q + b * groups * kInt8BlockGroupBytes,
                        w.group_scales + b * groups * kInt8BlockRows, g0, g1, act, g0 == 0,
                        acc.data() + ((b - b0) * m + i0) * kInt8BlockRows);
      }
    }
  }
  for (int64_t b = b0; b < b1; ++b) {
    // Block lane r is output row first + r; the task writes rows [n0, n0 + nn).
    const int64_t first = w.int8_block_row0(b);
    const int64_t lo = std::max<int64_t>(0, n0 - first);
    const int64_t hi = std::min<int64_t>(kInt8BlockRows, n0 + nn - first);
    for (int64_t i = 0; i < m; ++i) {
      const float* lanes = acc.data() + ((b - b0) * m + i) * kInt8BlockRows;
      float* y = job.y + (i_begin + i) * n_rows + first;
      for (int64_t r = lo; r < hi; ++r) {
        y[r] = job.bias != nullptr ? lanes[r] + job.bias[first + r] : lanes[r];
      }
    }
  }
}

}  // namespace
}  // namespace glmserve::internal
