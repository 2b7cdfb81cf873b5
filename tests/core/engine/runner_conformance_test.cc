// The ModelRunner contract (core/model/model_runner.h), checked the same way on every backend: one
// suite, instantiated per runner (the CPU in f32 and bf16 weights always; the CUDA runner in
// bf16 and f32 when built with it and a GPU is present, skipped with the reason otherwise and
// failing under GLMSERVE_REQUIRE_CUDA=1). Seeded random "tiny" models: incremental decode
// equals one full forward, a sequence inside a ragged batch equals the sequence alone,
// chunked prefill equals unchunked, per-sequence logits pick exactly the requested rows, a
// layer-span chain equals the whole stack, malformed batches are refused.
//
// Equality: the CPU kernels reduce in an order that depends on neither batch composition nor
// chunking, so CPU results must be bit-identical. The GPU runs bf16 activations whose kernels
// may pick other cuBLAS algorithms or split counts per shape, so GPU-vs-GPU results must agree
// to a relative error of the norm under 1e-2 (backend-specific checks, e.g. CUDA graphs and
// GPU against CPU, live in tests/core/cuda/model_cuda_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/engine/host_sampling_runner.h"
#include "core/engine/runner_factory.h"
#include "core/engine/sampler.h"
#include "core/model/checkpoint.h"
#include "tests/core/all_logits.h"
#include "tests/core/engine/runner_cases.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

constexpr double kGpuTolerance = 1e-2;

using testing::kRunnerCases;
using testing::RunnerCase;

std::vector<int32_t> Tokens(int64_t n, int32_t salt) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 37 + salt * 11 + 3) % 256);
  return ids;
}

std::vector<float> Rows(const std::vector<float>& v, int64_t width, int64_t from, int64_t count) {
  return std::vector<float>(v.begin() + from * width, v.begin() + (from + count) * width);
}

class RunnerConformance : public ::testing::TestWithParam<RunnerCase> {
 protected:
  void SetUp() override { GLM_REQUIRE_RUNNER(GetParam()); }

  // The tiny preset on seeded random weights (stddev 0.1, larger than HF's 0.02, so that
  // every layer visibly matters), loaded for `span`.
  std::unique_ptr<ModelRunner> Make(LayerSpan span = {}) {
    absl::StatusOr<ModelConfig> config = PresetConfig(GetParam().preset);
    EXPECT_TRUE(config.ok()) << config.status();
    if (config.ok()) vocab_ = config->vocab_size;
    RandomWeightOptions options;
    options.seed = 42;
    options.dtype = GetParam().dtype;
    options.stddev = 0.1;
    absl::StatusOr<ModelWeights> w = RandomWeights(*config, options, span);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateModelRunner(
        *std::move(w), GetParam().device, GetParam().cpu_math, nullptr,
        GetParam().fp8_tensor_cores ? Fp8TensorCores::kAuto : Fp8TensorCores::kOff);
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return nullptr;
    const absl::Status s = (*runner)->SetKvCacheDType(GetParam().kv_cache);
    EXPECT_TRUE(s.ok()) << s;
    if (GetParam().host_sampling) return std::make_unique<HostSamplingRunner>(*std::move(runner));
    return *std::move(runner);
  }

  int64_t vocab_ = 0;  // logits row width (ExpectSame)

  std::unique_ptr<KvCache> Cache(ModelRunner& runner, int64_t num_blocks, int64_t block_size = 4) {
    absl::StatusOr<std::unique_ptr<KvCache>> cache = runner.CreateCache(num_blocks, block_size);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? *std::move(cache) : nullptr;
  }

