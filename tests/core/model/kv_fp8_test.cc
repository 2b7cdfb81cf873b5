// The FP8 KV cache (core/model/kv_fp8.h, docs/kv_cache.md): the codec's round trip, the cache's
// layout and size, and the CPU model on it: prefill-then-decode and batch composition
// bit-exact, close to the fp32 cache, refused where it does not apply. The engine's
// invariants (batching, chunking, preemption, prefix hits, sessions) run with it in
// engine_test.cc's "fp8_kv" mode.
#include "core/model/kv_fp8.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "bench/instant_runner.h"
#include "core/base/dtype.h"
#include "core/cpu/cpu_model.h"
#include "core/model/checkpoint.h"
#include "core/model/kv_cache.h"
#include "core/model/model_runner.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

std::vector<float> RoundTrip(const std::vector<float>& x, int64_t heads,
                             std::vector<float>* scales) {
  const int64_t hd = static_cast<int64_t>(x.size()) / heads;
  std::vector<uint8_t> codes(x.size());
  scales->assign(heads, -1.f);
  EncodeKvRow(x.data(), heads, hd, codes.data(), scales->data());
  std::vector<float> out(x.size());
  for (int64_t h = 0; h < heads; ++h) {
    DecodeKvHead(codes.data() + h * hd, (*scales)[h], hd, out.data() + h * hd);
  }
  return out;
}

TEST(KvFp8CodecTest, EveryE4m3ValueRoundTripsExactlyUnderAUnitScale) {
  // A head whose largest magnitude is 448 has scale 1: every finite e4m3 value, subnormals
  // (2^-9 .. 7 x 2^-9) and signed zeros included, comes back bit for bit.
  std::vector<float> x;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN codes
    x.push_back(E4m3ToFloat(static_cast<uint8_t>(code)));
  }
  ASSERT_EQ(x.size(), 254u);
  std::vector<float> scales;
  const std::vector<float> y = RoundTrip(x, 1, &scales);
  EXPECT_EQ(scales[0], 1.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], x[i]) << i;
    EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << i;
  }
  EXPECT_EQ(y[1], std::ldexp(1.0f, -9));  // the smallest subnormal
}

TEST(KvFp8CodecTest, ScalesArePerHeadAndErrorsBoundedByE4m3Precision) {
  // Two heads of very different magnitudes: each gets its own scale (amax / 448).
  const int64_t hd = 64;
  std::vector<float> x(2 * hd);
  for (int64_t d = 0; d < hd; ++d) {
    x[d] = std::sin(0.37f * d) * 3.0f;              // head 0, |x| <= 3
    x[hd + d] = std::cos(0.11f * d + 1) * 1.5e-3f;  // head 1, tiny
  }
  std::vector<float> scales;
  const std::vector<float> y = RoundTrip(x, 2, &scales);
  for (int64_t h = 0; h < 2; ++h) {
    float amax = 0;
    for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[h * hd + d]));
    EXPECT_EQ(scales[h], amax / 448.0f) << h;
    for (int64_t d = 0; d < hd; ++d) {
      const float v = x[h * hd + d];
      // Normal e4m3: half an ulp is 2^-4 relative; subnormal: 2^-10 absolute (times scale).
      const float bound = std::max(std::fabs(v) * 0.0625f, scales[h] * 0.0009765625f) * 1.0001f;
      EXPECT_LE(std::fabs(y[h * hd + d] - v), bound) << h << " " << d;
    }
  }
}

