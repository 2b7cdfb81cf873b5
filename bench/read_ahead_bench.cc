// Why the attentions read the next block ahead the way they do (RowsAhead / LinesAhead,
// core/cpu/ops/attention_items.h): one core reads a decode step's K and V rows in the order the
// attention does (KV head by KV head; each position's 128-dim bf16 head slice, 256 B, a whole
// KV row of 8 heads, 2 KiB, from the next; blocks of 64 positions), summing them and nothing
// else, with
//   none:   no prefetch (the hardware prefetchers do not follow the stride);
//   burst:  before each block, a prefetch of every line of the next block's rows;
//   spread: LinesAhead's lines of the next block, handed out four a row read (the attention
//           hands out one or two per step of its loops).
// Set against one core's streaming read (machine_limits.h's ReadBandwidth) in the same run.
//
//   build/bench/read_ahead_bench
//   build/bench/read_ahead_bench --positions=4096 --rounds=9
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/machine_limits.h"
#include "core/base/huge_pages.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/attention_items.h"

ABSL_FLAG(int, positions, 16384, "cached positions (64 MiB of K and V at 16,384)");
ABSL_FLAG(int, rounds, 5, "timed passes per mode (the median is shown)");

namespace {

using glmserve::bench::Clock;
using glmserve::bench::Median;
using glmserve::bench::Since;
using glmserve::internal::kPositionBlock;

constexpr int64_t kKvHeads = 8, kRowBytes = 256;  // GLM-4.5-Air's bf16 head slice
constexpr int64_t kKvRow = kKvHeads * kRowBytes;  // one position's K (or V) row

enum class Mode { kNone, kBurst, kSpread };

// One pass over every head's K then V rows; the sum keeps the reads alive.
uint64_t Pass(const uint8_t* cache, int64_t positions, Mode mode) {
  uint64_t sum = 0;
  glmserve::internal::RowsAhead rows_ahead;
  for (int64_t head = 0; head < kKvHeads; ++head) {
    for (int64_t kind = 0; kind < 2; ++kind) {
      const uint8_t* base = cache + kind * positions * kKvRow + head * kRowBytes;
      glmserve::internal::LinesAhead ahead;
      for (int64_t p0 = 0; p0 < positions; p0 += kPositionBlock) {
        const int64_t p1 = std::min(positions, p0 + kPositionBlock);
        const int64_t next_end = std::min(positions, p1 + kPositionBlock);
        if (mode == Mode::kBurst) {
          for (int64_t p = p1; p < next_end; ++p) {
            for (int64_t b = 0; b < kRowBytes; b += 64) __builtin_prefetch(base + p * kKvRow + b);
          }
        } else if (mode == Mode::kSpread) {
          rows_ahead.Clear();
          for (int64_t p = p1; p < next_end; ++p) rows_ahead.Add(base + p * kKvRow, kRowBytes);
          ahead = rows_ahead.lines();
        }
        for (int64_t p = p0; p < p1; ++p) {
          if (mode == Mode::kSpread) {
            for (int l = 0; l < 4; ++l) ahead.Prefetch();
          }
          uint64_t words[kRowBytes / 8];
          std::memcpy(words, base + p * kKvRow, kRowBytes);
          for (const uint64_t w : words) sum += w;
        }
      }
    }
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t positions = absl::GetFlag(FLAGS_positions);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  if (positions < 1) {
    std::fprintf(stderr, "--positions must be >= 1\n");
    return 1;
  }
  glmserve::SetNumThreads(1);
  const double read_gbs = glmserve::bench::ReadBandwidth(2);
  // K and V of every head, in huge pages as the KV cache has them.
  std::vector<uint8_t, glmserve::HugePageAllocator<uint8_t>> cache(2 * positions * kKvRow, 1);
  const double bytes = static_cast<double>(cache.size());
  std::printf(
      "one core; %lld positions x %lld KV heads of %lld B, K and V: %.0f MiB; streaming "
      "read %.1f GB/s\n\n",
      static_cast<long long>(positions), static_cast<long long>(kKvHeads),
      static_cast<long long>(kRowBytes), bytes / (1 << 20), read_gbs);
  std::printf("| prefetch | pass | read | of streaming |\n|---|---|---|---|\n");
  const std::pair<const char*, Mode> modes[] = {
      {"none", Mode::kNone}, {"burst", Mode::kBurst}, {"spread", Mode::kSpread}};
  for (const auto& [name, mode] : modes) {
    volatile uint64_t sink = Pass(cache.data(), positions, mode);  // warm-up
    std::vector<double> s;
    for (int r = 0; r < rounds; ++r) {
      const auto t = Clock::now();
      sink = sink + Pass(cache.data(), positions, mode);
      s.push_back(Since(t));
    }
    const double median = Median(s);
    std::printf("| %s | %.3f ms | %.1f GB/s | %.2f |\n", name, median * 1e3, bytes / median / 1e9,
                bytes / median / 1e9 / read_gbs);
  }
  return 0;
}
