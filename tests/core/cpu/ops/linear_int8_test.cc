// The int8-weight arithmetic (core/cpu/ops/linear.h, "group-serial"): every mode and every
// kernel against the formula written out here bit for bit, and against a float64 reference of
// what it computes, in both weight layouts (Int8Layout); the VNNI and AVX2 kernels called
// directly against the portable one; RowSlices of kRows16 weights inside a block; batch
// invariance across the decode (AVX2) and many-row (VNNI) kernels; ragged K and N; shared
// activations in LinearMany; the operands the quantizer fills; non-finite activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <utility>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_int8_amx.h"
#include "core/cpu/quantize.h"
#include "tests/core/cpu/int8_matrix.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::RandomVector;
using testing::RelativeError;

using testing::QuantizeInt8;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The arithmetic as linear.h states it, written out independently of the kernels (activations
// by QuantizeGroupInt8, one exact int32 dot per group, one FMA per group in order: `formula`);
// beside it the same quantized products summed in float64 (`float64`: what the arithmetic
// approximates), and the unquantized activations against the int8 weights in float64
// (`unquantized`: the total error of quantizing the activations).
struct References {
  std::vector<float> formula, float64, unquantized;
};
References Reference(const std::vector<float>& x, int64_t m, const testing::Int8Matrix& w,
                     const float* bias) {
  const int64_t n = w.view.rows, k = w.view.cols, groups = w.view.scale_cols();
  References out{std::vector<float>(m * n), std::vector<float>(m * n), std::vector<float>(m * n)};
  std::vector<int8_t> xq(kInt8Group);
  for (int64_t i = 0; i < m; ++i) {
    std::vector<float> acc(n, 0.0f);
    std::vector<double> acc64(n, 0.0), plain(n, 0.0);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * kInt8Group, len = std::min(kInt8Group, k - begin);
      const float xs = QuantizeGroupInt8(x.data() + i * k + begin, len, xq.data());
      for (int64_t j = 0; j < n; ++j) {
        int32_t d = 0;
        for (int64_t t = 0; t < len; ++t) d += xq[t] * w.q[j * k + begin + t];
        const float ws = Bf16ToFloat(w.scales[j * groups + g]);
        acc[j] = std::fma(static_cast<float>(d), xs * ws, acc[j]);
        acc64[j] += double{xs} * d * ws;
        for (int64_t t = 0; t < len; ++t) {
          plain[j] += double{x[i * k + begin + t]} * w.q[j * k + begin + t] * ws;
        }
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const float b = bias != nullptr ? bias[j] : 0.0f;
      out.formula[i * n + j] = bias != nullptr ? acc[j] + b : acc[j];
      out.float64[i * n + j] = static_cast<float>(acc64[j] + b);
      out.unquantized[i * n + j] = static_cast<float>(plain[j] + b);
    }
  }
  return out;
}

std::vector<float> RunLinear(const std::vector<float>& x, int64_t m, const testing::Int8Matrix& w,
                             const float* bias, bool generic, CpuMath math = CpuMath::kBf16) {
  std::vector<float> y(m * w.view.rows, NAN);
  internal::ForceGenericKernels(generic);
  Linear(x.data(), m, w.view, bias, y.data(), math);
  internal::ForceGenericKernels(false);
  return y;
}

struct Shape {
  int64_t m, n, k;
};

TEST(LinearInt8, EveryModeAndKernelEqualsTheFormulaBitForBit) {
  std::printf("int8 kernel on this machine: %s\n", LinearInt8KernelName());
  // Ragged K (a partial group, a partial 64-step, both; an odd count of groups; past the VNNI
  // kernel's 16-group K blocks) and N (partial 4- and 8-row chunks and 32-row blocks); m on
  // both sides of kInt8VnniMinRows, past 16-row vectors and 3-vector tiles, across the AVX2
  // kernel's 32-row blocks.
  const Shape shapes[] = {{1, 1, 1},     {1, 9, 45},     {3, 33, 64},   {4, 40, 1030},
                          {6, 37, 2100}, {17, 70, 513},  {1, 96, 4096}, {9, 5, 4129},
                          {33, 9, 2100}, {70, 37, 4129}, {49, 31, 200}, {100, 64, 2048}};
  uint32_t seed = 40;
  for (const Shape& s : shapes) {
    const std::vector<float> x = RandomVector(s.m * s.k, seed++);
    const std::vector<float> wf = RandomVector(s.n * s.k, seed++, 0.1f);
    const testing::Int8Matrix w = QuantizeInt8(wf, s.n, s.k);
    const std::vector<float> bias = RandomVector(s.n, seed++);
    const References want = Reference(x, s.m, w, bias.data());
    for (Int8Layout layout : {Int8Layout::kRowMajor, Int8Layout::kRows16}) {
      const testing::Int8Matrix wl = QuantizeInt8(wf, s.n, s.k, layout);
      for (CpuMath math : {CpuMath::kBf16, CpuMath::kExact, CpuMath::kBf16Amx}) {
        for (bool generic : {false, true}) {
          const std::vector<float> y = RunLinear(x, s.m, wl, bias.data(), generic, math);
          for (int64_t i = 0; i < s.m * s.n; ++i) {
            ASSERT_EQ(Bits(y[i]), Bits(want.formula[i]))
                << "m=" << s.m << " n=" << s.n << " k=" << s.k << " math=" << CpuMathName(math)
                << " generic=" << generic << " rows16=" << (layout == Int8Layout::kRows16)
                << " element " << i;
          }
        }
      }
    }
    EXPECT_LT(RelativeError(want.formula, want.float64), 2e-6)
        << "m=" << s.m << " n=" << s.n << " k=" << s.k;
    // Activation quantization: per element within half a scale, ~0.5% of a dot product.
    EXPECT_LT(RelativeError(want.formula, want.unquantized), 3e-2) << "m=" << s.m << " k=" << s.k;
  }
}

using BlockFn = void (*)(const internal::Int8Job&, int64_t);

// The same codes and scales as `w`, row-major.
Matrix RowMajorView(const testing::Int8Matrix& w) {
  Matrix m = w.view;
  m.data = w.q.data();
  m.group_scales = w.scales.data();
  m.int8_layout = Int8Layout::kRowMajor;
  return m;
}

// `kernel` called directly, task by task, on weights in `layout` against the portable kernel on
// the same operands row-major, bit for bit, with and without a bias.
void ExpectKernelEqualsPortable(BlockFn kernel, internal::Int8Operands operands,
                                std::initializer_list<Shape> shapes, uint32_t seed,
                                Int8Layout layout = Int8Layout::kRowMajor) {
  for (const Shape& s : shapes) {
    const std::vector<float> x = RandomVector(s.m * s.k, seed++);
    const testing::Int8Matrix w =
        QuantizeInt8(RandomVector(s.n * s.k, seed++, 0.1f), s.n, s.k, layout);
    const Matrix row_major = RowMajorView(w);
    const std::vector<float> bias = RandomVector(s.n, seed++);
    internal::Int8Activation a;
    internal::QuantizeActivationInt8(x.data(), s.m, s.k, &a, operands);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      std::vector<float> simd(s.m * s.n, NAN), portable(s.m * s.n, NAN);
      for (int64_t nb = 0; nb * internal::kBlockN < s.n; ++nb) {
        kernel({&a, &w.view, b, simd.data()}, nb);
        internal::Int8BlockGeneric({&a, &row_major, b, portable.data()}, nb);
      }
      for (int64_t i = 0; i < s.m * s.n; ++i) {
        ASSERT_EQ(Bits(simd[i]), Bits(portable[i]))
            << "m=" << s.m << " n=" << s.n << " k=" << s.k << " at " << i;
      }
    }
  }
}

