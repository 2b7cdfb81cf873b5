// The device row scans for sampling (core/cuda/sampling.cu) against the CPU sampler's own
// scans (core/engine/sampler_scan.h), which they are to replace: the same ids and values, exactly,
// on rows built for the edges (ties everywhere, NaN, +-inf, -0 next to +0, all -inf, rows
// shorter than a block, k = 1, k = vocab, k = the maximum), and the per-row finite flags.
// Outputs are poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/device_memory.h"
#include "core/cuda/kernels.h"
#include "core/engine/sampler.h"
#include "core/engine/sampler_scan.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/cuda/device_buffers.h"

namespace glmserve::cuda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Rows {
  std::string name;
  int64_t vocab;
  std::vector<float> logits;  // [rows, vocab]
  int64_t count() const { return static_cast<int64_t>(logits.size()) / vocab; }
};

// Four rows of `vocab`: model-like, quantised (heavy ties), NaN / inf / signed zeros, all -inf.
Rows MakeRows(int64_t vocab, uint32_t seed) {
  Rows r{"vocab " + std::to_string(vocab), vocab, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(-2.0f, 2.5f);
  std::uniform_int_distribution<int64_t> id(0, vocab - 1);
  std::vector<float> row(vocab);
  for (float& x : row) x = bulk(rng);
  for (int i = 0; i < 20; ++i) row[id(rng)] = 9.0f + static_cast<float>(i % 5);
  r.logits.insert(r.logits.end(), row.begin(), row.end());
  for (float& x : row) x = std::round(bulk(rng));
  r.logits.insert(r.logits.end(), row.begin(), row.end());
  for (int64_t i = 0; i < vocab; ++i) {
    const int64_t m = i % 7;
    row[i] = m == 0   ? std::numeric_limits<float>::quiet_NaN()
             : m == 1 ? -kInf
             : m == 2 ? -0.0f
             : m == 3 ? 0.0f
                      : bulk(rng) - 10.0f;
  }
  if (vocab > 5) row[vocab / 2] = kInf;
  r.logits.insert(r.logits.end(), row.begin(), row.end());
  r.logits.insert(r.logits.end(), vocab, -kInf);
  return r;
}

// Each row's flag says whether all its values are finite (the model-like and quantised rows
// are; the NaN/inf and all -inf rows are not).
void ExpectFiniteFlags(const Rows& rows, const std::vector<int32_t>& flags) {
  for (int64_t r = 0; r < rows.count(); ++r) {
    bool finite = true;
    for (int64_t i = 0; i < rows.vocab; ++i)
      finite &= std::isfinite(rows.logits[r * rows.vocab + i]);
    EXPECT_EQ(flags[r], finite ? 1 : 0) << "row " << r;
  }
}

class CudaSampling : public ::testing::Test {
 protected:
  void SetUp() override { GLM_REQUIRE_CUDA_DEVICE(); }
};

TEST_F(CudaSampling, RowArgMaxEqualsTheCpuScanAndGreedy) {
  for (int64_t vocab : {1, 3, 255, 256, 257, 5000, 151552}) {
    const Rows rows = MakeRows(vocab, static_cast<uint32_t>(vocab));
    SCOPED_TRACE(rows.name);
    const int64_t n = rows.count();
    DeviceBuffer logits = Upload(rows.logits);
    DeviceBuffer ids = Poisoned<int32_t>(n), values = Poisoned<float>(n);
    DeviceBuffer finite = Poisoned<int32_t>(n);
    ASSERT_EQ(LaunchRowArgMax(logits.as<float>(), n, vocab, ids.as<int32_t>(), values.as<float>(),
                              finite.as<int32_t>(), nullptr),
              cudaSuccess);
    const std::vector<int32_t> got_ids = Download<int32_t>(ids, n);
    const std::vector<float> got_values = Download<float>(values, n);
    ExpectFiniteFlags(rows, Download<int32_t>(finite, n));
    for (int64_t r = 0; r < n; ++r) {
      const float* row = rows.logits.data() + r * vocab;
      const sampler_internal::FloatBest want =
          sampler_internal::ArgMaxRange(row, 0, static_cast<int32_t>(vocab));
      EXPECT_EQ(got_ids[r], want.id) << "row " << r;
      EXPECT_EQ(got_values[r], want.value) << "row " << r;
      // The CPU sampler's greedy token, penalty off.
      EXPECT_EQ(got_ids[r], SampleToken(absl::MakeConstSpan(row, vocab), SamplingParams{}, {}, 0,
                                        LogprobRequest{})
                                .token)
          << "row " << r;
    }
  }
}

TEST_F(CudaSampling, RowTopKEqualsTheCpuSelection) {
  struct Case {
    int64_t vocab;
    int k;
  };
  for (const Case c : {Case{1, 1}, Case{3, 3}, Case{3, 1}, Case{300, 2}, Case{300, 300},
                       Case{5000, 50}, Case{5000, 1024}, Case{151552, 1}, Case{151552, 64}}) {
    const Rows rows = MakeRows(c.vocab, static_cast<uint32_t>(c.vocab + c.k));
    SCOPED_TRACE(rows.name + ", k " + std::to_string(c.k));
    const int64_t n = rows.count();
    DeviceBuffer logits = Upload(rows.logits);
    DeviceBuffer ids = Poisoned<int32_t>(n * c.k), values = Poisoned<float>(n * c.k);
    DeviceBuffer finite = Poisoned<int32_t>(n);
    ASSERT_EQ(LaunchRowTopK(logits.as<float>(), n, c.vocab, c.k, ids.as<int32_t>(),
                            values.as<float>(), finite.as<int32_t>(), nullptr),
              cudaSuccess);
    ExpectFiniteFlags(rows, Download<int32_t>(finite, n));
    const std::vector<int32_t> got_ids = Download<int32_t>(ids, n * c.k);
    const std::vector<float> got_values = Download<float>(values, n * c.k);
    for (int64_t r = 0; r < n; ++r) {
      const float* row = rows.logits.data() + r * c.vocab;
      std::vector<std::pair<float, int32_t>> heap;
      sampler_internal::TopKFloat top(static_cast<size_t>(c.k), &heap);
      top.Scan(row, 0, static_cast<int32_t>(c.vocab));
      const std::vector<int32_t> want = top.TakeIds();  // ascending
      const std::vector<int32_t> got(got_ids.begin() + r * c.k, got_ids.begin() + (r + 1) * c.k);
      EXPECT_EQ(got, want) << "row " << r;
      for (int j = 0; j < c.k && j < static_cast<int>(want.size()); ++j) {
        const float x = row[want[j]];
        EXPECT_EQ(got_values[r * c.k + j], std::isnan(x) ? -kInf : x) << "row " << r << " " << j;
      }
    }
  }
}

TEST_F(CudaSampling, RowTopKRefusesAnImpossibleK) {
  DeviceBuffer logits = Upload(std::vector<float>(10, 1.0f));
  DeviceBuffer ids = Poisoned<int32_t>(2048), values = Poisoned<float>(2048);
  for (int k : {0, -1, 11, kMaxDeviceTopK + 1}) {
    EXPECT_EQ(LaunchRowTopK(logits.as<float>(), 1, 10, k, ids.as<int32_t>(), values.as<float>(),
                            nullptr, nullptr),
              cudaErrorInvalidValue)
        << k;
  }
}

}  // namespace
}  // namespace glmserve::cuda
