// Int8 weights quantized at load (core/cpu/quantize.h): the quantizer's error bound, the model's
// quantized matrices, and the accuracy against the Transformers goldens (logits error and
// greedy agreement). The kernels are tested in tests/core/cpu/ops/linear_int8_test.cc.
#include "core/cpu/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/base/npy.h"
#include "core/cpu/cpu_model.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_int8_amx.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/core/cpu/int8_matrix.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::RandomVector;
using testing::RelativeError;

using testing::QuantizeInt8;

TEST(QuantizeInt8, ErrorWithinHalfAScalePerElement) {
  const int64_t rows = 7, cols = 77;  // a 13-wide last group
  std::vector<float> w = RandomVector(rows * cols, 3, 0.2f);
  for (int64_t c = 0; c < cols; ++c) w[2 * cols + c] = 0;  // an all-zero row
  const testing::Int8Matrix qm = QuantizeInt8(w, rows, cols);
  const int64_t groups = qm.view.scale_cols();
  ASSERT_EQ(groups, 3);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (int64_t c = g * 32; c < std::min<int64_t>(cols, g * 32 + 32); ++c)
        amax = std::max(amax, std::fabs(w[r * cols + c]));
      // The stored scale: amax / 127 rounded up to bf16, i.e. the least bf16 >= it.
      const float scale = Bf16ToFloat(qm.scales[r * groups + g]);
      const float exact = amax / 127.0f;
      EXPECT_GE(scale, exact);
      EXPECT_LE(scale, exact * (1 + 1.0f / 128));
      EXPECT_EQ(FloatToBf16(scale), qm.scales[r * groups + g]);  // representable
      if (exact > 0) {                                           // the least such bf16
        EXPECT_LT(Bf16ToFloat(qm.scales[r * groups + g] - 1), exact);
      }
      for (int64_t c = g * 32; c < std::min<int64_t>(cols, g * 32 + 32); ++c) {
        const float back = qm.q[r * cols + c] * scale;
        EXPECT_LE(std::fabs(back - w[r * cols + c]), scale * 0.5f * (1 + 1e-5f) + 1e-30f)
            << r << "," << c;
        EXPECT_LE(std::abs(qm.q[r * cols + c]), 127);
      }
    }
  }
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(qm.q[2 * cols + c], 0);
  // 34 bytes per full group of 32, as Q8_0.
  EXPECT_EQ(qm.view.bytes(), rows * cols + rows * groups * 2);
}

// A group whose amax is 127 times a bf16 is stored with exactly that scale and reaches +-127;
// tiny and huge groups keep a usable scale (bf16 has fp32's range, fp16 would flush or
// overflow them).
TEST(QuantizeInt8, WeightScaleIsTheLeastBf16AboveAmaxOver127) {
  std::vector<float> v(32, 0.0f);
  std::vector<int8_t> q(32);
  v[0] = 127 * 0.5f;
  v[1] = -0.25f;
  EXPECT_EQ(Bf16ToFloat(QuantizeWeightGroupInt8(v.data(), 32, q.data())), 0.5f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 0);  // -0.5 rounds to even
  for (const float amax : {1e-30f, 1e-6f, 3e-3f, 7.0f, 1e30f}) {
    for (int c = 0; c < 32; ++c) v[c] = amax * (c % 2 == 0 ? 1.0f : -0.37f) * (1 + c) / 31;
    ASSERT_EQ(v[30], amax);  // the largest magnitude
    const float scale = Bf16ToFloat(QuantizeWeightGroupInt8(v.data(), 32, q.data()));
    EXPECT_GE(scale, amax / 127) << amax;
    EXPECT_LE(scale, amax / 127 * (1 + 1.0f / 128)) << amax;
    int peak = 0;
    for (int c = 0; c < 32; ++c) {
      peak = std::max(peak, std::abs(int{q[c]}));
      EXPECT_LE(std::fabs(q[c] * scale - v[c]), scale * 0.5f * (1 + 1e-5f)) << amax << " " << c;
    }
    EXPECT_GE(peak, 126) << amax;  // the range is used: at most 1% lost to the rounding up
  }
  v[5] = NAN;
  EXPECT_TRUE(std::isnan(Bf16ToFloat(QuantizeWeightGroupInt8(v.data(), 32, q.data()))));
  for (int8_t e : q) EXPECT_EQ(e, 0);
}