// The VNNI kernel: 1 and 2 activation vectors per register tile, partial vectors, 1-4 weight
// rows per tile, K blocks and tails.
TEST(LinearInt8, VnniKernelEqualsThePortableOneBitForBit) {
  if (!internal::CpuHasAvx512Vnni()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  ExpectKernelEqualsPortable(internal::Int8BlockAvx512Vnni, internal::Int8Operands::kVnniTiles,
                             {{1, 1, 1},
                              {2, 9, 45},
                              {4, 33, 64},
                              {16, 40, 1030},
                              {17, 37, 2100},
                              {33, 70, 513},
                              {47, 35, 4096},
                              {48, 5, 4129},
                              {49, 31, 96},
                              {100, 64, 544}},
                             240);
}

// The same kernel on Int8Layout::kRows16 weights: its 4-row chunks fall inside and across
// 16-row blocks, the last block partial.
TEST(LinearInt8, VnniKernelOnRows16EqualsThePortableOneBitForBit) {
  if (!internal::CpuHasAvx512Vnni()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  ExpectKernelEqualsPortable(internal::Int8BlockAvx512Vnni, internal::Int8Operands::kVnniTiles,
                             {{4, 1, 1},
                              {5, 9, 45},
                              {16, 33, 64},
                              {17, 40, 1030},
                              {33, 70, 513},
                              {47, 35, 4096},
                              {100, 64, 544}},
                             440, Int8Layout::kRows16);
}

// A kernel for kRows16 weights with kGroups operands against the portable one: one to four
// activation rows per pass and more (m = 6, 9, 63 take several passes of VNNI's decode kernel;
// 70 and 129, a prefill, take the 256-bit kernels' K ranges), partial and single-row blocks, N
// across 32-row tasks, ragged K (a zero-padded last group).
void ExpectRows16KernelEqualsPortable(BlockFn kernel, uint32_t seed) {
  ExpectKernelEqualsPortable(kernel, internal::Int8Operands::kGroups,
                             {{1, 1, 1},
                              {1, 9, 31},
                              {2, 16, 32},
                              {3, 17, 33},
                              {4, 40, 96},
                              {1, 70, 1408},
                              {6, 33, 513},
                              {9, 35, 4129},
                              {1, 64, 4096},
                              {63, 20, 300},
                              {70, 20, 300},
                              {129, 64, 1030}},
                             seed, Int8Layout::kRows16);
}

// VNNI's decode kernel (below kInt8Rows16TileMinRows rows on AVX512-VNNI; any m works).
TEST(LinearInt8, VnniRows16KernelEqualsThePortableOneBitForBit) {
  if (!internal::CpuHasAvx512Vnni()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  ExpectRows16KernelEqualsPortable(internal::Int8BlockAvx512VnniRows16, 540);
}

// The AVX2 kernel (x86-64 without AVX512-VNNI or AVX-VNNI, every row count).
TEST(LinearInt8, Avx2Rows16KernelEqualsThePortableOneBitForBit) {
  if (!internal::CpuHasAvx2Fma()) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  ExpectRows16KernelEqualsPortable(internal::Int8BlockAvx2Rows16, 640);
}

// The same loops on AVX-VNNI (vpdpbusd on 256 bits; the activation's group code sums too).
TEST(LinearInt8, AvxVnniRows16KernelEqualsThePortableOneBitForBit) {
  if (!internal::CpuHasAvxVnni()) GTEST_SKIP() << "this CPU has no AVX-VNNI";
  ExpectRows16KernelEqualsPortable(internal::Int8BlockAvxVnniRows16, 740);
}

// A RowSlice of kRows16 weights that starts inside a block (its first row at a non-zero lane,
// as mla.cc's per-head slices may) gives the rows the row-major slice gives, through every kernel
// (VNNI's decode kernel for m = 1 to 20, its tile kernel for m = 70, whose 4-row chunks then fall
// inside a block and across a block's edge; the AVX2 ones) and the portable one.
TEST(LinearInt8, Rows16RowSliceInsideABlock) {
  const int64_t n = 100, k = 200;
  const std::vector<float> wf = RandomVector(n * k, 95, 0.1f);
  const testing::Int8Matrix rows16 = QuantizeInt8(wf, n, k, Int8Layout::kRows16);
  const testing::Int8Matrix row_major = QuantizeInt8(wf, n, k);
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{5, 40}, {17, 3}, {31, 69}, {48, 35}}) {
    const Matrix a = rows16.view.RowSlice(begin, count);
    const Matrix b = row_major.view.RowSlice(begin, count);
    EXPECT_EQ(a.int8_row_phase, (begin % 16));
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t c = 0; c < k; c += 7) ASSERT_EQ(a.Int8Code(r, c), b.Int8Code(r, c));
      ASSERT_EQ(a.Int8Scale(r, 3), b.Int8Scale(r, 3));
    }
    for (int64_t m : {1, 3, 5, 20, 70}) {
      const std::vector<float> x = RandomVector(m * k, 96 + static_cast<uint32_t>(m));
      for (const char* kernels : {"native", "avx2", "avx_vnni", "generic"}) {
        std::vector<float> ya(m * count, NAN), yb(m * count, NAN);
        internal::ForceAvx2Kernels(std::strcmp(kernels, "avx2") == 0);
        internal::ForceAvxVnniKernels(std::strcmp(kernels, "avx_vnni") == 0);
        internal::ForceGenericKernels(std::strcmp(kernels, "generic") == 0);
        Linear(x.data(), m, a, nullptr, ya.data(), CpuMath::kBf16);
        Linear(x.data(), m, b, nullptr, yb.data(), CpuMath::kBf16);
        internal::ForceAvx2Kernels(false);
        internal::ForceAvxVnniKernels(false);
        internal::ForceGenericKernels(false);
        for (int64_t i = 0; i < m * count; ++i) {
          ASSERT_EQ(Bits(ya[i]), Bits(yb[i])) << "slice [" << begin << ", +" << count << ") m=" << m
                                              << " kernels=" << kernels << " " << i;
        }
      }
    }
  }
}

