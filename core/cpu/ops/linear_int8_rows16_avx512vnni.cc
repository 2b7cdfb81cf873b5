// The int8-weight Linear kernel for Int8Layout::kRows16 weights on AVX512-VNNI, for activations
// of fewer than kInt8VnniMinRows rows: decode (arithmetic: linear.h, "group-serial"; reference:
// Int8BlockGeneric, which this kernel matches bit for bit).
//
// Decode reads every weight once, so it is bound by how fast the weights stream in, and on one
// core by how few instructions each 64 bytes costs. Row-major weights need a reduction across
// lanes per row and group (the lanes of a vpdpbusd over 64 codes of one row hold partial sums of
// two groups): about 48 vector instructions per 512 codes there, and a Zen 4 core could not issue
// them as fast as memory delivered (docs/performance.md). In kRows16 one 64-byte vector holds 4
// codes of 16 rows, so one vpdpbusd by 4 broadcast activation codes adds those to 16 rows' group
// dots at once, and 8 of them finish a group for the 16 rows: no reduction, about 20
// instructions per 512 codes, and a task's blocks lie one after another (one stream).
//
// vpdpbusd multiplies unsigned bytes by signed ones: the weight codes are biased to unsigned
// (w xor 0x80 = w + 128) and the activation codes stay signed, so the lanes sum w x + 128 x; each
// dot starts from -128 x (the group's activation code sum, Int8Activation::group_sum) and ends
// exact. Then per group the exact conversion, the scales' product (one rounding) and one FMA,
// the groups in order: lane r of the sum is output row 16 b + r of the block.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

constexpr int kMaxRows = 4;  // activation rows per pass over a block (their sums in registers)
// How far ahead each group's weights are asked for: 8 groups, 4 KiB. Measured on the Zen 5 VM,
// linear_bench --modes=int8 --tokens=128 --experts=128 (8 rows per expert, weights from memory),
// experts on one thread 16.1 GB/s without, 21.1 at 2 KiB, 23.1-23.5 at 4, 23.2-23.8 at 8;
// cpu_bench --modes=int8 decode batch 8: 47.6-49.0 -> 37.6-39.0 ms/step.
constexpr int64_t kPrefetchGroups = 8;

struct ActRows {
  const int8_t* q[kMaxRows];     // [kp] codes
  const float* scale[kMaxRows];  // [groups] group scales
  const int32_t* sum[kMaxRows];  // [groups] group code sums
};

inline __m512i Broadcast4(const int8_t* codes) {
  int32_t word;
  std::memcpy(&word, codes, sizeof(word));
  return _mm512_set1_epi32(word);
}

// One block's 16 rows (codes [groups][512], scales [groups][16]) against R activation rows:
// out[i] lane r = the sum for block row r and activation row i, before the bias.
template <int R>
void BlockDots(const int8_t* q, const uint16_t* scales, int64_t groups, const ActRows& x,
               __m512* out) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 f[R];
  for (int i = 0; i < R; ++i) f[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* unit = q + g * kInt8BlockGroupBytes;
    // The weights stream from memory once (decode, or an expert's few rows of a prefill), one
    // block after another: each group asks for the one kPrefetchGroups ahead (past the block's
    // end, the next block's, which the task or its neighbour reads next; a prefetch never
    // faults). The hardware prefetcher alone left compute and memory taking turns. At one row
    // the loop is short enough to run ahead by itself (decode batch 1 is at the read ceiling),
    // and the prefetches only cost issue slots.
    if constexpr (R > 1) {
      for (int64_t line = 0; line < kInt8BlockGroupBytes; line += 64) {
        _mm_prefetch(
            reinterpret_cast<const char*>(unit + kPrefetchGroups * kInt8BlockGroupBytes + line),
            _MM_HINT_T0);
      }
    }
    // Two chains per row (even and odd words) so that one row's dots do not wait on each
    // other's latency; their sum is exact.
    __m512i d0[R], d1[R];
    for (int i = 0; i < R; ++i) {
      d0[i] = _mm512_set1_epi32(-128 * x.sum[i][g]);
      d1[i] = _mm512_setzero_si512();
    }
    for (int p = 0; p < 8; p += 2) {
      const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(unit + p * 64), flip);
      const __m512i w1 = _mm512_xor_si512(_mm512_loadu_si512(unit + (p + 1) * 64), flip);
      for (int i = 0; i < R; ++i) {
        const int8_t* codes = x.q[i] + g * kInt8Group + 4 * p;
        d0[i] = _mm512_dpbusd_epi32(d0[i], w0, Broadcast4(codes));
        d1[i] = _mm512_dpbusd_epi32(d1[i], w1, Broadcast4(codes + 4));
      }
    }
    // A bf16 is the high half of its fp32.
    const __m512 ws = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + g * kInt8BlockRows))),
        16));
    for (int i = 0; i < R; ++i) {
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(x.scale[i][g]), ws);
      f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0[i], d1[i])), s, f[i]);
    }
  }
  for (int i = 0; i < R; ++i) out[i] = f[i];
}

using BlockDotsFn = void (*)(const int8_t*, const uint16_t*, int64_t, const ActRows&, __m512*);
constexpr BlockDotsFn kBlockDots[kMaxRows] = {BlockDots<1>, BlockDots<2>, BlockDots<3>,
                                              BlockDots<4>};

}  // namespace

void Int8BlockAvx512VnniRows16(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t n_rows = w.rows, groups = w.scale_cols(), x_groups = x.kp / kInt8Group;
  // The blocks holding the task's rows (a RowSlice that starts inside a block shares its
  // first and last blocks with the neighbouring tasks, which compute them again).
  const int64_t b0 = w.int8_block(n0), b1 = w.int8_block(n0 + nn - 1) + 1;
  const int8_t* q = static_cast<const int8_t*>(w.data);
  for (int64_t b = b0; b < b1; ++b) {
    // Block lane r is output row first + r; the task writes rows [n0, n0 + nn).
    const int64_t first = w.int8_block_row0(b);
    const int64_t lo = std::max<int64_t>(0, n0 - first);
    const int64_t hi = std::min<int64_t>(kInt8BlockRows, n0 + nn - first);
    for (int64_t i0 = 0; i0 < x.m; i0 += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, x.m - i0));
      ActRows act;
      for (int i = 0; i < rows; ++i) {
        act.q[i] = x.q.data() + (i0 + i) * x.kp;
        act.scale[i] = x.group_scale.data() + (i0 + i) * x_groups;
        act.sum[i] = x.group_sum.data() + (i0 + i) * x_groups;
      }
      __m512 sums[kMaxRows];
      kBlockDots[rows - 1](q + b * groups * kInt8BlockGroupBytes,
                           w.group_scales + b * groups * kInt8BlockRows, groups, act, sums);
      for (int i = 0; i < rows; ++i) {
        float* y = job.y + (i0 + i) * n_rows + first;
        if (lo == 0 && hi == kInt8BlockRows) {
          __m512 v = sums[i];
          if (job.bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(job.bias + first));
          _mm512_storeu_ps(y, v);
          continue;
        }
        alignas(64) float lanes[kInt8BlockRows];
        _mm512_store_ps(lanes, sums[i]);
        for (int64_t r = lo; r < hi; ++r) {
          y[r] = job.bias != nullptr ? lanes[r] + job.bias[first + r] : lanes[r];
        }
      }
    }
  }
}

}  // namespace glmserve::internal
