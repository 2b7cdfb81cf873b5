// Model-level invariants on seeded random weights: incremental decode equals one full
// forward, a sequence inside a ragged batch equals the sequence alone, chunked prefill
// equals unchunked, a layer span chain equals the whole stack. All bit-exact: the kernels
// reduce in an order that depends on neither batch composition nor chunking.
#include "core/model.h"

#include <gtest/gtest.h>

#include "core/checkpoint.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

ModelWeights TinyWeights(const char* preset, DType dtype, LayerSpan span = {}) {
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  RandomWeightOptions options;
  options.seed = 42;
  options.dtype = dtype;
  options.stddev = 0.1;  // larger than HF's 0.02, so that every layer visibly matters
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options, span);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

std::vector<int32_t> Tokens(int64_t n, int32_t salt) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 37 + salt * 11 + 3) % 256);
  return ids;
}

// Logits of every position of `ids` in one forward over a fresh cache.
std::vector<float> FullForward(Model& model, const std::vector<int32_t>& ids) {
  KvCache cache(model.CacheShape(64, 4));
  BlockTable table;
  EXPECT_TRUE(cache.Reserve(&table, static_cast<int64_t>(ids.size())).ok());
  ForwardBatch batch;
  batch.sequences = {{static_cast<int64_t>(ids.size()), 0, &table}};
  batch.token_ids = ids;
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult result;
  EXPECT_TRUE(model.Forward(batch, &cache, options, &result).ok());
  return result.logits;
}

// Every invariant for both architectures: GLM-4.5 ("tiny") and GLM-5 ("tiny-glm5": latent
// attention, index_topk 8, so the prompts below also exercise the sparse selection).
class ModelTest : public ::testing::TestWithParam<std::tuple<const char*, DType>> {
 protected:
  ModelWeights Weights(LayerSpan span = {}) {
    return TinyWeights(std::get<0>(GetParam()), std::get<1>(GetParam()), span);
  }
};

TEST_P(ModelTest, PrefillThenDecodeEqualsFullForward) {
  Model model(Weights());
  const int64_t vocab = model.config().vocab_size;
  const std::vector<int32_t> ids = Tokens(23, 1);
  const std::vector<float> full = FullForward(model, ids);

  KvCache cache(model.CacheShape(64, 4));
  BlockTable table;
  ASSERT_TRUE(cache.Reserve(&table, 23).ok());
  const int64_t prefill = 9;
  ForwardBatch batch;
  batch.sequences = {{prefill, 0, &table}};
  batch.token_ids = absl::MakeConstSpan(ids.data(), prefill);
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult result;
  ASSERT_TRUE(model.Forward(batch, &cache, options, &result).ok());
  std::vector<float> incremental = result.logits;
  options.logits = LogitsRows::kLast;
  for (int64_t pos = prefill; pos < 23; ++pos) {
    batch.sequences = {{1, pos, &table}};
    batch.token_ids = absl::MakeConstSpan(ids.data() + pos, 1);
    ASSERT_TRUE(model.Forward(batch, &cache, options, &result).ok());
    ASSERT_EQ(result.logits.size(), static_cast<size_t>(vocab));
    incremental.insert(incremental.end(), result.logits.begin(), result.logits.end());
  }
  ASSERT_EQ(incremental.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) ASSERT_EQ(incremental[i], full[i]) << "element " << i;
}