// The AVX2 kernel (so a machine with AVX512-VNNI checks it too): ragged K and N, partial 8-row
// chunks; m = 33 and 70 cross its 32-row activation blocks (the last one ragged and odd).
TEST(LinearInt8, Avx2KernelEqualsThePortableOneBitForBit) {
  if (!internal::CpuHasAvx2Fma()) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  ExpectKernelEqualsPortable(internal::Int8BlockAvx2, internal::Int8Operands::kGroups,
                             {{1, 1, 1},
                              {1, 9, 45},
                              {2, 33, 64},
                              {3, 40, 1030},
                              {5, 37, 2100},
                              {17, 70, 513},
                              {1, 35, 4096},
                              {4, 5, 4129},
                              {33, 9, 2100},
                              {70, 37, 4129}},
                             140);
}

// VNNI's kernel for decode-sized activations (lanes along K, the AVX2 kernel's driver): K at
// and around its 64-code units and 16-group blocks (a masked last unit, one group alone in it,
// the tail group), partial 8-row chunks; m = 33 crosses the 32-row activation blocks.
TEST(LinearInt8, VnniRowsKernelEqualsThePortableOneBitForBit) {
  if (!internal::CpuHasAvx512Vnni()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  ExpectKernelEqualsPortable(internal::Int8BlockAvx512VnniRows, internal::Int8Operands::kGroups,
                             {{1, 1, 1},
                              {1, 9, 31},
                              {1, 33, 32},
                              {2, 40, 33},
                              {3, 37, 63},
                              {1, 8, 64},
                              {1, 70, 65},
                              {2, 35, 96},
                              {1, 5, 511},
                              {3, 9, 512},
                              {1, 37, 513},
                              {1, 64, 1408},
                              {2, 31, 4129},
                              {33, 17, 1030}},
                             340);
}

// Every row of a batch of m equals that row run alone, bit for bit, on this machine's kernels,
// the AVX2 and AVX-VNNI ones and the portable one, in both layouts: a row alone runs a decode
// kernel (where VNNI exists: lanes along K below kInt8VnniMinRows rows for row-major weights, lanes
// along the weight rows below kInt8Rows16TileMinRows for kRows16), a batch the many-row one; the
// order depends on neither.
TEST(LinearInt8, BatchInvariance) {
  const int64_t n = 45, k = 2100;
  const std::vector<float> bias = RandomVector(n, 52);
  // (generic, avx2, avx_vnni, layout): the kernels of a CPU without AVX-512, with AVX2 alone
  // (ForceAvx2Kernels) or with AVX-VNNI too (ForceAvxVnniKernels).
  struct Case {
    bool generic, avx2, avx_vnni;
    Int8Layout layout;
  };
  for (const Case c : {Case{false, false, false, Int8Layout::kRowMajor},
                       {true, false, false, Int8Layout::kRowMajor},
                       {false, false, false, Int8Layout::kRows16},
                       {false, true, false, Int8Layout::kRowMajor},
                       {false, true, false, Int8Layout::kRows16},
                       {false, false, true, Int8Layout::kRows16}}) {
    const testing::Int8Matrix w = QuantizeInt8(RandomVector(n * k, 51, 0.05f), n, k, c.layout);
    internal::ForceAvx2Kernels(c.avx2);
    internal::ForceAvxVnniKernels(c.avx_vnni);
    for (int64_t m : {1, 3, 4, 16, 17, 63, 64, 128}) {
      const std::vector<float> x = RandomVector(m * k, 60 + static_cast<uint32_t>(m));
      const std::vector<float> all = RunLinear(x, m, w, bias.data(), c.generic);
      for (int64_t i = 0; i < m; i += (m > 20 ? 7 : 1)) {
        const std::vector<float> row(x.begin() + i * k, x.begin() + (i + 1) * k);
        const std::vector<float> alone = RunLinear(row, 1, w, bias.data(), c.generic);
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(alone[j], all[i * n + j]) << (c.generic    ? "generic"
                                                  : c.avx2     ? "avx2"
                                                  : c.avx_vnni ? "avx_vnni"
                                                               : "simd")
                                              << " rows16=" << (c.layout == Int8Layout::kRows16)
                                              << " m=" << m << " row " << i << " col " << j;
        }
      }
    }
    internal::ForceAvx2Kernels(false);
    internal::ForceAvxVnniKernels(false);
  }
}

