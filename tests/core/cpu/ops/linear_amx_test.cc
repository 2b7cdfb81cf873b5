// CpuMath::kBf16Amx (core/cpu/ops/linear_amx.h): the AMX kernel's TDPBF16PS against its portable
// emulation, bit for bit, on random tiles of every kind of value (where the machine has
// AMX; skipped with the reason otherwise, a failure under GLMSERVE_REQUIRE_AMX=1); the
// emulation's documented arithmetic on hand-made cases (everywhere); batch invariance, awkward
// shapes, bias and LinearMany through Linear in the dispatched kernel, the portable one and the
// tile unit's code on the software tile model (amx_tiles.h), which runs it on any CPU.
#include "core/cpu/ops/linear_amx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/linear.h"
#include "tests/core/cpu/ops/amx_test_util.h"
#include "tests/core/cpu/ops/bf16_reference.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::RandomVector;
using testing::RelativeError;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Same bits, or both NaN (payloads are not part of the contract: linear_amx.h).
bool SameValue(float a, float b) { return Bits(a) == Bits(b) || (std::isnan(a) && std::isnan(b)); }

struct ForceGeneric {
  ForceGeneric() { internal::ForceGenericKernels(true); }
  ~ForceGeneric() { internal::ForceGenericKernels(false); }
};
// The tile unit's kernel code on the software tile model (amx_tiles.h), on any CPU.
struct ForceTileModel {
  ForceTileModel() { internal::ForceAmxTileModel(true); }
  ~ForceTileModel() { internal::ForceAmxTileModel(false); }
};

// Random bf16 / fp32 bit patterns by kind: 0 moderate exponents; 1 any exponent (inf/NaN
// included); 2 a mix of zeros of both signs, subnormals, inf/NaN, extremes; 3 tiny (subnormal
// inputs and products); 4 huge (overflowing products).
class Values {
 public:
  Values(int kind, uint64_t seed) : kind_(kind), rng_(seed) {}
  uint16_t Bf16() {
    const uint64_t r = rng_();
    const int pick = static_cast<int>(r % 100);
    const uint16_t sign = ((r >> 8) & 1) != 0 ? 0x8000 : 0;
    const uint16_t frac = (r >> 9) & 0x7f;
    int e = 0;
    switch (kind_) {
      case 0:
        e = 120 + static_cast<int>((r >> 20) % 16);
        break;
      case 1:
        e = static_cast<int>((r >> 20) % 256);
        break;
      case 3:
        e = pick < 30   ? 0
            : pick < 60 ? 1 + static_cast<int>((r >> 20) % 8)
                        : 55 + static_cast<int>((r >> 20) % 20);
        break;
      case 4:
        e = pick < 5 ? 255 : 180 + static_cast<int>((r >> 20) % 76);
        break;
      default:
        if (pick >= 95) return sign;  // signed zeros
        e = pick < 10   ? 0
            : pick < 15 ? 255
            : pick < 20 ? 1 + static_cast<int>((r >> 20) % 3)
            : pick < 25 ? 250 + static_cast<int>((r >> 20) % 5)
                        : 110 + static_cast<int>((r >> 20) % 36);
    }
    return static_cast<uint16_t>(sign | (e << 7) | frac);
  }
  float F32() {
    const uint64_t r = rng_();
    const int pick = static_cast<int>((r >> 1) % 100);
    int e = 0;
    switch (kind_) {
      case 0:
        e = 115 + static_cast<int>((r >> 8) % 26);
        break;
      case 1:
        e = static_cast<int>((r >> 8) % 256);
        break;
      case 3:
        e = pick < 50 ? 0 : static_cast<int>((r >> 8) % 8);
        break;
      case 4:
        e = 200 + static_cast<int>((r >> 8) % 56);
        break;
      default:
        e = pick < 8 ? 0 : pick < 12 ? 255 : pick < 16 ? 1 : 100 + static_cast<int>((r >> 8) % 56);
    }
    const uint32_t frac = pick >= 96 ? 0 : (r >> 20) & 0x7fffff;
    return FromBits(((r & 1) != 0 ? 0x80000000u : 0u) | (static_cast<uint32_t>(e) << 23) | frac);
  }

 private:
  int kind_;
  std::mt19937_64 rng_;
};

