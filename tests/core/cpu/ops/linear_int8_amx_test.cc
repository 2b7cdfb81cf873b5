// The AMX int8 kernels (core/cpu/ops/linear_int8_amx.h): the B-tile packing (and the VNNI
// kernel's biased form of it) and kRows16's padded rows, non-finite activations, LinearMany
// mixing it with the bf16 tile kernel, both kernels' tiling (row-major and kRows16 weights) on a
// software tile model on every CPU, and (on a CPU with AMX-INT8) TDPBSSD and the hardware
// kernels against the portable reference bit for bit. The
// arithmetic itself (the formula, every mode, batch invariance) is tested in linear_int8_test.cc.
#include "core/cpu/ops/linear_int8_amx.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/quantize.h"
#include "tests/core/cpu/int8_matrix.h"
#include "tests/core/cpu/ops/amx_test_util.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::QuantizeInt8;
using testing::RandomVector;
using testing::RelativeError;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> RunLinear(const std::vector<float>& x, int64_t m, const testing::Int8Matrix& w,
                             const float* bias, CpuMath math = CpuMath::kBf16Amx) {
  std::vector<float> y(m * w.view.rows, NAN);
  Linear(x.data(), m, w.view, bias, y.data(), math);
  return y;
}

struct Shape {
  int64_t m, n, k;
};
// Ragged K (a partial group; a partial 64-wide padding step), N (a 16-row tile, a 32-row
// task) and m (a partial 16-row activation tile, an odd number of tiles).
const Shape kShapes[] = {{1, 1, 1},    {1, 9, 45},    {3, 33, 64},    {16, 40, 1030},
                         {17, 37, 96}, {33, 70, 513}, {1, 96, 4096},  {9, 5, 4129},
                         {48, 16, 32}, {50, 31, 200}, {100, 64, 2048}};

// Word (p, i) of tile (u, g) holds row 16u + i's codes 32g + 4p .. + 3; its scale sits at
// [u][g][i]; rows past m are zeros.
TEST(LinearInt8Amx, PackingPutsARowsFourCodesInEachWord) {
  const int64_t m = 20, k = 96;  // kp = 128: four groups, the last past K
  const std::vector<float> x = RandomVector(m * k, 9);
  internal::Int8Activation a;
  internal::QuantizeActivationInt8(x.data(), m, k, &a, internal::Int8Operands::kAmxTiles);
  ASSERT_EQ(a.kp, 128);
  const int64_t groups = a.kp / kInt8Group;
  ASSERT_EQ(static_cast<int64_t>(a.tiles.size()), internal::Int8AmxTilesSize(m, a.kp));
  ASSERT_EQ(static_cast<int64_t>(a.tiles.size()), 2 * groups * 8 * 16);
  ASSERT_EQ(static_cast<int64_t>(a.tile_scale.size()), 2 * groups * 16);
  for (int64_t u = 0; u < 2; ++u) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t r = 16 * u + i;
        const float scale = a.tile_scale[(u * groups + g) * 16 + i];
        EXPECT_EQ(scale, r < m ? a.group_scale[r * groups + g] : 0.0f) << r << " " << g;
        if (r < m && g < 3) {
          EXPECT_GT(scale, 0.0f);
        }
        for (int64_t p = 0; p < 8; ++p) {
          int8_t bytes[4];
          std::memcpy(bytes, &a.tiles[((u * groups + g) * 8 + p) * 16 + i], 4);
          for (int j = 0; j < 4; ++j) {
            const int8_t want = r < m ? a.q[r * a.kp + 32 * g + 4 * p + j] : 0;
            ASSERT_EQ(bytes[j], want) << "u=" << u << " g=" << g << " i=" << i << " p=" << p;
          }
        }
      }
    }
  }
  // The VNNI kernel's operands: the same words with each byte's top bit flipped (code + 128 as
  // an unsigned byte), the same scales.
  internal::Int8Activation v;
  internal::QuantizeActivationInt8(x.data(), m, k, &v, internal::Int8Operands::kVnniTiles);
  ASSERT_EQ(v.tiles.size(), a.tiles.size());
  for (size_t i = 0; i < a.tiles.size(); ++i) {
    ASSERT_EQ(static_cast<uint32_t>(v.tiles[i]), static_cast<uint32_t>(a.tiles[i]) ^ 0x80808080u)
        << i;
  }
  EXPECT_EQ(v.tile_scale, a.tile_scale);
  internal::QuantizeActivationInt8(x.data(), m, k, &a);
  EXPECT_TRUE(a.tiles.empty() && a.tile_scale.empty()) << "a reused activation keeps old tiles";
}