TEST(QuantizeInt8, NonFiniteGroupGetsANanScale) {
  std::vector<float> v = RandomVector(32, 4);
  std::vector<int8_t> q(32, 5);
  v[7] = NAN;
  EXPECT_TRUE(std::isnan(QuantizeGroupInt8(v.data(), 32, q.data())));
  for (int8_t e : q) EXPECT_EQ(e, 0);
  v[7] = -INFINITY;
  EXPECT_TRUE(std::isnan(QuantizeGroupInt8(v.data(), 32, q.data())));
  v[7] = 0;
  EXPECT_EQ(QuantizeGroupInt8(v.data(), 32, q.data()) > 0, true);
  const std::vector<float> zeros(32, 0.0f);
  EXPECT_EQ(QuantizeGroupInt8(zeros.data(), 32, q.data()), 0.0f);
  for (int8_t e : q) EXPECT_EQ(e, 0);
}

// FP8 at load (kFp8Channel / kFp8Block): scale = amax / 448 per block, codes e4m3(w / scale)
// so each element is within half an e4m3 step (2^-4 relative, for normals) of the weight.
TEST(QuantizeFp8, ScalesPerBlockAndCodesWithinHalfAStep) {
  const int64_t rows = 130, cols = 200;  // blocks cut short at the right and bottom edges
  std::vector<float> w = RandomVector(rows * cols, 9, 0.1f);
  for (int64_t c = 0; c < cols; ++c) w[129 * cols + c] = 0;  // an all-zero row (its own block)
  const Matrix m{DType::kF32, rows, cols, w.data()};
  for (const auto& [br, bc] : {std::pair<int64_t, int64_t>{1, cols}, {128, 128}}) {
    const int64_t scale_cols = (cols + bc - 1) / bc;
    std::vector<uint8_t> codes(rows * cols);
    std::vector<float> scales(((rows + br - 1) / br) * scale_cols, -1);
    QuantizeMatrixFp8(m, br, bc, codes.data(), scales.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float scale = scales[r / br * scale_cols + c / bc];
        const float back = E4m3ToFloat(codes[r * cols + c]) * scale;
        const float v = w[r * cols + c];
        // Normals: 3 mantissa bits, half a step is 2^-4 of the value; subnormals: 2^-10 * scale.
        EXPECT_LE(std::fabs(back - v), std::max(std::fabs(v) / 16.0f, scale / 1024.0f) * 1.0001f)
            << br << "x" << bc << " " << r << "," << c;
      }
    }
    // Each block's largest element maps to 448 exactly; the zero row's block (per channel) gets 1.
    for (size_t b = 0; b < scales.size(); ++b) EXPECT_GT(scales[b], 0) << b;
    if (br == 1) {
      EXPECT_EQ(scales[129], 1.0f);
    }
  }
}