// q, k and v share one activation (quantized once); each result is Linear's on its own.
TEST(LinearInt8, LinearManySharesTheActivation) {
  const int64_t m = 5, k = 300;
  const std::vector<float> x = RandomVector(m * k, 70);
  const testing::Int8Matrix a = QuantizeInt8(RandomVector(33 * k, 71, 0.1f), 33, k);
  const testing::Int8Matrix b = QuantizeInt8(RandomVector(8 * k, 72, 0.1f), 8, k);
  std::vector<float> ya(m * 33), yb(m * 8);
  const LinearJob jobs[] = {{x.data(), m, &a.view, nullptr, ya.data()},
                            {x.data(), m, &b.view, nullptr, yb.data()}};
  LinearMany(jobs, CpuMath::kBf16);
  EXPECT_EQ(ya, RunLinear(x, m, a, nullptr, false));
  EXPECT_EQ(yb, RunLinear(x, m, b, nullptr, false));
}

// A prefill's activation on the VNNI tiles runs a part of its rows at a time (linear.h,
// kPartBytes): 900 rows at K = 16,384 make parts of 384, 384 and 132 rows (none a multiple of
// the 32-row register tiles past the first), and every row gets the portable kernel's bits
// on the whole activation, bias included, across a ragged last block of weight rows.
TEST(LinearInt8, VnniTilesRunInPartsWithEachRowsBits) {
  if (!internal::CpuHasAvx512Vnni()) GTEST_SKIP() << "this CPU has no AVX512-VNNI";
  const int64_t m = 900, n = 40, k = 16384;
  const int64_t part = internal::ActivationPartRows(k + k / 32 * 4);
  ASSERT_LT(2 * part, m) << "the activation must cross two cuts";
  // An AMX-INT8 CPU runs this prompt on the tile unit instead (whole, no parts: the int8
  // mode never picks the VNNI tiles there), and is held to the same bits.
  ASSERT_EQ(internal::Int8OperandsFor(m, Int8Layout::kRowMajor),
            internal::CpuHasAmxInt8() ? internal::Int8Operands::kAmxTiles
                                      : internal::Int8Operands::kVnniTiles);
  const std::vector<float> x = RandomVector(m * k, 90);
  const std::vector<float> bias = RandomVector(n, 91);
  for (Int8Layout layout : {Int8Layout::kRowMajor, Int8Layout::kRows16}) {
    const testing::Int8Matrix w = QuantizeInt8(RandomVector(n * k, 92, 0.1f), n, k, layout);
    const std::vector<float> parts = RunLinear(x, m, w, bias.data(), false);
    const std::vector<float> whole = RunLinear(x, m, w, bias.data(), true);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_EQ(Bits(parts[i]), Bits(whole[i])) << "row " << i / n << " output " << i % n;
    }
  }
}

