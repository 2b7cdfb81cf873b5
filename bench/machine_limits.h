// This machine's limits, measured in the bench's own run so that the kernels' figures can be
// read as fractions of them on shared, noisy machines: the fp32 FMA peak, the bf16
// dot-product (vdpbf16ps) peak, the AMX bf16 tile (TDPBF16PS) peak, the int8 dot-product
// (vpdpbusd) peak and the memory read bandwidth, all on the thread pool's
// threads (core/base/parallel.h), as the kernels run. The read ceiling is the best of a plain
// streaming sum (1, 2, 4, 8 streams per thread) and the engine's own decode-shaped kernels
// over a 1 GiB matrix (bf16 in the bf16 mode, int8): a kernel that streams faster than the
// plain sum shows that the sum was not the ceiling, so the ceiling is calibrated to it.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/base/parallel.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"

namespace glmserve::bench {

using Clock = std::chrono::steady_clock;
inline double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The upper median of v (0 for none): what the benches report of repeated timings.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Best of `reps` runs of fn, in seconds.
template <typename Fn>
double BestOf(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = Clock::now();
    fn();
    best = std::min(best, Since(t));
  }
  return best;
}

// 12 independent accumulators cover the FMA latency (4 cycles) times two pipes with room.
constexpr int kPeakAccumulators = 12;
constexpr int64_t kPeakIterations = int64_t{1} << 21;

// A horizontal sum of the accumulators, so that the loops are not optimised away (stored and
// added in scalar: GCC 12's reduce intrinsics raise false -Wuninitialized warnings).
__attribute__((target("avx512f"))) inline float Sum(const __m512* acc) {
  alignas(64) float lanes[16];
  float total = 0;
  for (int i = 0; i < kPeakAccumulators; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    for (float v : lanes) total += v;
  }
  return total;
}

__attribute__((target("avx512f"))) inline float FmaLoop(float seed) {
  __m512 acc[kPeakAccumulators];
  for (int i = 0; i < kPeakAccumulators; ++i) acc[i] = _mm512_set1_ps(seed * i);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < kPeakIterations; ++it) {
    for (int i = 0; i < kPeakAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  return Sum(acc);
}

// The same on AVX2 + FMA (8 lanes): the exact kernel's peak on x86-64 without AVX-512.
__attribute__((target("avx2,fma"))) inline float FmaLoopAvx2(float seed) {
  __m256 acc[kPeakAccumulators];
  for (int i = 0; i < kPeakAccumulators; ++i) acc[i] = _mm256_set1_ps(seed * i);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < kPeakIterations; ++it) {
    for (int i = 0; i < kPeakAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  alignas(32) float lanes[8];
  float total = 0;
  for (int i = 0; i < kPeakAccumulators; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float v : lanes) total += v;
  }
  return total;
}

__attribute__((target("avx512f,avx512bf16"))) inline float DpBf16Loop(float seed) {
  __m512 acc[kPeakAccumulators];
  for (int i = 0; i < kPeakAccumulators; ++i) acc[i] = _mm512_set1_ps(seed * i);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  for (int64_t it = 0; it < kPeakIterations; ++it) {
    for (int i = 0; i < kPeakAccumulators; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  return Sum(acc);
}

__attribute__((target("avx512f,avx512vnni"))) inline float DpBusdLoop(float seed) {
  __m512i acc[kPeakAccumulators];
  for (int i = 0; i < kPeakAccumulators; ++i)
    acc[i] = _mm512_set1_epi32(static_cast<int>(seed) + i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < kPeakIterations; ++it) {
    for (int i = 0; i < kPeakAccumulators; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  // Summed in scalar (GCC 12's 512-bit conversion intrinsics raise false -Wuninitialized).
  alignas(64) int32_t lanes[16];
  float total = 0;
  for (int i = 0; i < kPeakAccumulators; ++i) {
    _mm512_store_si512(lanes, acc[i]);
    for (int32_t v : lanes) total += static_cast<float>(v);
  }
  return total;
}

// GFLOP/s of `loop` (flops_per_op per instruction) on every pool thread; 0 if unsupported.
template <typename Loop>
double PeakGflops(Loop loop, double flops_per_op) {
  const int64_t chunks = 4 * NumThreads();
  std::atomic<int64_t> sink{0};
  const double s = BestOf(3, [&] {
    ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) sink += static_cast<int64_t>(loop(static_cast<float>(c)));
    });
  });
  return chunks * kPeakIterations * kPeakAccumulators * flops_per_op / s / 1e9;
}

// fp32 FMA peak: 16 lanes x 2 flops per vfmadd (8 lanes on AVX2 + FMA); 0 with neither.
inline double FmaPeakGflops() {
  if (__builtin_cpu_supports("avx512f")) return PeakGflops(FmaLoop, 32.0);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return PeakGflops(FmaLoopAvx2, 16.0);
  }
  return 0;
}
// bf16 dot-product peak: 16 lanes x 2 products x 2 flops per vdpbf16ps.
inline double Bf16DotPeakGflops() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return 0;
  return PeakGflops(DpBf16Loop, 64.0);
}