TEST(LinearAmx, TileProductOnHardwareEqualsTheEmulationBitForBit) {
  GLM_REQUIRE_AMX(internal::CpuHasAmx(), "AMX-BF16");
  const char* kinds[] = {"moderate", "any exponent", "specials", "tiny", "huge"};
  for (int kind = 0; kind < 5; ++kind) {
    Values values(kind, 1000 + kind);
    int64_t compared = 0;
    for (int tile = 0; tile < 400; ++tile) {
      std::vector<uint16_t> a(512), b(512);
      std::vector<float> c(256);
      for (uint16_t& v : a) v = values.Bf16();
      for (uint16_t& v : b) v = values.Bf16();
      for (float& v : c) v = tile % 4 == 0 ? 0.0f : values.F32();
      std::vector<float> hw = c, emu = c;
      ASSERT_TRUE(internal::AmxTileDpHardware(hw.data(), a.data(), b.data()));
      internal::AmxTileDpEmulated(emu.data(), a.data(), b.data());
      for (int i = 0; i < 256; ++i, ++compared) {
        ASSERT_TRUE(SameValue(hw[i], emu[i]))
            << kinds[kind] << " tile " << tile << " element " << i << ": hardware " << std::hex
            << Bits(hw[i]) << " emulation " << Bits(emu[i]) << " c " << Bits(c[i]);
      }
    }
    std::printf("%s: %lld elements identical\n", kinds[kind], static_cast<long long>(compared));
  }
}

// One C element of AmxTileDpEmulated from 32 products given as pairs (a, b) in row 0 / column 0.
float OneElement(float c, const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<uint16_t> ta(512, 0), tb(512, 0);
  for (size_t j = 0; j < a.size(); ++j) {
    ta[j] = FloatToBf16(a[j]);
    tb[(j / 2) * 32 + (j % 2)] = FloatToBf16(b[j]);  // column 0, pair row j / 2
  }
  std::vector<float> tc(256, 0.0f);
  tc[0] = c;
  std::vector<float> hw = tc;
  internal::AmxTileDpEmulated(tc.data(), ta.data(), tb.data());
  // Where the hardware is here, it agrees (the random test above covers it broadly).
  if (internal::AmxTileDpHardware(hw.data(), ta.data(), tb.data())) {
    EXPECT_TRUE(SameValue(hw[0], tc[0])) << hw[0] << " vs " << tc[0];
  }
  return tc[0];
}

TEST(LinearAmx, EmulationSumsEvenAndOddProductsInTwoChains) {
  // Products 2^24, 1, -2^24, 1 at k = 0..3: the even chain gives 2^24 - 2^24 = 0, the odd one
  // 1 + 1 = 2, so the result is 2; a single chain in k order would give 1 (2^24 + 1 rounds to
  // 2^24), one exact sum 2 as well but see the next case.
  EXPECT_EQ(OneElement(0.0f, {0x1p24f, 1, -0x1p24f, 1}, {1, 1, 1, 1}), 2.0f);
  // Products 1, 2^24, 1 (even: 1 + 1 = 2 exactly; odd: 2^24): e + o = 2^24 + 2 exactly. A
  // single chain in k order gives 2^24 (1 + 2^24 -> 2^24, + 1 -> 2^24, ties to even).
  EXPECT_EQ(OneElement(0.0f, {1, 0x1p24f, 1}, {1, 1, 1}), 0x1p24f + 2.0f);
  // Within a chain each step rounds: 2^24 + 1 + 1 (k = 0, 2, 4) is 2^24 in fp32 steps.
  EXPECT_EQ(OneElement(0.0f, {0x1p24f, 0, 1, 0, 1}, {1, 0, 1, 0, 1}), 0x1p24f);
  // c is added last: c = 2^24, products 1 and 1 (one per chain): 2^24 + (1 + 1) = 2^24 + 2.
  EXPECT_EQ(OneElement(0x1p24f, {1, 1}, {1, 1}), 0x1p24f + 2.0f);
  // bf16 subnormal inputs read as zero; subnormal results flush to zero.
  EXPECT_EQ(Bits(OneElement(0.0f, {0x1p-130f}, {0x1p100f})), 0u);  // not 2^-30
  EXPECT_EQ(Bits(OneElement(0.0f, {0x1p-70f}, {0x1p-70f})), 0u);   // 2^-140 -> +0
  // A subnormal accumulator reads as zero: 2^-126, not 2^-126 + 2^-140.
  EXPECT_EQ(OneElement(0x1p-140f, {0x1p-63f}, {0x1p-63f}), 0x1p-126f);
}