TEST(KvFp8CodecTest, ZerosNanAndInfinity) {
  std::vector<float> scales;
  // An all-zero head: scale 1, zeros back.
  std::vector<float> y = RoundTrip(std::vector<float>(8, 0.f), 1, &scales);
  EXPECT_EQ(scales[0], 1.0f);
  for (float v : y) EXPECT_EQ(v, 0.f);
  // NaN stays NaN and does not poison the scale; +-inf saturates to +-448 x scale, the scale
  // coming from the finite values alone.
  const float inf = std::numeric_limits<float>::infinity();
  y = RoundTrip({std::nanf(""), 2.0f, -inf, inf, -1.0f, 0.5f, 0.f, 1.5f}, 1, &scales);
  EXPECT_EQ(scales[0], 2.0f / 448.0f);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_FLOAT_EQ(y[1], 2.0f);
  EXPECT_FLOAT_EQ(y[2], -2.0f);
  EXPECT_FLOAT_EQ(y[3], 2.0f);
  EXPECT_FLOAT_EQ(y[4], -1.0f);
  // Heads of fp32 subnormals: the scale is kept >= FLT_MIN so x / scale stays finite.
  y = RoundTrip({1e-41f, -2e-41f, 0.f, 5e-42f}, 1, &scales);
  EXPECT_GE(scales[0], FLT_MIN);
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

TEST(KvFp8CacheTest, LayoutAndBytes) {
  KvCacheShape shape;
  shape.num_layers = 3;
  shape.kv_heads = 2;
  shape.head_dim = 8;
  shape.block_size = 4;
  shape.num_blocks = 5;
  shape.fp8 = true;
  KvCache cache(shape);
  EXPECT_TRUE(cache.host_fp8());
  EXPECT_FALSE(cache.host_fp32());
  EXPECT_EQ(cache.dtype(), DType::kF8E4M3);
  EXPECT_EQ(cache.keys(0, 0), nullptr) << "no fp32 rows in an FP8 cache";
  // Per token: K and V, 3 layers, 16 one-byte codes + 2 four-byte scales each.
  EXPECT_EQ(cache.bytes_per_token(), 2 * 3 * (16 + 2 * 4));
  ASSERT_NE(cache.codes(2, 4, 1), nullptr);
  // The last block's value rows end exactly at the end of the storage.
  EXPECT_EQ(cache.codes(2, 4, 1) + 4 * 16, cache.codes(0, 0, 0) + cache.num_elements());
  EXPECT_EQ(cache.scales(2, 4, 1) + 4 * 2, cache.scales(0, 0, 0) + cache.num_elements() / 8);
  absl::StatusOr<std::unique_ptr<KvCache>> host = KvCache::CreateHost(shape);
  ASSERT_TRUE(host.ok()) << host.status();
  shape.latent = true;
  EXPECT_EQ(KvCache::CreateHost(shape).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseKvCacheDType("fp8_e4m3").value(), KvCacheDType::kFp8E4M3);
  EXPECT_EQ(ParseKvCacheDType("auto").value(), KvCacheDType::kAuto);
  EXPECT_EQ(ParseKvCacheDType("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

// --- the CPU model on an FP8 cache (tiny preset: 3 layers, 2 KV heads x 16) ---

std::unique_ptr<CpuModel> Tiny(bool fp8, const char* preset = "tiny") {
  absl::StatusOr<ModelConfig> c = PresetConfig(preset);
  EXPECT_TRUE(c.ok());
  RandomWeightOptions o;
  o.seed = 11;
  o.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(*c, o);
  EXPECT_TRUE(w.ok()) << w.status();
  auto m = std::make_unique<CpuModel>(*std::move(w));
  if (fp8) {
    absl::Status s = m->SetKvCacheDType(KvCacheDType::kFp8E4M3);
    EXPECT_TRUE(s.ok()) << s;
  }
  return m;
}

std::vector<int32_t> Ids(int n, int salt) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + salt * 11 + 3) % 256;
  return ids;
}

// Logits of every token of `seqs`, run as one ragged batch, each over its own table.
std::vector<std::vector<float>> Batch(CpuModel& m, const std::vector<std::vector<int32_t>>& seqs) {
  std::unique_ptr<KvCache> cache = *m.CreateCache(64, 4);
  std::vector<BlockTable> tables(seqs.size());
  ForwardBatch batch;
  std::vector<int32_t> ids;
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_TRUE(cache->Reserve(&tables[i], seqs[i].size()).ok());
    batch.sequences.push_back({static_cast<int64_t>(seqs[i].size()), 0, &tables[i]});
    ids.insert(ids.end(), seqs[i].begin(), seqs[i].end());
  }
  batch.token_ids = ids;
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult r;
  absl::Status s = m.Forward(batch, cache.get(), options, &r);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<std::vector<float>> out;
  const int64_t v = m.config().vocab_size;
  int64_t row = 0;
  for (const auto& seq : seqs) {
    out.emplace_back(r.logits.begin() + row * v, r.logits.begin() + (row + seq.size()) * v);
    row += static_cast<int64_t>(seq.size());
  }
  return out;
}

TEST(KvFp8ModelTest, PrefillThenDecodeAndBatchCompositionAreBitExact) {
  std::unique_ptr<CpuModel> m = Tiny(/*fp8=*/true);
  EXPECT_EQ(m->kv_bytes_per_token(), 3 * 2 * 2 * (16 + 4));  // 3 layers, K+V, 2 heads x 16
  const std::vector<int32_t> ids = Ids(21, 1);
  const std::vector<float> full = Batch(*m, {ids})[0];
  // The same sequence inside a ragged batch with two others.
  const std::vector<std::vector<float>> batched = Batch(*m, {Ids(7, 2), ids, Ids(13, 3)});
  EXPECT_EQ(batched[1], full);
  // Prefill 15 tokens, then decode 6 one at a time: every decode row equals the full row.
  std::unique_ptr<KvCache> cache = *m->CreateCache(16, 4);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(&table, ids.size()).ok());
  const int64_t v = m->config().vocab_size;
  for (int64_t start = 0, n = 15; start < static_cast<int64_t>(ids.size()); start += n, n = 1) {
    ForwardBatch batch;
    batch.sequences = {{n, start, &table}};
    batch.token_ids = absl::MakeConstSpan(ids).subspan(start, n);
    ForwardOptions options;
    options.logits = LogitsRows::kLast;
    ForwardResult r;
    ASSERT_TRUE(m->Forward(batch, cache.get(), options, &r).ok());
    const int64_t last = start + n - 1;
    EXPECT_TRUE(std::equal(r.logits.begin(), r.logits.end(), full.begin() + last * v))
        << "position " << last;
  }
}