// AMX: four C tiles in registers, two A and two B tiles loaded once (from L1), then only
// TDPBF16PS, each 16 x 16 outputs x 32 products x 2 flops; the tile configuration is per
// thread, so each chunk loads and releases it (as the kernel does). Eight 16 x 64-byte tiles.
inline const internal::AmxTileConfig& AmxPeakConfig() {
  static const internal::AmxTileConfig config = [] {
    internal::AmxTileConfig c;
    std::fill_n(c.colsb, 8, uint16_t{64});
    std::fill_n(c.rows, 8, uint8_t{16});
    return c;
  }();
  return config;
}
constexpr int64_t kAmxPeakIterations = int64_t{1} << 17;
__attribute__((target("amx-tile,amx-bf16"))) inline float AmxLoop(float seed) {
  alignas(64) uint16_t a[512], b[512];
  alignas(64) float c[256];
  for (int i = 0; i < 512; ++i) a[i] = b[i] = 0x3a83;  // ~1e-3 in bf16
  _tile_loadconfig(&AmxPeakConfig());
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  for (int64_t it = 0; it < kAmxPeakIterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0] + seed;
}

// A tile loop's rate on every pool thread: `ops` per tile product, 4 products per iteration.
inline double AmxLoopRate(float (*loop)(float), double ops) {
  const int64_t chunks = 4 * NumThreads();
  std::atomic<int64_t> sink{0};
  const double s = BestOf(3, [&] {
    ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) sink += static_cast<int64_t>(loop(static_cast<float>(c)));
    });
  });
  return chunks * kAmxPeakIterations * 4 * ops / s / 1e9;
}

// TDPBF16PS peak in GFLOP/s on every pool thread; 0 without usable AMX.
inline double AmxBf16PeakGflops() {
  return internal::CpuHasAmx() ? AmxLoopRate(AmxLoop, 16.0 * 16 * 32 * 2) : 0;
}

// TDPBSSD with whole 16 x 64-byte tiles in registers (the same configuration as AmxLoop).
__attribute__((target("amx-tile,amx-int8"))) inline float AmxInt8Loop(float seed) {
  alignas(64) int8_t a[1024], b[1024];
  alignas(64) int32_t c[256];
  for (int i = 0; i < 1024; ++i) a[i] = b[i] = static_cast<int8_t>(i % 7 - 3);
  _tile_loadconfig(&AmxPeakConfig());
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  for (int64_t it = 0; it < kAmxPeakIterations; ++it) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return static_cast<float>(c[0]) + seed;
}

// TDPBSSD peak in GOP/s (16 x 16 x 64 products, 2 ops each) on every pool thread; 0 without
// usable AMX-INT8. The int8 kernel runs 32-wide K tiles (one group each) and scales every
// group's dots on the vector unit, so a fraction of this is its practical ceiling.
inline double AmxInt8PeakGops() {
  return internal::CpuHasAmxInt8() ? AmxLoopRate(AmxInt8Loop, 16.0 * 16 * 64 * 2) : 0;
}

// int8 dot-product peak (GOP/s): 16 lanes x 4 products x 2 ops per vpdpbusd. The VNNI int8
// kernel spends 12 instructions per 8 vpdpbusd (a group: the start, a conversion, the scale
// product and an FMA beside them), so about two thirds of this is its practical ceiling.
inline double Int8DotPeakGops() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni")) return 0;
  return PeakGflops(DpBusdLoop, 128.0);
}

// Sums `streams` equal parts of [b, e) in lockstep, 64 bytes of each per iteration: several
// independent sequential streams per thread, as the linear kernels read 4 weight rows at once.
__attribute__((target("avx512f"))) inline uint64_t SumStreams(const uint64_t* p, int64_t b,
                                                              int64_t e, int streams) {
  const int64_t len = (e - b) / streams / 8 * 8;
  __m512i acc[8];
  for (int s = 0; s < 8; ++s) acc[s] = _mm512_setzero_si512();
  for (int64_t i = 0; i < len; i += 8) {
    for (int s = 0; s < streams; ++s) {
      acc[s] = _mm512_add_epi64(acc[s], _mm512_loadu_si512(p + b + s * len + i));
    }
  }
  uint64_t total = 0;
  alignas(64) uint64_t lanes[8];
  for (int s = 0; s < streams; ++s) {
    _mm512_store_si512(lanes, acc[s]);
    for (uint64_t v : lanes) total += v;
  }
  return total;
}

