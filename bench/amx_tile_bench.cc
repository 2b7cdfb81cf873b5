// The AMX tile unit on this machine, in short slices on one thread (run by hand, not in CI):
//  1. the TDPBF16PS rate with the operands in registers, slice by slice: its spread says how
//     steady the unit is (on the 2-vCPU VM of docs/performance.md it jumps between ~1.0 and
//     ~2.7 TFLOP/s within milliseconds, whatever this process does, so every AMX figure there
//     is a same-run ratio);
//  2. the kernel's inner step, 2 A + 2 B tile loads from L1 per 4 TDPBF16PS, with the tiles
//     on cache lines and shifted off them by 16 and 32 bytes: each slice's rate over the
//     register-only slice run just before it, medians. Why the kernels keep their tile
//     operands on cache lines (core/base/aligned_vector.h).
//  3. the same step fed from each level of the memory below L1, in the patterns the bf16
//     GEMM (linear_amx.cc) runs, beside this core's plain read rate from that level: the
//     ceilings behind issue 28's first target (docs/performance.md, "On the AMX Xeon again:
//     the tile unit's feed level by level").
//   build/bench/amx_tile_bench --slices=200 [--feed_rounds=5]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/machine_limits.h"
#include "core/base/aligned_vector.h"
#include "core/cpu/ops/linear_amx.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

ABSL_FLAG(int, slices, 200, "slices per measurement (each ~0.1-0.5 ms)");
ABSL_FLAG(int, feed_rounds, 5, "runs of each feed pattern (the median is shown; 0: skip them)");