// LinearMany keeps its quantized activations' storage from call to call (on the thread): a
// call quantizes its own activations afresh even at the address, shape and operands of the
// last call's, and a smaller call after a larger one reads none of the larger one's rows.
TEST(LinearInt8, LinearManyQuantizesEachCallAfresh) {
  const int64_t k = 300;
  const testing::Int8Matrix w = QuantizeInt8(RandomVector(40 * k, 73, 0.1f), 40, k);
  std::vector<float> x(100 * k);
  uint32_t seed = 74;
  // m = 100 on the tiles (when this CPU has them), then 100 again with other values at the
  // same address, then 70 and 5 rows of it; the references after all four calls (they run
  // LinearMany too).
  const int64_t rows[] = {100, 100, 70, 5};
  std::vector<std::vector<float>> values, ys;
  for (int64_t m : rows) {
    values.push_back(RandomVector(m * k, seed++));
    std::copy(values.back().begin(), values.back().end(), x.begin());
    ys.emplace_back(m * 40, NAN);
    const LinearJob job{x.data(), m, &w.view, nullptr, ys.back().data()};
    LinearMany({&job, 1}, CpuMath::kBf16);
  }
  for (size_t i = 0; i < ys.size(); ++i) {
    // The portable kernel on the same values at another address.
    EXPECT_EQ(ys[i], RunLinear(values[i], rows[i], w, nullptr, true)) << "call " << i;
  }
}

