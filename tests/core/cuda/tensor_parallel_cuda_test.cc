// CUDA tensor-parallel ranks (docs/parallel.md): a group of CudaModel ranks, one per GPU, each
// with its slice of the weights, summing and gathering through NCCL (under the emulation:
// several emulated devices and tools/cuda_emu's in-process NCCL), against the same model on
// one GPU. Greedy tokens must be equal and logits close.
//
// Tolerance: 1e-2 relative (kGpuTolerance of model_cuda_test.cc, GPU against GPU). A group
// adds o_proj's and the FFN's partial sums in rank order instead of one GEMM's order, so the
// fp32 residual differs from one GPU's in its last bits; the next layer rounds its input to
// bf16 (2^-9 relative), where such a difference flips an occasional value by one bf16 step.
// The CPU group, whose activations stay fp32, is within 1e-4 of one rank
// (cpu_tensor_parallel_test.cc); here the bf16 roundings bound it, as between cuBLAS
// algorithms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cpu/quantize.h"
#include "core/cuda/model.h"
#include "core/cuda/nccl_communicator.h"
#include "core/engine/multi_node.h"
#include "core/model/checkpoint.h"
#include "core/model/rank_group.h"
#include "core/model/weight_shard.h"
#include "nlohmann/json.hpp"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/engine/engine_harness.h"
#include "tests/mtp_steps.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::RelativeError;

constexpr double kGpuTolerance = 1e-2;

// Skips (or fails under GLMSERVE_REQUIRE_CUDA=1) without a GPU; skips on a host with fewer GPUs
// than the group needs or without NCCL: a hardware fact, not a missing feature (the emulation
// has 8 devices and its NCCL stand-in).
#define GLM_REQUIRE_GPUS(n)                                                     \
  do {                                                                          \
    GLM_REQUIRE_CUDA_DEVICE();                                                  \
    int glm_count_ = 0;                                                         \
    if (cudaGetDeviceCount(&glm_count_) != cudaSuccess || glm_count_ < (n)) {   \
      GTEST_SKIP() << "needs " << (n) << " GPUs, this host has " << glm_count_; \
    }                                                                           \
    if (const absl::Status glm_nccl_ = LoadNccl(); !glm_nccl_.ok()) {           \
      GTEST_SKIP() << glm_nccl_;                                                \
    }                                                                           \
  } while (false)

// GLM-4.5's structure, small: 8 query heads over 2 KV heads (TP 4 replicates them), 10 routed
// experts of 3 per token (uneven over 4 ranks), a dense first layer.
ModelConfig TpConfig() {
  ModelConfig c = *PresetConfig("tiny");
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.n_routed_experts = 10;
  c.num_experts_per_tok = 3;
  c.n_group = 2;
  c.topk_group = 2;
  return c;
}

