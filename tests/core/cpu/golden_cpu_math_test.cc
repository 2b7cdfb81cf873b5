// The CPU backend's bf16 fast modes (CpuMath::kBf16 and kBf16Amx, same bounds) against the Hugging
// Face goldens (the exact mode, on every runner, is golden_test.cc's).
//
// Tolerances: fp32 checkpoints, and bf16 checkpoints against the reference's fp32 compute on
// the same bf16 weights, must agree to a relative error under 1e-5 (the two differ only in
// fp32 summation order). Against the reference's native bf16 forward the bound is 3e-2: there
// every activation is rounded to bf16 (8 significant bits, relative rounding 2^-9 ~ 0.2%)
// after each op, and those roundings compound through the layers; our CPU path keeps fp32
// activations, so it is the more accurate of the two.
//
// In CpuMath::kBf16 (core/cpu/ops/linear.h) the linear layers round their inputs to bf16 as the
// reference's bf16 forward does (other activations, the residual stream, norms, attention
// and the router stay fp32). fp32 checkpoints take the exact arithmetic in that mode, so the
// bounds above still hold for them. For the bf16 checkpoint: relative error under 1e-2
// against the fp32-compute reference (one bf16 rounding per linear input, about 2^-9 each;
// 3.7e-3 measured) and above 1e-5 (the rounding is really applied), and under 3e-2 against
// the native bf16 forward, as in the exact mode: measured 9.3e-3 (exact mode: 8.7e-3), not
// closer, because the native forward also rounds the residual stream, the norms and the
// attention, which this mode keeps in fp32. Greedy tokens must match in both modes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/base/npy.h"
#include "core/cpu/cpu_model.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/model/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using Expected = testing::GoldenExpected;
using testing::GoldenCases;
constexpr auto ReadExpected = testing::ReadGoldenExpected;

class GoldenCpuMathTest : public ::testing::TestWithParam<std::tuple<std::string, CpuMath>> {};

TEST_P(GoldenCpuMathTest, LogitsHiddenStatesAndGreedyMatchTransformers) {
  const std::string name = std::get<0>(GetParam());
  const CpuMath math = std::get<1>(GetParam());
  const std::string dir = testing::GoldenDir(name);
  const Expected expected = ReadExpected(dir);
  absl::StatusOr<ModelWeights> weights = LoadCheckpoint(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->weight_dtype, expected.fp8                           ? DType::kF8E4M3
                                   : expected.weights_dtype == "bfloat16" ? DType::kBF16
                                                                          : DType::kF32)
      << "weights must stay in their stored precision";
  const bool rounded = math != CpuMath::kExact && weights->weight_dtype == DType::kBF16;
  // GLM-5's block rounds more linear inputs per layer (q_a, q_b, kv_a, the absorbed W_uk and
  // W_uv products, the indexer's projections): measured 3.75e-2 against the fp32-compute
  // reference and 4.0e-2 against the native bf16 forward (greedy identical), so its bounds
  // are 6e-2 there; GLM-4.5's stay 1e-2 and 3e-2 (docs/cpu_math.md).
  const bool mla = weights->config.is_mla();
  const double fp32_bound = rounded ? (mla ? 6e-2 : 1e-2) : 1e-5;
  const double native_bound = rounded && mla ? 6e-2 : 3e-2;
  const std::string label = absl::StrCat(name, " ", CpuMathName(math));
  CpuModel model(*std::move(weights), math);
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(expected.prompt.size());

  const int64_t total = n + static_cast<int64_t>(expected.greedy.size());
  KvCache cache(model.CacheShape((total + 3) / 4, 4));
  BlockTable table;
  ASSERT_TRUE(cache.Reserve(&table, total).ok());
  ForwardBatch batch;
  batch.sequences = {{n, 0, &table}};
  batch.token_ids = expected.prompt;
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  options.return_layer_hidden = true;
  ForwardResult result;
  ASSERT_TRUE(model.Forward(batch, &cache, options, &result).ok());

  absl::StatusOr<NpyArray> logits = ReadNpy(dir + "/logits.npy");
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->shape, (std::vector<int64_t>{n, c.vocab_size}));
  const double logits_err = testing::RelativeError(result.logits, logits->data);
  EXPECT_LT(logits_err, fp32_bound) << "logits vs fp32-compute reference";
  if (rounded) {
    EXPECT_GT(logits_err, 1e-5) << "the bf16 mode did not round anything";
  }
  std::printf("[ %s ] logits relative error vs fp32 reference: %.3g\n", label.c_str(), logits_err);

  absl::StatusOr<NpyArray> hidden = ReadNpy(dir + "/hidden_states.npy");
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  ASSERT_EQ(hidden->shape, (std::vector<int64_t>{c.num_hidden_layers + 1, n, c.hidden_size}));
  ASSERT_EQ(result.layer_hidden.size(), static_cast<size_t>(c.num_hidden_layers + 1));
  for (int64_t l = 0; l <= c.num_hidden_layers; ++l) {
    const float* ref = hidden->data.data() + l * n * c.hidden_size;
    const double err =
        testing::RelativeError(result.layer_hidden[l].data(), ref, n * c.hidden_size);
    EXPECT_LT(err, fp32_bound) << "hidden state " << l << " (0 = embedding output)";
    if (rounded)
      std::printf("[ %s ] hidden state %lld relative error: %.3g\n", label.c_str(),
                  static_cast<long long>(l), err);
  }

  if (expected.weights_dtype == "bfloat16") {
    absl::StatusOr<NpyArray> native = ReadNpy(dir + "/logits_bf16.npy");
    ASSERT_TRUE(native.ok()) << native.status();
    const double native_err = testing::RelativeError(result.logits, native->data);
    std::printf("[ %s ] logits relative error vs native bf16 reference: %.3g\n", label.c_str(),
                native_err);
    EXPECT_LT(native_err, native_bound) << "logits vs the reference's native bf16 forward";
  }

  // Greedy continuation through the KV cache, one token per step.
  std::vector<int32_t> generated;
  int32_t next = static_cast<int32_t>(
      std::max_element(result.logits.end() - c.vocab_size, result.logits.end()) -
      (result.logits.end() - c.vocab_size));
  options = ForwardOptions{};
  for (size_t step = 0; step < expected.greedy.size(); ++step) {
    generated.push_back(next);
    batch.sequences = {{1, n + static_cast<int64_t>(step), &table}};
    batch.token_ids = absl::MakeConstSpan(&next, 1);
    ASSERT_TRUE(model.Forward(batch, &cache, options, &result).ok());
    next = static_cast<int32_t>(std::max_element(result.logits.begin(), result.logits.end()) -
                                result.logits.begin());
  }
  EXPECT_EQ(generated, expected.greedy);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenCpuMathTest,
                         ::testing::Combine(::testing::ValuesIn(GoldenCases()),
                                            ::testing::Values(CpuMath::kBf16, CpuMath::kBf16Amx)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_",
                                               CpuMathName(std::get<1>(info.param)));
                         });

