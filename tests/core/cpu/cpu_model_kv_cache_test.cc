// CpuModel's KV cache formats (SetKvCacheDType, docs/kv_cache.md): `auto` keeps K and V in bf16
// exactly where the attention rounds them to bf16 anyway (the bf16 and bf16_amx arithmetic on
// bf16 weights, int8 included), so the logits keep their bits in half the bytes, and in fp32
// everywhere else; an explicit bf16 cache on the fp32 path rounds K and V and nothing else;
// GLM-5's latent cache refuses bf16 at both doors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu/cpu_model.h"
#include "core/cpu/quantize.h"
#include "core/model/checkpoint.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

struct ModelSetup {
  const char* preset;
  DType dtype;
  CpuMath math;
  WeightQuant quant;
};

std::unique_ptr<CpuModel> Make(const ModelSetup& s, KvCacheDType kv) {
  absl::StatusOr<ModelConfig> config = PresetConfig(s.preset);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  RandomWeightOptions options;
  options.seed = 42;
  options.dtype = s.dtype;
  options.stddev = 0.1;  // every layer visibly matters (as runner_conformance_test's models)
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  EXPECT_TRUE(QuantizeWeights(&*w, s.quant).ok());
  auto model = std::make_unique<CpuModel>(*std::move(w), s.math);
  const absl::Status status = model->SetKvCacheDType(kv);
  EXPECT_TRUE(status.ok()) << status;
  return model;
}

// The logits of a 21-token prompt (every row: every row's attention read the cache after its
// K/V went in) and of three decode steps after it, over 4-token blocks.
std::vector<float> PrefillThenDecode(CpuModel& model) {
  const int64_t n = 21, steps = 3;
  absl::StatusOr<std::unique_ptr<KvCache>> cache = model.CreateCache(8, 4);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  BlockTable table;
  EXPECT_TRUE((*cache)->Reserve(&table, n + steps).ok());
  std::vector<float> logits;
  for (int64_t step = 0; step <= steps; ++step) {
    ForwardBatch batch;
    const int64_t start = step == 0 ? 0 : n + step - 1, count = step == 0 ? n : 1;
    batch.sequences = {{count, start, &table}};
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < count; ++i) {
      ids.push_back(static_cast<int32_t>(((start + i) * 37 + 5) % 256));
    }
    batch.token_ids = ids;
    ForwardOptions options;
    options.logits = LogitsRows::kAll;
    ForwardResult result;
    const absl::Status s = model.Forward(batch, cache->get(), options, &result);
    EXPECT_TRUE(s.ok()) << s;
    logits.insert(logits.end(), result.logits.begin(), result.logits.end());
  }
  return logits;
}

// Where the attention rounds K and V to bf16 (attention_bf16.h, attention_amx.h), auto is a bf16
// cache: half the bytes per token, and the logits of prefill and decode bit for bit those of the
// fp32 cache.
TEST(CpuModelKvCacheTest, AutoIsBf16WhereTheAttentionRoundsToBf16AndKeepsEveryBit) {
  for (const ModelSetup& s :
       {ModelSetup{"tiny", DType::kBF16, CpuMath::kBf16, WeightQuant::kStored},
        ModelSetup{"tiny", DType::kBF16, CpuMath::kBf16Amx, WeightQuant::kStored},
        ModelSetup{"tiny", DType::kBF16, CpuMath::kBf16, WeightQuant::kInt8}}) {
    SCOPED_TRACE(CpuMathName(s.math) + std::string(" ") + WeightQuantName(s.quant));
    std::unique_ptr<CpuModel> automatic = Make(s, KvCacheDType::kAuto);
    std::unique_ptr<CpuModel> fp32 = Make(s, KvCacheDType::kFp32);
    ASSERT_NE(automatic, nullptr);
    ASSERT_NE(fp32, nullptr);
    EXPECT_EQ(automatic->kv_cache_dtype(), KvCacheDType::kBf16);
    EXPECT_EQ(fp32->kv_cache_dtype(), KvCacheDType::kFp32);
    EXPECT_TRUE(automatic->CacheShape(1).bf16);
    EXPECT_EQ(2 * automatic->kv_bytes_per_token(), fp32->kv_bytes_per_token());
    absl::StatusOr<std::unique_ptr<KvCache>> cache = automatic->CreateCache(2, 4);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_TRUE((*cache)->host_bf16());
    EXPECT_EQ((*cache)->bytes_per_token(), automatic->kv_bytes_per_token());
    const std::vector<float> a = PrefillThenDecode(*automatic), b = PrefillThenDecode(*fp32);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  }
}