// A NaN or infinity reaches its own row's outputs (its group's scale is NaN) and no other.
TEST(LinearInt8Amx, NonFiniteActivationStaysInItsRow) {
  const int64_t m = 20, n = 33, k = 100;
  std::vector<float> x = RandomVector(m * k, 21);
  x[3 * k + 40] = NAN;
  x[17 * k + 99] = INFINITY;
  const testing::Int8Matrix w = QuantizeInt8(RandomVector(n * k, 22, 0.1f), n, k);
  const std::vector<float> y = RunLinear(x, m, w, nullptr);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (i == 3 || i == 17) {
        EXPECT_TRUE(std::isnan(y[i * n + j])) << i << " " << j;
      } else {
        EXPECT_TRUE(std::isfinite(y[i * n + j])) << i << " " << j;
      }
    }
  }
}

// LinearMany with int8 and bf16 weights in kBf16Amx: each job's result is its lone call's
// (on AMX the threads switch between the two kernels' tile configurations).
TEST(LinearInt8Amx, ManyJobsMixingInt8AndBf16MatchSingleCalls) {
  const int64_t m = 40, k = 256, n = 80;
  const std::vector<float> x = RandomVector(m * k, 31);
  const std::vector<float> wf = RandomVector(n * k, 32, 0.1f);
  const testing::Int8Matrix w8 = QuantizeInt8(wf, n, k);
  std::vector<uint16_t> wb(n * k);
  for (int64_t i = 0; i < n * k; ++i) wb[i] = FloatToBf16(wf[i]);
  const Matrix w16{DType::kBF16, n, k, wb.data()};
  std::vector<float> y8(m * n), y16(m * n), y8b(m * n);
  const LinearJob jobs[] = {{x.data(), m, &w8.view, nullptr, y8.data()},
                            {x.data(), m, &w16, nullptr, y16.data()},
                            {x.data(), m, &w8.view, nullptr, y8b.data()}};
  LinearMany(jobs, CpuMath::kBf16Amx);
  std::vector<float> want8(m * n), want16(m * n);
  Linear(x.data(), m, w8.view, nullptr, want8.data(), CpuMath::kBf16Amx);
  Linear(x.data(), m, w16, nullptr, want16.data(), CpuMath::kBf16Amx);
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_EQ(Bits(y8[i]), Bits(want8[i])) << i;
    ASSERT_EQ(Bits(y8b[i]), Bits(want8[i])) << i;
    ASSERT_EQ(Bits(y16[i]), Bits(want16[i])) << i;
  }
}

// The tile emulation: sums of 4-byte products per word, accumulating into c, wrapping as the
// tile unit's 32-bit integers do.
TEST(LinearInt8Amx, TileEmulationSumsTheWordProductsIntoC) {
  std::vector<int8_t> a(16 * 32), b(8 * 64);
  std::vector<int32_t> c(256);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(-128, 127);
  for (int8_t& v : a) v = static_cast<int8_t>(byte(rng));
  for (int8_t& v : b) v = static_cast<int8_t>(byte(rng));
  for (int32_t& v : c) v = byte(rng) * 1000;
  c[5] = INT32_MAX;  // wraps
  std::vector<int32_t> got = c;
  internal::AmxInt8TileDpEmulated(got.data(), a.data(), b.data());
  for (int r = 0; r < 16; ++r) {
    for (int col = 0; col < 16; ++col) {
      int64_t sum = c[r * 16 + col];
      for (int kk = 0; kk < 32; ++kk) sum += a[r * 32 + kk] * b[(kk / 4) * 64 + col * 4 + kk % 4];
      ASSERT_EQ(got[r * 16 + col], static_cast<int32_t>(static_cast<uint32_t>(sum)))
          << r << " " << col;
    }
  }
}