// The portable kBf16 and kBf16Amx kernels (emulations of vdpbf16ps and of TDPBF16PS) give
// the dispatched kernel's bits on a whole forward, prefill and decode: a machine without
// AVX512_BF16 (or AMX) computes what one with it does. For kBf16Amx, so does the AMX kernels'
// own code on the software tile unit (ForceAmxTileModel: linear and attention).
class PortableKernelTest : public ::testing::TestWithParam<CpuMath> {};

TEST_P(PortableKernelTest, GivesTheDispatchedBits) {
  const CpuMath math = GetParam();
  auto run = [math](bool generic, bool tile_model = false) {
    absl::StatusOr<ModelWeights> weights = LoadCheckpoint(testing::GoldenDir("bf16"));
    EXPECT_TRUE(weights.ok()) << weights.status();
    CpuModel model(*std::move(weights), math);
    const Expected expected = ReadExpected(testing::GoldenDir("bf16"));
    const int64_t n = static_cast<int64_t>(expected.prompt.size());
    KvCache cache(model.CacheShape(8, 4));
    BlockTable table;
    EXPECT_TRUE(cache.Reserve(&table, n + 1).ok());
    internal::ForceGenericKernels(generic);
    internal::ForceAmxTileModel(tile_model);
    ForwardBatch batch;
    batch.sequences = {{n, 0, &table}};
    batch.token_ids = expected.prompt;
    ForwardOptions options;
    options.logits = LogitsRows::kAll;
    ForwardResult prefill, decode;
    EXPECT_TRUE(model.Forward(batch, &cache, options, &prefill).ok());
    const int32_t next = expected.greedy[0];
    batch.sequences = {{1, n, &table}};
    batch.token_ids = absl::MakeConstSpan(&next, 1);
    EXPECT_TRUE(model.Forward(batch, &cache, options, &decode).ok());
    internal::ForceGenericKernels(false);
    internal::ForceAmxTileModel(false);
    prefill.logits.insert(prefill.logits.end(), decode.logits.begin(), decode.logits.end());
    return prefill.logits;
  };
  std::printf("dispatched %s kernel: %s\n", CpuMathName(math), LinearKernelName(math));
  const std::vector<float> dispatched = run(false);
  const std::vector<float> generic = run(true);
  ASSERT_FALSE(dispatched.empty());
  EXPECT_EQ(dispatched, generic);
  if (math == CpuMath::kBf16Amx) EXPECT_EQ(run(false, /*tile_model=*/true), generic);
}

INSTANTIATE_TEST_SUITE_P(Modes, PortableKernelTest,
                         ::testing::Values(CpuMath::kBf16, CpuMath::kBf16Amx),
                         [](const auto& info) { return std::string(CpuMathName(info.param)); });

}  // namespace
}  // namespace glmserve
