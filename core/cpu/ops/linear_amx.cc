// The kBf16Amx kernel (linear_amx.h): the AMX one, compiled for AMX through function target
// attributes and chosen at run time, and its portable emulation, bit for bit.
#include "core/cpu/ops/linear_amx.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/base/aligned_vector.h"
#include "core/cpu/ops/bf16_math.h"
#include "core/cpu/ops/linear.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace glmserve::internal {
namespace {

int64_t Chunks(int64_t k) { return (k + kAmxTileK - 1) / kAmxTileK; }

// A unit's L2 budget (AmxUnits): its weight blocks, read in place, in about 1 MiB; a slab of
// activation rows (whole 32-row pairs) in about 512 KiB beside them. Both are sized for at most
// kRangeChunks chunks of K: a wider K is taken in ranges of that many chunks (the hardware
// kernel keeps the C tiles between ranges), so that o_proj's and the FFN's down projection
// (K = 12288, 10944) keep groups of 4 blocks and 64-row slabs instead of 1 block and 32 rows.
constexpr int64_t kGroupWeightBytes = int64_t{1} << 20;
constexpr int64_t kSlabBytes = int64_t{512} << 10;
constexpr int64_t kMaxGroupBlocks = 8;
constexpr int64_t kRangeChunks = 128;  // K = 4096
int64_t RangeK(int64_t k) { return std::min(k, kRangeChunks * kAmxTileK); }
int64_t SlabRows(int64_t k) {
  return std::max<int64_t>(2 * kAmxTileRows,
                           kSlabBytes / std::max<int64_t>(1, RangeK(k) * 2) / 32 * 32);
}

// Index of activation (i, k) in the packed B operand of width-k_total rows.
inline int64_t PackedIndex(int64_t i, int64_t k, int64_t chunks) {
  return ((i / kAmxTileRows) * chunks + k / kAmxTileK) * kAmxTileElems +
         ((k % kAmxTileK) / 2) * (2 * kAmxTileRows) + (i % kAmxTileRows) * 2 + (k % 2);
}

// One TDPBF16PS step of one C element (AmxBf16Element, bf16_math.h): the even and odd chains
// over 16 pairs, then c + (e + o). a: 32 bf16 of the A row; b(j): element j (0..31) of the B
// column, as pairs.
template <typename B>
inline float ChunkStep(float c, const uint16_t* a, B b) {
  return AmxBf16Element(
      c, 16, [a](int j) { return a[j]; }, b);
}

}  // namespace

int64_t AmxPackedSize(int64_t m, int64_t k) {
  return (m + kAmxTileRows - 1) / kAmxTileRows * Chunks(k) * kAmxTileElems;
}

namespace {

void PackBlockPortable(const float* x, int64_t m, int64_t k, int64_t block, uint16_t* out) {
  const int64_t chunks = Chunks(k);
  // Tile (block, kc) element (i, 32 kc + 2p + j) sits at pair row p, slot 2i + j: one row's 32
  // values of a chunk are 16 pairs spread over the tile's 16 pair rows, written as uint32.
  uint32_t* tiles = reinterpret_cast<uint32_t*>(out + block * chunks * kAmxTileElems);
  thread_local std::vector<uint16_t> row;  // one row rounded, zero-padded to whole chunks
  row.resize(chunks * kAmxTileK);
  for (int64_t i = 0; i < kAmxTileRows; ++i) {
    const int64_t r = block * kAmxTileRows + i;
    if (r < m) {
      const float* src = x + r * k;
      for (int64_t j = 0; j < k; ++j) row[j] = FloatToBf16(src[j]);
      std::fill(row.begin() + k, row.end(), uint16_t{0});
    } else {
      std::fill(row.begin(), row.end(), uint16_t{0});
    }
    for (int64_t kc = 0; kc < chunks; ++kc) {
      uint32_t* tile = tiles + kc * (kAmxTileElems / 2) + i;
      const uint16_t* v = row.data() + kc * kAmxTileK;
      for (int64_t p = 0; p < kAmxTileK / 2; ++p) {
        tile[p * kAmxTileRows] = uint32_t{v[2 * p]} | (uint32_t{v[2 * p + 1]} << 16);
      }
    }
  }
}

}  // namespace