namespace {

using glmserve::AlignedVector;
using glmserve::bench::Median;

constexpr int64_t kIterations = 2048;  // per slice; 4 TDPBF16PS each
constexpr double kFlopsPerTdp = 16.0 * 16 * 32 * 2;

#if defined(__x86_64__)

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// One slice: GFLOP/s of kIterations x 4 TDPBF16PS, reloading the 4 input tiles from `tiles`
// (4 KiB at any offset) each iteration when `load`, else from registers.
__attribute__((target("amx-tile,amx-bf16"))) double Slice(const uint16_t* tiles, bool load) {
  _tile_loadd(4, tiles, 64);
  _tile_loadd(5, tiles + 512, 64);
  _tile_loadd(6, tiles + 1024, 64);
  _tile_loadd(7, tiles + 1536, 64);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kIterations; ++i) {
    if (load) {
      _tile_loadd(4, tiles, 64);
      _tile_loadd(5, tiles + 512, 64);
      _tile_loadd(6, tiles + 1024, 64);
      _tile_loadd(7, tiles + 1536, 64);
    }
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[256];
  _tile_stored(0, c, 64);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return kIterations * 4 * kFlopsPerTdp / s / 1e9 + 0 * c[0];
}

// --- 3. The 2 x 2 step fed from L2, L3 and memory ----------------------------------------
//
// The bf16 GEMM's step: C tiles 0-3 over K = kFeedK, A tiles 4, 5 = 32 weight rows read in
// place (row-major, a row every kFeedK elements), B tiles 6, 7 = an activation pair packed as
// tiles (1 KiB per chunk, a tile's chunks in order). A unit is kFeedGroup such 32-row blocks
// (1 MiB of weights); it takes the activation rows in slabs of kFeedSlab, each slab through
// every block (linear_amx.cc's AmxUnitOn, without its K ranges and stores).
constexpr int64_t kFeedK = 4096, kFeedChunks = kFeedK / 32, kFeedGroup = 4, kFeedSlab = 64;
constexpr int64_t kFeedUnitElems = kFeedGroup * 32 * kFeedK;  // 1 MiB of bf16

// One unit: weights w (kFeedUnitElems), activation rows [0, m) of the packed b; `pin` keeps
// every slab on the first one (its rows stay in L2). Returns the products run.
__attribute__((target("amx-tile,amx-bf16"))) int64_t FeedUnit(const uint16_t* w, const uint16_t* b,
                                                              int64_t m, bool pin) {
  int64_t products = 0;
  for (int64_t s0 = 0; s0 < m; s0 += kFeedSlab) {
    for (int64_t g = 0; g < kFeedGroup; ++g) {
      const uint16_t* a0 = w + g * 32 * kFeedK;
      const uint16_t* a1 = a0 + 16 * kFeedK;
      for (int64_t p = 0; p < std::min(kFeedSlab, m - s0); p += 32) {
        const uint16_t* b0 = b + ((pin ? 0 : s0) + p) * kFeedK;
        const uint16_t* b1 = b0 + 16 * kFeedK;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kc = 0; kc < kFeedChunks; ++kc) {
          _tile_loadd(4, a0 + kc * 32, kFeedK * 2);
          _tile_loadd(5, a1 + kc * 32, kFeedK * 2);
          _tile_loadd(6, b0 + kc * 512, 64);
          _tile_loadd(7, b1 + kc * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        alignas(64) static float c[256];
        _tile_stored(0, c, 64);
        products += 4 * kFeedChunks;
      }
    }
  }
  return products;
}

// This core's plain read rate over n bytes (machine_limits.h's SumStreams, 4 streams), GB/s,
// the best of rounds.
double ReadRate(const uint8_t* p, int64_t n, int rounds) {
  const uint64_t* words = reinterpret_cast<const uint64_t*>(p);
  const int64_t passes = std::max<int64_t>(1, (int64_t{256} << 20) / n);
  double best = 0;
  uint64_t total = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = glmserve::bench::Clock::now();
    for (int64_t pass = 0; pass < passes; ++pass) {
      asm volatile("" ::: "memory");  // each pass reads again (the sum is the same each time)
      total += glmserve::bench::SumStreams(words, 0, n / 8, 4);
    }
    best = std::max(best, passes * n / glmserve::bench::Since(t0) / 1e9);
  }
  if (total == 0) std::abort();  // keeps the sums alive (the buffers are never zero)
  return best;
}

// The step's rate from each level: the median of rounds, over the register-only rate.
void FeedTable(const uint16_t* tiles, int rounds) {
  constexpr int64_t kPrompt = 2048, kExpertRows = 128, kExpertUnits = 32;
  // 1 GiB of weights: each round's experts take fresh units from its start, which the fill of
  // the rest pushed out of the caches (this VM's L3 reads 480 MiB in lscpu).
  constexpr int64_t kWeightUnits = 1024;
  AlignedVector<uint16_t> weights(kWeightUnits * kFeedUnitElems, uint16_t{0x3a83});
  AlignedVector<uint16_t> acts(kPrompt * kFeedK, uint16_t{0x3a83});
  const auto bytes = [](const uint16_t* p) { return reinterpret_cast<const uint8_t*>(p); };
  struct Pattern {
    const char* level;
    const char* what;
    bool experts;      // fresh units of kExpertRows rows, else one unit over the prompt 20 times
    bool pin;          // every slab is the first one (it stays in L2)
    double far_bytes;  // operand bytes per product from below L2 (of the step's 1 KiB)
    const uint8_t* read_base;  // where the plain read rate is measured, and how much of it
    int64_t read_bytes;
  };
  // A unit's first block over each slab reads that slab from below L2: 512 KiB per 4,096
  // products (512 / kFeedGroup bytes a product). An expert's first pair over each block reads
  // the block from memory: 1 MiB per 8,192 products (128 bytes a product); its activation rows
  // stay in L2 here (in the model they are another expert's each time: an optimistic case).
  const Pattern patterns[] = {
      {"L2", "a unit after its first pass: 1 MiB of weights, the same 64-row slab", false, true, 0,
       bytes(weights.data()), kFeedUnitElems * 2},
      {"L3", "a unit over a 2,048-row prompt: each 64-row slab from L3, used by 4 blocks", false,
       false, 512.0 / kFeedGroup, bytes(acts.data()), kPrompt * kFeedK * 2},
      {"memory", "experts: fresh 1 MiB units of weights, 128 rows each", true, false, 128,
       bytes(weights.data()), kWeightUnits * kFeedUnitElems * 2},
  };
  const double ref_rate = [&] {
    std::vector<double> r;
    for (int s = 0; s < 50; ++s) r.push_back(Slice(tiles, false));
    return Median(r);
  }();
  std::printf(
      "\n| 2 x 2 step fed from | pattern | GFLOP/s | of the register rate | operand GB/s in all "
      "/ from below L2 | this core's plain read rate there |\n|---|---|---|---|---|---|\n");
  for (const Pattern& pat : patterns) {
    std::vector<double> rates;
    for (int r = 0; r < rounds; ++r) {
      int64_t products = 0;
      const auto t0 = glmserve::bench::Clock::now();
      if (pat.experts) {
        for (int64_t u = r * kExpertUnits; u < (r + 1) * kExpertUnits; ++u) {
          const int64_t unit = u % kWeightUnits;
          products +=
              FeedUnit(weights.data() + unit * kFeedUnitElems, acts.data(), kExpertRows, pat.pin);
        }
      } else {
        for (int rep = 0; rep < 20; ++rep) {
          products += FeedUnit(weights.data(), acts.data(), kPrompt, pat.pin);
        }
      }
      rates.push_back(products * kFlopsPerTdp / glmserve::bench::Since(t0) / 1e9);
    }
    const double rate = Median(rates), products_per_s = rate * 1e9 / kFlopsPerTdp;
    std::printf("| %s | %s | %.0f | %.2f | %.0f / %.1f | %.1f GB/s |\n", pat.level, pat.what, rate,
                rate / ref_rate, products_per_s * 1024 / 1e9, products_per_s * pat.far_bytes / 1e9,
                ReadRate(pat.read_base, pat.read_bytes, 3));
  }
  std::printf("(register-only rate of this run: %.0f GFLOP/s)\n", ref_rate);
}

__attribute__((target("amx-tile,amx-bf16"))) int Run() {
  static const TileConfig config;
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  // 4 tiles plus room to shift them; small bf16 values (no overflow over the slices).
  alignas(64) static uint16_t buffer[4 * 512 + 64];
  std::fill(std::begin(buffer), std::end(buffer), uint16_t{0x3a83});
  const int slices = std::max(1, absl::GetFlag(FLAGS_slices));

  std::vector<double> alone;
  for (int s = 0; s < slices; ++s) alone.push_back(Slice(buffer, false));
  std::vector<double> sorted = alone;
  std::sort(sorted.begin(), sorted.end());
  const double best = sorted.back();
  const auto near_best =
      std::count_if(alone.begin(), alone.end(), [&](double g) { return g >= 0.8 * best; });
  std::printf(
      "TDPBF16PS, operands in registers, %d slices of %lld x 4 on one thread: min %.0f, "
      "median %.0f, max %.0f GFLOP/s; %.0f%% of slices within 0.8 of the max\n",
      slices, static_cast<long long>(kIterations), sorted.front(), Median(alone), best,
      100.0 * near_best / slices);

  std::printf(
      "\n| tile loads from L1 (2 A + 2 B per 4 products) | median of slice / register-only slice "
      "before it |\n|---|---|\n");
  for (int shift : {0, 16, 32}) {
    const uint16_t* tiles = buffer + shift / 2;
    std::vector<double> ratio;
    for (int s = 0; s < slices; ++s) {
      const double ref = Slice(buffer, false);
      ratio.push_back(Slice(tiles, true) / ref);
    }
    std::printf("| %s (%d bytes past a cache line) | %.2f |\n",
                shift == 0 ? "aligned" : "misaligned", shift, Median(ratio));
  }
  if (absl::GetFlag(FLAGS_feed_rounds) > 0) FeedTable(buffer, absl::GetFlag(FLAGS_feed_rounds));
  _tile_release();
  return 0;
}

#endif

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
#if defined(__x86_64__)
  if (glmserve::internal::AmxPermitted()) return Run();
#endif
  std::printf(
      "no usable AMX-BF16 here (CPU, or the OS refused the tile state): nothing to measure\n");
  return 0;
}
