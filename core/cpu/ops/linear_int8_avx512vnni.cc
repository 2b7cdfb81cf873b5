// The int8-weight Linear kernel on AVX512-VNNI for activations of several rows (arithmetic:
// linear.h, "group-serial"; reference: Int8BlockGeneric in linear_int8.cc, which this kernel
// matches bit for bit). Fewer rows (decode) run Int8BlockAvx512VnniRows at the end of this
// file, whose lanes lie along K (row-major weights), or Int8BlockAvx512VnniRows16
// (linear_int8_rows16_avx512vnni.cc, weights in Int8Layout::kRows16). This kernel reads
// either layout: only where a row's next 4 codes and next group lie differs (Strides).
//
// Lanes lie along the activation rows here: the operands are the activation packed as the AMX
// kernel packs its B tiles (Int8Operands::kVnniTiles: per 16 rows and 32-wide group, 8 vectors
// of 16 rows x 4 codes), each code biased by 128 to an unsigned byte. One vpdpbusd multiplies
// such a vector by 4 codes of one weight row broadcast from memory: 16 rows' 4 products each.
// Eight of them give a group's dot for 16 activation rows of one output, plus 128 times the sum
// of the weight row's 32 codes, which the accumulator starts from the negative of (computed
// once per task and row): the lane ends at the exact dot d. Then, per group, one exact
// conversion, the scales' product (one rounding) and one FMA, over the groups in order.
//
// Register tiles of R (up to 2) activation vectors x C (up to 4) weight rows: R x C int32 dots
// and R x C fp32 sums, all in registers (3 x 4 spilled the sums and ran no faster: 0.56-0.58
// of the int8 dot peak either way on a Zen 4 VM, linear_bench --modes=int8 --tokens=2048).
// Each dot runs as two chains, the group's even and odd code words, added at the group's end:
// an integer sum, so its order is free, and 16 chains cover vpdpbusd's latency where 8 left
// a tenth of the unit idle (a Zen 5 probe: 8 independent chains 0.91 of its rate, 12 or more
// 1.0). A kRows16 chunk whose 4 rows sit side by side in one block (kChunk) reads its words,
// sums and scales at one pointer's offsets instead of 3 x 4 pointers per group.
// K is cut in blocks whose activation operands (2 x 16 rows x 512 codes)
// stay in L1 while every 4-row weight chunk of the task meets them; the sums wait in memory
// between blocks. A prefill's activation rows come a part at a time (Int8Job::row_begin,
// linear.h kPartBytes), so that the part stays in L3 while both threads' tasks read it. The
// blocking never changes an output's sequence of FMAs.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/ops/bf16_pack_avx512.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_int8_rows.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

constexpr int kTileR = 2;             // activation vectors (of 16 rows) per register tile
constexpr int kTileC = 4;             // weight rows per register tile
constexpr int64_t kBlockGroups = 16;  // groups of 32 per K block
constexpr int kWords = 8 * 16;        // one packed group of 16 rows: 8 vectors of 16 words

// The task's weight rows as the kernel reads them, in either layout (Int8Layout): per row, where
// its group 0 starts (codes; -128 x each group's code sum; each group's scale widened), and in
// the template's strides how far each next group and each next 4 codes lie. Row-major codes
// are read in place for the groups wholly inside K, the tail group from a zero-padded copy;
// kRows16 has whole groups only.
struct Weights {
  const int8_t* q[kBlockN];
  const int32_t* corr[kBlockN];
  const float* scale[kBlockN];
  int64_t full;        // groups read in place (row-major: wholly inside K)
  const int8_t* tail;  // row-major: [rows][32], the tail group zero-padded
};

// Strides of the layouts: between groups and between 4-code words (codes); between groups
// (the prepared sums and scales).
template <bool kRows16>
struct Strides {
  static constexpr int64_t kGroup = kRows16 ? kInt8BlockGroupBytes : kInt8Group;
  static constexpr int64_t kWord = kRows16 ? 64 : 4;
  static constexpr int64_t kPrepared = kRows16 ? kInt8BlockRows : 1;
};

