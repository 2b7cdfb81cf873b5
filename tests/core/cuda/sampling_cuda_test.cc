// The device row scans for sampling (core/cuda/sampling.cu) against the CPU sampler's own
// scans (core/engine/sampler_scan.h), which they are to replace: the same ids and values, exactly,
// on rows built for the edges (ties everywhere, NaN, +-inf, -0 next to +0, all -inf, rows
// shorter than a block, k = 1, k = vocab, k = the maximum), and the per-row finite flags.
// And the device sampler (core/cuda/row_sample.cu) against SampleToken: the same token on the
// sampler's hard cases (tests/core/engine/sampler_cases.h), draw for draw, and frequencies that
// match the softmax. Outputs are poisoned first.
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
#include "tests/core/engine/sampler_cases.h"

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

// What a LaunchRowSample launch gave back per row.
struct DeviceDraws {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;     // [rows, kMaxRowTopLogprobs]
  std::vector<float> top_logprobs;  // [rows, kMaxRowTopLogprobs]
};

// One launch of LaunchRowSample over `logits` rows, each with its params, history and token
// index, and (where `want` / `forced` have entries) its logprob request and forced token;
// checks the finite flags.
DeviceDraws DeviceSampleFull(const std::vector<const std::vector<float>*>& rows,
                             const std::vector<SamplingParams>& params,
                             const std::vector<const std::vector<int32_t>*>& histories,
                             const std::vector<uint64_t>& indices, int32_t columns,
                             const std::vector<LogprobRequest>& want,
                             const std::vector<int32_t>& forced) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t vocab = static_cast<int64_t>(rows[0]->size());
  std::vector<float> logits;
  std::vector<samplemath::RowSampling> specs;
  std::vector<int32_t> penalised;
  for (int64_t r = 0; r < n; ++r) {
    logits.insert(logits.end(), rows[r]->begin(), rows[r]->end());
    const SamplingParams& p = params[r];
    const std::vector<int32_t> ids = PenalisedIds(p, *histories[r], columns > 0 ? columns : vocab);
    samplemath::RowSampling spec = RowSamplingFor(p, indices[r]);
    spec.columns = columns;
    if (!want.empty()) {
      spec.logprob = want[r].chosen || want[r].top > 0;
      spec.top_logprobs = want[r].top;
    }
    if (!forced.empty()) spec.forced = forced[r];
    spec.penalised_begin = static_cast<int32_t>(penalised.size());
    spec.penalised_count = static_cast<int32_t>(ids.size());
    penalised.insert(penalised.end(), ids.begin(), ids.end());
    specs.push_back(spec);
  }
  DeviceBuffer d_logits = Upload(logits), d_specs = Upload(specs), d_pen = Upload(penalised);
  const int64_t k = samplemath::kMaxRowTopLogprobs;
  DeviceBuffer tokens = Poisoned<int32_t>(n), finite = Poisoned<int32_t>(n);
  DeviceBuffer logprobs = Poisoned<float>(n), top_ids = Poisoned<int32_t>(n * k),
               top_logprobs = Poisoned<float>(n * k);
  EXPECT_EQ(LaunchRowSample(d_logits.as<float>(), n, vocab, d_specs.as<samplemath::RowSampling>(),
                            d_pen.as<int32_t>(), tokens.as<int32_t>(), finite.as<int32_t>(),
                            logprobs.as<float>(), top_ids.as<int32_t>(), top_logprobs.as<float>(),
                            nullptr),
            cudaSuccess);
  const std::vector<int32_t> flags = Download<int32_t>(finite, n);
  for (int64_t r = 0; r < n; ++r) {
    bool all = true;
    for (float x : *rows[r]) all &= std::isfinite(x);
    EXPECT_EQ(flags[r], all ? 1 : 0) << "row " << r;
  }
  return {Download<int32_t>(tokens, n), Download<float>(logprobs, n),
          Download<int32_t>(top_ids, n * k), Download<float>(top_logprobs, n * k)};
}

