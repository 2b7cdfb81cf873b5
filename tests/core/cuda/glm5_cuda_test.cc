// GLM-5 on the CUDA runner beyond the bf16 forward of model_cuda_test.cc: FP8 weights on the
// device (what is uploaded, the device-generated preset, the forward against the CPU's exact
// FP8 path, a mixed group refused) and CUDA graphs for decode steps (replay against eager,
// bit for bit). The FP8 golden (glm5_fp8_block_fp32) runs in golden_test.cc, the batching
// invariants of FP8 GLM-5 in runner_conformance_test.cc (cuda_fp8_glm5).
//
// Tolerance against the CPU: model_cuda_test.cc's 3e-2 per row (bf16 activations into the FP8
// kernels, a bf16 latent cache; the CPU keeps fp32). Graph against eager: identical bits, since
// a power-of-two batch makes the graph's padded step the eager step's shape, and every kernel
// computes a token's row without regard to its neighbours.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/cpu_model.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/model.h"
#include "core/model/checkpoint.h"
#include "tests/core/all_logits.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::AllLogits;

using ::glmserve::testing::RelativeError;

constexpr double kModelTolerance = 3e-2;

ModelWeights RandomGlm5(DType dtype, int64_t index_topk = 8) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny-glm5");
  EXPECT_TRUE(config.ok()) << config.status();
  config->index_topk = index_topk;
  RandomWeightOptions options;
  options.seed = 42;
  options.dtype = dtype;
  options.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

std::unique_ptr<CudaModel> Gpu(ModelWeights w) {
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

std::vector<int32_t> Tokens(int64_t n, int32_t salt) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 37 + salt * 11 + 3) % 256);
  return ids;
}

TEST(CudaGlm5Fp8, WeightsStayFp8OnTheDevice) {
  GLM_REQUIRE_CUDA_DEVICE();
  ModelWeights w = RandomGlm5(DType::kF8E4M3);
  const ModelConfig c = w.config;
  std::unique_ptr<CudaModel> fp8 = Gpu(std::move(w));
  std::unique_ptr<CudaModel> bf16 = Gpu(RandomGlm5(DType::kBF16));
  ASSERT_NE(fp8, nullptr);
  ASSERT_NE(bf16, nullptr);
  const DeviceWeights& d = fp8->device_weights();
  for (size_t i = 0; i < d.layers.size(); ++i) {
    const DeviceMla& m = d.layers[i].mla;
    EXPECT_TRUE(m.fp8()) << "layer " << i;
    EXPECT_EQ(m.q_a, nullptr) << "no bf16 copy as well";
    EXPECT_EQ(m.kv_b, nullptr) << "kv_b stays FP8: the attention kernel reads its codes";
    EXPECT_NE(m.kv_b8.codes, nullptr);
    EXPECT_EQ(m.kv_b8.rows, c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim));
    EXPECT_EQ(m.kv_b8.cols, c.kv_lora_rank);
    EXPECT_EQ(m.kv_b8.block_rows, 128);  // GLM-5-FP8's 128 x 128 blocks
    EXPECT_EQ(m.kv_b8.block_cols, 128);
    EXPECT_NE(m.o8.codes, nullptr);
    EXPECT_NE(m.q_a_norm, nullptr);
    const bool full = c.has_indexer(static_cast<int64_t>(i));
    EXPECT_EQ(m.has_indexer(), full) << "layer " << i;
    EXPECT_EQ(m.wq_b8.codes != nullptr, full);
    EXPECT_EQ(m.wk8.codes != nullptr, full);
    EXPECT_EQ(m.weights_proj != nullptr, full) << "weights_proj stays fp32";
    EXPECT_EQ(m.wq_b, nullptr);
    EXPECT_TRUE(d.layers[i].is_moe || d.layers[i].dense.fp8());
  }
  EXPECT_LT(fp8->weight_bytes(), bf16->weight_bytes() * 3 / 4);
}

