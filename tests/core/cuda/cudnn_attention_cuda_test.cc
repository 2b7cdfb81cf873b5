// cuDNN's fused SDPA over the paged bf16 cache (core/cuda/cudnn_attention.h) against the
// tensor-core kernel it falls back to (LaunchPagedAttentionTc) and the CPU's PagedAttention, on
// awkward steps: one token, odd lengths, a single KV head, contexts across many scattered
// blocks, prefill chunks over cached context mixed with decode rows. Outputs are poisoned
// (0xff: NaN in bf16) first, so a row cuDNN leaves unwritten fails. Then the whole model with
// cuDNN attention against the same model without it.
//
// Skips without a GPU (a failure under GLMSERVE_REQUIRE_CUDA=1) and, with a clear line, without
// a usable libcudnn (a failure under GLMSERVE_REQUIRE_CUDNN=1: tools/gpu_bundle_run.sh sets it
// when the host has cuDNN). Tolerances: kCudnnCheckAbs / kCudnnCheckRel per element against
// the tensor-core kernel (cudnn_attention.h says why); 1e-2 relative error of the norm against
// the CPU (the kernel's own bound is 4e-3; cuDNN also rounds q and P to bf16); the model's
// logits within model_cuda_test.cc's 3e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/cpu/ops/attention.h"
#include "core/cuda/cudnn_attention.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels.h"
#include "core/cuda/model.h"
#include "core/cuda/step_plan.h"
#include "core/model/checkpoint.h"
#include "core/model/kv_cache.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/cuda/device_buffers.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::FromBf16;
using ::glmserve::testing::RandomVector;
using ::glmserve::testing::RelativeError;
using ::glmserve::testing::ToBf16;

bool CudnnRequired() {
  const char* env = std::getenv("GLMSERVE_REQUIRE_CUDNN");
  return env != nullptr && env[0] == '1';
}

// `made`: a StatusOr from CudnnAttention::Create.
#define GLM_REQUIRE_CUDNN(made)                                                          \
  do {                                                                                   \
    if (!(made).ok()) {                                                                  \
      if (CudnnRequired()) FAIL() << "GLMSERVE_REQUIRE_CUDNN=1 but " << (made).status(); \
      GTEST_SKIP() << "cuDNN attention unavailable: " << (made).status().message();      \
    }                                                                                    \
  } while (false)

struct Case {
  int64_t heads, kv_heads, head_dim, block_size;
};
struct Seq {
  int64_t start, tokens;
};

class CudnnAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_REQUIRE_CUDA_DEVICE();
    ASSERT_EQ(PrepareKernels(), cudaSuccess);
    absl::StatusOr<Stream> s = CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = *std::move(s);
  }
  // Upload and Poisoned use the legacy stream, which the test's non-blocking stream (the
  // model's kind) does not wait for.
  static void Settle() { ASSERT_TRUE(SynchronizeDevice().ok()); }

  // One step of `seqs` over a fresh random cache: cuDNN against the kernel and the CPU.
  void Check(const Case& c, const std::vector<Seq>& seqs, uint32_t seed) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.heads << " kv " << c.kv_heads << " hd "
                                      << c.head_dim << " block " << c.block_size);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    AttentionShape ashape{c.heads, c.kv_heads, c.head_dim, c.block_size, 0, scale};
    absl::StatusOr<std::unique_ptr<CudnnAttention>> made =
        CudnnAttention::Create(ashape, stream_.get());
    GLM_REQUIRE_CUDNN(made);
    CudnnAttention& cudnn = **made;
    ASSERT_TRUE(cudnn.SelfCheckForTest(c.block_size).ok()) << cudnn.status();

    const int64_t kv_dim = c.kv_heads * c.head_dim, group = c.heads / c.kv_heads;
    int64_t blocks_needed = 0, total = 0;
    for (const Seq& s : seqs) {
      blocks_needed += (s.start + s.tokens + c.block_size - 1) / c.block_size;
      total += s.tokens;
    }
    const int64_t num_blocks = blocks_needed + 7;
    KvCacheShape shape{1, c.kv_heads, c.head_dim, c.block_size, num_blocks};
    KvCache cpu(shape);
    const std::vector<uint16_t> image = ToBf16(RandomVector(cpu.num_elements(), seed));
    const std::vector<float> widened = FromBf16(image);
    std::copy(widened.begin(), widened.end(), static_cast<float*>(cpu.storage()));
    std::mt19937 rng(seed);
    std::vector<int32_t> free_blocks(num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    std::vector<BlockTable> tables(seqs.size());
    ForwardBatch batch;
    int64_t next = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t need = (seqs[i].start + seqs[i].tokens + c.block_size - 1) / c.block_size;
      for (int64_t b = 0; b < need; ++b) tables[i].push_back(free_blocks[next++]);
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      batch.sequences.push_back({seqs[i].tokens, seqs[i].start, &tables[i]});
    }
    const int64_t q_dim = c.heads * c.head_dim, q_stride = q_dim + 2 * kv_dim;
    const std::vector<float> q = RandomVector(total * q_dim, seed + 1);
    std::vector<float> want(total * q_dim);
    PagedAttention(q.data(), batch.sequences, cpu, 0, c.heads, scale, want.data());

    StepPlan plan;
    BuildStepPlan(batch, LogitsRows::kNone, c.block_size, AttentionTileTokens(group), StepPadding{},
                  false, &plan);
    std::vector<float> q_strided(plan.tokens * q_stride, 0.f);
    for (int64_t t = 0; t < total; ++t) {
      std::copy_n(q.begin() + t * q_dim, q_dim, q_strided.begin() + t * q_stride);
    }
    DeviceBuffer dq = Upload(q_strided), dcache = Upload(image), dtiles = Upload(plan.tiles);
    DeviceBuffer dbt = Upload(plan.block_tables);
    ashape.q_stride = q_stride;
    DeviceBuffer ref = Poisoned<uint16_t>(total * q_dim);
    ASSERT_EQ(LaunchPagedAttentionTc(dq.as<float>(), dtiles.as<int32_t>(),
                                     static_cast<int>(plan.num_tiles), dbt.as<int32_t>(),
                                     dcache.as<uint16_t>(), ashape, 1, nullptr, ref.as<uint16_t>(),
                                     nullptr),
              cudaSuccess);
    const std::vector<float> kernel = FromBf16(Download<uint16_t>(ref, total * q_dim));
    // Twice: the second call reuses the step's uploaded metadata (a later layer's call).
    for (int pass = 0; pass < 2; ++pass) {
      DeviceBuffer out = Poisoned<uint16_t>(total * q_dim);
      Settle();
      absl::StatusOr<bool> ran = cudnn.Enqueue(plan, dq.as<float>(), dcache.as<uint16_t>(),
                                               num_blocks, ashape, out.as<uint16_t>());
      ASSERT_TRUE(ran.ok()) << ran.status();
      ASSERT_TRUE(*ran) << cudnn.status();
      ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
      const std::vector<float> got = FromBf16(Download<uint16_t>(out, total * q_dim));
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const bool ok =
            std::fabs(got[i] - kernel[i]) <= kCudnnCheckAbs + kCudnnCheckRel * std::fabs(kernel[i]);
        if (!ok && bad++ < 5) {
          ADD_FAILURE() << "element " << i << " (token " << i / q_dim << ", head "
                        << (i % q_dim) / c.head_dim << "): cuDNN " << got[i] << ", kernel "
                        << kernel[i];
        }
      }
      EXPECT_EQ(bad, 0) << "elements beyond the tolerance (pass " << pass << ")";
      EXPECT_LT(RelativeError(got, want), 1e-2) << "against the CPU";
    }
    EXPECT_FALSE(cudnn.disabled()) << cudnn.status();
  }

  Stream stream_;
};

// Without a GPU too: where libcudnn loads, every tensor and operation descriptor of the graph
// (types, dims, strides, ragged offsets, by-value scalars, masks, paged loads) finalizes.
TEST(CudnnAttentionOps, DescriptorsFinalizeWithoutADevice) {
  for (const Case c : {Case{4, 1, 64, 16}, Case{96, 8, 128, 16}, Case{12, 4, 128, 64}}) {
    AttentionShape shape{c.heads, c.kv_heads, c.head_dim, c.block_size, 0, 0.1f};
    for (const CudnnPlanKey key : {CudnnPlanKey{1, 1, 1}, CudnnPlanKey{8, 64, 32}}) {
      const absl::Status s = CudnnAttentionOpsForTest(shape, c.block_size, 100, key);
      if (!CudnnAttentionBuilt() || absl::StrContains(s.message(), "cannot load")) {
        if (CudnnRequired()) FAIL() << "GLMSERVE_REQUIRE_CUDNN=1 but " << s;
        GTEST_SKIP() << "cuDNN unavailable: " << s.message();
      }
      EXPECT_TRUE(s.ok()) << s << " (heads " << c.heads << ", key " << key.batch << "x" << key.max_q
                          << "x" << key.max_pages << ")";
    }
  }
}

TEST_F(CudnnAttentionTest, MixedStepsMatchKernelAndCpu) {
  // A long prefill chunk after a cached prefix, a fresh prompt of odd length, decode rows deep
  // into their contexts and at position 1, a one-token prompt.
  const std::vector<Seq> mixed = {{37, 29}, {0, 13}, {300, 1}, {1, 1}, {63, 1}, {0, 1}};
  for (const Case c : {Case{4, 1, 64, 16}, Case{8, 2, 128, 16}, Case{12, 4, 128, 32},
                       Case{96, 8, 128, 16}, Case{16, 16, 64, 64}}) {
    Check(c, mixed, 7);
    if (IsSkipped() || HasFatalFailure()) return;
  }
}

TEST_F(CudnnAttentionTest, DecodeOnlyAndSingleTokenSteps) {
  std::vector<Seq> decode;
  for (int64_t i = 0; i < 9; ++i) decode.push_back({i * 47 + 3, 1});  // contexts 4..380
  Check(Case{8, 1, 128, 16}, decode, 11);
  if (IsSkipped() || HasFatalFailure()) return;
  Check(Case{8, 2, 128, 16}, {{0, 1}}, 12);    // a one-token prompt alone
  Check(Case{8, 2, 128, 16}, {{511, 1}}, 13);  // one decode row across 32 blocks
}