  // Bit-identical on the CPU, within kGpuTolerance on the GPU.
  void ExpectSame(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    if (GetParam().exact()) {
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << what << ", element " << i;
      }
    } else {
      // Random weights leave near-ties in expert routes and DSA selections; the device's
      // roundings can flip one (its FP8 GEMV and tiled kernels sum in different orders, so
      // they differ with the chunking: measured on cuda_fp8_glm5, one row of 30 at 0.3), and
      // that row then differs wholesale (model_cuda_test.cc's ExpectRowsMatch). At most one
      // row in 20 may; the others together stay within kGpuTolerance.
      if (vocab_ <= 0 || want.empty() || want.size() % static_cast<size_t>(vocab_) != 0) {
        EXPECT_LT(testing::RelativeError(got, want), kGpuTolerance) << what;  // not logit rows
        return;
      }
      const int64_t rows = static_cast<int64_t>(want.size()) / vocab_;
      std::vector<float> kept_got, kept_want;
      int64_t flipped = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const float* g = got.data() + r * vocab_;
        const float* w = want.data() + r * vocab_;
        if (testing::RelativeError(g, w, vocab_) > 3 * kGpuTolerance) {
          ++flipped;
          continue;
        }
        kept_got.insert(kept_got.end(), g, g + vocab_);
        kept_want.insert(kept_want.end(), w, w + vocab_);
      }
      EXPECT_LE(flipped, rows / 20) << what << ": rows beyond " << 3 * kGpuTolerance;
      EXPECT_LT(testing::RelativeError(kept_got, kept_want), kGpuTolerance) << what;
    }
  }
};

TEST_P(RunnerConformance, PrefillThenDecodeEqualsFullForward) {
  std::unique_ptr<ModelRunner> runner = Make();
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> ids = Tokens(40, 1);
  const std::vector<float> full = testing::AllLogits(*runner, ids);
  std::unique_ptr<KvCache> cache = Cache(*runner, 16);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(&table, 40).ok());
  const int64_t prefill = 9;
  ForwardBatch batch;
  batch.sequences = {{prefill, 0, &table}};
  batch.token_ids = absl::MakeConstSpan(ids.data(), prefill);
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult result;
  ASSERT_TRUE(runner->Forward(batch, cache.get(), options, &result).ok());
  std::vector<float> incremental = result.logits;
  options.logits = LogitsRows::kLast;
  for (int64_t pos = prefill; pos < 40; ++pos) {
    batch.sequences = {{1, pos, &table}};
    batch.token_ids = absl::MakeConstSpan(ids.data() + pos, 1);
    ASSERT_TRUE(runner->Forward(batch, cache.get(), options, &result).ok());
    ASSERT_EQ(result.logits.size(), static_cast<size_t>(vocab));
    incremental.insert(incremental.end(), result.logits.begin(), result.logits.end());
  }
  ExpectSame(incremental, full, "prefill 9, then decode one token a step");

  // As the engine prefills: a chunk mid-prompt wants no logits and the last chunk only its
  // last row, so the run's last layer finishes (o_proj, FFN) on that row alone, or on none.
  // Every token's K/V must still reach the cache: the decode after it sees the whole prompt.
  std::unique_ptr<KvCache> cache2 = Cache(*runner, 16);
  BlockTable table2;
  ASSERT_TRUE(cache2->Reserve(&table2, 40).ok());
  const auto step = [&](int64_t start, int64_t n, LogitsRows logits) {
    batch.sequences = {{n, start, &table2}};
    batch.token_ids = absl::MakeConstSpan(ids.data() + start, n);
    options.logits = logits;
    return runner->Forward(batch, cache2.get(), options, &result);
  };
  ASSERT_TRUE(step(0, 9, LogitsRows::kNone).ok());
  EXPECT_TRUE(result.logits.empty());
  ASSERT_TRUE(step(9, 10, LogitsRows::kLast).ok());
  ExpectSame(result.logits, Rows(full, vocab, 18, 1), "a no-logits chunk, then the last row");
  for (int64_t pos = 19; pos < 24; ++pos) {
    ASSERT_TRUE(step(pos, 1, LogitsRows::kLast).ok());
    ExpectSame(result.logits, Rows(full, vocab, pos, 1), "decode at " + std::to_string(pos));
  }
}