std::vector<int32_t> DeviceSample(const std::vector<const std::vector<float>*>& rows,
                                  const std::vector<SamplingParams>& params,
                                  const std::vector<const std::vector<int32_t>*>& histories,
                                  const std::vector<uint64_t>& indices, int32_t columns = 0) {
  return DeviceSampleFull(rows, params, histories, indices, columns, {}, {}).tokens;
}

// Logprobs from the device and the host differ only by float64 rounding (another summation
// order, DetExp against the C library's exp): equal as floats up to a couple of ulps.
void ExpectLogprobNear(float got, float want, const std::string& what) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, 4e-7f * std::max(1.0f, std::abs(want))) << what;
  }
}

std::string Describe(const SamplingParams& p) {
  return "T=" + std::to_string(p.temperature) + " k=" + std::to_string(p.top_k) +
         " top_p=" + std::to_string(p.top_p) + " min_p=" + std::to_string(p.min_p) +
         " penalty=" + std::to_string(p.repetition_penalty);
}

// Every (row, setting) of the sampler's hard cases, `draws` token indices each, in one launch:
// the device's token must be SampleToken's.
// With `columns` > 0 every row is sampled from its first `columns` ids (the host sees that
// span), as GenerateRequest::sample_vocab_limit asks.
void ExpectDeviceEqualsHost(int vocab, int draws, size_t max_settings, int32_t columns = 0) {
  const std::vector<sampler_cases::Row> cases = sampler_cases::Rows(vocab);
  std::vector<SamplingParams> settings = sampler_cases::Settings(vocab);
  if (settings.size() > max_settings) {
    // An even spread over the list (it is ordered by path), the last (greedy on NaN) kept.
    std::vector<SamplingParams> some;
    for (size_t i = 0; i < max_settings; ++i) {
      some.push_back(settings[i * (settings.size() - 1) / (max_settings - 1)]);
    }
    settings = some;
  }
  std::vector<std::vector<int32_t>> histories;
  for (const auto& c : cases) histories.push_back(sampler_cases::History(c.logits));
  std::vector<const std::vector<float>*> rows;
  std::vector<SamplingParams> params;
  std::vector<const std::vector<int32_t>*> hist;
  std::vector<uint64_t> indices;
  std::vector<std::string> names;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (const SamplingParams& p : settings) {
      for (int d = 0; d < draws; ++d) {
        rows.push_back(&cases[c].logits);
        params.push_back(p);
        hist.push_back(&histories[c]);
        indices.push_back(static_cast<uint64_t>(d) * 7919 + 3);
        names.push_back(cases[c].name + ", " + Describe(p));
      }
    }
  }
  // Every third draw also asks for the token's logprob and 5 alternatives.
  std::vector<LogprobRequest> wants(rows.size());
  for (size_t r = 0; r < rows.size(); r += 3) wants[r] = LogprobRequest{true, 5};
  const DeviceDraws got = DeviceSampleFull(rows, params, hist, indices, columns, wants, {});
  const int64_t k = samplemath::kMaxRowTopLogprobs;
  int failures = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const absl::Span<const float> span =
        absl::MakeConstSpan(*rows[r]).subspan(0, columns > 0 ? columns : vocab);
    const SampledToken want = SampleToken(span, params[r], *hist[r], indices[r], wants[r]);
    if (got.tokens[r] != want.token && ++failures <= 10) {
      ADD_FAILURE() << names[r] << ", index " << indices[r] << ": device " << got.tokens[r]
                    << ", host " << want.token;
    }
    if (!wants[r].chosen) continue;
    ExpectLogprobNear(got.logprobs[r], want.logprob, names[r] + ": logprob");
    ASSERT_EQ(want.top.size(), std::min<size_t>(5, span.size()));
    for (size_t j = 0; j < want.top.size(); ++j) {
      EXPECT_EQ(got.top_ids[r * k + j], want.top[j].token) << names[r] << ": top " << j;
      ExpectLogprobNear(got.top_logprobs[r * k + j], want.top[j].logprob,
                        names[r] + ": top logprob " + std::to_string(j));
    }
  }
  EXPECT_EQ(failures, 0) << "of " << rows.size() << " draws";
}