TEST(KvFp8ModelTest, CloseToTheFp32CacheButNotEqual) {
  std::unique_ptr<CpuModel> fp8 = Tiny(true), fp32 = Tiny(false);
  const std::vector<int32_t> ids = Ids(40, 4);
  const std::vector<float> a = Batch(*fp8, {ids})[0], b = Batch(*fp32, {ids})[0];
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  const double rel = std::sqrt(num / den);
  std::printf("[ tiny, 40 tokens ] FP8 KV cache logits relative error vs fp32 cache: %.3g\n", rel);
  EXPECT_GT(rel, 0) << "the cache must actually be FP8";
  // Random weights of stddev 0.1 make this model unusually sensitive (its attention scores
  // are large); the goldens below measure realistic scales.
  EXPECT_LT(rel, 0.3);
}

// The accuracy figures of docs/kv_cache.md: on every GLM-4.5 golden fixture, the prompt and
// its greedy continuation (teacher-forced, one token per step) with the FP8 cache against
// the fp32 cache: logit errors, and whether each step's argmax is still the reference's
// greedy token.
TEST(KvFp8ModelTest, AccuracyOnTheGoldenFixtures) {
  int fixtures = 0, steps = 0, agree = 0;
  double worst_rel = 0;
  for (const std::string& name : testing::GoldenCases()) {
    const std::string dir = testing::GoldenDir(name);
    absl::StatusOr<ModelWeights> w8 = LoadCheckpoint(dir), w32 = LoadCheckpoint(dir);
    ASSERT_TRUE(w8.ok() && w32.ok()) << name;
    if (w8->config.is_mla()) continue;  // GLM-5 keeps its latent cache in fp32
    const testing::GoldenExpected e = testing::ReadGoldenExpected(dir);
    CpuModel fp8(*std::move(w8)), fp32(*std::move(w32));
    ASSERT_TRUE(fp8.SetKvCacheDType(KvCacheDType::kFp8E4M3).ok());
    std::vector<int32_t> ids = e.prompt;
    ids.insert(ids.end(), e.greedy.begin(), e.greedy.end() - 1);
    const std::vector<float> a = Batch(fp8, {ids})[0], b = Batch(fp32, {ids})[0];
    const int64_t v = fp8.config().vocab_size, n = static_cast<int64_t>(e.prompt.size());
    double max_abs = 0, sum_abs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_abs = std::max(max_abs, double(std::fabs(a[i] - b[i])));
      sum_abs += std::fabs(a[i] - b[i]);
    }
    const double rel = testing::RelativeError(a, b);
    int ok = 0;
    for (size_t k = 0; k < e.greedy.size(); ++k) {  // row n - 1 + k predicts greedy[k]
      const float* row = a.data() + (n - 1 + static_cast<int64_t>(k)) * v;
      ok += (std::max_element(row, row + v) - row) == e.greedy[k];
    }
    std::printf(
        "[ %s ] FP8 KV vs fp32 KV: logits max abs %.3g, mean abs %.3g, relative %.3g; "
        "greedy %d of %zu\n",
        name.c_str(), max_abs, sum_abs / a.size(), rel, ok, e.greedy.size());
    ++fixtures;
    steps += static_cast<int>(e.greedy.size());
    agree += ok;
    worst_rel = std::max(worst_rel, rel);
    EXPECT_GT(rel, 0) << name;
  }
  std::printf("FP8 KV cache over %d fixtures: greedy %d of %d, worst relative error %.3g\n",
              fixtures, agree, steps, worst_rel);
  EXPECT_GE(fixtures, 8);
  EXPECT_LT(worst_rel, 0.1);
  EXPECT_GE(agree, steps * 9 / 10);
}

