// The AMX tile unit on this machine, in short slices on one thread (run by hand, not in CI):
//  1. the TDPBF16PS rate with the operands in registers, slice by slice: its spread says how
//     steady the unit is (on the 2-vCPU VM of docs/performance.md it jumps between ~1.0 and
//     ~2.7 TFLOP/s within milliseconds, whatever this process does, so every AMX figure there
//     is a same-run ratio);
//  2. the kernel's inner step, 2 A + 2 B tile loads from L1 per 4 TDPBF16PS, with the tiles
//     on cache lines and shifted off them by 16 and 32 bytes: each slice's rate over the
//     register-only slice run just before it, medians. Why the kernels keep their tile
//     operands on cache lines (core/base/aligned_vector.h).
//   build/bench/amx_tile_bench --slices=200
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/machine_limits.h"
#include "core/cpu/ops/linear_amx.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

ABSL_FLAG(int, slices, 200, "slices per measurement (each ~0.1-0.5 ms)");

namespace {

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
