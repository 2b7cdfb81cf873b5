// The software tile unit (core/cpu/ops/amx_tiles.h): its products equal the one-tile
// emulations that the AMX machines checked against TDPBF16PS and TDPBSSD (linear_amx_test,
// linear_int8_amx_test), loads and stores follow the configured shapes and strides, shapes
// smaller than a whole tile index the operands as the instructions do (on an AMX CPU: as the
// tile unit does, bit for bit), and what the tile unit would fault on stops the process with the
// reason.
#include "core/cpu/ops/amx_tiles.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/base/dtype.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"
#include "tests/core/cpu/ops/amx_test_util.h"

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

// One program of tile instructions with shapes smaller than a whole tile (M, N and K all off
// 16), bf16 and int8, each operand read at a stride wider than its row, written once over Tiles
// like the kernels.
struct ProgramData {
  std::vector<float> c_f32 = std::vector<float>(3 * 10, -3.5f);       // C: 3 rows x 5 of 10
  std::vector<uint16_t> a_bf16 = std::vector<uint16_t>(3 * 20);       // A: 3 rows x 8 of 20
  std::vector<uint16_t> b_bf16 = std::vector<uint16_t>(4 * 20);       // B: 4 rows x 10 of 20
  std::vector<int32_t> c_i32 = std::vector<int32_t>(5 * 8, 1 << 30);  // C: 5 rows x 3 of 8
  std::vector<int8_t> a_i8 = std::vector<int8_t>(5 * 24);             // A: 5 rows x 8 of 24
  std::vector<int8_t> b_i8 = std::vector<int8_t>(2 * 24);             // B: 2 rows x 12 of 24
};

#if defined(__x86_64__)
#define GLM_TEST_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,amx-int8")))
#else
#define GLM_TEST_AMX_TARGET
#endif

template <typename Tiles>
GLM_TEST_AMX_TARGET void RunProgram(ProgramData* d) {
  const AmxTileConfig config = Config({{3, 20}, {3, 16}, {4, 20}, {5, 12}, {5, 8}, {2, 12}});
  GLM_TILE(Tiles, loadconfig, &config);
  GLM_TILE(Tiles, loadd, 0, d->c_f32.data(), 40);
  GLM_TILE(Tiles, loadd, 1, d->a_bf16.data(), 40);
  GLM_TILE(Tiles, loadd, 2, d->b_bf16.data(), 40);
  GLM_TILE(Tiles, dpbf16ps, 0, 1, 2);
  GLM_TILE(Tiles, dpbf16ps, 0, 1, 2);  // twice: C goes on from the first product's result
  GLM_TILE(Tiles, stored, 0, d->c_f32.data(), 40);
  GLM_TILE(Tiles, loadd, 3, d->c_i32.data(), 32);
  GLM_TILE(Tiles, loadd, 4, d->a_i8.data(), 24);
  GLM_TILE(Tiles, loadd, 5, d->b_i8.data(), 24);
  GLM_TILE(Tiles, dpbssd, 3, 4, 5);
  GLM_TILE(Tiles, stored, 3, d->c_i32.data(), 32);
  GLM_TILE(Tiles, release);
}

ProgramData RandomProgramData(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  ProgramData d;
  for (uint16_t& v : d.a_bf16) v = FloatToBf16(dist(rng));
  for (uint16_t& v : d.b_bf16) v = FloatToBf16(dist(rng));
  for (int8_t& v : d.a_i8) v = static_cast<int8_t>(rng());
  for (int8_t& v : d.b_i8) v = static_cast<int8_t>(rng());
  return d;
}

// On an AMX CPU the model and the tile unit run the program to the same bits, the parts of
// the buffers outside the configured shapes untouched by both.
TEST(AmxTileModel, RunsAProgramOfPartialTilesAsTheTileUnitDoes) {
  GLM_REQUIRE_AMX(internal::CpuHasAmx() && internal::CpuHasAmxInt8(), "AMX-BF16 and AMX-INT8");
#if defined(__x86_64__)
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    ProgramData model = RandomProgramData(seed), unit = model;
    RunProgram<Model>(&model);
    RunProgram<internal::AmxTileUnit>(&unit);
    EXPECT_EQ(0, std::memcmp(model.c_f32.data(), unit.c_f32.data(), 4 * model.c_f32.size()));
    EXPECT_EQ(model.c_i32, unit.c_i32);
  }
#endif
}

// The same program on the model everywhere: what it must compute, by plain arithmetic (the
// bf16 operands are small integers, so every sum is exact in any order).
TEST(AmxTileModel, RunsAProgramOfPartialTiles) {
  ProgramData d;
  for (size_t i = 0; i < d.a_bf16.size(); ++i) d.a_bf16[i] = FloatToBf16(float(i % 7) - 3.0f);
  for (size_t i = 0; i < d.b_bf16.size(); ++i) d.b_bf16[i] = FloatToBf16(float(i % 5) - 2.0f);
  for (size_t i = 0; i < d.a_i8.size(); ++i) d.a_i8[i] = static_cast<int8_t>(i * 37);
  for (size_t i = 0; i < d.b_i8.size(); ++i) d.b_i8[i] = static_cast<int8_t>(i * 91);
  ProgramData want = d;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 5; ++j) {
      float dot = 0.0f;
      for (int q = 0; q < 8; ++q) {
        dot +=
            Bf16ToFloat(d.a_bf16[i * 20 + q]) * Bf16ToFloat(d.b_bf16[(q / 2) * 20 + 2 * j + q % 2]);
      }
      want.c_f32[i * 10 + j] += 2.0f * dot;
    }
  }
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 3; ++j) {
      uint32_t acc = static_cast<uint32_t>(want.c_i32[i * 8 + j]);
      for (int q = 0; q < 8; ++q) {
        acc += static_cast<uint32_t>(int32_t{d.a_i8[i * 24 + q]} *
                                     int32_t{d.b_i8[(q / 4) * 24 + 4 * j + q % 4]});
      }
      want.c_i32[i * 8 + j] = static_cast<int32_t>(acc);
    }
  }
  RunProgram<Model>(&d);
  EXPECT_EQ(d.c_f32, want.c_f32);
  EXPECT_EQ(d.c_i32, want.c_i32);
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
