// How the order of a decode kernel's weight reads sets their rate, with no arithmetic: rows of
// K bytes (contiguous, as a matrix's rows are) read one after another, or `--lockstep` rows at a
// time 32 bytes from each in turn (as the int8 AVX2 kernel read its 8-row chunks before
// linear_int8_rows.h). One thread, a buffer on huge pages as the engine's weights are.
//   build/bench/read_pattern_bench --rows_bytes=1408,4096 --mb=256
// Each cell: the best of --reps passes over the buffer, GB/s.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/int_list.h"
#include "bench/machine_limits.h"
#include "core/base/huge_pages.h"

ABSL_FLAG(std::string, rows_bytes, "1408,4096", "row lengths K in bytes (multiples of 32)");
ABSL_FLAG(int, lockstep, 8, "rows read in lockstep in the second pattern");
ABSL_FLAG(int, mb, 256, "buffer size in MiB (well past the last-level cache)");
ABSL_FLAG(int, reps, 5, "passes per cell; the best is printed");

namespace glmserve::bench {
namespace {

// Sums `rows` rows of k bytes from p, `lockstep` rows at a time, 32 bytes of each in turn (1:
// in order). Four 64-bit words per 32 bytes, kept in four sums the compiler may vectorize.
uint64_t SumRows(const uint64_t* p, int64_t rows, int64_t k, int64_t lockstep) {
  const int64_t words = k / 8;
  uint64_t s[4] = {0, 0, 0, 0};
  for (int64_t r0 = 0; r0 + lockstep <= rows; r0 += lockstep) {
    for (int64_t w = 0; w < words; w += 4) {
      for (int64_t c = 0; c < lockstep; ++c) {
        const uint64_t* q = p + (r0 + c) * words + w;
        for (int j = 0; j < 4; ++j) s[j] += q[j];
      }
    }
  }
  return s[0] + s[1] + s[2] + s[3];
}

int Main() {
  absl::StatusOr<std::vector<int>> ks =
      ParseIntList("rows_bytes", absl::GetFlag(FLAGS_rows_bytes), 32, 1 << 20);
  const int lockstep = absl::GetFlag(FLAGS_lockstep), mb = absl::GetFlag(FLAGS_mb);
  if (!ks.ok() || lockstep < 1 || lockstep > 64 || mb < 1 || mb > 65536) {
    std::fprintf(stderr, "bad flags: %s (--lockstep in [1, 64], --mb in [1, 65536])\n",
                 ks.status().ToString().c_str());
    return 2;
  }
  for (int k : *ks) {
    if (k % 32 != 0) {
      std::fprintf(stderr, "--rows_bytes: %d is not a multiple of 32\n", k);
      return 2;
    }
  }
  const size_t bytes = static_cast<size_t>(mb) << 20;
  std::vector<uint64_t, HugePageAllocator<uint64_t>> buffer(bytes / 8);
  std::memset(buffer.data(), 1, bytes);  // fault every page in before timing
  std::printf("one thread, %d MiB on huge pages; GB/s, best of %d\n\n", mb,
              absl::GetFlag(FLAGS_reps));
  std::printf("| row bytes | rows in order | %d rows in lockstep | lockstep / in order |\n",
              lockstep);
  std::printf("|---|---|---|---|\n");
  volatile uint64_t sink = 0;
  for (int k : *ks) {
    const int64_t rows = static_cast<int64_t>(bytes / k) / lockstep * lockstep;
    const double read = static_cast<double>(rows) * k;
    double gbs[2];
    for (int pattern = 0; pattern < 2; ++pattern) {
      const int64_t step = pattern == 0 ? 1 : lockstep;
      const double s = BestOf(absl::GetFlag(FLAGS_reps),
                              [&] { sink = sink + SumRows(buffer.data(), rows, k, step); });
      gbs[pattern] = read / s / 1e9;
    }
    std::printf("| %d | %.1f | %.1f | %.2f |\n", k, gbs[0], gbs[1], gbs[1] / gbs[0]);
  }
  return 0;
}

}  // namespace
}  // namespace glmserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return glmserve::bench::Main();
}