struct Acts {
  const int32_t* tiles;  // from the first vector's group 0; vector v is v * ld words further
  const float* scale;    // from the first vector's group 0: [16] per group, v * sld further
  int64_t ld, sld;
};

// Groups [g0, g1) of R activation vectors x C weight rows (the task's rows c0 ..): sums `acc`
// [R][C][16] read (or zero, first) and written back.
template <int R, int C, bool kRows16, bool kChunk = false>
void Block(const Acts& x, const Weights& w, int64_t c0, int64_t g0, int64_t g1, bool first,
           float* acc) {
  using S = Strides<kRows16>;
  __m512 f[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      f[r][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (r * C + c) * 16);
  for (int64_t g = g0; g < g1; ++g) {
    const int8_t* wp[C];
    __m512i d[R][C], e[R][C];
    for (int c = 0; c < C; ++c) {
      const int64_t row = c0 + c;
      if constexpr (kChunk) {
        wp[c] = w.q[c0] + g * S::kGroup + 4 * c;
      } else {
        wp[c] = g < w.full ? w.q[row] + g * S::kGroup : w.tail + row * kInt8Group;
      }
      const __m512i start = _mm512_set1_epi32(kChunk ? w.corr[c0][g * S::kPrepared + c]
                                                     : w.corr[row][g * S::kPrepared]);
      for (int r = 0; r < R; ++r) {
        d[r][c] = start;
        e[r][c] = _mm512_setzero_si512();
      }
    }
    const int32_t* xt = x.tiles + g * kWords;
    for (int p = 0; p < 8; ++p) {
      __m512i a[R];
      for (int r = 0; r < R; ++r) a[r] = _mm512_loadu_si512(xt + r * x.ld + p * 16);
      for (int c = 0; c < C; ++c) {
        int32_t word;
        std::memcpy(&word, wp[c] + S::kWord * p, sizeof(word));  // (the tail: row-major)
        const __m512i b = _mm512_set1_epi32(word);
        for (int r = 0; r < R; ++r) {
          if (p % 2 == 0) {
            d[r][c] = _mm512_dpbusd_epi32(d[r][c], a[r], b);
          } else {
            e[r][c] = _mm512_dpbusd_epi32(e[r][c], a[r], b);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) d[r][c] = _mm512_add_epi32(d[r][c], e[r][c]);
    for (int r = 0; r < R; ++r) {
      const __m512 xs = _mm512_loadu_ps(x.scale + r * x.sld + g * 16);
      for (int c = 0; c < C; ++c) {
        const float ws =
            kChunk ? w.scale[c0][g * S::kPrepared + c] : w.scale[c0 + c][g * S::kPrepared];
        const __m512 scale = _mm512_mul_ps(xs, _mm512_set1_ps(ws));
        f[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][c]), scale, f[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + (r * C + c) * 16, f[r][c]);
}

using BlockFn = void (*)(const Acts&, const Weights&, int64_t, int64_t, int64_t, bool, float*);
template <int R, bool kRows16>
constexpr BlockFn kBlocksForR[kTileC] = {Block<R, 1, kRows16>, Block<R, 2, kRows16>,
                                         Block<R, 3, kRows16>, Block<R, 4, kRows16>};
template <bool kRows16>
constexpr const BlockFn* kBlocks[kTileR] = {kBlocksForR<1, kRows16>, kBlocksForR<2, kRows16>};
template <int R>
constexpr BlockFn kChunkBlocksForR[kTileC] = {Block<R, 1, true, true>, Block<R, 2, true, true>,
                                              Block<R, 3, true, true>, Block<R, 4, true, true>};
constexpr const BlockFn* kChunkBlocks[kTileR] = {kChunkBlocksForR<1>, kChunkBlocksForR<2>};

// Row-major weights: -128 x the sum of each group's codes and the widened scales of rows
// [n0, n0 + rows), [rows][groups], and their tail groups zero-padded. Vectorized: at one vector
// per 8 groups of a row this costs a quarter of a 16-row tile's arithmetic on them, which
// decode-sized activations (one tile) pay per call (written with a scalar reduction per group it
// cost as much as the tile).
void PrepareRowMajor(const Matrix& w, int64_t n0, int64_t rows, std::vector<int8_t>* tail,
                     std::vector<int32_t>* corr, std::vector<float>* scale) {
  const int64_t k = w.cols, groups = w.scale_cols(), full = k / kInt8Group;
  const int8_t* q = static_cast<const int8_t*>(w.data) + n0 * k;
  tail->assign(static_cast<size_t>(rows * kInt8Group), 0);
  corr->resize(static_cast<size_t>(rows * groups));
  scale->resize(static_cast<size_t>(rows * groups));
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  // vpsadbw sums unsigned bytes: each qword the sum of 8 codes + 8 x 128.
  auto sad = [&](const int8_t* p) {
    return _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(p), flip), _mm512_setzero_si512());
  };
  const __m512i order = _mm512_setr_epi64(0, 2, 1, 3, 4, 6, 5, 7);
  const __m512i biased = _mm512_set1_epi64(kInt8Group * 128);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* row = q + r * k;
    int32_t* cr = corr->data() + r * groups;
    int64_t g = 0;
    for (; g + 8 <= full; g += 8) {
      // s[j]: qwords 0-3 the 4 parts of group g + 2j, 4-7 those of group g + 2j + 1.
      __m512i s[4];
      for (int j = 0; j < 4; ++j) s[j] = sad(row + (g + 2 * j) * kInt8Group);
      // Pairs of parts, then the two halves of each group: qwords g, g+2, g+1, g+3, g+4, ...
      const __m512i t0 =
          _mm512_add_epi64(_mm512_unpacklo_epi64(s[0], s[1]), _mm512_unpackhi_epi64(s[0], s[1]));
      const __m512i t1 =
          _mm512_add_epi64(_mm512_unpacklo_epi64(s[2], s[3]), _mm512_unpackhi_epi64(s[2], s[3]));
      const __m512i u =
          _mm512_add_epi64(_mm512_shuffle_i64x2(t0, t1, 0x88), _mm512_shuffle_i64x2(t0, t1, 0xDD));
      const __m512i sums = _mm512_sub_epi64(_mm512_permutexvar_epi64(order, u), biased);
      // -128 x sum; |sum| <= 32 x 128, so it fits the int32 it narrows to.
      const __m512i c = _mm512_sub_epi64(_mm512_setzero_si512(), _mm512_slli_epi64(sums, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(cr + g), _mm512_cvtepi64_epi32(c));
    }
    for (; g < full; ++g) {
      int32_t sum = 0;
      for (int64_t j = 0; j < kInt8Group; ++j) sum += row[g * kInt8Group + j];
      cr[g] = -128 * sum;
    }
    if (full < groups) {
      int8_t* t = tail->data() + r * kInt8Group;
      std::memcpy(t, row + full * kInt8Group, static_cast<size_t>(k - full * kInt8Group));
      int32_t sum = 0;
      for (int64_t j = 0; j < kInt8Group; ++j) sum += t[j];
      cr[full] = -128 * sum;
    }
    // A bf16 is the high half of its fp32.
    const uint16_t* bf16 = w.group_scales + (n0 + r) * groups;
    float* out = scale->data() + r * groups;
    int64_t j = 0;
    for (; j + 16 <= groups; j += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bf16 + j));
      _mm512_storeu_si512(out + j, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (; j < groups; ++j) out[j] = Bf16ToFloat(bf16[j]);
  }
}

// kRows16 weights: the same sums and scales for the blocks that hold rows [n0, n0 + rows),
// [blocks][groups][16] as the codes are: one vpdpbusd by ones per 64 codes gives 16 rows' sums.
void PrepareRows16(const Matrix& w, int64_t n0, int64_t rows, std::vector<int32_t>* corr,
                   std::vector<float>* scale) {
  const int64_t groups = w.scale_cols();
  const int64_t b0 = w.int8_block(n0), b1 = w.int8_block(n0 + rows - 1) + 1;
  corr->resize(static_cast<size_t>((b1 - b0) * groups * kInt8BlockRows));
  scale->resize(corr->size());
  const int8_t* q = static_cast<const int8_t*>(w.data);
  const __m512i ones = _mm512_set1_epi8(1);
  // Four groups at a time: each group's sum is a chain of 8 vpdpbusd, and one chain alone would
  // wait on the instruction's latency at every step (a tenth of a 128-row expert's time).
  constexpr int64_t kChains = 4;
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t g0 = 0; g0 < groups; g0 += kChains) {
      const int64_t n = std::min(kChains, groups - g0);
      __m512i sum[kChains];
      for (int64_t j = 0; j < kChains; ++j) sum[j] = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p) {
        for (int64_t j = 0; j < kChains; ++j) {
          // (Past the last group: the last one again, so that the chains stay in registers.)
          const int64_t g = std::min(g0 + j, groups - 1);
          const int8_t* codes = q + (b * groups + g) * kInt8BlockGroupBytes + p * 64;
          sum[j] = _mm512_dpbusd_epi32(sum[j], ones, _mm512_loadu_si512(codes));
        }
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t unit = b * groups + g0 + j;
        const int64_t out = ((b - b0) * groups + g0 + j) * kInt8BlockRows;
        // |sum| <= 32 x 128: -128 x sum fits.
        _mm512_storeu_si512(corr->data() + out,
                            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum[j], 7)));
        const __m256i h = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(w.group_scales + unit * kInt8BlockRows));
        _mm512_storeu_si512(scale->data() + out, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
    }
  }
}