TEST(QuantizeFp8, TheModelsLinearLayersButNotTheHead) {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny");
  ASSERT_TRUE(w.ok()) << w.status();
  const void* head = w->lm_head.data;
  ASSERT_TRUE(QuantizeWeights(&*w, WeightQuant::kFp8Block).ok());
  EXPECT_EQ(w->linear_format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(w->layers[0].attn.q_proj.format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(w->layers[0].attn.q_proj.scale_block_rows, 128);
  EXPECT_EQ(w->layers[1].moe.experts[0].down.dtype, DType::kF8E4M3);
  EXPECT_EQ(w->lm_head.data, head);  // kept as stored, as the FP8 releases keep it
  EXPECT_EQ(w->lm_head.format, WeightFormat::kDense);
  EXPECT_EQ(QuantizeWeights(&*w, WeightQuant::kFp8Channel).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ParseWeightQuant("fp8_channel"), WeightQuant::kFp8Channel);
  EXPECT_STREQ(WeightQuantName(WeightQuant::kFp8Block), "fp8_block");
  EXPECT_FALSE(ParseWeightQuant("fp8").ok());
}

TEST(QuantizeWeights, QuantizesTheLinearLayersOnceAndIsNeverSilent) {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny");
  ASSERT_TRUE(w.ok()) << w.status();
  const int64_t before = w->ParameterBytes();
  const Matrix router = w->layers.back().moe.router;
  ASSERT_TRUE(QuantizeWeights(&*w, WeightQuant::kInt8).ok());
  EXPECT_EQ(w->linear_format, WeightFormat::kInt8Groups);
  EXPECT_EQ(w->layers[0].attn.q_proj.format, WeightFormat::kInt8Groups);
  EXPECT_EQ(w->layers.back().moe.experts[0].down.format, WeightFormat::kInt8Groups);
  EXPECT_EQ(w->layers.back().moe.router.data, router.data) << "the router stays as stored";
  EXPECT_EQ(w->embed_tokens.format, WeightFormat::kDense);
  EXPECT_LT(w->ParameterBytes(), before);
  // Every matrix's codes and scales start on a cache line (the AMX int8 kernel's tile loads).
  for (const Matrix* m : w->LinearMatrices()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m->group_scales) % 64, 0u);
  }
  EXPECT_EQ(QuantizeWeights(&*w, WeightQuant::kInt8).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SaveCheckpoint(*w, testing::MakeTempDir("q8_save")).code(),
            absl::StatusCode::kFailedPrecondition);
  CpuModel model(*w, CpuMath::kBf16);
  EXPECT_NE(model.compute_description().find("weights int8 (groups of 32, quantized at load"),
            std::string::npos)
      << model.compute_description();
  // In either mode the int8 matrices name this machine's int8 kernel (one arithmetic).
  CpuModel amx(*w, CpuMath::kBf16Amx);
  for (const CpuModel* m : {&model, &amx}) {
    EXPECT_NE(m->compute_description().find(absl::StrCat("(kernel ", LinearInt8KernelName(), ")")),
              std::string::npos)
        << m->compute_description();
  }
  absl::StatusOr<std::unique_ptr<ModelRunner>> cuda = CreateModelRunner(*w, DeviceKind::kCuda);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ParseWeightQuant("int8"), WeightQuant::kInt8);
  EXPECT_EQ(*ParseWeightQuant("stored"), WeightQuant::kStored);
  EXPECT_EQ(ParseWeightQuant("int4").status().code(), absl::StatusCode::kInvalidArgument);
  // int8 with the approximate arithmetic only (both bf16 modes), never a silent change of exact.
  EXPECT_TRUE(CheckWeightQuantMath(WeightQuant::kInt8, CpuMath::kBf16).ok());
  EXPECT_TRUE(CheckWeightQuantMath(WeightQuant::kInt8, CpuMath::kBf16Amx).ok());
  EXPECT_TRUE(CheckWeightQuantMath(WeightQuant::kStored, CpuMath::kExact).ok());
  const absl::Status exact = CheckWeightQuantMath(WeightQuant::kInt8, CpuMath::kExact);
  EXPECT_EQ(exact.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(exact.message().find("--cpu_math=bf16 (or bf16_amx)"), std::string::npos);
}