ModelWeights Weights(const ModelConfig& c, DType dtype = DType::kBF16) {
  RandomWeightOptions options;
  options.seed = 31;
  options.dtype = dtype;
  options.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(c, options);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

// A group of `tp` CUDA ranks on devices 0..tp-1, built as CreateCudaTensorParallelRunner
// does, with the model options a test needs.
std::unique_ptr<RankGroup> Group(const ModelWeights& whole, int tp, bool expert_parallel,
                                 const CudaModelOptions& options = {}) {
  ParallelConfig parallel;
  parallel.tensor_parallel = tp;
  parallel.expert_parallel = expert_parallel;
  const int64_t unit = WeightSplitUnit(whole);
  const absl::Status layout = CheckParallelLayout(whole.config, parallel, unit);
  EXPECT_TRUE(layout.ok()) << layout;
  std::vector<int> devices(tp);
  for (int r = 0; r < tp; ++r) devices[r] = r;
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> comms = CreateNcclGroup(devices);
  EXPECT_TRUE(comms.ok()) << comms.status();
  if (!comms.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<RankGroup>> group = RankGroup::Create(
      whole.config, parallel, RankGroupOptions{}, *std::move(comms),
      [&](int rank, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        const RankLayout l = LayoutOf(whole.config, parallel, rank, unit);
        ASSIGN_OR_RETURN(ModelWeights mine, ShardWeights(whole, l));
        CudaModelOptions o = options;
        o.device = rank;
        ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> model,
                         CudaModel::CreateRank(std::move(mine), o, l, comm));
        return std::unique_ptr<ModelRunner>(std::move(model));
      });
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? *std::move(group) : nullptr;
}

CudaModel& Rank(RankGroup& group, int r) { return dynamic_cast<CudaModel&>(group.rank_runner(r)); }

// Greedy decoding of three sequences (prompts of 5, 11 and 2 tokens, prefilled together) for
// `steps` decode steps: every step's logits, and the tokens chosen from them.
struct Trace {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

Trace Greedy(ModelRunner& runner, int steps) {
  const int64_t vocab = runner.config().vocab_size;
  auto cache = runner.CreateCache(32, 4);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  std::vector<std::vector<int32_t>> seqs = {
      {3, 17, 42, 9, 100}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {200, 7}};
  std::vector<BlockTable> tables(seqs.size());
  std::vector<int64_t> done(seqs.size(), 0);
  Trace trace;
  for (int step = 0; step <= steps; ++step) {
    ForwardBatch batch;
    std::vector<int32_t> ids;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t n = static_cast<int64_t>(seqs[s].size()) - done[s];
      EXPECT_TRUE((*cache)->Reserve(&tables[s], done[s] + n).ok());
      batch.sequences.push_back({n, done[s], &tables[s]});
      ids.insert(ids.end(), seqs[s].begin() + done[s], seqs[s].end());
    }
    batch.token_ids = ids;
    ForwardResult result;
    const absl::Status status = runner.Forward(batch, cache->get(), ForwardOptions{}, &result);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) return trace;
    EXPECT_EQ(result.logits.size(), seqs.size() * vocab);
    trace.logits.push_back(result.logits);
    for (size_t s = 0; s < seqs.size(); ++s) {
      done[s] = static_cast<int64_t>(seqs[s].size());
      const float* row = result.logits.data() + s * vocab;
      const int32_t token = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      seqs[s].push_back(token);
      trace.tokens.push_back(token);
    }
  }
  return trace;
}

// The group against one GPU on the same weights: tokens equal, logits within the bound; and
// with graphs on, every rank replayed graphs (the collectives were captured in them).
void ExpectGroupMatchesOneGpu(const ModelWeights& weights, int tp, bool expert_parallel,
                              bool graphs) {
  CudaModelOptions options;
  options.cuda_graphs = graphs;
  absl::StatusOr<std::unique_ptr<CudaModel>> one = CudaModel::Create(weights, options);
  ASSERT_TRUE(one.ok()) << one.status();
  const Trace want = Greedy(**one, 5);
  std::unique_ptr<RankGroup> group = Group(weights, tp, expert_parallel, options);
  ASSERT_NE(group, nullptr);
  const Trace got = Greedy(*group, 5);
  const std::string what = absl::StrCat("TP ", tp, expert_parallel ? " EP" : " width split",
                                        graphs ? ", graphs" : ", eager");
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  double worst = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    worst = std::max(worst, RelativeError(got.logits[i], want.logits[i]));
  }
  EXPECT_LT(worst, kGpuTolerance) << what;
  std::printf("%s: worst relative logits error against one GPU %.2e\n", what.c_str(), worst);
  for (int r = 0; r < tp; ++r) {
    CudaModel& rank = Rank(*group, r);
    EXPECT_EQ(rank.graph_launches() > 0, graphs) << what << ", rank " << r;
    EXPECT_TRUE(rank.graph_error().empty()) << what << ": " << rank.graph_error();
  }
  EXPECT_TRUE(group->health().ok()) << group->health();
}

TEST(CudaTensorParallelTest, Glm45RanksMatchOneGpu) {
  GLM_REQUIRE_GPUS(4);
  const ModelWeights w = Weights(TpConfig());
  ExpectGroupMatchesOneGpu(w, 2, /*expert_parallel=*/true, /*graphs=*/true);
  ExpectGroupMatchesOneGpu(w, 2, /*expert_parallel=*/false, /*graphs=*/false);
  ExpectGroupMatchesOneGpu(w, 4, /*expert_parallel=*/true, /*graphs=*/false);
  ExpectGroupMatchesOneGpu(w, 4, /*expert_parallel=*/false, /*graphs=*/true);
}

