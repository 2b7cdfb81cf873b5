// The software tile unit (amx_tiles.h): this thread's register file, the instructions' shape
// rules, TDPBF16PS's arithmetic from bf16_math.h and TDPBSSD's wrapping int32 sums.
#include "core/cpu/ops/amx_tiles.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/cpu/ops/bf16_math.h"

namespace glmserve::internal {
namespace {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

struct TileFile {
  bool configured = false;  // LDTILECFG with palette 1 since the last release
  AmxTileConfig config;
  alignas(64) uint8_t data[kTiles][kMaxRows * kMaxColsb];
};
thread_local TileFile file;

// Where the tile unit raises #UD or #GP, the model stops the process with the reason.
[[noreturn]] void Fault(const char* instruction, const char* what, int tile) {
  std::fprintf(stderr, "AMX tile model: %s on tmm%d: %s\n", instruction, tile, what);
  std::abort();
}

// Tile t's configured rows, checked usable (configured, in range, not left empty).
int Rows(const char* instruction, int t) {
  if (t < 0 || t >= kTiles) Fault(instruction, "no such tile", t);
  if (!file.configured) Fault(instruction, "no tile configuration loaded (LDTILECFG)", t);
  if (file.config.rows[t] == 0 || file.config.colsb[t] == 0) {
    Fault(instruction, "the configuration leaves this tile empty", t);
  }
  return file.config.rows[t];
}
int Colsb(int t) { return file.config.colsb[t]; }

// The shape rules of TDPBF16PS and TDPBSSD (C += A B): three different tiles, M = rows(C) =
// rows(A), N bytes = colsb(C) = colsb(B), K bytes = colsb(A) = 4 rows(B). Returns M.
int CheckProduct(const char* instruction, int c, int a, int b) {
  const int m = Rows(instruction, c), m_a = Rows(instruction, a), k_rows = Rows(instruction, b);
  if (c == a || c == b || a == b) Fault(instruction, "C, A and B must be different tiles", c);
  if (m != m_a) Fault(instruction, "rows of C and A differ", a);
  if (Colsb(c) != Colsb(b)) Fault(instruction, "bytes per row of C and B differ", b);
  if (Colsb(a) != 4 * k_rows) Fault(instruction, "bytes per row of A are not 4 x rows of B", a);
  if (Colsb(c) % 4 != 0) Fault(instruction, "C rows are not whole dwords", c);
  return m;
}

float LoadFloat(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint16_t LoadBf16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
int32_t LoadInt32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

void AmxTileModel::loadconfig(const AmxTileConfig* config) {
  if (config->palette == 0) {  // palette 0: the initial state, as TILERELEASE leaves it
    release();
    return;
  }
  if (config->palette != 1) Fault("LDTILECFG", "only palette 1 exists", 0);
  if (config->start_row != 0) Fault("LDTILECFG", "start_row is for restarts only", 0);
  for (uint8_t r : config->reserved) {
    if (r != 0) Fault("LDTILECFG", "reserved bytes must be zero", 0);
  }
  for (int t = 0; t < 16; ++t) {
    const bool exists = t < kTiles;
    if (config->rows[t] > (exists ? kMaxRows : 0) || config->colsb[t] > (exists ? kMaxColsb : 0)) {
      Fault("LDTILECFG", "a tile larger than palette 1 allows", t);
    }
    if (exists && (config->rows[t] == 0) != (config->colsb[t] == 0)) {
      Fault("LDTILECFG", "rows and bytes per row must both be zero or both not", t);
    }
  }
  file.config = *config;
  file.configured = true;
  std::memset(file.data, 0, sizeof file.data);  // LDTILECFG zeroes every tile
}

void AmxTileModel::release() {
  file.configured = false;
  file.config = AmxTileConfig{};
  std::memset(file.data, 0, sizeof file.data);
}

void AmxTileModel::zero(int t) {
  Rows("TILEZERO", t);
  std::memset(file.data[t], 0, sizeof file.data[t]);
}

void AmxTileModel::loadd(int t, const void* base, int64_t stride_bytes) {
  const int rows = Rows("TILELOADD", t), colsb = Colsb(t);
  const uint8_t* src = static_cast<const uint8_t*>(base);
  std::memset(file.data[t], 0, sizeof file.data[t]);  // the rest of the tile reads as zero
  for (int r = 0; r < rows; ++r)
    std::memcpy(file.data[t] + r * kMaxColsb, src + r * stride_bytes, colsb);
}

void AmxTileModel::stored(int t, void* base, int64_t stride_bytes) {
  const int rows = Rows("TILESTORED", t), colsb = Colsb(t);
  uint8_t* dst = static_cast<uint8_t*>(base);
  for (int r = 0; r < rows; ++r)
    std::memcpy(dst + r * stride_bytes, file.data[t] + r * kMaxColsb, colsb);
}

void AmxTileModel::dpbf16ps(int c, int a, int b) {
  const int m_rows = CheckProduct("TDPBF16PS", c, a, b), n = Colsb(c) / 4, pairs = Colsb(a) / 4;
  uint8_t* ct = file.data[c];
  const uint8_t *at = file.data[a], *bt = file.data[b];
  for (int i = 0; i < m_rows; ++i) {
    for (int j = 0; j < n; ++j) {
      // A row i's element q is bf16 q of the row; B's element q of column j sits in pair row
      // q / 2, slot 2 j + q % 2 (the "VNNI" pair layout).
      auto av = [&](int q) { return LoadBf16(at + i * kMaxColsb + 2 * q); };
      auto bv = [&](int q) { return LoadBf16(bt + (q / 2) * kMaxColsb + 4 * j + 2 * (q % 2)); };
      const float v = AmxBf16Element(LoadFloat(ct + i * kMaxColsb + 4 * j), pairs, av, bv);
      std::memcpy(ct + i * kMaxColsb + 4 * j, &v, sizeof v);
    }
  }
}

void AmxTileModel::dpbssd(int c, int a, int b) {
  const int m_rows = CheckProduct("TDPBSSD", c, a, b), n = Colsb(c) / 4, words = Colsb(a) / 4;
  uint8_t* ct = file.data[c];
  const uint8_t *at = file.data[a], *bt = file.data[b];
  for (int i = 0; i < m_rows; ++i) {
    for (int j = 0; j < n; ++j) {
      // The tile unit's int32 sums wrap; unsigned arithmetic wraps the same way here.
      uint32_t acc = static_cast<uint32_t>(LoadInt32(ct + i * kMaxColsb + 4 * j));
      for (int p = 0; p < words; ++p) {
        for (int q = 0; q < 4; ++q) {
          const int32_t x = static_cast<int8_t>(at[i * kMaxColsb + 4 * p + q]);
          const int32_t y = static_cast<int8_t>(bt[p * kMaxColsb + 4 * j + q]);
          acc += static_cast<uint32_t>(x * y);
        }
      }
      const int32_t v = static_cast<int32_t>(acc);
      std::memcpy(ct + i * kMaxColsb + 4 * j, &v, sizeof v);
    }
  }
}

}  // namespace glmserve::internal
