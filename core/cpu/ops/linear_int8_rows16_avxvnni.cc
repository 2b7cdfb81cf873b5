// The int8-weight Linear kernel for Int8Layout::kRows16 weights on AVX2 with AVX-VNNI (the VEX
// form of vpdpbusd on 256 bits: Intel's client and E-core CPUs, which lack AVX-512), for every
// number of activation rows (arithmetic: linear.h, "group-serial"; reference: Int8BlockGeneric,
// which this kernel matches bit for bit). It is linear_int8_rows16_avx2.cc with each 4-product
// step one vpdpbusd instead of an abs, a sign, vpmaddubsw, vpmaddwd and an add: the loops, the
// two activation rows per pass and a prefill's K ranges are that file's.
//
// vpdpbusd multiplies unsigned bytes by signed ones: the weight codes are biased to unsigned
// (w xor 0x80 = w + 128) and the activation codes stay signed, so the lanes sum w x + 128 x;
// each dot starts from -128 x (the group's activation code sum, Int8Activation::group_sum) and
// ends exact.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/base/aligned_vector.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

// Activation rows per pass over a block (as in the AVX2 kernel).
constexpr int kMaxRows = 2;
// Groups per K range of a prefill (see Int8BlockAvx2Rows16).
constexpr int64_t kRangeGroups = 16;
// How far ahead each group's weights are asked for: 8 groups, 4 KiB (docs/performance.md,
// "Int8 weights on AVX2 in 16-row blocks").
constexpr int64_t kPrefetchGroups = 8;

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
// activation rows (codes xq[i], group scales xs[i], group code sums x_sum[i]): acc [R][16]
// (lane r: block row r), from zero (first) or as left by the groups before, before the bias.
template <int R>
void BlockSums(const int8_t* q, const uint16_t* scales, int64_t g0, int64_t g1,
               const int8_t* const* xq, const float* const* xs, const int32_t* const* x_sum,
               bool first, float* acc) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 f[R][2];
  for (int i = 0; i < R; ++i) {
    for (int h = 0; h < 2; ++h) {
      f[i][h] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc + 16 * i + 8 * h);
    }
  }
  for (int64_t g = g0; g < g1; ++g) {
    const int8_t* unit = q + g * kInt8BlockGroupBytes;
    // Each group asks for the one kPrefetchGroups ahead (past the block's end, the next block's;
    // a prefetch never faults), as VNNI's decode kernel does: alone, the hardware prefetcher
    // left the weights of a decode step arriving at 0.72-0.74 of the read ceiling.
    for (int64_t line = 0; line < kInt8BlockGroupBytes; line += 64) {
      _mm_prefetch(
          reinterpret_cast<const char*>(unit + kPrefetchGroups * kInt8BlockGroupBytes + line),
          _MM_HINT_T0);
    }
    __m256i d[R][2];
    for (int i = 0; i < R; ++i) d[i][0] = d[i][1] = _mm256_set1_epi32(-128 * x_sum[i][g]);
    for (int p = 0; p < 8; ++p) {
      const __m256i w0 = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + p * 64)), flip);
      const __m256i w1 = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + p * 64 + 32)), flip);
      for (int i = 0; i < R; ++i) {
        const __m256i x = Broadcast4(xq[i] + g * kInt8Group + 4 * p);
        d[i][0] = _mm256_dpbusd_avx_epi32(d[i][0], w0, x);
        d[i][1] = _mm256_dpbusd_avx_epi32(d[i][1], w1, x);
      }
    }
    const __m256 ws[2] = {WidenScales(scales + g * kInt8BlockRows),
                          WidenScales(scales + g * kInt8BlockRows + 8)};
    for (int i = 0; i < R; ++i) {
      const __m256 x_scale = _mm256_set1_ps(xs[i][g]);
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

using BlockSumsFn = void (*)(const int8_t*, const uint16_t*, int64_t, int64_t, const int8_t* const*,
                             const float* const*, const int32_t* const*, bool, float*);
constexpr BlockSumsFn kBlockSums[kMaxRows] = {BlockSums<1>, BlockSums<2>};

}  // namespace

void Int8BlockAvxVnniRows16(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t n_rows = w.rows, groups = w.scale_cols(), x_groups = x.kp / kInt8Group;
  const int64_t i_begin = job.row_begin, m = job.RowEnd() - i_begin;
  // The blocks holding the task's rows (a RowSlice that starts inside a block shares its
  // first and last blocks with the neighbouring tasks, which compute them again).
  const int64_t b0 = w.int8_block(n0), b1 = w.int8_block(n0 + nn - 1) + 1;
  const int8_t* q = static_cast<const int8_t*>(w.data);
  // Sums per block and activation row, [b1 - b0][m][16], waiting between K ranges.
  thread_local AlignedVector<float> acc;
  acc.resize((b1 - b0) * m * kInt8BlockRows);
  // A prefill takes K in ranges: the blocks' range (8 KiB each) stays in L1 while every
  // activation row meets it, where all of K (64 KiB a block at K = 4,096) came from L2 for each
  // pair of rows. Decode reads each block once, whole, one block after the next.
  const int64_t range = m > kMaxRows ? kRangeGroups : groups;
  for (int64_t g0 = 0; g0 < groups; g0 += range) {
    const int64_t g1 = std::min(groups, g0 + range);
    for (int64_t i0 = 0; i0 < m; i0 += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - i0));
      const int8_t* xq[kMaxRows];
      const float* xs[kMaxRows];
      const int32_t* x_sum[kMaxRows];
      for (int i = 0; i < rows; ++i) {
        xq[i] = x.q.data() + (i_begin + i0 + i) * x.kp;
        xs[i] = x.group_scale.data() + (i_begin + i0 + i) * x_groups;
        x_sum[i] = x.group_sum.data() + (i_begin + i0 + i) * x_groups;
      }
      for (int64_t b = b0; b < b1; ++b) {
        kBlockSums[rows - 1](q + b * groups * kInt8BlockGroupBytes,
                             w.group_scales + b * groups * kInt8BlockRows, g0, g1, xq, xs, x_sum,
                             g0 == 0, acc.data() + ((b - b0) * m + i0) * kInt8BlockRows);
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

}  // namespace glmserve::internal