TEST_P(ModelTest, SequenceInRaggedBatchEqualsAlone) {
  Model model(Weights());
  const int64_t vocab = model.config().vocab_size;
  // Three sequences: a fresh prompt, one with a cached prefix getting a chunk, one decoding.
  const std::vector<int32_t> a = Tokens(7, 2), b = Tokens(12, 3), c = Tokens(5, 4);
  KvCache cache(model.CacheShape(64, 4));
  BlockTable ta, tb, tc;
  ASSERT_TRUE(cache.Reserve(&ta, 7).ok());
  ASSERT_TRUE(cache.Reserve(&tb, 12).ok());
  ASSERT_TRUE(cache.Reserve(&tc, 5).ok());
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult result;
  // Earlier steps: b's first 8 tokens, c's first 4.
  ForwardBatch warm;
  warm.sequences = {{8, 0, &tb}, {4, 0, &tc}};
  std::vector<int32_t> warm_ids(b.begin(), b.begin() + 8);
  warm_ids.insert(warm_ids.end(), c.begin(), c.begin() + 4);
  warm.token_ids = warm_ids;
  ASSERT_TRUE(model.Forward(warm, &cache, options, &result).ok());
  // The mixed step.
  ForwardBatch step;
  step.sequences = {{7, 0, &ta}, {4, 8, &tb}, {1, 4, &tc}};
  std::vector<int32_t> step_ids(a);
  step_ids.insert(step_ids.end(), b.begin() + 8, b.end());
  step_ids.push_back(c[4]);
  step.token_ids = step_ids;
  ASSERT_TRUE(model.Forward(step, &cache, options, &result).ok());
  ASSERT_EQ(result.logits.size(), static_cast<size_t>(12 * vocab));

  const std::vector<float> fa = FullForward(model, a), fb = FullForward(model, b),
                           fc = FullForward(model, c);
  auto expect_rows = [&](const std::vector<float>& full, int64_t from, int64_t count,
                         int64_t batch_row) {
    for (int64_t r = 0; r < count; ++r)
      for (int64_t v = 0; v < vocab; ++v)
        ASSERT_EQ(result.logits[(batch_row + r) * vocab + v], full[(from + r) * vocab + v])
            << "row " << batch_row + r;
  };
  expect_rows(fa, 0, 7, 0);
  expect_rows(fb, 8, 4, 7);
  expect_rows(fc, 4, 1, 11);

  // kLast returns one row per sequence, each its last new token.
  options.logits = LogitsRows::kLast;
  KvCache cache2(model.CacheShape(64, 4));
  BlockTable t1, t2;
  ASSERT_TRUE(cache2.Reserve(&t1, 7).ok());
  ASSERT_TRUE(cache2.Reserve(&t2, 5).ok());
  ForwardBatch two;
  two.sequences = {{7, 0, &t1}, {5, 0, &t2}};
  std::vector<int32_t> two_ids(a);
  two_ids.insert(two_ids.end(), c.begin(), c.end());
  two.token_ids = two_ids;
  ASSERT_TRUE(model.Forward(two, &cache2, options, &result).ok());
  ASSERT_EQ(result.logits.size(), static_cast<size_t>(2 * vocab));
  for (int64_t v = 0; v < vocab; ++v) {
    ASSERT_EQ(result.logits[v], fa[6 * vocab + v]);
    ASSERT_EQ(result.logits[vocab + v], fc[4 * vocab + v]);
  }
}

TEST_P(ModelTest, ChunkedPrefillEqualsUnchunked) {
  Model model(Weights());
  const std::vector<int32_t> ids = Tokens(30, 5);
  const std::vector<float> full = FullForward(model, ids);
  const int64_t vocab = model.config().vocab_size;
  for (int64_t chunk : {1, 4, 7, 16}) {
    KvCache cache(model.CacheShape(64, 4));
    BlockTable table;
    ASSERT_TRUE(cache.Reserve(&table, 30).ok());
    std::vector<float> logits;
    ForwardOptions options;
    options.logits = LogitsRows::kAll;
    ForwardResult result;
    for (int64_t start = 0; start < 30; start += chunk) {
      const int64_t n = std::min<int64_t>(chunk, 30 - start);
      ForwardBatch batch;
      batch.sequences = {{n, start, &table}};
      batch.token_ids = absl::MakeConstSpan(ids.data() + start, n);
      ASSERT_TRUE(model.Forward(batch, &cache, options, &result).ok());
      logits.insert(logits.end(), result.logits.begin(), result.logits.end());
    }
    ASSERT_EQ(logits.size(), static_cast<size_t>(30 * vocab));
    for (size_t i = 0; i < full.size(); ++i) ASSERT_EQ(logits[i], full[i]) << "chunk " << chunk;
  }
}