// The device-generated preset (no host copy of the codes: gpu_bench's glm-5-fp8) gives the
// host preset's image, so the same logits bit for bit.
TEST(CudaGlm5Fp8, DeviceGeneratedPresetEqualsTheHostPreset) {
  GLM_REQUIRE_CUDA_DEVICE();
  RandomWeightOptions on_device;
  on_device.fp8_codes_on_device = true;
  absl::StatusOr<ModelWeights> host = LoadModel("tiny-glm5-fp8:layers=3");
  absl::StatusOr<ModelWeights> device = LoadModel("tiny-glm5-fp8:layers=3", {}, on_device);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE(device.ok()) << device.status();
  ASSERT_FALSE(device->device_generated_fp8.empty());
  EXPECT_EQ(device->layers[0].mla.kv_b_proj.data, nullptr);
  EXPECT_EQ(device->layers[2].mla.indexer.wq_b.data, nullptr);
  std::unique_ptr<CudaModel> a = Gpu(*std::move(host));
  std::unique_ptr<CudaModel> b = Gpu(*std::move(device));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a->weight_bytes(), b->weight_bytes());
  const DeviceMla& ma = a->device_weights().layers[2].mla;
  const DeviceMla& mb = b->device_weights().layers[2].mla;
  ASSERT_TRUE(mb.has_indexer()) << "a full layer whose wq_b has no host data";
  const auto codes = [](const Fp8DeviceMatrix& m) {
    std::vector<uint8_t> out(m.rows * m.cols);
    EXPECT_TRUE(CopyToHost(out.data(), m.codes, out.size()).ok());
    return out;
  };
  EXPECT_EQ(codes(ma.kv_b8), codes(mb.kv_b8));
  EXPECT_EQ(codes(ma.wq_b8), codes(mb.wq_b8));
  const std::vector<int32_t> ids = Tokens(12, 3);
  EXPECT_EQ(AllLogits(*a, ids), AllLogits(*b, ids));
}

// Every query dense (index_topk 64): the FP8 MLA path (FP8 projections, kv_b's codes in the
// absorb and the expansion) row by row against the CPU's exact FP8 path.
TEST(CudaGlm5Fp8, DenseForwardMatchesTheCpuFp8PathRowByRow) {
  GLM_REQUIRE_CUDA_DEVICE();
  CpuModel cpu(RandomGlm5(DType::kF8E4M3, 64));
  std::unique_ptr<CudaModel> gpu = Gpu(RandomGlm5(DType::kF8E4M3, 64));
  ASSERT_NE(gpu, nullptr);
  const std::vector<int32_t> ids = Tokens(24, 5);
  const std::vector<float> got = AllLogits(*gpu, ids), want = AllLogits(cpu, ids);
  const int64_t vocab = cpu.config().vocab_size;
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (int64_t r = 0; r < 24; ++r) {
    const double err = RelativeError(got.data() + r * vocab, want.data() + r * vocab, vocab);
    worst = std::max(worst, err);
    EXPECT_LT(err, kModelTolerance) << "row " << r;
  }
  std::printf("[ FP8 GLM-5 dense ] worst row relative error vs the CPU: %.3g\n", worst);
}