TEST(CudaTensorParallelTest, Glm45EightRanksMatchOneGpu) {
  // One query head a rank, each KV head replicated four times; 10 experts over 8 ranks (two
  // ranks hold two).
  GLM_REQUIRE_GPUS(8);
  ExpectGroupMatchesOneGpu(Weights(TpConfig()), 8, /*expert_parallel=*/true, /*graphs=*/true);
}

TEST(CudaTensorParallelTest, Fp8BlockScaledRanksMatchOneGpu) {
  // 128x128 blocks: o_proj's columns split on a block (8 heads of 32 = 2 blocks), and the
  // 96-wide dense FFN and 32-wide shared expert are one block each, so rank 1 holds none of
  // them (zero width: it adds zeros). Experts are whole per rank (EP): their 32 columns are
  // one block too, which a width split could not share.
  GLM_REQUIRE_GPUS(2);
  ModelConfig c = TpConfig();
  c.head_dim = 32;
  ModelWeights w = Weights(c);
  ASSERT_TRUE(QuantizeWeights(&w, WeightQuant::kFp8Block).ok());
  ExpectGroupMatchesOneGpu(w, 2, /*expert_parallel=*/true, /*graphs=*/true);
  // Per-channel FP8 (the released GLM-4.5-FP8 form): widths split on any row.
  ModelWeights channel = Weights(c);
  ASSERT_TRUE(QuantizeWeights(&channel, WeightQuant::kFp8Channel).ok());
  ExpectGroupMatchesOneGpu(channel, 2, /*expert_parallel=*/false, /*graphs=*/false);
}

TEST(CudaTensorParallelTest, Glm5MlaRanksMatchOneGpu) {
  // MLA: each rank holds half the heads (q_b, kv_b rows; o_proj columns) and the whole latent
  // cache (every head reads every token's latent row); the DSA indexer replicated.
  GLM_REQUIRE_GPUS(2);
  const ModelWeights w = Weights(*PresetConfig("tiny-glm5"));
  ExpectGroupMatchesOneGpu(w, 2, /*expert_parallel=*/true, /*graphs=*/true);
}

TEST(CudaTensorParallelTest, TwoProcessesOfTwoGpusMatchOneGpu) {
  // A group over two processes (core/engine/multi_node.h), played by two threads of this test
  // on one host: the leader holds ranks 0-1 on GPUs 0-1 and the engine's view of the group; the
  // worker holds ranks 2-3 on GPUs 2-3 and follows the leader's steps over TCP. NCCL's group id
  // travels in the leader's welcome; the sums cross "processes" through NCCL.
  GLM_REQUIRE_GPUS(4);
  const ModelWeights w = Weights(TpConfig());
  absl::StatusOr<std::unique_ptr<CudaModel>> one = CudaModel::Create(w);
  ASSERT_TRUE(one.ok()) << one.status();
  const Trace want = Greedy(**one, 5);

  ParallelConfig parallel;
  parallel.tensor_parallel = 4;
  NodeGroupOptions nodes;
  nodes.nodes = 2;
  nodes.token = "test";
  nodes.join_timeout = absl::Seconds(60);
  const int leader_port = testing::FreePortPair();  // the leader takes port and port + 1
  ASSERT_NE(leader_port, 0);
  nodes.leader_address = absl::StrCat("127.0.0.1:", leader_port);
  absl::Status worker_stopped;
  std::thread worker([&] {
    NodeGroupOptions mine = nodes;
    mine.node = 1;
    worker_stopped =
        RunWorker(w, parallel, CudaRankBackend(parallel, Fp8TensorCores::kOff, 2), mine);
  });
  std::string how;
  absl::StatusOr<std::unique_ptr<ModelRunner>> leader = CreateLeaderRunner(
      w, parallel, CudaRankBackend(parallel, Fp8TensorCores::kOff, 0), nodes, &how);
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_NE(how.find("4 CUDA ranks over 2 processes"), std::string::npos) << how;
  EXPECT_TRUE((*leader)->samples_tokens());
  const Trace got = Greedy(**leader, 5);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  double worst = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    worst = std::max(worst, RelativeError(got.logits[i], want.logits[i]));
  }
  EXPECT_LT(worst, kGpuTolerance);
  EXPECT_TRUE((*leader)->health().ok()) << (*leader)->health();
  leader->reset();  // closes the step channel: the worker stops
  worker.join();
  EXPECT_EQ(worker_stopped.code(), absl::StatusCode::kUnavailable) << worker_stopped;
}

