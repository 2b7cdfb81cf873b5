// Sampling from a row summary (the few largest raw logits and the penalised ids' raw logits,
// what a device can send back instead of the whole row) gives exactly SampleToken's token,
// for every request SummaryCandidates accepts; malformed or short summaries are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/engine/sampler.h"
#include "core/engine/sampler_scan.h"

namespace glmserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<std::vector<float>> Rows(int vocab) {
  std::mt19937 rng(vocab);
  std::normal_distribution<float> bulk(-2.0f, 2.5f);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<std::vector<float>> rows;
  std::vector<float> row(vocab);
  for (float& x : row) x = bulk(rng);
  for (int i = 0; i < 25; ++i) row[id(rng)] = 8.0f + static_cast<float>(i % 6);
  rows.push_back(row);
  for (float& x : row) x = std::round(bulk(rng));  // ties everywhere
  rows.push_back(row);
  for (int i = 0; i < vocab; i += 5) row[i] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 2; i < vocab; i += 11) row[i] = -kInf;
  row[vocab / 2] = kInf;
  rows.push_back(row);
  rows.push_back(std::vector<float>(vocab, -kInf));
  return rows;
}

// What the device would send: the row's `count` largest (TopKFloat, the CPU twin of
// LaunchRowTopK) and the raw logits at the penalised ids.
struct Summary {
  std::vector<int32_t> top_ids, penalised_ids;
  std::vector<float> top_values, penalised_raw;
  RowSummary view(int64_t vocab) const {
    return {vocab, top_ids, top_values, penalised_ids, penalised_raw};
  }
};

Summary Summarise(const std::vector<float>& row, int64_t count, std::vector<int32_t> penalised) {
  Summary s;
  std::vector<std::pair<float, int32_t>> heap;
  sampler_internal::TopKFloat top(static_cast<size_t>(count), &heap);
  top.Scan(row.data(), 0, static_cast<int32_t>(row.size()));
  s.top_ids = top.TakeIds();
  for (int32_t id : s.top_ids) s.top_values.push_back(std::isnan(row[id]) ? -kInf : row[id]);
  s.penalised_ids = std::move(penalised);
  for (int32_t id : s.penalised_ids) s.penalised_raw.push_back(row[id]);
  return s;
}

TEST(SamplerSummaryTest, EqualsSampleTokenWheneverAccepted) {
  int compared = 0;
  for (int vocab : {1, 7, 300, 4000}) {
    const std::vector<std::vector<float>> rows = Rows(vocab);
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> id(-3, vocab + 3);
    std::vector<int32_t> history;
    for (int i = 0; i < 60; ++i) history.push_back(id(rng));
    for (size_t r = 0; r < rows.size(); ++r) {
      // Penalised ids among the strongest tokens too.
      std::vector<int32_t> h = history;
      for (int32_t i = 0; i < vocab; ++i) {
        if (rows[r][i] >= 10.0f) h.push_back(i);
      }
      for (float penalty : {1.0f, 1.3f, 0.7f}) {
        for (float temperature : {0.0f, 0.6f, 1.0f}) {
          for (int32_t top_k : {0, 1, 3, 40}) {
            for (float top_p : {1.0f, 0.8f}) {
              SamplingParams p;
              p.temperature = temperature;
              p.top_k = top_k;
              p.top_p = top_p;
              p.min_p = top_p < 1.0f ? 0.02f : 0.0f;
              p.repetition_penalty = penalty;
              p.seed = 99 + r;
              const std::vector<int32_t> pen = PenalisedIds(p, h, vocab);
              const int64_t need =
                  SummaryCandidates(p, {}, static_cast<int64_t>(pen.size()), vocab, 1 << 20);
              const bool accepted = !(temperature > 0.0f) || (top_k > 0 && top_k < vocab);
              ASSERT_EQ(need > 0, accepted) << temperature << " " << top_k;
              if (!accepted) continue;
              const Summary s = Summarise(rows[r], need, pen);
              for (uint64_t index = 0; index < 25; ++index) {
                const absl::StatusOr<int32_t> got = SampleFromSummary(s.view(vocab), p, index);
                ASSERT_TRUE(got.ok()) << got.status();
                const int32_t want = SampleToken(rows[r], p, h, index, LogprobRequest{}).token;
                ASSERT_EQ(*got, want)
                    << "vocab " << vocab << " row " << r << " T " << temperature << " k " << top_k
                    << " top_p " << top_p << " penalty " << penalty << " index " << index;
                ++compared;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 5000);
}

TEST(SamplerSummaryTest, SummaryCandidatesSaysWhenTheRowIsNeeded) {
  SamplingParams greedy;
  EXPECT_EQ(SummaryCandidates(greedy, {}, 0, 151552, 1024), 1);
  EXPECT_EQ(SummaryCandidates(greedy, {}, 200, 151552, 1024), 201);
  EXPECT_EQ(SummaryCandidates(greedy, {}, 2000, 151552, 1024), 0);  // over the cap
  EXPECT_EQ(SummaryCandidates(greedy, LogprobRequest{true, 0}, 0, 151552, 1024), 0);
  EXPECT_EQ(SummaryCandidates(greedy, LogprobRequest{false, 2}, 0, 151552, 1024), 0);
  SamplingParams t;
  t.temperature = 0.8f;
  EXPECT_EQ(SummaryCandidates(t, {}, 0, 151552, 1024), 0);  // every weight counts
  t.top_k = 50;
  EXPECT_EQ(SummaryCandidates(t, {}, 10, 151552, 1024), 60);
  EXPECT_EQ(SummaryCandidates(t, {}, 10, 40, 1024), 0);  // top_k >= vocab: off
  EXPECT_EQ(SummaryCandidates(t, {}, 10, 55, 1024), 55);
  const std::vector<int32_t> history = {5, -1, 5, 9, 100, 2};
  SamplingParams pen;
  EXPECT_TRUE(PenalisedIds(pen, history, 10).empty());  // penalty 1
  pen.repetition_penalty = 1.2f;
  EXPECT_EQ(PenalisedIds(pen, history, 10), (std::vector<int32_t>{2, 5, 9}));
}

TEST(SamplerSummaryTest, RefusesMalformedOrShortSummaries) {
  const std::vector<float> row = Rows(300)[0];
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 5;
  p.repetition_penalty = 1.1f;
  const std::vector<int32_t> pen = {3, 7};
  Summary ok = Summarise(row, 7, pen);
  ASSERT_TRUE(SampleFromSummary(ok.view(300), p, 0).ok());
  auto refused = [&](Summary s, int64_t vocab, const std::string& what) {
    const absl::StatusOr<int32_t> r = SampleFromSummary(s.view(vocab), p, 0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << what;
  };
  refused(Summarise(row, 6, pen), 300, "one candidate short");
  Summary unsorted = ok;
  std::swap(unsorted.top_ids[0], unsorted.top_ids[1]);
  refused(unsorted, 300, "ids not ascending");
  Summary out_of_range = ok;
  out_of_range.penalised_ids[1] = 300;
  refused(out_of_range, 300, "penalised id out of range");
  Summary sizes = ok;
  sizes.top_values.pop_back();
  refused(sizes, 300, "sizes differ");
  refused(ok, 0, "no vocabulary");
  SamplingParams whole = p;
  whole.top_k = 0;
  const absl::StatusOr<int32_t> r = SampleFromSummary(ok.view(300), whole, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace glmserve