void PackAmxActivations(const float* x, int64_t m, int64_t k, int64_t block, uint16_t* out) {
#if defined(__x86_64__)
  // Tiles start on cache lines wherever the packed operand does (whole 1 KiB tiles).
  if (CpuHasAvx512() && reinterpret_cast<uintptr_t>(out) % 64 == 0) {
    PackAmxActivationsAvx512(x, m, k, block, out);
    return;
  }
#endif
  PackBlockPortable(x, m, k, block, out);
}

void AmxTileDpEmulated(float* c, const uint16_t* a, const uint16_t* b) {
  for (int64_t r = 0; r < kAmxTileRows; ++r) {
    for (int64_t col = 0; col < kAmxTileRows; ++col) {
      // Element j of column col: pair row j / 2, slot col * 2 + j % 2.
      auto bv = [&](int j) { return b[(j / 2) * 32 + col * 2 + (j % 2)]; };
      c[r * 16 + col] = ChunkStep(c[r * 16 + col], a + r * kAmxTileK, bv);
    }
  }
}

namespace {

void EmulateBlock(const AmxJob& job, int64_t nb) {
  const Matrix& w = *job.w;
  const int64_t n_rows = w.rows, k_total = w.cols, chunks = Chunks(k_total);
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const uint16_t* wp = static_cast<const uint16_t*>(w.data);
  uint16_t a[kAmxTileK];
  for (int64_t i = 0; i < job.m; ++i) {
    for (int64_t n = n0; n < n0 + nn; ++n) {
      float acc = 0.0f;
      for (int64_t kc = 0; kc < chunks; ++kc) {
        const int64_t k0 = kc * kAmxTileK, len = std::min(kAmxTileK, k_total - k0);
        std::fill_n(a, kAmxTileK, uint16_t{0});  // the tail chunk's padding: +0
        std::copy_n(wp + n * k_total + k0, len, a);
        auto bv = [&](int j) { return job.xp[PackedIndex(i, k0 + j, chunks)]; };
        acc = ChunkStep(acc, a, bv);
      }
      if (job.bias != nullptr) acc += job.bias[n];
      job.y[i * n_rows + n] = acc;
    }
  }
}

}  // namespace

int64_t AmxGroupBlocks(const AmxJob& job) {
  const int64_t block_bytes = kBlockN * RangeK(job.w->cols) * 2;
  return std::clamp<int64_t>(kGroupWeightBytes / std::max<int64_t>(1, block_bytes), 1,
                             kMaxGroupBlocks);
}

int64_t AmxUnits(const AmxJob& job) {
  if (job.m <= 0) return 0;
  const int64_t blocks = (job.w->rows + kBlockN - 1) / kBlockN, group = AmxGroupBlocks(job);
  return (blocks + group - 1) / group;
}

void AmxUnitEmulated(const AmxJob& job, int64_t unit) {
  const int64_t group = AmxGroupBlocks(job), blocks = (job.w->rows + kBlockN - 1) / kBlockN;
  for (int64_t nb = unit * group; nb < std::min(blocks, (unit + 1) * group); ++nb) {
    EmulateBlock(job, nb);
  }
}

// Tiles 0-3: C (row tile t, activation tile u at 2t + u); 4, 5: A; 6, 7: B. All 16 x 64 bytes.
const AmxTileConfig& AmxBf16TileConfig() {
  static const AmxTileConfig config = [] {
    AmxTileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.colsb[t] = 64;
      c.rows[t] = 16;
    }
    return c;
  }();
  return config;
}