// A non-finite activation poisons its own row's outputs (NaN), never another row's, and
// nothing crashes; both kernels agree.
TEST(LinearInt8, NonFiniteActivationGivesNanInItsRowOnly) {
  const int64_t m = 3, n = 6, k = 100;
  std::vector<float> x = RandomVector(m * k, 80);
  x[1 * k + 40] = INFINITY;
  const testing::Int8Matrix w = QuantizeInt8(RandomVector(n * k, 81, 0.1f), n, k);
  for (bool generic : {false, true}) {
    const std::vector<float> y = RunLinear(x, m, w, nullptr, generic);
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_TRUE(std::isnan(y[1 * n + j])) << j;
      EXPECT_TRUE(std::isfinite(y[0 * n + j])) << j;
      EXPECT_TRUE(std::isfinite(y[2 * n + j])) << j;
    }
  }
}

TEST(LinearInt8, QuantizedActivationLayout) {
  const int64_t k = 70;  // 3 groups, the last of 6; padded to 128
  std::vector<float> x = RandomVector(2 * k, 90);
  internal::Int8Activation a;
  internal::QuantizeActivationInt8(x.data(), 2, k, &a);
  ASSERT_EQ(a.kp, 128);
  ASSERT_EQ(a.q.size(), 2u * 128);
  ASSERT_EQ(a.group_scale.size(), 2u * 4);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t c = k; c < 128; ++c) EXPECT_EQ(a.q[i * 128 + c], 0);
    std::vector<int8_t> q(kInt8Group);
    const float s2 = QuantizeGroupInt8(x.data() + i * k + 64, 6, q.data());
    EXPECT_GT(s2, 0.0f);
    EXPECT_EQ(a.group_scale[i * 4 + 2], s2);
    EXPECT_EQ(a.group_scale[i * 4 + 3], 0.0f) << "the padded fourth group";
    for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(a.q[i * 128 + 64 + c], q[c]);
  }
}