TEST(CudaTensorParallelTest, ASequencesLogitsDoNotDependOnItsBatch) {
  // The group's sums add the ranks' partials in rank order element by element, whatever the
  // rows travelling together: a sequence decoded alone and batched with two others gets the
  // same logits (bit for bit under the emulation, whose GEMMs are exact per element; within the
  // GPU bound on a device, where cuBLAS may choose other algorithms for other shapes).
  GLM_REQUIRE_GPUS(2);
  const ModelWeights w = Weights(TpConfig());
  std::unique_ptr<RankGroup> group = Group(w, 2, /*expert_parallel=*/true);
  ASSERT_NE(group, nullptr);
  const int64_t vocab = w.config.vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8}, {40, 41}, {9, 9, 9, 9, 9, 9}};
  // Sequence 0's logits over a prefill and 4 decode steps, batched with `others`.
  const auto run = [&](int others) {
    auto cache = *group->CreateCache(32, 4);
    std::vector<BlockTable> tables(1 + others);
    std::vector<std::vector<int32_t>> seqs(prompts.begin(), prompts.begin() + 1 + others);
    std::vector<float> mine;
    std::vector<int64_t> done(seqs.size(), 0);
    for (int step = 0; step < 5; ++step) {
      ForwardBatch batch;
      std::vector<int32_t> ids;
      for (size_t s = 0; s < seqs.size(); ++s) {
        const int64_t n = static_cast<int64_t>(seqs[s].size()) - done[s];
        EXPECT_TRUE(cache->Reserve(&tables[s], done[s] + n).ok());
        batch.sequences.push_back({n, done[s], &tables[s]});
        ids.insert(ids.end(), seqs[s].begin() + done[s], seqs[s].end());
      }
      batch.token_ids = ids;
      ForwardResult result;
      EXPECT_TRUE(group->Forward(batch, cache.get(), ForwardOptions{}, &result).ok());
      mine.insert(mine.end(), result.logits.begin(), result.logits.begin() + vocab);
      for (size_t s = 0; s < seqs.size(); ++s) {
        done[s] = static_cast<int64_t>(seqs[s].size());
        const float* row = result.logits.data() + s * vocab;
        seqs[s].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      }
    }
    return mine;
  };
  const std::vector<float> alone = run(0), batched = run(2);
  if (testing::Emulated()) {
    EXPECT_EQ(alone, batched);
  } else {
    EXPECT_LT(RelativeError(alone, batched), kGpuTolerance);
  }
}