// FP8 tensor cores on (off by default): a 24-token prefill of FP8 GLM-5 sends its FP8
// GEMMs (the MLA projections, the dense and shared FFNs, the grouped experts) to cuBLASLt's
// block-scaled matmul, and its logits move only by the activations' e4m3 rounding from the
// CUDA-core path's (bound 0.3, as model_cuda_test.cc's kFp8ActivationTolerance on this kind of
// deliberately sensitive random model). Decode-sized steps keep the quantizing GEMV.
TEST(CudaGlm5Fp8, PrefillRunsOnFp8TensorCores) {
  GLM_REQUIRE_CUDA_DEVICE();
  std::unique_ptr<CudaModel> tc = Gpu(RandomGlm5(DType::kF8E4M3, 64));
  std::unique_ptr<CudaModel> cores = Gpu(RandomGlm5(DType::kF8E4M3, 64));
  ASSERT_NE(tc, nullptr);
  ASSERT_NE(cores, nullptr);
  tc->set_fp8_tensor_cores(true);
  std::printf("FP8 tensor cores: %s\n", tc->fp8_tensor_core_status().c_str());
  const std::vector<int32_t> ids = Tokens(24, 5);
  const std::vector<float> a = AllLogits(*tc, ids), b = AllLogits(*cores, ids);
  EXPECT_GT(tc->fp8_tensor_core_gemms(), 0) << tc->fp8_tensor_core_status();
  EXPECT_EQ(cores->fp8_tensor_core_gemms(), 0);
  const double rel = RelativeError(a, b);
  std::printf(
      "[ FP8 GLM-5 ] 24 tokens, tensor cores vs CUDA cores: logits %.4f, %lld GEMMs on "
      "tensor cores\n",
      rel, static_cast<long long>(tc->fp8_tensor_core_gemms()));
  EXPECT_GT(rel, 0) << "the activations are quantized on the tensor-core path";
  EXPECT_LT(rel, 0.3);
  const int64_t before = tc->fp8_tensor_core_gemms();
  AllLogits(*tc, Tokens(3, 6));  // decode-sized: the quantizing GEMV
  EXPECT_EQ(tc->fp8_tensor_core_gemms(), before);
}

TEST(CudaGlm5Fp8, MixedMlaGroupIsRefused) {
  GLM_REQUIRE_CUDA_DEVICE();
  ModelWeights dense = RandomGlm5(DType::kBF16);
  ModelWeights w = RandomGlm5(DType::kF8E4M3);
  w.layers[1].mla.kv_b_proj = dense.layers[1].mla.kv_b_proj;  // the rest FP8
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("layer 1 MLA attention: 4 of 5"), std::string::npos)
      << m.status();
}

// The tensor-core attention (mla_tc.cu) serves every step of these shapes up to 128 tokens;
// switched off, mla.cu's CUDA-core kernel runs instead. A 40-token prompt, every query dense
// (index_topk 64): with tensor cores every row within 3e-2 of the CPU (bf16 and FP8 weights);
// the two kernels differ by their own roundings (q_lat and P in bf16 on the tensor cores),
// which on random weights may flip an expert route of a near-tie (model_cuda_test.cc): at
// most 2 of 40 rows apart (measured: 1, the CUDA-core run's, FP8 weights).
TEST(CudaGlm5TensorCores, MatchCpuAndTheCudaCoreKernel) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    CpuModel cpu(RandomGlm5(dtype, 64));
    std::unique_ptr<CudaModel> gpu = Gpu(RandomGlm5(dtype, 64));
    ASSERT_NE(gpu, nullptr);
    EXPECT_EQ(gpu->mla_tc_tokens(), 128) << "tiny-glm5's scratch covers every graph bucket";
    const std::vector<int32_t> ids = Tokens(40, 5);
    const std::vector<float> tc = AllLogits(*gpu, ids);
    gpu->set_mla_tensor_cores(false);
    EXPECT_EQ(gpu->mla_tc_tokens(), 0);
    const std::vector<float> cores = AllLogits(*gpu, ids);
    const std::vector<float> want = AllLogits(cpu, ids);
    const int64_t vocab = cpu.config().vocab_size;
    double worst_tc = 0;
    int64_t apart = 0;  // rows where the two kernels' roundings flipped an expert route
    for (int64_t r = 0; r < 40; ++r) {
      const double e_tc = RelativeError(tc.data() + r * vocab, want.data() + r * vocab, vocab);
      EXPECT_LT(e_tc, kModelTolerance) << "row " << r;
      worst_tc = std::max(worst_tc, e_tc);
      apart +=
          RelativeError(tc.data() + r * vocab, cores.data() + r * vocab, vocab) > kModelTolerance
              ? 1
              : 0;
    }
    EXPECT_NE(tc, cores) << "both runs took the same kernel";
    EXPECT_LE(apart, 2) << "rows where the tensor-core and CUDA-core kernels disagree";
    std::printf(
        "[ GLM-5 %s, dense ] worst row vs the CPU with tensor cores: %.3g; rows beyond "
        "%.0e between the two kernels: %ld of 40\n",
        dtype == DType::kBF16 ? "bf16" : "fp8", worst_tc, kModelTolerance,
        static_cast<long>(apart));
  }
}

