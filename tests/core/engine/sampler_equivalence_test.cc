// The fast sampler (core/engine/sampler.cc) against the pre-fast-path one (sampler_legacy.cc): the
// same token, logprob and top logprobs, bit for bit, on every path (greedy, top-k on raw
// floats, min-p block skipping, whole row), on rows built to hit the shortcuts' edges: exact
// ties, NaN and infinities, penalised ids among the winners, k near the vocabulary size,
// tiny and infinite temperatures.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/engine/sampler.h"
#include "tests/core/engine/sampler_cases.h"
#include "tests/core/engine/sampler_legacy.h"

namespace glmserve {
namespace {

using sampler_cases::History;
using sampler_cases::ModelLike;
using sampler_cases::Row;
using sampler_cases::Rows;
using sampler_cases::Settings;

std::string Describe(const SamplingParams& p) {
  return absl::StrCat("T=", p.temperature, " k=", p.top_k, " top_p=", p.top_p, " min_p=", p.min_p,
                      " penalty=", p.repetition_penalty);
}

void ExpectSameAsLegacy(int vocab, int draws) {
  const std::vector<Row> rows = Rows(vocab);
  const std::vector<SamplingParams> settings = Settings(vocab);
  size_t checked = 0;
  for (const Row& row : rows) {
    const std::vector<int32_t> history = History(row.logits);
    for (const SamplingParams& p : settings) {
      int failures = 0;
      for (int i = 0; i < draws; ++i) {
        const uint64_t index = static_cast<uint64_t>(i) * 7919;
        const int32_t top = i % 3 == 0 ? 5 : 0;
        const SampledToken want = legacy::LegacySampleToken(row.logits, p, history, index, top);
        const SampledToken got = SampleToken(row.logits, p, history, index, top);
        const SampledToken bare = SampleToken(row.logits, p, history, index, LogprobRequest{});
        ++checked;
        bool same = got.token == want.token && bare.token == want.token &&
                    std::bit_cast<uint32_t>(got.logprob) == std::bit_cast<uint32_t>(want.logprob) &&
                    got.top.size() == want.top.size();
        for (size_t j = 0; same && j < got.top.size(); ++j) {
          same = got.top[j].token == want.top[j].token &&
                 std::bit_cast<uint32_t>(got.top[j].logprob) ==
                     std::bit_cast<uint32_t>(want.top[j].logprob);
        }
        if (!same && ++failures <= 3) {
          ADD_FAILURE() << row.name << ", " << Describe(p) << ", index " << index << ": token "
                        << got.token << " (unrequested " << bare.token << ") logprob "
                        << got.logprob << ", legacy " << want.token << " " << want.logprob;
        }
        EXPECT_EQ(bare.logprob, 0.0f);
        EXPECT_TRUE(bare.top.empty());
      }
    }
  }
  EXPECT_EQ(checked, rows.size() * settings.size() * static_cast<size_t>(draws));
}

TEST(SamplerEquivalenceTest, SmallVocabularyManyDraws) { ExpectSameAsLegacy(3000, 40); }

TEST(SamplerEquivalenceTest, FullGlmVocabulary) { ExpectSameAsLegacy(151552, 3); }

TEST(SamplerEquivalenceTest, OddVocabularySizes) {
  // Rows shorter than a scan block, and not a multiple of one.
  for (int vocab : {1, 2, 63, 64, 65, 130}) {
    SCOPED_TRACE(vocab);
    ExpectSameAsLegacy(vocab, 6);
  }
}

TEST(SamplerEquivalenceTest, LogprobRequestOnlyAddsWhatWasAsked) {
  const std::vector<float> row = ModelLike(5000, 8);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 30;
  const SampledToken chosen = SampleToken(row, p, {}, 4, LogprobRequest{true, 0});
  const SampledToken full = SampleToken(row, p, {}, 4, LogprobRequest{true, 3});
  const SampledToken implied = SampleToken(row, p, {}, 4, LogprobRequest{false, 3});
  EXPECT_EQ(chosen.token, full.token);
  EXPECT_TRUE(chosen.top.empty());
  EXPECT_LT(chosen.logprob, 0.0f);
  EXPECT_EQ(chosen.logprob, full.logprob);
  ASSERT_EQ(full.top.size(), 3u);
  EXPECT_EQ(implied.logprob, full.logprob);  // top > 0 implies the chosen token's logprob
  ASSERT_EQ(implied.top.size(), 3u);
  EXPECT_EQ(implied.top[0].token, full.top[0].token);
}

}  // namespace
}  // namespace glmserve
