// The AMX int8 kernel's support (linear_int8_amx.h): the activation packing (shared with the
// VNNI kernel), the driver on the software tile unit (amx_tiles.h), the tile configuration and
// the one-tile test hook. The hardware kernel is in linear_int8_amx_avx512.cc (it scales with
// AVX-512); the reference that defines the bits is Int8BlockGeneric (linear_int8.cc).
#include "core/cpu/ops/linear_int8_amx.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx_driver.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace glmserve::internal {

namespace {
constexpr int64_t kTileWords = 8 * 16;  // one B tile: 8 rows of 16 int32 words (512 bytes)
std::atomic<bool> tile_model_forced{false};
}  // namespace

void ForceInt8AmxTileModel(bool force) { tile_model_forced.store(force); }
bool Int8AmxTileModelForced() { return tile_model_forced.load(std::memory_order_relaxed); }

int64_t Int8AmxTilesSize(int64_t m, int64_t kp) {
  return (m + kAmxTileRows - 1) / kAmxTileRows * (kp / kInt8Group) * kTileWords;
}

void PackInt8AmxBlock(Int8Activation* a, int64_t block) {
  const int64_t kp = a->kp, groups = kp / kInt8Group;
  int32_t* tiles = a->tiles.data() + block * groups * kTileWords;
  float* scales = a->tile_scale.data() + block * groups * kAmxTileRows;
  // vpdpbusd takes the activation as unsigned bytes: code + 128, the top bit of each flipped.
  const uint32_t flip = a->operands == Int8Operands::kVnniTiles ? 0x80808080u : 0;
  for (int64_t i = 0; i < kAmxTileRows; ++i) {
    const int64_t r = block * kAmxTileRows + i;
    const int8_t* q = r < a->m ? a->q.data() + r * kp : nullptr;
    for (int64_t g = 0; g < groups; ++g) {
      // Word (p, i) of tile (block, g): the 4 codes at k = 32 g + 4 p of row i.
      for (int64_t p = 0; p < 8; ++p) {
        uint32_t word = 0;
        if (q != nullptr) std::memcpy(&word, q + g * kInt8Group + 4 * p, 4);
        tiles[g * kTileWords + p * kAmxTileRows + i] = static_cast<int32_t>(word ^ flip);
      }
      scales[g * kAmxTileRows + i] = q != nullptr ? a->group_scale[r * groups + g] : 0.0f;
    }
  }
}

void MakeInt8ASource(const Matrix& w, int64_t row0, std::vector<int8_t>* padded, Int8ASource* s) {
  const int64_t k_total = w.cols, rows = std::min<int64_t>(16, w.rows - row0);
  const int8_t* src = static_cast<const int8_t*>(w.data) + row0 * k_total;
  s->ld = k_total;
  if (rows == 16) {
    s->p = src;
  } else {
    padded->assign(16 * k_total, 0);
    std::memcpy(padded->data(), src, static_cast<size_t>(rows * k_total));
    s->p = padded->data();
  }
  const int64_t full = k_total / 32 * 32, len = k_total - full;
  std::memset(s->tail, 0, sizeof(s->tail));
  for (int64_t r = 0; r < 16 && len > 0; ++r) {
    std::memcpy(s->tail + r * 32, s->p + r * k_total + full, static_cast<size_t>(len));
  }
}

namespace {

// Tiles 0-3: C, 16 rows of 16 int32; 4, 5: A, 16 weight rows of one 32-byte group; 6, 7: B,
// 8 rows of 16 words.
const AmxTileConfig& Config() {
  static const AmxTileConfig config = [] {
    AmxTileConfig c;
    constexpr uint16_t kColsb[8] = {64, 64, 64, 64, 32, 32, 64, 64};
    constexpr uint8_t kRows[8] = {16, 16, 16, 16, 16, 16, 8, 8};
    std::copy_n(kColsb, 8, c.colsb);
    std::copy_n(kRows, 8, c.rows);
    return c;
  }();
  return config;
}

// The driver on the software tile unit, with scalar scaling (the same bits).
struct ModelOps {
  using Tiles = AmxTileModel;
  static void ScaleRow(float* acc, const int32_t* d, float ws, const float* xs) {
    for (int j = 0; j < 16; ++j) acc[j] = std::fma(static_cast<float>(d[j]), ws * xs[j], acc[j]);
  }
};

}  // namespace

void Int8AmxBlockTileModel(const Int8Job& job, int64_t nb) {
  AmxTileModel::loadconfig(&Config());
  Int8AmxBlock<ModelOps>(job, nb);
  AmxTileModel::release();
}
void Int8AmxRows16BlockTileModel(const Int8Job& job, int64_t nb) {
  AmxTileModel::loadconfig(&Config());
  Int8AmxRows16Block<ModelOps>(job, nb);
  AmxTileModel::release();
}

void AmxInt8TileDpEmulated(int32_t* c, const int8_t* a, const int8_t* b) {
  for (int64_t r = 0; r < kAmxTileRows; ++r) {
    for (int64_t col = 0; col < kAmxTileRows; ++col) {
      // Integer sums wrap in the tile unit; unsigned arithmetic wraps the same way here.
      uint32_t acc = static_cast<uint32_t>(c[r * 16 + col]);
      for (int64_t p = 0; p < 8; ++p) {
        for (int64_t j = 0; j < 4; ++j) {
          const int32_t prod = int32_t{a[r * 32 + 4 * p + j]} * b[p * 64 + col * 4 + j];
          acc += static_cast<uint32_t>(prod);
        }
      }
      c[r * 16 + col] = static_cast<int32_t>(acc);
    }
  }
}

#if defined(__x86_64__)

namespace {

bool CpuidAmxInt8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 25)) != 0;  // AMX-INT8
}

}  // namespace

bool AmxInt8Permitted() {
  static const bool permitted = AmxPermitted() && CpuidAmxInt8();
  return permitted;
}

bool CpuHasAmxInt8() { return AmxInt8Permitted() && CpuHasAmx() && CpuHasAvx512(); }

GLM_AMX_INT8_TARGET void Int8AmxThreadBegin() {
  if (AmxInt8Permitted()) _tile_loadconfig(&Config());
}

GLM_AMX_INT8_TARGET bool AmxInt8TileDpHardware(int32_t* c, const int8_t* a, const int8_t* b) {
  if (!CpuHasAmxInt8()) return false;
  Int8AmxThreadBegin();
  _tile_loadd(0, c, 64);
  _tile_loadd(4, a, 32);
  _tile_loadd(6, b, 64);
  _tile_dpbssd(0, 4, 6);
  _tile_stored(0, c, 64);
  AmxThreadEnd();
  return true;
}

#else  // not x86-64: no AMX; the portable kernel serves the int8 weights

bool AmxInt8Permitted() { return false; }
bool CpuHasAmxInt8() { return false; }
void Int8AmxThreadBegin() {}
bool AmxInt8TileDpHardware(int32_t*, const int8_t*, const int8_t*) { return false; }
void Int8AmxBlockHardware(const Int8Job& job, int64_t nb) { Int8BlockGeneric(job, nb); }
void Int8AmxRows16BlockHardware(const Int8Job& job, int64_t nb) { Int8BlockGeneric(job, nb); }

#endif

}  // namespace glmserve::internal