// Four sequences (ragged prompts of 3 to 12 tokens) decode 10 steps together, their contexts
// crossing index_topk 8 (dense, then sparse selections; shared layers reuse them), once
// through captured graphs and once eagerly on a fresh cache: every logit identical.
class CudaGlm5Graphs : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { GLM_REQUIRE_CUDA_DEVICE(); }
};

TEST_P(CudaGlm5Graphs, ReplayEqualsEagerBitForBit) {
  std::unique_ptr<CudaModel> gpu = Gpu(RandomGlm5(GetParam()));
  ASSERT_NE(gpu, nullptr);
  const int64_t vocab = gpu->config().vocab_size, seqs = 4, steps = 10;
  const auto run = [&](bool graphs) {
    gpu->set_cuda_graphs(graphs);
    std::unique_ptr<KvCache> cache = *gpu->CreateCache(40, 4);
    std::vector<BlockTable> tables(seqs);
    std::vector<std::vector<int32_t>> prompts(seqs);
    std::vector<float> out;
    ForwardBatch batch;
    ForwardOptions options;
    ForwardResult result;
    for (int64_t j = 0; j < seqs; ++j) {  // prefill each prompt (eager either way)
      prompts[j] = Tokens(3 + 3 * j, static_cast<int32_t>(j));
      EXPECT_TRUE(cache->Reserve(&tables[j], static_cast<int64_t>(prompts[j].size()) + steps).ok());
      batch.sequences = {{static_cast<int64_t>(prompts[j].size()), 0, &tables[j]}};
      batch.token_ids = prompts[j];
      EXPECT_TRUE(gpu->Forward(batch, cache.get(), options, &result).ok());
    }
    std::vector<int32_t> ids;
    for (int64_t s = 0; s < steps; ++s) {
      batch.sequences.clear();
      ids.clear();
      for (int64_t j = 0; j < seqs; ++j) {
        const int64_t pos = static_cast<int64_t>(prompts[j].size()) + s;
        batch.sequences.push_back({1, pos, &tables[j]});
        ids.push_back(static_cast<int32_t>((pos * 13 + j) % vocab));
      }
      batch.token_ids = ids;
      const absl::Status st = gpu->Forward(batch, cache.get(), options, &result);
      EXPECT_TRUE(st.ok()) << st;
      out.insert(out.end(), result.logits.begin(), result.logits.end());
    }
    return out;
  };
  const int64_t launches_before = gpu->graph_launches();
  const std::vector<float> graph = run(true);
  EXPECT_EQ(gpu->graph_launches() - launches_before, steps) << gpu->graph_error();
  EXPECT_TRUE(gpu->graph_error().empty()) << gpu->graph_error();
  const int64_t launches = gpu->graph_launches();
  const std::vector<float> eager = run(false);
  EXPECT_EQ(gpu->graph_launches(), launches) << "the eager run launched a graph";
  ASSERT_EQ(graph.size(), static_cast<size_t>(steps * seqs * vocab));
  ASSERT_EQ(eager.size(), graph.size());
  int64_t differing = 0;
  for (size_t i = 0; i < graph.size(); ++i) {
    differing += std::memcmp(&graph[i], &eager[i], sizeof(float)) != 0 ? 1 : 0;
  }
  EXPECT_EQ(differing, 0) << "logits differing between graph replay and eager decode";
}

INSTANTIATE_TEST_SUITE_P(Weights, CudaGlm5Graphs, ::testing::Values(DType::kBF16, DType::kF8E4M3),
                         [](const auto& info) {
                           return std::string(info.param == DType::kBF16 ? "bf16" : "fp8");
                         });

}  // namespace
}  // namespace glmserve::cuda