// The task's Weights, its prepared sums and scales in the thread's buffers.
Weights PrepareWeights(const Matrix& w, int64_t n0, int64_t rows, std::vector<int8_t>* tail,
                       std::vector<int32_t>* corr, std::vector<float>* scale) {
  Weights out;
  const int64_t groups = w.scale_cols();
  const int8_t* q = static_cast<const int8_t*>(w.data);
  if (w.int8_layout == Int8Layout::kRowMajor) {
    PrepareRowMajor(w, n0, rows, tail, corr, scale);
    for (int64_t r = 0; r < rows; ++r) {
      out.q[r] = q + (n0 + r) * w.cols;
      out.corr[r] = corr->data() + r * groups;
      out.scale[r] = scale->data() + r * groups;
    }
    out.full = w.cols / kInt8Group;
    out.tail = tail->data();
    return out;
  }
  PrepareRows16(w, n0, rows, corr, scale);
  const int64_t b0 = w.int8_block(n0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = w.int8_block(n0 + r), lane = w.int8_lane(n0 + r);
    out.q[r] = q + b * groups * kInt8BlockGroupBytes + lane * 4;
    out.corr[r] = corr->data() + (b - b0) * groups * kInt8BlockRows + lane;
    out.scale[r] = scale->data() + (b - b0) * groups * kInt8BlockRows + lane;
  }
  out.full = groups;
  out.tail = nullptr;
  return out;
}

}  // namespace