// Read bandwidth in GB/s: the pool's threads stream a 1 GiB buffer (far beyond the caches)
// with `streams` streams per thread, best of 5. Portable 64-bit sums without AVX-512.
inline double ReadBandwidth(int streams) {
  const int64_t n = (int64_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buffer(n, 1);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  std::atomic<uint64_t> total{0};
  const int64_t grain = n / (8 * NumThreads());
  const double s = BestOf(5, [&] {
    ParallelFor(n, grain, [&](int64_t b, int64_t e) {
      if (avx512) {
        total += SumStreams(buffer.data(), b, e, streams);
      } else {
        uint64_t acc = 0;
        for (int64_t i = b; i < e; ++i) acc += buffer[i];
        total += acc;
      }
    });
  });
  if (total.load() == 0) std::abort();  // keeps the sums alive
  return n * sizeof(uint64_t) / s / 1e9;
}

// GB/s of weights that Linear reads at m = 1 (a decode step's shape) over a 1 GiB matrix of
// 8192 columns, best of 5: bf16 weights in `math` (int8 = false) or int8 weights with their
// scales (int8 = true), in the layout QuantizeWeights would give them on this CPU (every code
// and scale the same value, so the bytes are those of either layout: rows and K are whole
// blocks and groups).
inline double KernelReadBandwidth(bool int8, CpuMath math = CpuMath::kBf16) {
  const int64_t k = 8192, rows = (int64_t{1} << 30) / k / (int8 ? 1 : 2);
  std::vector<float> x(k, 0.5f), y(rows);
  std::vector<uint16_t> wb;
  std::vector<int8_t> wq;
  std::vector<uint16_t> scales;
  Matrix w;
  if (int8) {
    wq.assign(rows * k, 3);
    scales.assign(rows * (k / kInt8Group), FloatToBf16(0.01f));
    w = Matrix{DType::kBF16, rows, k, wq.data(), WeightFormat::kInt8Groups};
    w.group_scales = scales.data();
    w.int8_layout = Int8LayoutForThisCpu();
  } else {
    wb.assign(rows * k, FloatToBf16(0.01f));
    w = Matrix{DType::kBF16, rows, k, wb.data()};
  }
  const double s = BestOf(5, [&] { Linear(x.data(), 1, w, nullptr, y.data(), math); });
  if (y[0] != y[rows - 1]) std::abort();  // keeps the results alive
  return w.bytes() / s / 1e9;
}

struct MachineLimits {
  double fma_gflops = 0;     // fp32 FMA peak
  double bf16_gflops = 0;    // vdpbf16ps peak (0: no AVX512_BF16)
  double amx_gflops = 0;     // TDPBF16PS peak (0: no usable AMX)
  double int8_gops = 0;      // vpdpbusd peak (0: no AVX512_VNNI)
  double amx_int8_gops = 0;  // TDPBSSD peak (0: no usable AMX-INT8)
  double read_gbs = 0;       // the read ceiling: the best of the figures below
  int read_best_streams = 0;
  double read_sum_gbs = 0;  // best plain streaming sum over 1, 2, 4 and 8 streams per thread
  double read_one_stream_gbs = 0;
  double read_bf16_kernel_gbs = 0;   // KernelReadBandwidth(false)
  double read_exact_kernel_gbs = 0;  // KernelReadBandwidth(false, CpuMath::kExact)
  double read_int8_kernel_gbs = 0;   // KernelReadBandwidth(true)
};

inline MachineLimits MeasureMachine() {
  MachineLimits m;
  m.fma_gflops = FmaPeakGflops();
  m.bf16_gflops = Bf16DotPeakGflops();
  m.amx_gflops = AmxBf16PeakGflops();
  m.int8_gops = Int8DotPeakGops();
  m.amx_int8_gops = AmxInt8PeakGops();
  for (int streams : {1, 2, 4, 8}) {
    const double gbs = ReadBandwidth(streams);
    if (streams == 1) m.read_one_stream_gbs = gbs;
    if (gbs > m.read_sum_gbs) {
      m.read_sum_gbs = gbs;
      m.read_best_streams = streams;
    }
  }
  m.read_bf16_kernel_gbs = KernelReadBandwidth(false);
  m.read_exact_kernel_gbs = KernelReadBandwidth(false, CpuMath::kExact);
  m.read_int8_kernel_gbs = KernelReadBandwidth(true);
  m.read_gbs = std::max(
      {m.read_sum_gbs, m.read_bf16_kernel_gbs, m.read_exact_kernel_gbs, m.read_int8_kernel_gbs});
  return m;
}

}  // namespace glmserve::bench