// The hardware kernel's driver over the software tile model, on every CPU: its A sources
// (in place, tail group, padded last tile), B tile addressing, 2 x 2 passes and transposed
// stores give the reference's bits.
TEST(LinearInt8Amx, TheKernelsTilingOnATileModelEqualsTheReference) {
  uint32_t seed = 500;
  for (const Shape& s : kShapes) {
    const std::vector<float> x = RandomVector(s.m * s.k, seed++);
    const testing::Int8Matrix w = QuantizeInt8(RandomVector(s.n * s.k, seed++, 0.1f), s.n, s.k);
    const std::vector<float> bias = RandomVector(s.n, seed++);
    internal::Int8Activation a;
    internal::QuantizeActivationInt8(x.data(), s.m, s.k, &a, internal::Int8Operands::kAmxTiles);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      std::vector<float> model(s.m * s.n, NAN), emu(s.m * s.n, NAN);
      for (int64_t nb = 0; nb * internal::kBlockN < s.n; ++nb) {
        internal::Int8AmxBlockTileModel({&a, &w.view, b, model.data()}, nb);
        internal::Int8BlockGeneric({&a, &w.view, b, emu.data()}, nb);
      }
      for (int64_t i = 0; i < s.m * s.n; ++i) {
        ASSERT_EQ(Bits(model[i]), Bits(emu[i]))
            << "m=" << s.m << " n=" << s.n << " k=" << s.k << " element " << i;
      }
    }
  }
}

// kRows16 weights (weights as B tiles, activation rows as A tiles in place): the same shapes,
// and RowSlices that start inside a block (a task's rows then span three blocks), against the
// reference on the same view and on the row-major slice, with and without a bias.
using Int8BlockFn = void (*)(const internal::Int8Job&, int64_t);
void ExpectRows16KernelEqualsTheReference(Int8BlockFn kernel, uint32_t seed) {
  for (const Shape& s : kShapes) {
    for (const int64_t phase : {0, 5, 15}) {
      const int64_t rows = s.n + phase + 3;  // the slice leaves rows on both sides
      const std::vector<float> wf = RandomVector(rows * s.k, seed++, 0.1f);
      const testing::Int8Matrix w16 = QuantizeInt8(wf, rows, s.k, Int8Layout::kRows16);
      const testing::Int8Matrix wrm = QuantizeInt8(wf, rows, s.k);
      const Matrix w = w16.view.RowSlice(phase, s.n), w_rm = wrm.view.RowSlice(phase, s.n);
      ASSERT_EQ(w.int8_row_phase, phase);
      const std::vector<float> x = RandomVector(s.m * s.k, seed++);
      const std::vector<float> bias = RandomVector(s.n, seed++);
      internal::Int8Activation a, ag;
      internal::QuantizeActivationInt8(x.data(), s.m, s.k, &a, internal::Int8Operands::kAmxRows);
      internal::QuantizeActivationInt8(x.data(), s.m, s.k, &ag);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<float> got(s.m * s.n, NAN), ref(s.m * s.n, NAN), ref_rm(s.m * s.n, NAN);
        for (int64_t nb = 0; nb * internal::kBlockN < s.n; ++nb) {
          kernel({&a, &w, b, got.data()}, nb);
          internal::Int8BlockGeneric({&ag, &w, b, ref.data()}, nb);
          internal::Int8BlockGeneric({&ag, &w_rm, b, ref_rm.data()}, nb);
        }
        for (int64_t i = 0; i < s.m * s.n; ++i) {
          ASSERT_EQ(Bits(got[i]), Bits(ref[i])) << "m=" << s.m << " n=" << s.n << " k=" << s.k
                                                << " phase=" << phase << " element " << i;
          ASSERT_EQ(Bits(ref[i]), Bits(ref_rm[i])) << "the layouts' references differ at " << i;
        }
      }
    }
  }
}