// The MTP layer on ranks (docs/mtp.md, docs/parallel.md): its block cut like any layer, eh_proj
// whole on every rank, its head (the model's, or a stored shared_head.head) by vocabulary rows
// and gathered on rank 0. The model over a prompt, then the MTP layer over its pairs: logits
// and head inputs within the GPU bound of one GPU's, the drafts (argmax) equal.
void ExpectMtpOnRanksMatchesOneGpu(const ModelWeights& w, int tp, bool expert_parallel) {
  const std::string what = absl::StrCat("TP ", tp, expert_parallel ? " EP" : " width split",
                                        w.mtp_head_stored ? ", stored MTP head" : "");
  absl::StatusOr<std::unique_ptr<CudaModel>> one = CudaModel::Create(w);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE((*one)->has_mtp()) << what;
  ASSERT_TRUE((*one)->EnableMtp().ok());
  std::unique_ptr<RankGroup> group = Group(w, tp, expert_parallel);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(group->has_mtp()) << what;
  ASSERT_TRUE(group->EnableMtp().ok());
  const std::vector<int32_t> ids = {3, 17, 42, 9, 100, 7, 7, 250, 1, 64, 5};
  const testing::MtpPass want = testing::RunModelThenMtp(**one, ids, true, true);
  const testing::MtpPass got = testing::RunModelThenMtp(*group, ids, true, true);
  ASSERT_EQ(got.mtp_logits.size(), want.mtp_logits.size()) << what;
  ASSERT_FALSE(want.mtp_logits.empty());
  const double logits = RelativeError(got.mtp_logits, want.mtp_logits);
  const double head = RelativeError(got.mtp_head_input, want.mtp_head_input);
  std::printf("%s: MTP logits relative error against one GPU %.2e, head inputs %.2e\n",
              what.c_str(), logits, head);
  EXPECT_LT(RelativeError(got.model_logits, want.model_logits), kGpuTolerance) << what;
  EXPECT_LT(logits, kGpuTolerance) << what;
  EXPECT_LT(head, kGpuTolerance) << what;
  const int64_t vocab = w.config.vocab_size;
  for (size_t r = 0; r + 1 < ids.size(); ++r) {
    const float* a = got.mtp_logits.data() + r * vocab;
    const float* b = want.mtp_logits.data() + r * vocab;
    EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b)
        << what << ": the draft at row " << r;
  }
  EXPECT_TRUE(group->health().ok()) << group->health();
}

ModelWeights WeightsWithMtp(bool stored_head) {
  ModelConfig c = TpConfig();
  c.num_nextn_predict_layers = 1;
  RandomWeightOptions options;
  options.seed = 37;
  options.dtype = DType::kBF16;
  options.stddev = 0.1;
  options.mtp = true;
  absl::StatusOr<ModelWeights> w = RandomWeights(c, options);
  EXPECT_TRUE(w.ok()) << w.status();
  if (stored_head) {  // shared_head.head of its own: the model's head with its rows reversed
    const Matrix& head = w->lm_head;
    auto rows = std::shared_ptr<uint16_t[]>(new uint16_t[head.rows * head.cols]);
    const auto* src = static_cast<const uint16_t*>(head.data);
    for (int64_t r = 0; r < head.rows; ++r) {
      std::copy_n(src + (head.rows - 1 - r) * head.cols, head.cols, rows.get() + r * head.cols);
    }
    w->mtp->head = head;
    w->mtp->head.data = rows.get();
    w->storage.push_back(rows);
    w->mtp_head_stored = true;
  }
  return *std::move(w);
}

TEST(CudaTensorParallelTest, MtpLayerOnRanksMatchesOneGpu) {
  GLM_REQUIRE_GPUS(4);
  ExpectMtpOnRanksMatchesOneGpu(WeightsWithMtp(false), 2, /*expert_parallel=*/false);
  ExpectMtpOnRanksMatchesOneGpu(WeightsWithMtp(false), 4, /*expert_parallel=*/true);
  ExpectMtpOnRanksMatchesOneGpu(WeightsWithMtp(true), 2, /*expert_parallel=*/true);
}

// Speculation through the engine on a CUDA group: the trained glm-4.5-kjv on TP 2 (its MTP
// layer on both ranks), k = 2, two greedy requests with logprobs, against the group without
// drafts: one request continues the model's greedy text (drafts accepted), one does not.
TEST(CudaTensorParallelTest, SpeculativeDecodingOnRanksKeepsTheOutput) {
  GLM_REQUIRE_GPUS(2);
  absl::StatusOr<ModelWeights> kjv = LoadModel(testing::ModelDir("glm-4.5-kjv"));
  ASSERT_TRUE(kjv.ok()) << kjv.status();
  std::ifstream f(testing::GoldenDir("kjv") + "/prompt.json");
  const std::vector<int32_t> greedy =
      nlohmann::json::parse(f)["greedy_64"].get<std::vector<int32_t>>();
  const auto run = [&](int32_t k) {
    std::unique_ptr<RankGroup> group = Group(*kjv, 2, /*expert_parallel=*/true);
    EXPECT_NE(group, nullptr);
    return testing::RunDraftedPair(std::move(group), k, greedy, 8, "CUDA TP 2");
  };
  const std::vector<testing::Outcome> plain = run(0), spec = run(2);
  for (int key = 0; key < 2; ++key) {
    EXPECT_FALSE(plain[key].tokens.empty());
    if (testing::Emulated()) {
      EXPECT_TRUE(spec[key] == plain[key]) << "request " << key << ": not bit-identical";
      continue;
    }
    EXPECT_EQ(spec[key].tokens, plain[key].tokens) << "request " << key;
  }
}