void Int8BlockAvx512Vnni(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t n_rows = w.rows, groups = w.scale_cols(), x_groups = x.kp / kInt8Group;
  thread_local std::vector<int8_t> tail;
  thread_local std::vector<int32_t> corr;
  thread_local std::vector<float> scale;
  const Weights wt = PrepareWeights(w, n0, nn, &tail, &corr, &scale);
  const BlockFn* const* blocks =
      w.int8_layout == Int8Layout::kRows16 ? kBlocks<true> : kBlocks<false>;
  // kRows16 chunks whose rows lie in one block (all but where a block's edge cuts the chunk):
  // their lanes are consecutive, so their words, sums and scales are one pointer's offsets.
  bool chunk[kBlockN / kTileC] = {};
  if (w.int8_layout == Int8Layout::kRows16) {
    for (int64_t c0 = 0; c0 < nn; c0 += kTileC) {
      const int64_t last = std::min(nn, c0 + kTileC) - 1;
      chunk[c0 / kTileC] = w.int8_block(n0 + c0) == w.int8_block(n0 + last);
    }
  }
  const int64_t vectors = (job.RowEnd() + 15) / 16;
  // Sums of every chunk of the task against one register tile of activation vectors.
  alignas(64) float acc[kBlockN / kTileC][kTileR * kTileC * 16];
  for (int64_t v0 = job.row_begin / 16; v0 < vectors; v0 += kTileR) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileR, vectors - v0));
    const Acts acts{x.tiles.data() + v0 * x_groups * kWords,
                    x.tile_scale.data() + v0 * x_groups * 16, x_groups * kWords, x_groups * 16};
    for (int64_t g0 = 0; g0 < groups; g0 += kBlockGroups) {
      const int64_t g1 = std::min(groups, g0 + kBlockGroups);
      for (int64_t c0 = 0; c0 < nn; c0 += kTileC) {
        const int nc = static_cast<int>(std::min<int64_t>(kTileC, nn - c0));
        (chunk[c0 / kTileC] ? kChunkBlocks : blocks)[nr - 1][nc - 1](acts, wt, c0, g0, g1, g0 == 0,
                                                                     acc[c0 / kTileC]);
      }
    }
    // Sum (r, c) lane i: output n0 + c0 + c of activation row 16 (v0 + r) + i. They go to y
    // through `rows`, one activation row's outputs side by side, so that y takes whole vectors:
    // y's rows lie n_rows apart, and writing it one float at a time, each to another line of a
    // matrix past L3, cost a third of the kernel's time (linear_bench --modes=int8).
    // Whole 16-output spans turn over with one 16 x 16 transpose (the scalar copy cost a
    // tenth of a 128-row expert's time), the tail's outputs one at a time.
    alignas(64) float rows[16][kBlockN];
    const __mmask16 tail_mask = static_cast<__mmask16>((1u << (nn % 16)) - 1);
    const int64_t whole = nn / 16 * 16;
    for (int r = 0; r < nr; ++r) {
      for (int64_t j = 0; j < whole; j += 16) {
        __m512i t[16];
        for (int o = 0; o < 16; ++o) {
          const int64_t c0 = j + o / kTileC * kTileC;
          t[o] = _mm512_load_si512(acc[c0 / kTileC] + (r * kTileC + o % kTileC) * 16);
        }
        Transpose16x16(t);
        for (int i = 0; i < 16; ++i) _mm512_store_si512(rows[i] + j, t[i]);
      }
      for (int64_t c0 = whole; c0 < nn; c0 += kTileC) {
        const int nc = static_cast<int>(std::min<int64_t>(kTileC, nn - c0));
        for (int c = 0; c < nc; ++c) {
          const float* s = acc[c0 / kTileC] + (r * nc + c) * 16;
          for (int i = 0; i < 16; ++i) rows[i][c0 + c] = s[i];
        }
      }
      const int64_t row0 = 16 * (v0 + r), m_rows = std::min<int64_t>(16, job.RowEnd() - row0);
      for (int64_t i = 0; i < m_rows; ++i) {
        float* y = job.y + (row0 + i) * n_rows + n0;
        for (int64_t j = 0; j < nn; j += 16) {
          const __mmask16 mask = j + 16 <= nn ? __mmask16{0xFFFF} : tail_mask;
          __m512 v = _mm512_maskz_loadu_ps(mask, rows[i] + j);
          if (job.bias != nullptr)
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, job.bias + n0 + j));
          _mm512_mask_storeu_ps(y + j, mask, v);
        }
      }
    }
  }
}