namespace {

// One A tile's source: 16 weight rows read in place (stride ld elements) for the full K
// chunks, and a zero-padded copy of the tail chunk; rows past the matrix: a padded copy.
struct ASource {
  const uint16_t* p = nullptr;
  int64_t ld = 0;
  alignas(64) uint16_t tail[kAmxTileElems];
};

void MakeSource(const Matrix& w, int64_t row0, AlignedVector<uint16_t>* padded, ASource* s) {
  const int64_t k_total = w.cols, rows = std::min<int64_t>(kAmxTileRows, w.rows - row0);
  const uint16_t* src = static_cast<const uint16_t*>(w.data) + row0 * k_total;
  s->ld = k_total;
  if (rows == kAmxTileRows) {
    s->p = src;
  } else {
    padded->assign(kAmxTileRows * k_total, 0);
    std::copy_n(src, rows * k_total, padded->data());
    s->p = padded->data();
  }
  const int64_t full = k_total / kAmxTileK * kAmxTileK, len = k_total - full;
  std::fill_n(s->tail, kAmxTileElems, uint16_t{0});
  for (int64_t r = 0; r < kAmxTileRows && len > 0; ++r) {
    std::copy_n(s->p + r * k_total + full, len, s->tail + r * kAmxTileK);
  }
}

// C tiles for NT (1, 2) row tiles x MT (1, 2) activation tiles over K chunks [kc0, kc1),
// starting from +0 (kc0 = 0) or from the tiles in c (a previous range's, exactly as the tile
// unit left them: continuing from them is the same chain), stored to c [NT * 2 + MT][16][16].
// b: the packed tiles of the first activation tile; the second's are b_next elements further.
template <typename Tiles, int NT, int MT>
GLM_AMX_BF16_TARGET void TileLoop(const ASource* a, const uint16_t* b, int64_t b_next, int64_t kc0,
                                  int64_t kc1, float* c) {
  if (kc0 == 0) {
    GLM_TILE(Tiles, zero, 0);
    if constexpr (MT == 2) GLM_TILE(Tiles, zero, 1);
    if constexpr (NT == 2) GLM_TILE(Tiles, zero, 2);
    if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, zero, 3);
  } else {
    GLM_TILE(Tiles, loadd, 0, c, 64);
    if constexpr (MT == 2) GLM_TILE(Tiles, loadd, 1, c + 256, 64);
    if constexpr (NT == 2) GLM_TILE(Tiles, loadd, 2, c + 512, 64);
    if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, loadd, 3, c + 768, 64);
  }
  const int64_t full = a[0].ld / kAmxTileK;
  const int64_t lda = a[0].ld * 2;  // bytes
  for (int64_t kc = kc0; kc < kc1; ++kc) {
    const uint16_t* bk = b + kc * kAmxTileElems;
    if (kc < full) {
      GLM_TILE(Tiles, loadd, 4, a[0].p + kc * kAmxTileK, lda);
      if constexpr (NT == 2) GLM_TILE(Tiles, loadd, 5, a[1].p + kc * kAmxTileK, lda);
    } else {
      GLM_TILE(Tiles, loadd, 4, a[0].tail, 64);
      if constexpr (NT == 2) GLM_TILE(Tiles, loadd, 5, a[1].tail, 64);
    }
    GLM_TILE(Tiles, loadd, 6, bk, 64);
    if constexpr (MT == 2) GLM_TILE(Tiles, loadd, 7, bk + b_next, 64);
    GLM_TILE(Tiles, dpbf16ps, 0, 4, 6);
    if constexpr (MT == 2) GLM_TILE(Tiles, dpbf16ps, 1, 4, 7);
    if constexpr (NT == 2) GLM_TILE(Tiles, dpbf16ps, 2, 5, 6);
    if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, dpbf16ps, 3, 5, 7);
  }
  GLM_TILE(Tiles, stored, 0, c, 64);
  if constexpr (MT == 2) GLM_TILE(Tiles, stored, 1, c + 256, 64);
  if constexpr (NT == 2) GLM_TILE(Tiles, stored, 2, c + 512, 64);
  if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, stored, 3, c + 768, 64);
}