TEST_P(RunnerConformance, SequenceInRaggedBatchEqualsAlone) {
  std::unique_ptr<ModelRunner> runner = Make();
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->config().vocab_size;
  // Three sequences: a fresh prompt, one with a cached prefix getting a chunk, one decoding.
  const std::vector<int32_t> a = Tokens(7, 2), b = Tokens(12, 3), c = Tokens(5, 4);
  std::unique_ptr<KvCache> cache = Cache(*runner, 64);
  BlockTable ta, tb, tc;
  ASSERT_TRUE(cache->Reserve(&ta, 7).ok());
  ASSERT_TRUE(cache->Reserve(&tb, 12).ok());
  ASSERT_TRUE(cache->Reserve(&tc, 5).ok());
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult result;
  // Earlier steps: b's first 8 tokens, c's first 4.
  ForwardBatch warm;
  warm.sequences = {{8, 0, &tb}, {4, 0, &tc}};
  std::vector<int32_t> warm_ids(b.begin(), b.begin() + 8);
  warm_ids.insert(warm_ids.end(), c.begin(), c.begin() + 4);
  warm.token_ids = warm_ids;
  ASSERT_TRUE(runner->Forward(warm, cache.get(), options, &result).ok());
  // The mixed step.
  ForwardBatch step;
  step.sequences = {{7, 0, &ta}, {4, 8, &tb}, {1, 4, &tc}};
  std::vector<int32_t> step_ids(a);
  step_ids.insert(step_ids.end(), b.begin() + 8, b.end());
  step_ids.push_back(c[4]);
  step.token_ids = step_ids;
  ASSERT_TRUE(runner->Forward(step, cache.get(), options, &result).ok());
  ASSERT_EQ(result.logits.size(), static_cast<size_t>(12 * vocab));
  const std::vector<float> fa = testing::AllLogits(*runner, a), fb = testing::AllLogits(*runner, b),
                           fc = testing::AllLogits(*runner, c);
  ExpectSame(Rows(result.logits, vocab, 0, 7), Rows(fa, vocab, 0, 7), "fresh prompt a");
  ExpectSame(Rows(result.logits, vocab, 7, 4), Rows(fb, vocab, 8, 4), "b's second chunk");
  ExpectSame(Rows(result.logits, vocab, 11, 1), Rows(fc, vocab, 4, 1), "c's decode");

  // kLast returns one row per sequence, each its last new token.
  options.logits = LogitsRows::kLast;
  std::unique_ptr<KvCache> cache2 = Cache(*runner, 64);
  BlockTable t1, t2;
  ASSERT_TRUE(cache2->Reserve(&t1, 7).ok());
  ASSERT_TRUE(cache2->Reserve(&t2, 5).ok());
  ForwardBatch two;
  two.sequences = {{7, 0, &t1}, {5, 0, &t2}};
  std::vector<int32_t> two_ids(a);
  two_ids.insert(two_ids.end(), c.begin(), c.end());
  two.token_ids = two_ids;
  ASSERT_TRUE(runner->Forward(two, cache2.get(), options, &result).ok());
  ASSERT_EQ(result.logits.size(), static_cast<size_t>(2 * vocab));
  ExpectSame(Rows(result.logits, vocab, 0, 1), Rows(fa, vocab, 6, 1), "a's last row");
  ExpectSame(Rows(result.logits, vocab, 1, 1), Rows(fc, vocab, 4, 1), "c's last row");
}