using testing::ToBf16;

TEST(LinearAmx, MatchesFloat64ReferenceAndTheEmulationOnAwkwardShapes) {
  // K tails (odd, below 32, just over), N off the 16-row tile and the 32-row task, m off the
  // 16-row activation tile and odd numbers of activation tiles.
  const struct {
    int64_t m, n, k;
  } shapes[] = {{1, 1, 1},
                {1, 7, 5},
                {3, 33, 17},
                {16, 64, 64},
                {17, 37, 1030},
                {33, 130, 513},
                {1, 96, 2048},
                {9, 16, 33},
                {40, 48, 300},
                // Several activation slabs (the last one odd) and several weight groups, the
                // last one partial (AmxUnits).
                {300, 100, 2048},
                {300, 600, 1000},
                // K in ranges of 4096 (the C tiles kept between them): two ranges over several
                // slabs, and three with the tail chunk in the last.
                {300, 40, 4200},
                {70, 50, 9000}};
  std::printf("kBf16Amx kernel on this machine: %s\n", LinearKernelName(CpuMath::kBf16Amx));
  uint32_t seed = 31;
  for (const auto& s : shapes) {
    const std::vector<float> x = RandomVector(s.m * s.k, seed++);
    const std::vector<uint16_t> wb = ToBf16(RandomVector(s.n * s.k, seed++, 0.1f));
    const Matrix w{DType::kBF16, s.n, s.k, wb.data()};
    const std::vector<float> bias = RandomVector(s.n, seed++);
    for (bool with_bias : {false, true}) {
      const float* b = with_bias ? bias.data() : nullptr;
      const std::vector<float> ref = testing::Bf16ActivationReference(x, s.m, wb, s.n, s.k, b);
      // Poisoned: unwritten outputs show.
      std::vector<float> y(s.m * s.n, NAN), g(s.m * s.n, NAN), model(s.m * s.n, NAN);
      Linear(x.data(), s.m, w, b, y.data(), CpuMath::kBf16Amx);
      {
        ForceGeneric generic;
        Linear(x.data(), s.m, w, b, g.data(), CpuMath::kBf16Amx);
      }
      {
        ForceTileModel tile_model;
        Linear(x.data(), s.m, w, b, model.data(), CpuMath::kBf16Amx);
      }
      EXPECT_LT(RelativeError(y, ref), 2e-6) << "m=" << s.m << " n=" << s.n << " k=" << s.k;
      for (int64_t i = 0; i < s.m * s.n; ++i) {
        ASSERT_EQ(Bits(y[i]), Bits(g[i]))
            << LinearKernelName(CpuMath::kBf16Amx) << " vs generic_amx_bf16, m=" << s.m
            << " n=" << s.n << " k=" << s.k << " element " << i;
        ASSERT_EQ(Bits(model[i]), Bits(g[i]))
            << "the tile unit's code on the tile model vs generic_amx_bf16, m=" << s.m
            << " n=" << s.n << " k=" << s.k << " element " << i;
      }
    }
  }
}

void ExpectRowsIndependentOfBatch(int64_t k) {
  const int64_t n = 70, m_max = 300;
  const std::vector<float> x = RandomVector(m_max * k, 41);
  const std::vector<uint16_t> wb = ToBf16(RandomVector(n * k, 42, 0.05f));
  const Matrix w{DType::kBF16, n, k, wb.data()};
  const std::vector<float> bias = RandomVector(n, 43);
  std::vector<float> all(m_max * n);
  Linear(x.data(), m_max, w, bias.data(), all.data(), CpuMath::kBf16Amx);
  for (int64_t m : {1, 3, 16, 17, 33, 128, 257, 300}) {
    for (int64_t start : {int64_t{0}, m_max - m, (m_max - m) / 2}) {
      std::vector<float> part(m * n);
      Linear(x.data() + start * k, m, w, bias.data(), part.data(), CpuMath::kBf16Amx);
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(Bits(part[i]), Bits(all[start * n + i])) << "m " << m << " start " << start;
      }
    }
  }
}

// The contract: a row's bits do not depend on how many rows share the call (one activation
// tile or several, full or partial, odd or even counts of them) or where the row sits.
TEST(LinearAmx, RowResultIndependentOfBatch) {
  // Two activation slabs at k = 1000; K in two ranges at 4200 (the C tiles kept between them).
  for (const int64_t k : {1000, 4200}) {
    SCOPED_TRACE(k);
    ExpectRowsIndependentOfBatch(k);
  }
}