// Where the attention reads fp32 (the exact arithmetic; weights that are not bf16; GLM-5's latent
// attention) auto stays fp32: a bf16 cache would change results there.
TEST(CpuModelKvCacheTest, AutoIsFp32WhereTheAttentionReadsFp32) {
  for (const ModelSetup& s :
       {ModelSetup{"tiny", DType::kBF16, CpuMath::kExact, WeightQuant::kStored},
        ModelSetup{"tiny", DType::kF32, CpuMath::kBf16, WeightQuant::kStored},
        ModelSetup{"tiny", DType::kBF16, CpuMath::kBf16, WeightQuant::kFp8Block},
        ModelSetup{"tiny-glm5", DType::kBF16, CpuMath::kBf16, WeightQuant::kStored}}) {
    SCOPED_TRACE(s.preset + std::string(" ") + CpuMathName(s.math));
    std::unique_ptr<CpuModel> model = Make(s, KvCacheDType::kAuto);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->kv_cache_dtype(), KvCacheDType::kFp32);
    absl::StatusOr<std::unique_ptr<KvCache>> cache = model->CreateCache(2, 4);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_TRUE((*cache)->host_fp32());
  }
}

// Asked for on the fp32 path, a bf16 cache rounds each key and value (2^-9 relative) and nothing
// else: the logits move, a little.
TEST(CpuModelKvCacheTest, ABf16CacheOnTheFp32PathRoundsOnlyTheKeysAndValues) {
  const ModelSetup s{"tiny", DType::kF32, CpuMath::kExact, WeightQuant::kStored};
  std::unique_ptr<CpuModel> bf16 = Make(s, KvCacheDType::kBf16);
  std::unique_ptr<CpuModel> fp32 = Make(s, KvCacheDType::kAuto);
  ASSERT_NE(bf16, nullptr);
  ASSERT_NE(fp32, nullptr);
  EXPECT_EQ(bf16->kv_cache_dtype(), KvCacheDType::kBf16);
  const std::vector<float> a = PrefillThenDecode(*bf16), b = PrefillThenDecode(*fp32);
  ASSERT_EQ(a.size(), b.size());
  const double rel = testing::RelativeError(a, b);
  std::printf("exact arithmetic, bf16 cache against fp32: logits relative error %.3g\n", rel);
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 2e-2);
}

// GLM-5's latent rows stay fp32: SetKvCacheDType refuses bf16 (and FP8) with the reason, and a
// bf16 cache handed to Forward is refused before anything is written.
TEST(CpuModelKvCacheTest, Glm5RefusesABf16Cache) {
  std::unique_ptr<CpuModel> model =
      Make({"tiny-glm5", DType::kBF16, CpuMath::kBf16, WeightQuant::kStored}, KvCacheDType::kAuto);
  ASSERT_NE(model, nullptr);
  for (const KvCacheDType kv : {KvCacheDType::kBf16, KvCacheDType::kFp8E4M3}) {
    const absl::Status s = model->SetKvCacheDType(kv);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("latent"), std::string::npos) << s;
  }
  EXPECT_EQ(model->kv_cache_dtype(), KvCacheDType::kFp32);
  KvCacheShape shape = model->CacheShape(4, 4);
  shape.latent = false;  // a GQA-shaped bf16 cache: not one this model made
  shape.bf16 = true;
  KvCache cache(shape);
  BlockTable table;
  ASSERT_TRUE(cache.Reserve(&table, 3).ok());
  ForwardBatch batch;
  batch.sequences = {{3, 0, &table}};
  batch.token_ids = {1, 2, 3};
  ForwardResult result;
  const absl::Status s = model->Forward(batch, &cache, ForwardOptions{}, &result);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace glmserve