TEST_P(RunnerConformance, ChunkedPrefillEqualsUnchunked) {
  std::unique_ptr<ModelRunner> runner = Make();
  ASSERT_NE(runner, nullptr);
  const std::vector<int32_t> ids = Tokens(30, 5);
  const std::vector<float> full = testing::AllLogits(*runner, ids);
  for (int64_t chunk : {1, 4, 7, 16}) {
    std::unique_ptr<KvCache> cache = Cache(*runner, 64);
    BlockTable table;
    ASSERT_TRUE(cache->Reserve(&table, 30).ok());
    std::vector<float> logits;
    ForwardOptions options;
    options.logits = LogitsRows::kAll;
    ForwardResult result;
    for (int64_t start = 0; start < 30; start += chunk) {
      const int64_t n = std::min<int64_t>(chunk, 30 - start);
      ForwardBatch batch;
      batch.sequences = {{n, start, &table}};
      batch.token_ids = absl::MakeConstSpan(ids.data() + start, n);
      ASSERT_TRUE(runner->Forward(batch, cache.get(), options, &result).ok());
      logits.insert(logits.end(), result.logits.begin(), result.logits.end());
    }
    ExpectSame(logits, full, "chunk " + std::to_string(chunk));
  }
}

// The engine asks for logits per sequence; the rows that come back are exactly the requested
// ones of a whole-batch run, in batch order.
TEST_P(RunnerConformance, PerSequenceLogitsSelectTheRequestedRows) {
  std::unique_ptr<ModelRunner> runner = Make();
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> a = Tokens(5, 2), b = Tokens(3, 3), c = Tokens(4, 4);
  std::vector<int32_t> ids(a);
  ids.insert(ids.end(), b.begin(), b.end());
  ids.insert(ids.end(), c.begin(), c.end());
  const auto run = [&](const ForwardOptions& options, ForwardResult* result) {
    std::unique_ptr<KvCache> cache = Cache(*runner, 16);
    BlockTable ta, tb, tc;
    EXPECT_TRUE(cache->Reserve(&ta, 5).ok() && cache->Reserve(&tb, 3).ok() &&
                cache->Reserve(&tc, 4).ok());
    ForwardBatch batch;
    batch.sequences = {{5, 0, &ta}, {3, 0, &tb}, {4, 0, &tc}};
    batch.token_ids = ids;
    return runner->Forward(batch, cache.get(), options, result);
  };
  ForwardOptions all;
  all.logits = LogitsRows::kAll;
  ForwardResult whole;
  ASSERT_TRUE(run(all, &whole).ok());
  ForwardOptions mixed;
  mixed.sequence_logits = {LogitsRows::kLast, LogitsRows::kNone, LogitsRows::kAll};
  ForwardResult picked;
  ASSERT_TRUE(run(mixed, &picked).ok());
  ASSERT_EQ(picked.logits.size(), static_cast<size_t>(5 * vocab));
  ExpectSame(Rows(picked.logits, vocab, 0, 1), Rows(whole.logits, vocab, 4, 1), "a: last");
  ExpectSame(Rows(picked.logits, vocab, 1, 4), Rows(whole.logits, vocab, 8, 4), "c: all");
  // The engine reuses a result from step to step: a second run into the same result gives
  // the same rows again, and a step where every sequence wants its last row gives those.
  const std::vector<float> first = picked.logits;
  ASSERT_TRUE(run(mixed, &picked).ok());
  ExpectSame(picked.logits, first, "the same step into a reused result");
  ForwardOptions lasts;
  lasts.sequence_logits = {LogitsRows::kLast, LogitsRows::kLast, LogitsRows::kLast};
  ASSERT_TRUE(run(lasts, &picked).ok());
  ASSERT_EQ(picked.logits.size(), static_cast<size_t>(3 * vocab));
  ExpectSame(Rows(picked.logits, vocab, 0, 1), Rows(whole.logits, vocab, 4, 1), "a's last");
  ExpectSame(Rows(picked.logits, vocab, 1, 1), Rows(whole.logits, vocab, 7, 1), "b's last");
  ExpectSame(Rows(picked.logits, vocab, 2, 1), Rows(whole.logits, vocab, 11, 1), "c's last");
  // A run of a sub-span of the loaded layers: honoured where the runner says so, refused
  // clearly where it does not.
  ForwardOptions sub;
  sub.layer_end = 1;
  sub.logits = LogitsRows::kNone;
  sub.return_hidden = true;
  ForwardResult partial;
  const absl::Status s = run(sub, &partial);
  if (runner->supports_sub_spans()) {
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(partial.hidden.size(), static_cast<size_t>(12 * runner->config().hidden_size));
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  }
}