// The same contract for the tile unit's own code, run on the software tile model where the CPU
// has no AMX: its slabs, pairs of activation tiles and K ranges cut a batch differently from
// the emulation's row by row, so this is where a cut that changed a bit would show.
TEST(LinearAmx, RowResultIndependentOfBatchOnTheTileModel) {
  ForceTileModel tile_model;
  for (const int64_t k : {1000, 4200}) {
    SCOPED_TRACE(k);
    ExpectRowsIndependentOfBatch(k);
  }
}

// LinearMany shares one packed activation between jobs; each job's result is what Linear
// gives alone; fp32 weights take the exact arithmetic; and kBf16Amx differs from kBf16 (a
// different summation order) while both stay within bf16-rounding error of exact.
TEST(LinearAmx, ManyJobsMatchSingleCallsAndNonBf16WeightsStayExact) {
  const int64_t m = 5, k = 300, n = 45;
  const std::vector<float> x = RandomVector(m * k, 51);
  const std::vector<float> wf = RandomVector(n * k, 52, 0.1f);
  const std::vector<uint16_t> wb = ToBf16(wf);
  const Matrix w_bf16{DType::kBF16, n, k, wb.data()};
  const Matrix w_f32{DType::kF32, n, k, wf.data()};
  std::vector<float> a(m * n), b(m * n), c(m * n);
  const LinearJob jobs[] = {{x.data(), m, &w_bf16, nullptr, a.data()},
                            {x.data(), m, &w_f32, nullptr, b.data()},
                            {x.data() + k, m - 1, &w_bf16, nullptr, c.data()}};
  LinearMany(jobs, CpuMath::kBf16Amx);
  std::vector<float> want(m * n);
  Linear(x.data(), m, w_bf16, nullptr, want.data(), CpuMath::kBf16Amx);
  EXPECT_EQ(a, want);
  Linear(x.data(), m, w_f32, nullptr, want.data(), CpuMath::kExact);
  EXPECT_EQ(b, want) << "fp32 weights take the exact arithmetic in bf16_amx mode";
  for (int64_t i = 0; i < (m - 1) * n; ++i) ASSERT_EQ(c[i], a[n + i]) << i;
  std::vector<float> exact(m * n), bf16(m * n);
  Linear(x.data(), m, w_bf16, nullptr, exact.data(), CpuMath::kExact);
  Linear(x.data(), m, w_bf16, nullptr, bf16.data(), CpuMath::kBf16);
  EXPECT_NE(a, exact);
  EXPECT_NE(a, bf16);
  EXPECT_LT(RelativeError(a, exact), 1e-2);
  EXPECT_LT(RelativeError(a, bf16), 1e-5);
}

// The packed activations live in a per-thread arena reused from call to call (linear.cc),
// never cleared: the packing must write every padding zero itself. A call that leaves large
// values (and NaNs) in the arena is followed by smaller ones whose padding rows and K tail
// fall where those values were; each must equal the emulation, which packs nothing.
TEST(LinearAmx, ReusedScratchLeavesNoStaleValuesInThePadding) {
  const int64_t n = 40, k = 77;  // K tail of 13 in the last chunk
  std::vector<float> big = RandomVector(64 * 200, 61, 1e30f);
  for (size_t i = 0; i < big.size(); i += 7) big[i] = std::nanf("");
  const std::vector<uint16_t> w_big_data = ToBf16(RandomVector(n * 200, 62, 0.05f));
  const Matrix w_big{DType::kBF16, n, 200, w_big_data.data()};
  const std::vector<uint16_t> wb = ToBf16(RandomVector(n * k, 63, 0.05f));
  const Matrix w{DType::kBF16, n, k, wb.data()};
  for (int64_t m : {1, 5, 17}) {
    std::vector<float> scratch(64 * n);
    Linear(big.data(), 64, w_big, nullptr, scratch.data(), CpuMath::kBf16Amx);
    const std::vector<float> x = RandomVector(m * k, 64 + m);
    std::vector<float> got(m * n);
    Linear(x.data(), m, w, nullptr, got.data(), CpuMath::kBf16Amx);
    // The reference packs nothing: one emulated tile product per K chunk, the weight row as
    // A row 0 and the activation row as B column 0, everything else +0.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < n; ++r) {
        float c[256] = {};
        for (int64_t k0 = 0; k0 < k; k0 += 32) {
          uint16_t a[512] = {}, b[512] = {};
          for (int64_t j = 0; j < 32 && k0 + j < k; ++j) {
            a[j] = wb[r * k + k0 + j];
            b[(j / 2) * 32 + j % 2] = FloatToBf16(x[i * k + k0 + j]);
          }
          internal::AmxTileDpEmulated(c, a, b);
        }
        ASSERT_EQ(Bits(got[i * n + r]), Bits(c[0])) << "m " << m << " row " << i << " out " << r;
      }
    }
  }
}