TEST_P(ModelTest, LayerSpansChainToTheFullStack) {
  Model whole(Weights());
  Model head(Weights({0, 2}));
  Model tail(Weights({2, -1}));
  EXPECT_FALSE(head.weights().has_head());
  EXPECT_FALSE(tail.weights().has_embedding());
  const std::vector<int32_t> ids = Tokens(6, 6);
  const std::vector<float> full = FullForward(whole, ids);

  KvCache c1(head.CacheShape(8, 4)), c2(tail.CacheShape(8, 4));
  BlockTable t1, t2;
  ASSERT_TRUE(c1.Reserve(&t1, 6).ok());
  ASSERT_TRUE(c2.Reserve(&t2, 6).ok());
  ForwardBatch b1;
  b1.sequences = {{6, 0, &t1}};
  b1.token_ids = ids;
  ForwardOptions o1;
  o1.logits = LogitsRows::kNone;
  o1.return_hidden = true;
  ForwardResult r1;
  ASSERT_TRUE(head.Forward(b1, &c1, o1, &r1).ok());
  ASSERT_EQ(r1.hidden.size(), static_cast<size_t>(6 * whole.config().hidden_size));
  ForwardBatch b2;
  b2.sequences = {{6, 0, &t2}};
  b2.hidden_in = r1.hidden;
  ForwardOptions o2;
  o2.logits = LogitsRows::kAll;
  ForwardResult r2;
  ASSERT_TRUE(tail.Forward(b2, &c2, o2, &r2).ok());
  EXPECT_EQ(r2.logits, full);
  // Asking a span without the head for logits is refused.
  ForwardResult r3;
  o1.logits = LogitsRows::kLast;
  BlockTable t3;
  ASSERT_TRUE(c1.Reserve(&t3, 6).ok());
  b1.sequences = {{6, 0, &t3}};
  EXPECT_EQ(head.Forward(b1, &c1, o1, &r3).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(ModelTest, MalformedBatchesAreRefused) {
  Model model(Weights());
  KvCache cache(model.CacheShape(4, 4));
  BlockTable table;
  ASSERT_TRUE(cache.Reserve(&table, 4).ok());
  ForwardOptions options;
  ForwardResult result;
  const std::vector<int32_t> ok_ids = {1, 2, 3};
  const std::vector<int32_t> bad_ids = {1, 256, 3};
  const std::vector<int32_t> negative = {1, -1, 3};
  ForwardBatch batch;
  batch.sequences = {{3, 0, &table}};
  for (const auto* ids : {&bad_ids, &negative}) {
    batch.token_ids = *ids;
    absl::Status s = model.Forward(batch, &cache, options, &result);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("outside the vocabulary"), absl::string_view::npos) << s;
  }
  batch.token_ids = ok_ids;
  batch.sequences = {{3, 2, &table}};  // positions 2..4, the table covers 0..3
  EXPECT_EQ(model.Forward(batch, &cache, options, &result).code(),
            absl::StatusCode::kInvalidArgument);
  batch.sequences = {{2, 0, &table}};  // 3 ids for 2 tokens
  EXPECT_EQ(model.Forward(batch, &cache, options, &result).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> hidden(3 * model.config().hidden_size);
  batch.sequences = {{3, 0, &table}};
  batch.token_ids = {};
  batch.hidden_in = hidden;  // this span starts at layer 0: hidden input is refused
  EXPECT_EQ(model.Forward(batch, &cache, options, &result).code(),
            absl::StatusCode::kInvalidArgument);
  batch.sequences = {};
  EXPECT_EQ(model.Forward(batch, &cache, options, &result).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(PresetsAndWeightDTypes, ModelTest,
                         ::testing::Combine(::testing::Values("tiny", "tiny-glm5"),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param);
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name + "_" + std::string(DTypeName(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace glmserve