TEST(KvFp8ModelTest, RefusedForGlm5AndByBackendsWithoutIt) {
  std::unique_ptr<CpuModel> glm5 = Tiny(false, "tiny-glm5");
  absl::Status s = glm5->SetKvCacheDType(KvCacheDType::kFp8E4M3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("GLM-5"), absl::string_view::npos) << s;
  EXPECT_TRUE(glm5->SetKvCacheDType(KvCacheDType::kAuto).ok());
  // Nor does a GLM-5 model run on an FP8 cache made by hand: refused, never read.
  KvCacheShape shape = glm5->CacheShape(4, 4);
  shape.fp8 = true;
  KvCache hand_made(shape);
  BlockTable table;
  ASSERT_TRUE(hand_made.Reserve(&table, 3).ok());
  const std::vector<int32_t> ids = {1, 2, 3};
  ForwardBatch batch;
  batch.sequences = {{3, 0, &table}};
  batch.token_ids = ids;
  ForwardResult r;
  EXPECT_EQ(glm5->Forward(batch, &hand_made, ForwardOptions{}, &r).code(),
            absl::StatusCode::kInvalidArgument);
  // A backend that does not override SetKvCacheDType (the instant runner) refuses the flag
  // by name.
  InstantRunner instant(*PresetConfig("tiny"));
  s = instant.SetKvCacheDType(KvCacheDType::kFp8E4M3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--kv_cache_dtype=fp8_e4m3"), absl::string_view::npos) << s;
  EXPECT_TRUE(instant.SetKvCacheDType(KvCacheDType::kAuto).ok());
}

// The CUDA runner serves the flag in the same format: tests/core/cuda/kv_fp8_cuda_test.cc.

}  // namespace
}  // namespace glmserve