// One C tile ct [16 outputs][16 activation rows] into y (rows of y ld apart): element [r][col]
// to y[col * ld + r] for r < rows, col < cols, plus bias[r] where given.
void StoreTile(const float* ct, int64_t rows, int64_t cols, const float* bias, float* y,
               int64_t ld) {
  for (int64_t col = 0; col < cols; ++col) {
    for (int64_t r = 0; r < rows; ++r) {
      y[col * ld + r] = bias != nullptr ? ct[r * 16 + col] + bias[r] : ct[r * 16 + col];
    }
  }
}

// The nt x mt C tiles of c [4][16][16] for output rows [n0, n0 + nn) and activation tiles u0,
// u0 + 1: tile (t, u) element [r][col] is output row n0 + 16 t + r of activation row
// 16 (u0 + u) + col.
using StoreTileFn = void (*)(const float*, int64_t, int64_t, const float*, float*, int64_t);
void StoreTiles(const AmxJob& job, int64_t n0, int64_t nn, int64_t u0, int mt, const float* c,
                StoreTileFn store) {
  const int64_t n_rows = job.w->rows;
  for (int t = 0; t * kAmxTileRows < nn; ++t) {
    for (int u = 0; u < mt; ++u) {
      const int64_t rows = std::min<int64_t>(kAmxTileRows, nn - t * kAmxTileRows);
      const int64_t cols = std::min<int64_t>(kAmxTileRows, job.m - (u0 + u) * kAmxTileRows);
      float* y = job.y + (u0 + u) * kAmxTileRows * n_rows + n0 + t * kAmxTileRows;
      const float* bias = job.bias != nullptr ? job.bias + n0 + t * kAmxTileRows : nullptr;
      store(c + (t * 2 + u) * 256, rows, cols, bias, y, n_rows);
    }
  }
}

// Units of a job on the tile unit or on its model (Tiles, amx_tiles.h): one code for both, so
// that the tests of every CPU run the addressing, tails, ranges and stores the tile unit runs.
template <typename Tiles>
void AmxUnitOn(const AmxJob& job, int64_t unit) {
  const Matrix& w = *job.w;
  const int64_t n_rows = w.rows, k_total = w.cols, chunks = Chunks(k_total);
  const int64_t group = AmxGroupBlocks(job), blocks = (n_rows + kBlockN - 1) / kBlockN;
  const int64_t nb0 = unit * group, nb1 = std::min(blocks, nb0 + group);
  thread_local ASource a[kMaxGroupBlocks][2];
  thread_local AlignedVector<uint16_t> padded[kMaxGroupBlocks][2];
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
    for (int t = 0; t * kAmxTileRows < nn; ++t) {
      MakeSource(w, n0 + t * kAmxTileRows, &padded[nb - nb0][t], &a[nb - nb0][t]);
    }
  }
  const int64_t m_tiles = (job.m + kAmxTileRows - 1) / kAmxTileRows;
  const int64_t b_next = chunks * kAmxTileElems;  // from one activation tile to the next
  const int64_t slab_tiles = SlabRows(k_total) / kAmxTileRows;
  const int64_t pairs = (m_tiles + 1) / 2;
  // A wide K goes in ranges (RangeK): between them each (block, activation tile pair) keeps its
  // 4 C tiles here, [block of the group][pair][4][16][16] (1 MiB for 4 blocks at m = 2048).
  thread_local AlignedVector<float> partial;
  const bool ranged = chunks > kRangeChunks;
  if (ranged) partial.resize((nb1 - nb0) * pairs * 4 * 256);
  alignas(64) float c_own[4 * 256];
#if defined(__x86_64__)
  const StoreTileFn store = CpuHasAvx512() ? StoreAmxTileAvx512 : StoreTile;
#else
  const StoreTileFn store = StoreTile;