TEST_F(CudnnAttentionTest, OneLongPrefillChunkOverManyBlocks) {
  Check(Case{8, 2, 128, 16}, {{1000, 77}}, 17);
}

TEST_F(CudnnAttentionTest, RefusesPaddedGraphStepsWithoutTurningOff) {
  const Case c{4, 2, 64, 16};
  AttentionShape ashape{c.heads, c.kv_heads, c.head_dim, c.block_size, 0, 0.125f};
  absl::StatusOr<std::unique_ptr<CudnnAttention>> made =
      CudnnAttention::Create(ashape, stream_.get());
  GLM_REQUIRE_CUDNN(made);
  (*made)->set_self_check(false);
  const BlockTable table = {0};
  ForwardBatch batch;
  batch.sequences = {{1, 3, &table}};
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, c.block_size, 2, StepPadding{2}, false, &plan);
  absl::StatusOr<bool> ran = (*made)->Enqueue(plan, nullptr, nullptr, 1, ashape, nullptr);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_FALSE(*ran);
  EXPECT_FALSE((*made)->disabled());
}

// The model with cuDNN attention (the default where cuDNN is present) against the same model
// with it off: a chunked prefill, a mixed step (a chunk over cached context and a new prompt)
// and eager decode steps (graphs off, so that cuDNN serves them too).
TEST(CudnnAttentionModel, ModelWithCudnnEqualsModelWithout) {
  GLM_REQUIRE_CUDA_DEVICE();
  const auto make = [](bool cudnn) {
    absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
    EXPECT_TRUE(config.ok()) << config.status();
    RandomWeightOptions options;
    options.seed = 42;
    options.dtype = DType::kBF16;
    options.stddev = 0.1;
    absl::StatusOr<ModelWeights> w = RandomWeights(*config, options);
    EXPECT_TRUE(w.ok()) << w.status();
    CudaModelOptions model_options;
    model_options.cudnn_attention = cudnn;
    model_options.cuda_graphs = false;
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(*std::move(w), model_options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  };
  std::unique_ptr<CudaModel> with = make(true), without = make(false);
  ASSERT_NE(with, nullptr);
  ASSERT_NE(without, nullptr);
  if (with->cudnn_attention() == nullptr) {
    if (CudnnRequired())
      FAIL() << "GLMSERVE_REQUIRE_CUDNN=1 but " << with->cudnn_attention_status();
    GTEST_SKIP() << "cuDNN attention unavailable: " << with->cudnn_attention_status();
  }
  const int64_t block_size = 16, vocab = with->config().vocab_size;
  // Steps: {sequence, tokens} per step; sequence 0 then 1 grow step by step.
  const std::vector<std::vector<std::pair<int, int64_t>>> steps = {
      {{0, 37}}, {{0, 19}, {1, 5}}, {{0, 1}, {1, 1}}, {{0, 1}, {1, 1}}};
  std::vector<std::vector<float>> logits[2];
  for (int which = 0; which < 2; ++which) {
    CudaModel& model = which == 0 ? *with : *without;
    absl::StatusOr<std::unique_ptr<KvCache>> cache = model.CreateCache(16, block_size);
    ASSERT_TRUE(cache.ok()) << cache.status();
    BlockTable tables[2];
    int64_t lengths[2] = {0, 0};
    for (const auto& step : steps) {
      ForwardBatch batch;
      std::vector<int32_t> ids;
      for (const auto& [seq, n] : step) {
        ASSERT_TRUE((*cache)->Reserve(&tables[seq], lengths[seq] + n).ok());
        batch.sequences.push_back({n, lengths[seq], &tables[seq]});
        for (int64_t i = 0; i < n; ++i)
          ids.push_back(static_cast<int32_t>((lengths[seq] + i) * 31 + seq * 7) % 256);
        lengths[seq] += n;
      }
      batch.token_ids = ids;
      ForwardOptions options;
      options.logits = LogitsRows::kAll;
      ForwardResult result;
      const absl::Status s = model.Forward(batch, cache->get(), options, &result);
      ASSERT_TRUE(s.ok()) << s;
      logits[which].push_back(result.logits);
    }
  }
  EXPECT_FALSE(with->cudnn_attention()->disabled()) << with->cudnn_attention_status();
  EXPECT_GT(with->cudnn_attention()->layer_calls(), 0) << with->compute_description();
  std::printf("%s\n", with->compute_description().c_str());
  for (size_t i = 0; i < steps.size(); ++i) {
    ASSERT_EQ(logits[0][i].size(), logits[1][i].size());
    const int64_t rows = static_cast<int64_t>(logits[0][i].size()) / vocab;
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_LT(
          RelativeError(logits[0][i].data() + r * vocab, logits[1][i].data() + r * vocab, vocab),
          3e-2)
          << "step " << i << " row " << r;
    }
  }
}

}  // namespace
}  // namespace glmserve::cuda
