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
#include "tests/core/engine/sampler_legacy.h"

namespace glmserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

struct Row {
  std::string name;
  std::vector<float> logits;
};

// Language-model-like: a Gaussian bulk with a few dozen strong tokens.
std::vector<float> ModelLike(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(-2.0f, 2.5f);
  std::vector<float> row(vocab);
  for (float& x : row) x = bulk(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  for (int i = 0; i < 30; ++i) row[id(rng)] = 8.0f + static_cast<float>(i % 7);
  return row;
}

std::vector<Row> Rows(int vocab) {
  std::vector<Row> rows;
  rows.push_back({"model-like", ModelLike(vocab, 3)});
  // Quantised to a quarter: thousands of exact ties at every level, so top-k boundaries,
  // argmax and the canonical order all break ties by id.
  std::vector<float> ties = ModelLike(vocab, 4);
  for (float& x : ties) x = std::round(x * 4.0f) / 4.0f;
  rows.push_back({"ties", ties});
  // NaN, +-inf and huge values sprinkled in.
  std::vector<float> odd = ModelLike(vocab, 5);
  for (int i = 0; i < vocab; i += 97) odd[i] = kNan;
  for (int i = 13; i < vocab; i += 389) odd[i] = -kInf;
  odd[vocab / 3] = 3e38f;
  odd[vocab / 2] = 3e38f;
  odd[std::max(0, vocab - 2)] = -3e38f;
  rows.push_back({"nan-inf-huge", odd});
  std::vector<float> plus_inf = ModelLike(vocab, 6);
  plus_inf[vocab / 5] = kInf;
  plus_inf[vocab / 4] = kInf;
  rows.push_back({"plus-inf", plus_inf});
  rows.push_back({"all -inf", std::vector<float>(vocab, -kInf)});
  std::vector<float> nans(vocab, kNan);
  nans[vocab - 1] = -1.0f;
  rows.push_back({"all nan but last", nans});
  // A flat row: every weight 1, min-p keeps everything, walks go deep.
  rows.push_back({"flat", std::vector<float>(vocab, 0.5f)});
  return rows;
}

std::vector<SamplingParams> Settings(int vocab) {
  std::vector<SamplingParams> out;
  auto add = [&](float t, int32_t k, float top_p, float min_p, float penalty) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = penalty;
    p.seed = 1234 + out.size();
    out.push_back(p);
  };
  for (float penalty : {1.0f, 1.3f, 0.5f}) {
    add(0.0f, 0, 1.0f, 0.0f, penalty);  // greedy
    add(1.0f, 0, 1.0f, 0.0f, penalty);
    add(0.7f, 50, 1.0f, 0.0f, penalty);
    add(0.7f, 0, 0.9f, 0.0f, penalty);
    add(0.8f, 0, 1.0f, 0.05f, penalty);
    add(0.7f, 40, 0.95f, 0.02f, penalty);
  }
  for (int32_t k : {1, 2, 7, 1000, 1025, vocab - 1, vocab, vocab + 1}) {
    add(1.0f, k, 1.0f, 0.0f, 1.1f);
  }
  for (float min_p : {1e-6f, 0.001f, 0.5f, 0.999f}) add(1.5f, 0, 1.0f, min_p, 1.0f);
  add(1e-6f, 0, 1.0f, 0.01f, 1.0f);
  add(1e-6f, 20, 1.0f, 0.0f, 1.2f);
  add(std::numeric_limits<float>::denorm_min(), 5, 0.5f, 0.0f, 1.0f);
  add(50.0f, 0, 0.3f, 0.0f, 1.0f);
  add(kInf, 10, 1.0f, 0.0f, 1.0f);  // unvalidated: scaling ties every finite logit
  add(kNan, 10, 1.0f, 0.0f, 1.0f);  // unvalidated: greedy
  return out;
}

// History: repeats, out-of-range ids, and ids among the row's strongest tokens.
std::vector<int32_t> History(const std::vector<float>& row) {
  const int32_t vocab = static_cast<int32_t>(row.size());
  std::vector<int32_t> h = {-5, vocab, vocab + 100, 0, 0, 1, vocab - 1, vocab / 2, vocab / 3};
  for (int32_t i = 0; i < vocab && h.size() < 40; ++i) {
    if (row[i] >= 8.0f) h.push_back(i);
  }
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  for (int i = 0; i < 150; ++i) h.push_back(id(rng));
  return h;
}

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