#endif
  for (int64_t kc0 = 0; kc0 < chunks; kc0 += kRangeChunks) {
    const int64_t kc1 = std::min(chunks, kc0 + kRangeChunks);
    for (int64_t s0 = 0; s0 < m_tiles; s0 += slab_tiles) {
      const int64_t s1 = std::min(m_tiles, s0 + slab_tiles);
      for (int64_t nb = nb0; nb < nb1; ++nb) {
        const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
        const int nt = nn > kAmxTileRows ? 2 : 1;
        const ASource* src = a[nb - nb0];
        for (int64_t u0 = s0; u0 < s1; u0 += 2) {
          const int mt = u0 + 1 < s1 ? 2 : 1;
          const uint16_t* b = job.xp + u0 * b_next;
          float* c = ranged ? partial.data() + ((nb - nb0) * pairs + u0 / 2) * 4 * 256 : c_own;
          if (nt == 2) {
            mt == 2 ? TileLoop<Tiles, 2, 2>(src, b, b_next, kc0, kc1, c)
                    : TileLoop<Tiles, 2, 1>(src, b, b_next, kc0, kc1, c);
          } else {
            mt == 2 ? TileLoop<Tiles, 1, 2>(src, b, b_next, kc0, kc1, c)
                    : TileLoop<Tiles, 1, 1>(src, b, b_next, kc0, kc1, c);
          }
          if (kc1 == chunks) {
            StoreTiles(job, n0, nn, u0, mt, c, store);
          }
        }
      }
    }
  }
}

}  // namespace

namespace {
std::atomic<bool> tile_model_forced{false};
}  // namespace

void ForceAmxTileModel(bool force) { tile_model_forced.store(force); }
bool AmxTileModelForced() { return tile_model_forced.load(std::memory_order_relaxed); }

void AmxUnitTileModel(const AmxJob& job, int64_t unit) {
  AmxTileModel::loadconfig(&AmxBf16TileConfig());
  AmxUnitOn<AmxTileModel>(job, unit);
  AmxTileModel::release();
}

#if defined(__x86_64__)

bool AmxPermitted() {
  static const bool permitted = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool tile = (edx & (1u << 24)) != 0, bf16 = (edx & (1u << 22)) != 0;
    if (!tile || !bf16) return false;
    // Linux (5.16+) hands out the 8 KiB tile data state only on request, once per process.
    // A refusal (older kernel, a hypervisor or seccomp policy) leaves AMX off: the emulation
    // runs instead, never a faulting instruction.
    constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
    uint64_t mask = 0;
    if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
    return (mask & (uint64_t{1} << kXfeatureXtiledata)) != 0;
  }();
  return permitted;
}

// On the permission alone, not the tests' override: a caller that saw AMX usable must get
// its tiles configured even if the override flips meanwhile.
GLM_AMX_BF16_TARGET void AmxThreadBegin() {
  if (AmxPermitted()) _tile_loadconfig(&AmxBf16TileConfig());
}
GLM_AMX_BF16_TARGET void AmxThreadEnd() {
  if (AmxPermitted()) _tile_release();
}

void AmxUnitHardware(const AmxJob& job, int64_t unit) { AmxUnitOn<AmxTileUnit>(job, unit); }

GLM_AMX_BF16_TARGET bool AmxTileDpHardware(float* c, const uint16_t* a, const uint16_t* b) {
  if (!CpuHasAmx()) return false;
  AmxThreadBegin();
  _tile_loadd(0, c, 64);
  _tile_loadd(4, a, 64);
  _tile_loadd(6, b, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_stored(0, c, 64);
  AmxThreadEnd();
  return true;
}

#else  // not x86-64: no AMX; the emulation serves kBf16Amx

bool AmxPermitted() { return false; }
void AmxThreadBegin() {}
void AmxThreadEnd() {}
void AmxUnitHardware(const AmxJob& job, int64_t unit) { AmxUnitEmulated(job, unit); }
bool AmxTileDpHardware(float*, const uint16_t*, const uint16_t*) { return false; }

#endif

}  // namespace glmserve::internal