TEST(LinearInt8Amx, TheRows16KernelsTilingOnATileModelEqualsTheReference) {
  ExpectRows16KernelEqualsTheReference(internal::Int8AmxRows16BlockTileModel, 900);
}

// LinearMany as on an AMX-INT8 CPU (ForceInt8AmxTileModel: the operands and thresholds of one,
// both drivers on the tile model): per layout, jobs sharing an activation and one of their own,
// at row counts on both sides of kInt8AmxRows16MinRows, give what the CPU's own kernels give.
TEST(LinearInt8Amx, LinearManyAsOnAnAmxCpuEqualsThisCpusKernels) {
  const int64_t k = 300, n = 70;
  const std::vector<float> wf = RandomVector(n * k, 51, 0.1f);
  const std::vector<float> bias = RandomVector(n, 52);
  for (const Int8Layout layout : {Int8Layout::kRowMajor, Int8Layout::kRows16}) {
    const testing::Int8Matrix w = QuantizeInt8(wf, n, k, layout);
    const Matrix slice = w.view.RowSlice(7, 50);
    for (const int64_t m :
         {int64_t{1}, internal::kInt8AmxRows16MinRows - 1, internal::kInt8AmxRows16MinRows,
          int64_t{15}, int64_t{17}, int64_t{40}}) {
      const std::vector<float> x = RandomVector(m * k, 53 + static_cast<uint32_t>(m));
      auto run = [&](bool model) {
        internal::ForceInt8AmxTileModel(model);
        std::vector<float> y(3 * m * n, NAN);
        const LinearJob jobs[] = {{x.data(), m, &w.view, bias.data(), y.data()},
                                  {x.data(), m, &slice, nullptr, y.data() + m * n},
                                  {x.data(), m, &w.view, nullptr, y.data() + 2 * m * n}};
        LinearMany(jobs, CpuMath::kBf16);
        internal::ForceInt8AmxTileModel(false);
        return y;
      };
      const std::vector<float> model = run(true), own = run(false);
      for (size_t i = 0; i < own.size(); ++i) {
        ASSERT_EQ(Bits(model[i]), Bits(own[i]))
            << "rows16=" << (layout == Int8Layout::kRows16) << " m=" << m << " " << i;
      }
    }
  }
  internal::ForceInt8AmxTileModel(true);
  EXPECT_EQ(internal::Int8OperandsFor(1), internal::Int8Operands::kAmxTiles);
  const int64_t rows16_min = internal::kInt8AmxRows16MinRows;
  EXPECT_EQ(internal::Int8OperandsFor(rows16_min - 1, Int8Layout::kRows16),
            internal::Int8Operands::kGroups);
  EXPECT_EQ(internal::Int8OperandsFor(rows16_min, Int8Layout::kRows16),
            internal::Int8Operands::kAmxRows);
  EXPECT_EQ(internal::Int8OperandsFor(8, Int8Layout::kRows16), internal::Int8Operands::kAmxRows);
  internal::ForceInt8AmxTileModel(false);
}