// The tiles are packed only for the kernels that read them (AMX's, VNNI's: a 2,048-token MoE
// call's unread operands were once 150 MB of writes), and q and the group scales are the same
// whichever operands are asked. Int8OperandsFor asks for tiles only where their kernel runs.
TEST(LinearInt8, QuantizerFillsOnlyTheOperandsAsked) {
  const int64_t m = 3, k = 100;
  const std::vector<float> x = RandomVector(m * k, 91);
  internal::Int8Activation groups, vnni, amx;
  internal::QuantizeActivationInt8(x.data(), m, k, &groups);
  internal::QuantizeActivationInt8(x.data(), m, k, &vnni, internal::Int8Operands::kVnniTiles);
  internal::QuantizeActivationInt8(x.data(), m, k, &amx, internal::Int8Operands::kAmxTiles);
  EXPECT_TRUE(groups.tiles.empty() && groups.tile_scale.empty());
  EXPECT_EQ(groups.operands, internal::Int8Operands::kGroups);
  for (const internal::Int8Activation* a : {&vnni, &amx}) {
    EXPECT_EQ(a->tiles.size(), static_cast<size_t>(1 * 4 * 8 * 16));
    EXPECT_EQ(a->q, groups.q);
    EXPECT_EQ(a->group_scale, groups.group_scale);
  }
  EXPECT_EQ(vnni.operands, internal::Int8Operands::kVnniTiles);
  EXPECT_EQ(amx.operands, internal::Int8Operands::kAmxTiles);
  for (int64_t rows : {1, 3, 4, 15, 16, 63, 64, 100}) {
    const internal::Int8Operands want =
        internal::CpuHasAmxInt8() ? internal::Int8Operands::kAmxTiles
        : internal::CpuHasAvx512Vnni() && rows >= internal::kInt8VnniMinRows
            ? internal::Int8Operands::kVnniTiles
            : internal::Int8Operands::kGroups;
    EXPECT_EQ(internal::Int8OperandsFor(rows), want) << rows;
    // kRows16 weights: AMX reads the activation rows in place from a full tile; VNNI's tiles
    // from more rows; below either, VNNI's decode kernel on the groups.
    const internal::Int8Operands rows16 =
        internal::CpuHasAmxInt8() && rows >= internal::kInt8AmxRows16MinRows
            ? internal::Int8Operands::kAmxRows
        : !internal::CpuHasAmxInt8() && internal::CpuHasAvx512Vnni() &&
                rows >= internal::kInt8Rows16TileMinRows
            ? internal::Int8Operands::kVnniTiles
            : internal::Int8Operands::kGroups;
    EXPECT_EQ(internal::Int8OperandsFor(rows, Int8Layout::kRows16), rows16) << rows;
  }
}