// The two int8 layouts hold the same codes and scales and give the same bits through the whole
// model: a 70-token prompt (the tile kernel in either layout) and decode steps of one token (the
// row-major and the kRows16 decode kernels; the portable one where the CPU lacks VNNI), and on
// the AVX2 kernels in either layout and on AVX-VNNI's.
TEST(QuantizeWeights, Int8LayoutsGiveTheSameBits) {
  // amx_model: LinearMany as on an AMX-INT8 CPU, the kernels' drivers on the software tile
  // model (linear_int8_amx.h): the prompt's 70 rows on the tiles, the decode steps' one row on
  // VNNI's kernel for kRows16 and on the tiles for row-major codes.
  // avx2: the kernels of a CPU without AVX-512 (ForceAvx2Kernels; either layout at every m).
  // avx_vnni: those of one with AVX-VNNI too (ForceAvxVnniKernels).
  auto run = [](Int8Layout layout, bool amx_model, bool avx2 = false, bool avx_vnni = false) {
    internal::ForceInt8AmxTileModel(amx_model);
    internal::ForceAvx2Kernels(avx2);
    internal::ForceAvxVnniKernels(avx_vnni);
    absl::Cleanup reset = [] {
      internal::ForceInt8AmxTileModel(false);
      internal::ForceAvx2Kernels(false);
      internal::ForceAvxVnniKernels(false);
    };
    absl::StatusOr<ModelWeights> w = LoadModel("tiny");
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(QuantizeWeights(&*w, WeightQuant::kInt8, layout).ok());
    for (const Matrix* m : w->LinearMatrices()) EXPECT_EQ(m->int8_layout, layout);
    CpuModel model(*std::move(w), CpuMath::kBf16);
    EXPECT_EQ(model.compute_description().find("in 16-row blocks") != std::string::npos,
              layout == Int8Layout::kRows16)
        << model.compute_description();
    const int64_t n = 70, steps = 3;
    KvCache cache(model.CacheShape((n + steps + 3) / 4, 4));
    BlockTable table;
    EXPECT_TRUE(cache.Reserve(&table, n + steps).ok());
    std::vector<int32_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % 250);
    std::vector<float> logits;
    for (int64_t step = 0; step <= steps; ++step) {
      ForwardBatch batch;
      const int64_t len = step == 0 ? n : 1, pos = step == 0 ? 0 : n + step - 1;
      batch.sequences = {{len, pos, &table}};
      batch.token_ids = absl::MakeConstSpan(ids).subspan(step == 0 ? 0 : n - 1, len);
      ForwardResult result;
      EXPECT_TRUE(model.Forward(batch, &cache, ForwardOptions{}, &result).ok());
      logits.insert(logits.end(), result.logits.begin(), result.logits.end());
    }
    return logits;
  };
  const std::vector<float> row_major = run(Int8Layout::kRowMajor, false);
  ASSERT_FALSE(row_major.empty());
  struct Case {
    Int8Layout layout;
    bool amx_model, avx2, avx_vnni;
  };
  for (const Case c : {Case{Int8Layout::kRows16, false, false, false},
                       {Int8Layout::kRowMajor, true, false, false},
                       {Int8Layout::kRows16, true, false, false},
                       {Int8Layout::kRowMajor, false, true, false},
                       {Int8Layout::kRows16, false, true, false},
                       {Int8Layout::kRows16, false, false, true}}) {
    const std::vector<float> other = run(c.layout, c.amx_model, c.avx2, c.avx_vnni);
    ASSERT_EQ(row_major.size(), other.size());
    EXPECT_EQ(std::memcmp(row_major.data(), other.data(), row_major.size() * sizeof(float)), 0)
        << "rows16=" << (c.layout == Int8Layout::kRows16) << " amx_model=" << c.amx_model
        << " avx2=" << c.avx2 << " avx_vnni=" << c.avx_vnni;
  }
  // And the codes agree element by element (Matrix::Int8Code reads either layout).
  absl::StatusOr<ModelWeights> a = LoadModel("tiny"), b = LoadModel("tiny");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(QuantizeWeights(&*a, WeightQuant::kInt8, Int8Layout::kRowMajor).ok());
  ASSERT_TRUE(QuantizeWeights(&*b, WeightQuant::kInt8, Int8Layout::kRows16).ok());
  const Matrix& qa = a->layers[0].attn.q_proj;
  const Matrix& qb = b->layers[0].attn.q_proj;
  for (int64_t r = 0; r < qa.rows; ++r) {
    for (int64_t c = 0; c < qa.cols; ++c) ASSERT_EQ(qa.Int8Code(r, c), qb.Int8Code(r, c));
    for (int64_t g = 0; g < qa.scale_cols(); ++g) ASSERT_EQ(qa.Int8Scale(r, g), qb.Int8Scale(r, g));
  }
  EXPECT_EQ(QuantizeWeights(&*b, WeightQuant::kInt8).code(), absl::StatusCode::kFailedPrecondition);
}

