// The software tile unit (core/cpu/ops/amx_tiles.h): its products equal the one-tile
// emulations that the AMX machines checked against TDPBF16PS and TDPBSSD (linear_amx_test,
// linear_int8_amx_test), loads and stores follow the configured shapes and strides, shapes
// smaller than a whole tile index the operands as the instructions do, and what the tile unit
// would fault on stops the process with the reason.
#include "core/cpu/ops/amx_tiles.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/base/dtype.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"

namespace glmserve {
namespace {

using internal::AmxTileConfig;
using Model = internal::AmxTileModel;

AmxTileConfig Config(std::initializer_list<std::pair<int, int>> rows_colsb) {
  AmxTileConfig c;
  int t = 0;
  for (const auto& [rows, colsb] : rows_colsb) {
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = static_cast<uint16_t>(colsb);
    ++t;
  }
  return c;
}

// Releases the model's tiles at the end of a test, whatever it left configured.
struct Released {
  ~Released() { Model::release(); }
};

TEST(AmxTileModel, Bf16ProductEqualsTheOneTileEmulation) {
  Released released;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const AmxTileConfig config = Config({{16, 64}, {16, 64}, {16, 64}});
  for (int round = 0; round < 20; ++round) {
    std::vector<float> c(256);
    std::vector<uint16_t> a(512), b(512);
    for (float& v : c) v = dist(rng);
    for (uint16_t& v : a) v = FloatToBf16(dist(rng));
    for (uint16_t& v : b) v = FloatToBf16(dist(rng));
    std::vector<float> want = c, got(256);
    internal::AmxTileDpEmulated(want.data(), a.data(), b.data());
    Model::loadconfig(&config);
    Model::loadd(0, c.data(), 64);
    Model::loadd(1, a.data(), 64);
    Model::loadd(2, b.data(), 64);
    Model::dpbf16ps(0, 1, 2);
    Model::stored(0, got.data(), 64);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(got[i], want[i]) << "round " << round << " " << i;
  }
}

TEST(AmxTileModel, Int8ProductEqualsTheOneTileEmulationAndWraps) {
  Released released;
  std::mt19937 rng(8);
  // The int8 kernels' shapes: C 16 x 64 bytes, A 16 x 32, B 8 x 64.
  const AmxTileConfig config = Config({{16, 64}, {16, 32}, {8, 64}});
  for (int round = 0; round < 20; ++round) {
    std::vector<int32_t> c(256);
    std::vector<int8_t> a(512), b(512);
    for (int32_t& v : c) v = static_cast<int32_t>(rng());  // near the ends too: sums wrap
    for (int8_t& v : a) v = static_cast<int8_t>(rng());
    for (int8_t& v : b) v = static_cast<int8_t>(rng());
    std::vector<int32_t> want = c, got(256);
    internal::AmxInt8TileDpEmulated(want.data(), a.data(), b.data());
    Model::loadconfig(&config);
    Model::loadd(0, c.data(), 64);
    Model::loadd(1, a.data(), 32);
    Model::loadd(2, b.data(), 64);
    Model::dpbssd(0, 1, 2);
    Model::stored(0, got.data(), 64);
    ASSERT_EQ(got, want) << "round " << round;
  }
}

// M = 3, N = 5, K = 4 pairs (8 bf16), operands read at strides wider than their rows: every
// element is a sum of small integers, exact in any order, so the expected value is plain
// arithmetic and only the indexing is under test. Bytes outside the stored rows stay put.
TEST(AmxTileModel, PartialShapesIndexTheOperandsAsTheInstructionDoes) {
  Released released;
  const AmxTileConfig config = Config({{3, 20}, {3, 16}, {4, 20}});
  Model::loadconfig(&config);
  constexpr int kM = 3, kN = 5, kPairs = 4, kStride = 40;  // bytes
  std::vector<uint16_t> a(kM * kStride / 2, FloatToBf16(100.0f)), b(kPairs * kStride / 2);
  for (int i = 0; i < kM; ++i) {
    for (int q = 0; q < 2 * kPairs; ++q) a[i * kStride / 2 + q] = FloatToBf16(i + 1 + q);
  }
  for (int p = 0; p < kPairs; ++p) {
    for (int j = 0; j < kN; ++j) {
      for (int s = 0; s < 2; ++s) b[p * kStride / 2 + 2 * j + s] = FloatToBf16(j - 2 * p + s);
    }
  }
  std::vector<float> c(kM * kStride / 4, -7.0f);
  Model::loadd(0, c.data(), kStride);
  Model::loadd(1, a.data(), kStride);
  Model::loadd(2, b.data(), kStride);
  Model::dpbf16ps(0, 1, 2);
  Model::stored(0, c.data(), kStride);
  for (int i = 0; i < kM; ++i) {
    for (int j = 0; j < kStride / 4; ++j) {
      float want = -7.0f;
      if (j < kN) {
        for (int q = 0; q < 2 * kPairs; ++q)
          want += float(i + 1 + q) * float(j - 2 * (q / 2) + q % 2);
      }
      EXPECT_EQ(c[i * kStride / 4 + j], want) << "row " << i << " column " << j;
    }
  }
}

TEST(AmxTileModel, ZeroAndReloadAfterReleaseStartFromZero) {
  Released released;
  const AmxTileConfig config = Config({{16, 64}});
  std::vector<float> ones(256, 1.0f), got(256, 5.0f);
  Model::loadconfig(&config);
  Model::loadd(0, ones.data(), 64);
  Model::zero(0);
  Model::stored(0, got.data(), 64);
  EXPECT_EQ(got, std::vector<float>(256, 0.0f));
  Model::loadd(0, ones.data(), 64);
  Model::loadconfig(&config);  // LDTILECFG zeroes the tiles
  Model::stored(0, got.data(), 64);
  EXPECT_EQ(got, std::vector<float>(256, 0.0f));
}

using AmxTileModelDeathTest = ::testing::Test;

TEST_F(AmxTileModelDeathTest, WhatTheTileUnitFaultsOnStopsWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float buffer[256] = {};
  const AmxTileConfig config = Config({{16, 64}, {16, 64}, {16, 64}, {8, 64}});
  EXPECT_DEATH(Model::loadd(0, buffer, 64), "TILELOADD on tmm0: no tile configuration");
  EXPECT_DEATH(
      {
        Model::loadconfig(&config);
        Model::release();
        Model::zero(0);
      },
      "TILEZERO on tmm0: no tile configuration");
  EXPECT_DEATH(
      {
        Model::loadconfig(&config);
        Model::stored(5, buffer, 64);
      },
      "tmm5: the configuration leaves this tile empty");
  EXPECT_DEATH(
      {
        Model::loadconfig(&config);
        Model::dpbf16ps(0, 0, 1);
      },
      "C, A and B must be different tiles");
  EXPECT_DEATH(
      {
        Model::loadconfig(&config);
        Model::dpbf16ps(0, 1, 3);  // B has 8 rows: K of 16 pairs needs 16
      },
      "bytes per row of A are not 4 x rows of B");
  EXPECT_DEATH(
      {
        Model::loadconfig(&config);
        Model::dpbssd(3, 1, 2);  // C has 8 rows, A 16
      },
      "rows of C and A differ");
  AmxTileConfig bad = config;
  bad.rows[0] = 17;
  EXPECT_DEATH(Model::loadconfig(&bad), "larger than palette 1 allows");
  bad = config;
  bad.palette = 2;
  EXPECT_DEATH(Model::loadconfig(&bad), "only palette 1 exists");
}

}  // namespace
}  // namespace glmserve