namespace {

// Lanes of the result: the sums of the two 8-lane halves of v[j] (j = 0..7), group 2j (low
// half) and 2j + 1 (high half) in order: 16 groups' sums.
inline __m512i Reduce16(const __m512i* v) {
  // Within each 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] for a = v[2j], b = v[2j + 1].
  __m512i p[4];
  for (int j = 0; j < 4; ++j) {
    p[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * j], v[2 * j + 1]),
                            _mm512_unpackhi_epi32(v[2 * j], v[2 * j + 1]));
  }
  // Block b of q0: the sums of block b of v0, v1, v2, v3 (q1: v4..v7).
  const __m512i q0 =
      _mm512_add_epi32(_mm512_unpacklo_epi64(p[0], p[1]), _mm512_unpackhi_epi64(p[0], p[1]));
  const __m512i q1 =
      _mm512_add_epi32(_mm512_unpacklo_epi64(p[2], p[3]), _mm512_unpackhi_epi64(p[2], p[3]));
  // Blocks 0 + 1 are the low halves, 2 + 3 the high ones: groups 0 2 4 6 | 1 3 5 7 | 8 10 12
  // 14 | 9 11 13 15, which the permutation puts in order.
  const __m512i s = _mm512_add_epi32(_mm512_shuffle_i32x4(q0, q1, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i32x4(q0, q1, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  return _mm512_permutexvar_epi32(order, s);
}

// Int8BlockRows' group dots on AVX512-VNNI: one vpdpbusd per 64 codes (two groups). vpdpbusd
// multiplies unsigned bytes by signed ones, so the weight codes are biased to unsigned (w xor
// 0x80 = w + 128) and the activation codes stay signed: the lanes sum w x + 128 x, and
// Prepare's per-group 128 x (sum of the activation's codes), subtracted, leaves the exact dot.
// A row's last 64 codes are a masked load (zeros past K; the activation's codes past K are 0
// up to kp, a multiple of 64, so the zeros' +128 adds nothing).
class VnniRowDots {
 public:
  // `corr`: the thread's buffer, sized here.
  VnniRowDots(int64_t groups, std::vector<int32_t>* corr)
      : ld_((groups + kRowsGroupPad - 1) / kRowsGroupPad * kRowsGroupPad), corr_(*corr) {
    corr_.resize(static_cast<size_t>(kRowsBlock * ld_));
  }
  void Prepare(int64_t slot, const int8_t* xq, int64_t kp) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    int32_t* out = corr_.data() + slot * ld_;
    const int64_t units = kp / 64;  // kp: a multiple of 64
    for (int64_t u0 = 0; u0 < ld_ / 2; u0 += 8) {
      __m512i v[8];
      for (int j = 0; j < 8; ++j) {
        v[j] = u0 + j < units ? _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias,
                                                    _mm512_loadu_si512(xq + (u0 + j) * 64))
                              : _mm512_setzero_si512();
      }
      _mm512_storeu_si512(out + 2 * u0, Reduce16(v));
    }
  }
  void Row(int64_t slot, const int8_t* xq, const int8_t* w, int64_t k, int32_t* out) const {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const int32_t* corr = corr_.data() + slot * ld_;
    const int64_t whole = k / 64, units = (k + 63) / 64;
    // The unit's 16 lanes: w x + 128 x per 4 codes, both groups of the unit.
    const auto unit = [&](int64_t u, __m512i codes) {
      return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(codes, flip),
                                 _mm512_loadu_si512(xq + u * 64));
    };
    const auto store = [&](int64_t u0, const __m512i* v) {
      _mm512_storeu_si512(out + 2 * u0,
                          _mm512_sub_epi32(Reduce16(v), _mm512_loadu_si512(corr + 2 * u0)));
    };
    int64_t u0 = 0;
    for (; u0 + 8 <= whole; u0 += 8) {
      __m512i v[8];
      for (int j = 0; j < 8; ++j) v[j] = unit(u0 + j, _mm512_loadu_si512(w + (u0 + j) * 64));
      store(u0, v);
    }
    if (u0 < units) {  // the last units: a masked load past K, zeros past the row's units
      __m512i v[8];
      for (int j = 0; j < 8; ++j) {
        const int64_t u = u0 + j;
        v[j] = u < whole ? unit(u, _mm512_loadu_si512(w + u * 64))
               : u < units
                   ? unit(u, _mm512_maskz_loadu_epi8(~0ULL >> (64 - (k - u * 64)), w + u * 64))
                   : _mm512_setzero_si512();
      }
      store(u0, v);
    }
  }

 private:
  int64_t ld_;
  std::vector<int32_t>& corr_;  // [kRowsBlock][ld_]: 128 x each group's code sum
};

}  // namespace

void Int8BlockAvx512VnniRows(const Int8Job& job, int64_t nb) {
  thread_local std::vector<int32_t> corr;
  VnniRowDots dots(job.w->scale_cols(), &corr);
  Int8BlockRows(job, nb, dots);
}

}  // namespace glmserve::internal