TEST(CudaTensorParallelTest, RanksSampleOnRankZeroAsOneGpuDoes) {
  // Device sampling with the head split by vocabulary: rank 0 gathers the slices and samples;
  // the tokens and logprobs are one GPU's.
  GLM_REQUIRE_GPUS(2);
  const ModelWeights w = Weights(TpConfig());
  absl::StatusOr<std::unique_ptr<CudaModel>> one = CudaModel::Create(w);
  ASSERT_TRUE(one.ok()) << one.status();
  std::unique_ptr<RankGroup> group = Group(w, 2, /*expert_parallel=*/true);
  ASSERT_NE(group, nullptr);
  EXPECT_TRUE(group->samples_tokens());
  const auto run = [](ModelRunner& runner) {
    auto cache = *runner.CreateCache(16, 4);
    std::vector<BlockTable> tables(2);
    EXPECT_TRUE(cache->Reserve(&tables[0], 6).ok());
    EXPECT_TRUE(cache->Reserve(&tables[1], 3).ok());
    ForwardBatch batch;
    batch.sequences = {{6, 0, &tables[0]}, {3, 0, &tables[1]}};
    batch.token_ids = {5, 6, 7, 8, 9, 10, 40, 41, 42};
    ForwardOptions options;
    options.sample.resize(2);
    for (RowSampleRequest& r : options.sample) {
      r.sample = true;
      r.params.logprob = true;
    }
    options.sample[1].keep_logits = true;
    ForwardResult result;
    const absl::Status st = runner.Forward(batch, cache.get(), options, &result);
    EXPECT_TRUE(st.ok()) << st;
    return result;
  };
  const ForwardResult want = run(**one), got = run(*group);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.token_logprobs.size(), want.token_logprobs.size());
  for (size_t i = 0; i < want.token_logprobs.size(); ++i) {
    EXPECT_NEAR(got.token_logprobs[i], want.token_logprobs[i], 1e-2) << i;
  }
  ASSERT_EQ(got.logits.size(), want.logits.size());  // the one kept row
  EXPECT_LT(RelativeError(got.logits, want.logits), kGpuTolerance);
}

TEST(CudaTensorParallelTest, AnAbortedRankTakesTheGroupDown) {
  // A rank whose collectives fail (its NCCL communicator aborted, as a dead peer leaves it):
  // the step fails UNAVAILABLE naming it, and the group reports unhealthy, for glm-server to
  // drop readiness.
  GLM_REQUIRE_GPUS(2);
  const ModelWeights w = Weights(TpConfig());
  CudaModelOptions options;
  options.cuda_graphs = false;
  std::unique_ptr<RankGroup> group = Group(w, 2, /*expert_parallel=*/true, options);
  ASSERT_NE(group, nullptr);
  ASSERT_FALSE(Greedy(*group, 1).tokens.empty());
  ASSERT_TRUE(group->health().ok());
  // Only rank 1's view of the group is aborted: rank 0 learns of it through the group.
  auto cache = *group->CreateCache(8, 4);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(&table, 3).ok());
  ForwardBatch batch;
  batch.sequences = {{3, 0, &table}};
  batch.token_ids = {1, 2, 3};
  ForwardResult result;
  group->communicator(1).Abort(absl::UnavailableError("rank 1 lost its peer"));
  const absl::Status st = group->Forward(batch, cache.get(), ForwardOptions{}, &result);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_FALSE(group->health().ok());
}

}  // namespace
}  // namespace glmserve::cuda