// A runner that samples (samples_tokens(): the CUDA runner) chooses, for each requested row,
// the host sampler's token from that very row, returns only the rows asked to be kept, and
// flags them finite; the others refuse sample requests as unimplemented.
TEST_P(RunnerConformance, SampleRequestsGiveTheHostSamplersTokens) {
  std::unique_ptr<ModelRunner> runner = Make();
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> a = Tokens(5, 2), b = Tokens(3, 3), c = Tokens(4, 4);
  std::vector<int32_t> ids(a);
  ids.insert(ids.end(), b.begin(), b.end());
  ids.insert(ids.end(), c.begin(), c.end());
  const auto run = [&](const ForwardOptions& options, ForwardResult* result) {
    std::unique_ptr<KvCache> cache = Cache(*runner, 16);
    BlockTable ta, tb, tc;
    EXPECT_TRUE(cache->Reserve(&ta, 5).ok() && cache->Reserve(&tb, 3).ok() &&
                cache->Reserve(&tc, 4).ok());
    ForwardBatch batch;
    batch.sequences = {{5, 0, &ta}, {3, 0, &tb}, {4, 0, &tc}};
    batch.token_ids = ids;
    return runner->Forward(batch, cache.get(), options, result);
  };
  // Rows: a's last, then c's four (b returns none).
  std::vector<SamplingParams> params(5);
  params[0].temperature = 0.8f;
  params[0].top_p = 0.9f;
  params[0].repetition_penalty = 1.3f;
  params[0].seed = 11;
  params[1].temperature = 1.2f;
  params[1].top_k = 7;
  params[1].seed = 12;
  params[2].temperature = 0.0f;  // greedy
  params[3].temperature = 2.0f;
  params[3].min_p = 0.1f;
  params[3].seed = 13;
  params[4].temperature = 0.7f;
  params[4].seed = 14;
  const std::vector<int32_t> history = {1, 5, 9, 5, 200};
  ForwardOptions options;
  options.sequence_logits = {LogitsRows::kLast, LogitsRows::kNone, LogitsRows::kAll};
  for (size_t r = 0; r < params.size(); ++r) {
    RowSampleRequest req;
    req.sample = r != 4;  // the last row: returned, not sampled
    req.keep_logits = true;
    const std::vector<int32_t> pen = PenalisedIds(params[r], history, vocab);
    req.params = RowSamplingFor(params[r], 3 + r);
    samplemath::RowSampling& p = req.params;
    p.penalised_begin = static_cast<int32_t>(options.penalised_ids.size());
    p.penalised_count = static_cast<int32_t>(pen.size());
    options.penalised_ids.insert(options.penalised_ids.end(), pen.begin(), pen.end());
    options.sample.push_back(req);
  }
  ForwardResult result;
  const absl::Status status = run(options, &result);
  if (!runner->samples_tokens()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
    return;
  }
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(result.logits.size(), static_cast<size_t>(5 * vocab));
  ASSERT_EQ(result.tokens.size(), 5u);
  ASSERT_EQ(result.row_finite.size(), 5u);
  for (size_t r = 0; r < 5; ++r) {
    const absl::Span<const float> row =
        absl::MakeConstSpan(result.logits).subspan(r * vocab, vocab);
    EXPECT_EQ(result.row_finite[r], 1) << "row " << r;
    const int32_t want =
        r == 4 ? -1 : SampleToken(row, params[r], history, 3 + r, LogprobRequest{}).token;
    EXPECT_EQ(result.tokens[r], want) << "row " << r;
  }
  // The same step keeping only row 1: one row back, the same tokens.
  const std::vector<float> kept(result.logits.begin() + vocab, result.logits.begin() + 2 * vocab);
  const std::vector<int32_t> tokens = result.tokens;
  for (size_t r = 0; r < 5; ++r) options.sample[r].keep_logits = r == 1;
  ASSERT_TRUE(run(options, &result).ok());
  EXPECT_EQ(result.tokens, tokens);
  ExpectSame(result.logits, kept, "the one kept row");
  // A malformed request is refused before any work.
  options.sample.pop_back();
  EXPECT_EQ(run(options, &result).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(RunnerConformance, LayerSpansChainToTheWholeStack) {
  std::unique_ptr<ModelRunner> whole = Make();
  ASSERT_NE(whole, nullptr);
  const std::vector<int32_t> ids = Tokens(11, 6);
  const std::vector<float> want = testing::AllLogits(*whole, ids);
  for (const int64_t split : {1, 2}) {
    // GLM-5: a span may start only at a layer with its own DSA indexer (a 'shared' layer
    // reuses the previous layer's top-k); CreateModelRunner refuses the others.
    if (whole->config().is_mla() && !whole->config().has_indexer(split)) continue;
    std::unique_ptr<ModelRunner> first = Make({0, split}), rest = Make({split, -1});
    ASSERT_TRUE(first && rest);
    EXPECT_TRUE(first->has_embedding());
    EXPECT_FALSE(first->has_head());
    EXPECT_FALSE(rest->has_embedding());
    EXPECT_TRUE(rest->has_head());
    EXPECT_EQ(first->num_span_layers() + rest->num_span_layers(),
              whole->config().num_hidden_layers);
    std::unique_ptr<KvCache> c1 = Cache(*first, 8), c2 = Cache(*rest, 8);
    BlockTable t1, t2;
    ASSERT_TRUE(c1->Reserve(&t1, 11).ok());
    ASSERT_TRUE(c2->Reserve(&t2, 11).ok());
    ForwardBatch batch;
    batch.sequences = {{11, 0, &t1}};
    batch.token_ids = ids;
    ForwardOptions options;
    options.logits = LogitsRows::kNone;
    options.return_hidden = true;
    ForwardResult mid, out;
    ASSERT_TRUE(first->Forward(batch, c1.get(), options, &mid).ok());
    ASSERT_EQ(mid.hidden.size(), static_cast<size_t>(11 * whole->config().hidden_size));
    ForwardBatch next;
    next.sequences = {{11, 0, &t2}};
    next.hidden_in = mid.hidden;
    ForwardOptions last;
    last.logits = LogitsRows::kAll;
    ASSERT_TRUE(rest->Forward(next, c2.get(), last, &out).ok());
    ExpectSame(out.logits, want, "layers [0, " + std::to_string(split) + ") then the rest");
    // Asking a span without the head for logits is refused.
    BlockTable t3;
    ASSERT_TRUE(c1->Reserve(&t3, 11).ok());
    batch.sequences = {{11, 0, &t3}};
    options.logits = LogitsRows::kLast;
    ForwardResult refused;
    EXPECT_EQ(first->Forward(batch, c1.get(), options, &refused).code(),
              absl::StatusCode::kInvalidArgument)
        << "logits from a span without the head";
  }
}

// A step's hidden states, per layer and at the end, have that step's rows whatever ran before
// on the runner (the CPU runner keeps its buffers at the largest step's size): a 12-token
// prompt, then a 3-token one, against the 3-token one on a fresh runner.
TEST_P(RunnerConformance, HiddenStatesHaveTheStepsRowsAfterALargerStep) {
  std::unique_ptr<ModelRunner> used = Make(), fresh = Make();
  ASSERT_TRUE(used && fresh);
  const int64_t hidden = used->config().hidden_size;
  ForwardOptions options;
  options.logits = LogitsRows::kLast;
  options.return_hidden = true;
  options.return_layer_hidden = true;
  const auto run = [&](ModelRunner& runner, KvCache* cache, const std::vector<int32_t>& ids,
                       ForwardResult* result) {
    BlockTable table;
    EXPECT_TRUE(cache->Reserve(&table, static_cast<int64_t>(ids.size())).ok());
    ForwardBatch batch;
    batch.sequences = {{static_cast<int64_t>(ids.size()), 0, &table}};
    batch.token_ids = ids;
    return runner.Forward(batch, cache, options, result);
  };
  std::unique_ptr<KvCache> c1 = Cache(*used, 16), c2 = Cache(*fresh, 16);
  ForwardResult big, small, want;
  ASSERT_TRUE(run(*used, c1.get(), Tokens(12, 7), &big).ok());
  ASSERT_TRUE(run(*used, c1.get(), Tokens(3, 8), &small).ok());
  ASSERT_TRUE(run(*fresh, c2.get(), Tokens(3, 8), &want).ok());
  ASSERT_EQ(small.hidden.size(), static_cast<size_t>(3 * hidden));
  ExpectSame(small.hidden, want.hidden, "the final hidden states");
  ASSERT_EQ(small.layer_hidden.size(), want.layer_hidden.size());
  for (size_t i = 0; i < want.layer_hidden.size(); ++i) {
    ASSERT_EQ(small.layer_hidden[i].size(), static_cast<size_t>(3 * hidden)) << "layer " << i;
    ExpectSame(small.layer_hidden[i], want.layer_hidden[i], "layer " + std::to_string(i));
  }
  ExpectSame(small.logits, want.logits, "the logits");
}

TEST_P(RunnerConformance, MalformedBatchesAreRefused) {
  std::unique_ptr<ModelRunner> runner = Make();
  ASSERT_NE(runner, nullptr);
  std::unique_ptr<KvCache> cache = Cache(*runner, 4);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(&table, 4).ok());
  ForwardOptions options;
  ForwardResult result;
  const std::vector<int32_t> ok_ids = {1, 2, 3};
  const std::vector<int32_t> bad_ids = {1, 256, 3};
  const std::vector<int32_t> far = {1, 999, 3};
  const std::vector<int32_t> negative = {1, -1, 3};
  ForwardBatch batch;
  batch.sequences = {{3, 0, &table}};
  for (const auto* ids : {&bad_ids, &far, &negative}) {
    batch.token_ids = *ids;
    const absl::Status s = runner->Forward(batch, cache.get(), options, &result);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("outside the vocabulary"), absl::string_view::npos) << s;
  }
  batch.token_ids = ok_ids;
  batch.sequences = {{3, 2, &table}};  // positions 2..4, the table covers 0..3
  EXPECT_EQ(runner->Forward(batch, cache.get(), options, &result).code(),
            absl::StatusCode::kInvalidArgument);
  batch.sequences = {{2, 0, &table}};  // 3 ids for 2 tokens
  EXPECT_EQ(runner->Forward(batch, cache.get(), options, &result).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> hidden(3 * runner->config().hidden_size);
  batch.sequences = {{3, 0, &table}};
  batch.token_ids = {};
  batch.hidden_in = hidden;  // this span starts at layer 0: hidden input is refused
  EXPECT_EQ(runner->Forward(batch, cache.get(), options, &result).code(),
            absl::StatusCode::kInvalidArgument);
  batch.sequences = {};
  EXPECT_EQ(runner->Forward(batch, cache.get(), options, &result).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->CreateCache(0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  // The cache still works after every refusal: nothing was half-applied.
  batch.sequences = {{3, 0, &table}};
  batch.token_ids = ok_ids;
  batch.hidden_in = {};
  EXPECT_TRUE(runner->Forward(batch, cache.get(), options, &result).ok());
}

INSTANTIATE_TEST_SUITE_P(Runners, RunnerConformance, ::testing::ValuesIn(kRunnerCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace glmserve