TEST_F(CudaSampling, RowSampleEqualsTheHostSamplerOnItsHardCases) {
  ExpectDeviceEqualsHost(3000, 3, 1000);
  ExpectDeviceEqualsHost(257, 2, 1000);
  ExpectDeviceEqualsHost(2, 2, 1000);
  ExpectDeviceEqualsHost(3000, 1, 1000, /*columns=*/1500);
}

TEST_F(CudaSampling, RowSampleEqualsTheHostSamplerOnGlmsVocabulary) {
#if defined(GLMSERVE_CUDA_EMU)
  const size_t settings = 6;  // each row is ~40 passes over 151552 ids on the CPU's fibers
#else
  const size_t settings = 1000;
#endif
  ExpectDeviceEqualsHost(151552, 1, settings);
}

// A forced token comes back as itself, with the logprobs the host computes for it.
TEST_F(CudaSampling, RowSampleReturnsForcedTokensWithTheirLogprobs) {
  const std::vector<sampler_cases::Row> cases = sampler_cases::Rows(700);
  const std::vector<int32_t> history;
  std::vector<const std::vector<float>*> rows;
  std::vector<SamplingParams> params;
  std::vector<const std::vector<int32_t>*> hist;
  std::vector<uint64_t> indices;
  std::vector<LogprobRequest> wants;
  std::vector<int32_t> forced;
  for (const auto& c : cases) {
    for (int32_t f : {0, 3, 699}) {
      rows.push_back(&c.logits);
      SamplingParams p;
      p.temperature = 0.8f;
      params.push_back(p);
      hist.push_back(&history);
      indices.push_back(1);
      wants.push_back({true, 3});
      forced.push_back(f);
    }
  }
  const DeviceDraws got = DeviceSampleFull(rows, params, hist, indices, 0, wants, forced);
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampledToken want = ForcedToken(*rows[r], forced[r], wants[r]);
    EXPECT_EQ(got.tokens[r], forced[r]);
    ExpectLogprobNear(got.logprobs[r], want.logprob, "forced row " + std::to_string(r));
    for (size_t j = 0; j < want.top.size(); ++j) {
      EXPECT_EQ(got.top_ids[r * samplemath::kMaxRowTopLogprobs + j], want.top[j].token);
    }
  }
}

// Draws from a six-token row: the frequencies must follow softmax(x / T) (chi-square, 5
// degrees of freedom, p = 0.001 critical value 20.5), and a repeated launch gives the same
// tokens (seeded; one row's draw does not depend on its neighbours).
TEST_F(CudaSampling, RowSampleFrequenciesFollowTheSoftmax) {
  const std::vector<float> row = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.0f};
  const std::vector<int32_t> history;
  SamplingParams p;
  p.temperature = 0.9f;
  p.seed = 99;
  const int draws = 3000;
  std::vector<const std::vector<float>*> rows(draws, &row);
  std::vector<SamplingParams> params(draws, p);
  std::vector<const std::vector<int32_t>*> hist(draws, &history);
  std::vector<uint64_t> indices(draws);
  for (int i = 0; i < draws; ++i) indices[i] = static_cast<uint64_t>(i);
  const std::vector<int32_t> got = DeviceSample(rows, params, hist, indices);
  std::vector<double> count(row.size(), 0.0), prob(row.size());
  for (int32_t t : got) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, static_cast<int32_t>(row.size()));
    count[t] += 1.0;
  }
  double z = 0.0;
  for (size_t i = 0; i < row.size(); ++i) z += prob[i] = std::exp(row[i] / 0.9);
  double chi2 = 0.0;
  for (size_t i = 0; i < row.size(); ++i) {
    const double expected = draws * prob[i] / z;
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
  }
  EXPECT_LT(chi2, 20.5);
  // Same seeds, reversed batch order: the same token for each index.
  std::vector<uint64_t> reversed(indices.rbegin(), indices.rend());
  const std::vector<int32_t> again = DeviceSample(rows, params, hist, reversed);
  for (int i = 0; i < draws; ++i) EXPECT_EQ(again[draws - 1 - i], got[i]) << i;
}

}  // namespace
}  // namespace glmserve::cuda