// kAmxRows: q padded with zero rows to whole 16-row tiles (the A tiles read them in place), the
// codes and scales of the rows that exist as kGroups gives them, nothing else packed.
TEST(LinearInt8Amx, AmxRowsOperandsPadQToWholeTiles) {
  const int64_t m = 20, k = 100;  // kp = 128
  const std::vector<float> x = RandomVector(m * k, 41);
  internal::Int8Activation rows, groups;
  internal::QuantizeActivationInt8(x.data(), m, k, &rows, internal::Int8Operands::kAmxRows);
  internal::QuantizeActivationInt8(x.data(), m, k, &groups);
  EXPECT_EQ(rows.operands, internal::Int8Operands::kAmxRows);
  EXPECT_EQ(rows.m, m);
  ASSERT_EQ(rows.q.size(), static_cast<size_t>(32 * 128));
  EXPECT_TRUE(std::equal(groups.q.begin(), groups.q.end(), rows.q.begin()));
  EXPECT_TRUE(std::all_of(rows.q.begin() + m * 128, rows.q.end(), [](int8_t v) { return v == 0; }));
  EXPECT_EQ(rows.group_scale, groups.group_scale);
  EXPECT_TRUE(rows.tiles.empty() && rows.tile_scale.empty() && rows.group_sum.empty());
}

TEST(LinearInt8Amx, TileProductOnHardwareEqualsTheEmulation) {
  GLM_REQUIRE_AMX(internal::CpuHasAmxInt8(), "AMX-INT8 (with AVX-512)");
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> byte(-128, 127);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int8_t> a(16 * 32), b(8 * 64);
    std::vector<int32_t> c(256);
    for (int8_t& v : a)
      v = static_cast<int8_t>(trial % 7 == 0 ? (byte(rng) < 0 ? -128 : 127) : byte(rng));
    for (int8_t& v : b)
      v = static_cast<int8_t>(trial % 5 == 0 ? (byte(rng) < 0 ? -128 : 127) : byte(rng));
    for (int32_t& v : c) v = static_cast<int32_t>(rng());
    std::vector<int32_t> hw = c, emu = c;
    ASSERT_TRUE(internal::AmxInt8TileDpHardware(hw.data(), a.data(), b.data()));
    internal::AmxInt8TileDpEmulated(emu.data(), a.data(), b.data());
    ASSERT_EQ(hw, emu) << "trial " << trial;
  }
}

TEST(LinearInt8Amx, HardwareKernelEqualsTheReferenceBitForBit) {
  GLM_REQUIRE_AMX(internal::CpuHasAmxInt8(), "AMX-INT8 (with AVX-512)");
  uint32_t seed = 700;
  for (const Shape& s : kShapes) {
    const std::vector<float> x = RandomVector(s.m * s.k, seed++);
    const testing::Int8Matrix w = QuantizeInt8(RandomVector(s.n * s.k, seed++, 0.1f), s.n, s.k);
    const std::vector<float> bias = RandomVector(s.n, seed++);
    internal::Int8Activation a;
    internal::QuantizeActivationInt8(x.data(), s.m, s.k, &a, internal::Int8Operands::kAmxTiles);
    std::vector<float> hw(s.m * s.n, NAN), emu(s.m * s.n, NAN);
    internal::Int8AmxThreadBegin();
    for (int64_t nb = 0; nb * internal::kBlockN < s.n; ++nb) {
      internal::Int8AmxBlockHardware({&a, &w.view, bias.data(), hw.data()}, nb);
      internal::Int8BlockGeneric({&a, &w.view, bias.data(), emu.data()}, nb);
    }
    internal::AmxThreadEnd();
    for (int64_t i = 0; i < s.m * s.n; ++i) {
      ASSERT_EQ(Bits(hw[i]), Bits(emu[i]))
          << "m=" << s.m << " n=" << s.n << " k=" << s.k << " " << i;
    }
  }
}

TEST(LinearInt8Amx, HardwareRows16KernelEqualsTheReferenceBitForBit) {
  GLM_REQUIRE_AMX(internal::CpuHasAmxInt8(), "AMX-INT8 (with AVX-512)");
  internal::Int8AmxThreadBegin();
  ExpectRows16KernelEqualsTheReference(internal::Int8AmxRows16BlockHardware, 1100);
  internal::AmxThreadEnd();
}

}  // namespace
}  // namespace glmserve