// Accuracy against the Transformers goldens: prompt logits against the reference's fp32
// compute on the stored weights, and greedy continuation through the KV cache.
TEST(QuantizeWeights, GoldenAccuracy) {
  size_t greedy_agree = 0, greedy_total = 0;
  for (const std::string name :
       {"bf16", "qknorm_bias_fp32", "grouped_router_fp32", "dense2_tied_fp32"}) {
    const std::string dir = testing::GoldenDir(name);
    std::ifstream in(dir + "/expected.json");
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json expected = nlohmann::json::parse(text.str());
    const auto prompt = expected["prompt"].get<std::vector<int32_t>>();
    const auto greedy = expected["greedy"].get<std::vector<int32_t>>();
    absl::StatusOr<ModelWeights> weights = LoadCheckpoint(dir);
    ASSERT_TRUE(weights.ok()) << weights.status();
    ASSERT_TRUE(QuantizeWeights(&*weights, WeightQuant::kInt8).ok());
    CpuModel model(*std::move(weights), CpuMath::kBf16);
    const int64_t n = static_cast<int64_t>(prompt.size()), vocab = model.config().vocab_size;
    const int64_t total = n + static_cast<int64_t>(greedy.size());
    KvCache cache(model.CacheShape((total + 3) / 4, 4));
    BlockTable table;
    ASSERT_TRUE(cache.Reserve(&table, total).ok());
    ForwardBatch batch;
    batch.sequences = {{n, 0, &table}};
    batch.token_ids = prompt;
    ForwardOptions options;
    options.logits = LogitsRows::kAll;
    ForwardResult result;
    ASSERT_TRUE(model.Forward(batch, &cache, options, &result).ok());
    absl::StatusOr<NpyArray> ref = ReadNpy(dir + "/logits.npy");
    ASSERT_TRUE(ref.ok());
    const double err = RelativeError(result.logits, ref->data);
    // Teacher-forced top-1 agreement over the prompt positions, then free greedy decoding.
    int top1_agree = 0;
    for (int64_t t = 0; t < n; ++t) {
      const float* a = result.logits.data() + t * vocab;
      const float* b = ref->data.data() + t * vocab;
      top1_agree += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
    }
    std::vector<int32_t> generated;
    int32_t next =
        static_cast<int32_t>(std::max_element(result.logits.end() - vocab, result.logits.end()) -
                             (result.logits.end() - vocab));
    options = ForwardOptions{};
    for (size_t step = 0; step < greedy.size(); ++step) {
      generated.push_back(next);
      batch.sequences = {{1, n + static_cast<int64_t>(step), &table}};
      batch.token_ids = absl::MakeConstSpan(&next, 1);
      ASSERT_TRUE(model.Forward(batch, &cache, options, &result).ok());
      next = static_cast<int32_t>(std::max_element(result.logits.begin(), result.logits.end()) -
                                  result.logits.begin());
    }
    size_t same_prefix = 0;
    while (same_prefix < greedy.size() && generated[same_prefix] == greedy[same_prefix]) {
      ++same_prefix;
    }
    std::printf(
        "[ %s int8 ] logits relative error %.3g, prompt top-1 agreement %d/%lld, greedy "
        "prefix %zu/%zu\n",
        name.c_str(), err, top1_agree, static_cast<long long>(n), same_prefix, greedy.size());
    // Measured 1.5e-2 to 2.5e-2 (transformers 5.24 goldens; the activations' int8 rounding,
    // llama.cpp Q8_0's scheme, adds about as much as the weights'). Greedy: the whole
    // continuation on three cases; qknorm_bias_fp32 leaves it at step 3 (the random-weight
    // fixtures' top logits are close, and the result is deterministic, so the bound is the
    // measured value: any change to the arithmetic shows here).
    EXPECT_LT(err, 3e-2) << name;
    EXPECT_GE(same_prefix, 2u) << name;
    greedy_agree += same_prefix;
    greedy_total += greedy.size();
    EXPECT_GT(err, 1e-4) << name << ": quantization changed nothing?";
    EXPECT_GE(top1_agree, n - 1) << name;
  }
  std::printf("int8 greedy agreement over the four cases: %zu/%zu steps\n", greedy_agree,
              greedy_total);
  EXPECT_GE(greedy_agree, 26u);
}

}  // namespace
}  // namespace glmserve