// The kernels read the quantized activation as whole vectors, so its buffers start on cache
// lines (a buffer of this size from plain malloc sits 16 bytes off a line; every 64-byte load
// then splits, about 5% of the int8 prefill on a Zen 5 VM). Every operand form, a prefill's size.
TEST(LinearInt8, QuantizedActivationBuffersStartOnCacheLines) {
  const int64_t m = 300, k = 4096;
  const std::vector<float> x = RandomVector(m * k, 17);
  for (const internal::Int8Operands operands :
       {internal::Int8Operands::kGroups, internal::Int8Operands::kVnniTiles,
        internal::Int8Operands::kAmxTiles, internal::Int8Operands::kAmxRows}) {
    internal::Int8Activation a;
    internal::QuantizeActivationInt8(x.data(), m, k, &a, operands);
    auto on_line = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; };
    EXPECT_TRUE(on_line(a.q.data())) << static_cast<int>(operands);
    EXPECT_TRUE(on_line(a.group_scale.data())) << static_cast<int>(operands);
    if (!a.group_sum.empty()) {
      EXPECT_TRUE(on_line(a.group_sum.data())) << static_cast<int>(operands);
    }
    if (!a.tiles.empty()) {
      EXPECT_TRUE(on_line(a.tiles.data())) << static_cast<int>(operands);
      EXPECT_TRUE(on_line(a.tile_scale.data())) << static_cast<int>(operands);
    }
  }
}

// The activation quantizer, on AVX2 and portably, against QuantizeGroupInt8 (the definition)
// per group, bit for bit: ties of round-to-even (x / scale = n + 0.5 exactly), values at the
// clamp, signed zeros, an all-zero group, a denormal group, NaN and infinities (scale NaN,
// codes 0), and a ragged last group.
TEST(LinearInt8, ActivationQuantizerEqualsTheGroupDefinitionBitForBit) {
  const int64_t k = 32 * 9 + 7;  // nine full groups and a tail of 7
  const int64_t m = 4;
  std::vector<float> x = RandomVector(m * k, 92);
  // Row 0, group 0: amax 127 (scale 1): ties at +-0.5, 1.5, 2.5 and the extremes.
  const float ties[] = {0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, 126.5f, -127.0f, 127.0f, -0.0f};
  for (size_t i = 0; i < std::size(ties); ++i) x[i] = ties[i];
  std::fill_n(x.begin() + 32, 32, 0.0f);   // group 1: all zero
  std::fill_n(x.begin() + 64, 32, -0.0f);  // group 2: negative zeros
  for (int64_t i = 96; i < 128; ++i) x[i] = 1e-40f * static_cast<float>(i - 111);  // denormals
  x[k + 40] = NAN;                                                                 // row 1, group 1
  x[2 * k + 70] = INFINITY;                                                        // row 2, group 2
  x[3 * k + 32 * 9 + 3] = -INFINITY;  // row 3, the tail group
  x[3 * k + 10] = 3e38f;              // huge but finite
  const int64_t groups = (k + 63) / 64 * 64 / kInt8Group;
  for (bool generic : {false, true}) {
    internal::ForceGenericKernels(generic);
    internal::Int8Activation a;
    internal::QuantizeActivationInt8(x.data(), m, k, &a);
    internal::ForceGenericKernels(false);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = g * kInt8Group, n = std::clamp<int64_t>(k - begin, 0, kInt8Group);
        std::vector<int8_t> want(kInt8Group, 0);
        const float scale =
            n > 0 ? QuantizeGroupInt8(x.data() + i * k + begin, n, want.data()) : 0.0f;
        const float got = a.group_scale[i * groups + g];
        EXPECT_TRUE(std::isnan(scale) ? std::isnan(got) : got == scale)
            << "generic=" << generic << " row " << i << " group " << g;
        for (int64_t c = 0; c < kInt8Group; ++c) {
          ASSERT_EQ(a.q[i * a.kp + begin + c], want[c])
              << "generic=" << generic << " row " << i << " group " << g << " element " << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace glmserve