// The AVX-512 packing (what Linear runs on AVX-512 machines) writes the portable packing's
// bits, padding included: every kind of value (NaNs with payloads, infinities, subnormals,
// ties to even), m off the 16-row tile, K tails of every length class.
TEST(LinearAmx, VectorPackingGivesThePortableBits) {
  if (!internal::CpuHasAvx512()) GTEST_SKIP() << "no AVX-512: the portable packing runs alone";
  uint32_t seed = 71;
  for (int64_t k : {1, 5, 16, 17, 31, 32, 33, 100, 4096}) {
    for (int64_t m : {1, 15, 16, 17, 40}) {
      std::vector<float> x(m * k);
      for (int kind = 0; kind < 5; ++kind) {
        Values values(kind, seed++);
        for (float& v : x) v = values.F32();
        // Exact ties: round to even up and down.
        x[0] = FromBits(0x3f808000u);
        if (x.size() > 1) x[1] = FromBits(0x3f818000u);
        const int64_t size = internal::AmxPackedSize(m, k);
        AlignedVector<uint16_t> fast(size, 0xdead), portable(size, 0xbeef);
        for (int64_t b = 0; b * 16 < m; ++b) {
          internal::PackAmxActivations(x.data(), m, k, b, fast.data());
        }
        {
          ForceGeneric generic;
          for (int64_t b = 0; b * 16 < m; ++b) {
            internal::PackAmxActivations(x.data(), m, k, b, portable.data());
          }
        }
        for (int64_t i = 0; i < size; ++i) {
          ASSERT_EQ(fast[i], portable[i])
              << "m " << m << " k " << k << " kind " << kind << " element " << i;
        }
      }
    }
  }
}

TEST(LinearAmx, ParsesAndNamesTheMode) {
  EXPECT_EQ(*ParseCpuMath("bf16_amx"), CpuMath::kBf16Amx);
  EXPECT_STREQ(CpuMathName(CpuMath::kBf16Amx), "bf16_amx");
  const absl::StatusOr<CpuMath> bad = ParseCpuMath("amx");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("exact, bf16, bf16_amx"), std::string::npos);
  const std::string kernel = LinearKernelName(CpuMath::kBf16Amx);
  EXPECT_EQ(kernel, internal::CpuHasAmx() ? "amx_bf16" : "generic_amx_bf16");
  ForceGeneric generic;
  EXPECT_STREQ(LinearKernelName(CpuMath::kBf16Amx), "generic_amx_bf16");
}

TEST(LinearAmx, TileConfigurationSurvivesManyThreadsAndCalls) {
  // Every pool thread configures its own tiles per call (linear.cc): a matrix big enough to
  // spread over all threads, twice, with the same bits each time.
  const int64_t m = 20, n = 1024, k = 512;
  const std::vector<float> x = RandomVector(m * k, 3);
  const std::vector<uint16_t> wb = ToBf16(RandomVector(n * k, 4, 0.05f));
  const Matrix w{DType::kBF16, n, k, wb.data()};
  std::vector<float> y1(m * n), y2(m * n);
  Linear(x.data(), m, w, nullptr, y1.data(), CpuMath::kBf16Amx);
  Linear(x.data(), m, w, nullptr, y2.data(), CpuMath::kBf16Amx);
  EXPECT_EQ(y1, y2);
  // And other kernels on the same pool threads afterwards are unaffected by the tiles.
  std::vector<float> e1(m * n), e2(m * n);
  Linear(x.data(), m, w, nullptr, e1.data(), CpuMath::kBf16);
  {
    ForceGeneric generic;
    Linear(x.data(), m, w, nullptr, e2.data(), CpuMath::kBf16);
  }
  EXPECT_EQ(e1, e2);
}

}  // namespace
}  // namespace glmserve
