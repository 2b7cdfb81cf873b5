// The tensor-parallel memory planner (core/model/parallel_plan.h): per-rank bytes against sums
// written out here from the shapes, the four target plans of issue 31, refusals with the
// numbers, and the --devices grammar.
#include "core/model/parallel_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/gpu_memory_plan.h"

namespace glmserve {
namespace {

ModelConfig Preset(const char* name) {
  absl::StatusOr<ModelConfig> c = PresetConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// A matrix of `rows` x `cols` held by a rank, in the form under test; `scale_rows` the per-channel
// scales it keeps (its rows, or all of the whole matrix's rows when split by columns).
struct Bytes {
  bool fp8 = false;   // per-channel or block FP8 for the matrices FP8 releases quantize
  int64_t block = 0;  // 0: per channel
  int64_t Dense(int64_t rows, int64_t cols) const { return 2 * rows * cols; }
  int64_t Quant(int64_t rows, int64_t cols, int64_t scale_rows) const {
    if (!fp8) return Dense(rows, cols);
    const int64_t scales = block == 0 ? scale_rows : (rows / block) * ((cols + block - 1) / block);
    return rows * cols + 4 * scales;
  }
  // For block FP8 every split here is whole blocks along the split side; rows not a multiple of
  // the block only occur for unsplit matrices (kv_a: 576 rows), counted by BlockQuant.
  int64_t BlockQuant(int64_t rows, int64_t cols) const {
    if (!fp8) return Dense(rows, cols);
    return rows * cols + 4 * ((rows + block - 1) / block) * ((cols + block - 1) / block);
  }
};

// GLM-4.5's shapes (GQA), EP, the MTP layer (a MoE layer, its three norms, bf16 eh_proj, the
// model's head), one of `n` ranks when n divides heads, KV heads, widths, experts and vocabulary.
int64_t Glm45RankBytes(const ModelConfig& c, int64_t n, const Bytes& b) {
  const int64_t h = c.hidden_size, hd = c.head_dim;
  const int64_t q = c.num_attention_heads / n * hd, kv = c.num_key_value_heads / n * hd;
  const int64_t dense = c.intermediate_size / n, shared = c.moe_intermediate_size / n;
  const int64_t w = c.moe_intermediate_size, experts = c.n_routed_experts / n;
  const int64_t attention = b.Quant(q, h, q) + 2 * b.Quant(kv, h, kv) + b.Quant(h, q, h) +
                            (c.attention_bias ? 4 * (q + 2 * kv) : 0) +
                            (c.use_qk_norm ? 4 * 2 * hd : 0) +  // q_norm and k_norm, whole
                            4 * 2 * h /* input and post-attention norms */;
  const int64_t dense_ffn = 2 * b.Quant(dense, h, dense) + b.Quant(h, dense, h);
  const int64_t moe = 2 * c.n_routed_experts * h + 4 * c.n_routed_experts /* router, bias */ +
                      experts * (2 * b.Quant(w, h, w) + b.Quant(h, w, h)) +
                      2 * b.Quant(shared, h, shared) + b.Quant(h, shared, h);
  const int64_t dense_layers = c.first_k_dense_replace;
  const int64_t moe_layers = c.num_hidden_layers - dense_layers + 1;  // + the MTP layer
  const int64_t vocab = c.vocab_size / n;
  return (c.num_hidden_layers + 1) * attention + dense_layers * dense_ffn + moe_layers * moe +
         2 * 2 * vocab * h /* embedding, head */ + 4 * h /* final norm */ + 3 * 4 * h +
         2 * h * 2 * h /* MTP: enorm, hnorm, shared_head.norm; eh_proj */;
}

// GLM-5's shapes (MLA with the indexer on every layer and the MTP layer), block FP8 or bf16.
int64_t Glm5RankBytes(const ModelConfig& c, int64_t n, const Bytes& b) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads / n;
  const int64_t qa = c.q_lora_rank, kva = c.kv_lora_rank;
  const int64_t attention =
      b.BlockQuant(qa, h) + 4 * qa + b.BlockQuant(heads * c.qk_head_dim(), qa) +
      b.BlockQuant(kva + c.qk_rope_head_dim, h) + 4 * kva +
      b.BlockQuant(heads * (c.qk_nope_head_dim + c.v_head_dim), kva) +
      b.BlockQuant(h, heads * c.v_head_dim) +
      // indexer: wq_b, wk, k_norm weight and bias, weights_proj (bf16 in FP8 releases)
      b.BlockQuant(c.index_n_heads * c.index_head_dim, qa) + b.BlockQuant(c.index_head_dim, h) +
      4 * 2 * c.index_head_dim + 2 * c.index_n_heads * h + 4 * 2 * h /* layer norms */;
  const int64_t dense = c.intermediate_size / n, shared = c.moe_intermediate_size / n;
  const int64_t w = c.moe_intermediate_size, experts = c.n_routed_experts / n;
  const int64_t dense_ffn = 2 * b.BlockQuant(dense, h) + b.BlockQuant(h, dense);
  const int64_t moe = 2 * c.n_routed_experts * h + 4 * c.n_routed_experts +
                      experts * (2 * b.BlockQuant(w, h) + b.BlockQuant(h, w)) +
                      2 * b.BlockQuant(shared, h) + b.BlockQuant(h, shared);
  const int64_t dense_layers = 3, moe_layers = c.num_hidden_layers - dense_layers + 1;
  const int64_t vocab = c.vocab_size / n;
  return (c.num_hidden_layers + 1) * attention + dense_layers * dense_ffn + moe_layers * moe +
         2 * 2 * vocab * h + 4 * h + 3 * 4 * h + 2 * h * 2 * h;
}

// The arena estimate with a rank's sizes (every expert count here >= top-k).
int64_t RankArena(const ModelConfig& c, int64_t n) {
  const int64_t q = c.num_attention_heads / n * c.head_dim;
  const int64_t kv =
      c.is_mla() ? c.num_key_value_heads * c.head_dim : c.num_key_value_heads / n * c.head_dim;
  const int64_t ffn =
      std::max(c.intermediate_size / n,
               c.moe_intermediate_size * c.num_experts_per_tok + c.moe_intermediate_size / n);
  const int64_t per_token = 2 * c.hidden_size + 2 * q + 2 * kv + 2 * ffn + c.hidden_size;
  return (2048 * per_token + 64 * c.vocab_size) * 4;
}

int64_t ExpectedKvTokens(int64_t device, int64_t weights, int64_t arena, int64_t per_token) {
  const int64_t budget = static_cast<int64_t>(std::floor(device * 0.9));
  return (budget - weights - arena - (int64_t{1} << 30)) / per_token / 16 * 16;
}

ParallelPlanRequest Request(int devices, int64_t device_bytes, const PlanWeightForm& form) {
  ParallelPlanRequest r;
  r.devices = devices;
  r.device_bytes = device_bytes;
  r.form = form;
  return r;
}

struct Target {
  const char* preset;
  int devices;
  int64_t device_bytes;
};

// Issue 31's four plans: each fits, every rank holds the bytes written out above, and the KV
// tokens are what is left of the budget over the per-token bytes.
TEST(ParallelPlanTest, TheFourTargetPlansFit) {
  for (const Target& t :
       {Target{"glm-4.5-fp8", 8, 80'000'000'000}, Target{"glm-4.5-fp8", 4, 141'000'000'000},
        Target{"glm-5-fp8", 8, 141'000'000'000}, Target{"glm-4.5-air", 2, 141'000'000'000}}) {
    const ModelConfig c = Preset(t.preset);
    const bool fp8 = PresetIsFp8(t.preset);
    const absl::StatusOr<ParallelPlan> plan =
        PlanParallelMemory(c, Request(t.devices, t.device_bytes, PresetWeightForm(c, fp8)));
    ASSERT_TRUE(plan.ok()) << t.preset << ": " << plan.status();
    std::printf("%s on %d x %.0f GB:\n%s", t.preset, t.devices, t.device_bytes / 1e9,
                plan->Describe().c_str());
    const Bytes b{fp8, c.is_mla() ? 128 : 0};
    const int64_t n = t.devices;
    const int64_t weights = c.is_mla() ? Glm5RankBytes(c, n, b) : Glm45RankBytes(c, n, b);
    const int64_t per_token = (c.num_hidden_layers + 1) *
                              (c.is_mla() ? c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim
                                          : 2 * c.num_key_value_heads / n * c.head_dim) *
                              2;
    const int64_t tokens = ExpectedKvTokens(t.device_bytes, weights, RankArena(c, n), per_token);
    ASSERT_EQ(plan->ranks.size(), static_cast<size_t>(n));
    for (const RankPlan& r : plan->ranks) {
      EXPECT_EQ(r.weights.total, weights) << t.preset << " rank " << r.layout.rank;
      EXPECT_EQ(r.activation_bytes, RankArena(c, n)) << t.preset;
      EXPECT_EQ(r.kv_bytes_per_token, per_token) << t.preset;
      EXPECT_EQ(r.kv_bytes, tokens * per_token) << t.preset;
    }
    EXPECT_EQ(plan->kv_tokens, tokens) << t.preset;
    EXPECT_EQ(plan->kv_blocks * 16, tokens) << t.preset;
    EXPECT_GE(plan->kv_tokens, 4096) << t.preset;
    const std::string text = plan->Describe();
    EXPECT_NE(text.find(absl::StrCat("KV tokens: ", tokens, " (")), std::string::npos) << text;
    EXPECT_NE(text.find(plan->layout), std::string::npos) << text;
  }
}

// One rank holds the whole model: the bytes ModelWeightBytes counts (without the MTP layer,
// which it does not count), and ActivationArenaBytes.
TEST(ParallelPlanTest, OneRankIsTheWholeModel) {
  for (const char* name :
       {"tiny", "tiny-fp8", "tiny-glm5", "tiny-glm5-fp8", "glm-4.5-fp8", "glm-5-fp8", "glm-4.5"}) {
    const ModelConfig c = Preset(name);
    PlanWeightForm form = PresetWeightForm(c, PresetIsFp8(name));
    form.mtp = false;
    const RankLayout one = LayoutOf(c, {1, true}, 0, form.width_unit());
    EXPECT_EQ(RankWeights(c, one, form).total, ModelWeightBytes(c, PresetIsFp8(name))) << name;
    EXPECT_EQ(RankActivationArenaBytes(c, one, 2048, 64), ActivationArenaBytes(c, 2048, 64))
        << name;
    EXPECT_EQ(RankKvBytesPerToken(c, one, c.num_hidden_layers),
              KvBytesPerToken(c, c.num_hidden_layers))
        << name;
  }
}

// Summed over the ranks the bytes are the whole model's plus N - 1 more copies of what every
// rank holds alike (when the KV heads split evenly and block splits are whole blocks).
TEST(ParallelPlanTest, RanksSumToTheModelPlusTheReplicatedParts) {
  struct Case {
    const char* preset;
    int n;
    bool ep;
  };
  for (const Case& k :
       {Case{"glm-4.5-fp8", 8, true}, Case{"glm-5-fp8", 8, true}, Case{"glm-4.5-air", 2, true},
        Case{"tiny", 2, false}, Case{"tiny-fp8", 2, false}, Case{"glm-5-fp8", 4, false}}) {
    const ModelConfig c = Preset(k.preset);
    const PlanWeightForm form = PresetWeightForm(c, PresetIsFp8(k.preset));
    const int64_t whole = RankWeights(c, LayoutOf(c, {1, true}, 0, form.width_unit()), form).total;
    ASSERT_TRUE(CheckParallelLayout(c, {k.n, k.ep}, form.width_unit()).ok()) << k.preset;
    int64_t sum = 0, replicated = -1;
    for (int r = 0; r < k.n; ++r) {
      const RankWeightBytes b =
          RankWeights(c, LayoutOf(c, {k.n, k.ep}, r, form.width_unit()), form);
      sum += b.total;
      if (replicated < 0) replicated = b.replicated;
      EXPECT_EQ(b.replicated, replicated) << k.preset << " rank " << r;
    }
    EXPECT_GT(replicated, 0) << k.preset;
    EXPECT_EQ(sum - whole, (k.n - 1) * replicated) << k.preset << " TP " << k.n;
  }
}

// tiny has 2 KV heads: over 4 ranks each is held twice, so the sum carries one more copy of every
// k_proj and v_proj (and their biases) beyond the replicated parts.
TEST(ParallelPlanTest, ReplicatedKvHeadsCountOnEveryRankThatHoldsThem) {
  const ModelConfig c = Preset("tiny");
  PlanWeightForm form = PresetWeightForm(c, false);
  const int64_t whole = RankWeights(c, LayoutOf(c, {1, true}, 0), form).total;
  int64_t sum = 0, replicated = 0;
  for (int r = 0; r < 4; ++r) {
    const RankWeightBytes b = RankWeights(c, LayoutOf(c, {4, true}, r), form);
    sum += b.total;
    replicated = b.replicated;
  }
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  const int64_t kv_bytes_per_layer = 2 * (2 * kv * c.hidden_size + 4 * kv);
  EXPECT_EQ(sum - whole, 3 * replicated + (c.num_hidden_layers + 1) * kv_bytes_per_layer);
  // One KV head per rank in the cache too.
  EXPECT_EQ(RankKvBytesPerToken(c, LayoutOf(c, {4, true}, 3), 1), 2 * c.head_dim * 2);
}

// Experts that do not divide evenly: 10 over 4 ranks are 2, 3, 2, 3, and 160 over 6 ranks are
// 26, 27, 27, 26, 27, 27; a rank with one more expert holds one more expert's bytes per MoE layer
// (the MTP layer's included), and the instance's KV tokens are the fuller rank's.
TEST(ParallelPlanTest, UnevenExpertCountsGiveEachRankItsBytes) {
  ModelConfig tiny = Preset("tiny");
  tiny.n_routed_experts = 10;
  tiny.n_group = 1;
  ModelConfig big = Preset("glm-4.5-fp8");
  big.num_key_value_heads = 6;  // so that 6 ranks split the KV heads evenly
  struct Case {
    ModelConfig c;
    int n;
    bool fp8;
    std::vector<int64_t> experts;
  };
  for (const Case& k :
       {Case{tiny, 4, false, {2, 3, 2, 3}}, Case{big, 6, true, {26, 27, 27, 26, 27, 27}}}) {
    const ModelConfig& c = k.c;
    ASSERT_TRUE(ValidateConfig(c).ok());
    const PlanWeightForm form = PresetWeightForm(c, k.fp8);
    const int64_t h = c.hidden_size, w = c.moe_intermediate_size;
    const int64_t expert = k.fp8 ? 3 * w * h + 4 * (2 * w + h) : 3 * 2 * w * h;
    const int64_t moe_layers = c.num_hidden_layers - c.first_k_dense_replace + 1;
    const RankLayout l0 = LayoutOf(c, {k.n, true}, 0);
    const int64_t rank0 = RankWeights(c, l0, form).total;
    for (int r = 0; r < k.n; ++r) {
      const RankLayout l = LayoutOf(c, {k.n, true}, r);
      EXPECT_EQ(l.experts.count, k.experts[static_cast<size_t>(r)]);
      // The vocabulary may split unevenly too (151552 over 6): bf16 embedding and head rows.
      const int64_t vocab = 2 * 2 * (l.vocab.count - l0.vocab.count) * h;
      EXPECT_EQ(RankWeights(c, l, form).total - rank0,
                (l.experts.count - k.experts[0]) * moe_layers * expert + vocab)
          << "rank " << r << " of " << k.n;
    }
    ParallelPlanRequest q = Request(k.n, k.fp8 ? 141'000'000'000 : 1'000'000'000, form);
    q.min_kv_tokens = 16;
    q.max_batch_tokens = 64;
    q.max_running = 4;
    q.reserve_bytes = 0;
    const absl::StatusOr<ParallelPlan> plan = PlanParallelMemory(c, q);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->ranks[1].layout.experts.count, k.experts[1]);
    EXPECT_EQ(plan->limiting_rank, 1);  // the first rank with the most experts
    EXPECT_EQ(plan->kv_tokens, plan->ranks[1].own_kv_tokens);
    EXPECT_LT(plan->ranks[1].own_kv_tokens, plan->ranks[0].own_kv_tokens);
  }
}

// Expert width split: block-scaled weights split in whole 128-wide blocks; a width of 1536 over 5
// ranks is 12 blocks as 2, 2, 3, 2, 3 (SplitRange), each rank's scales its own blocks.
TEST(ParallelPlanTest, WidthSplitsFollowTheScaleBlocks) {
  ModelConfig c = Preset("glm-4.5");
  c.num_attention_heads = 100;  // 5 ranks need heads and KV heads that split by 5
  c.num_key_value_heads = 5;
  c.vocab_size = 151550;
  PlanWeightForm form;
  form.fp8 = true;
  form.fp8_block = 128;
  ASSERT_TRUE(CheckParallelLayout(c, {5, false}, 128).ok());
  const int64_t h = c.hidden_size;
  std::vector<int64_t> totals;
  for (int r = 0; r < 5; ++r) {
    const RankLayout l = LayoutOf(c, {5, false}, r, form.width_unit());
    totals.push_back(RankWeights(c, l, form).total);
  }
  // Rank 2 holds one more 128-wide block of every expert and shared expert (gate, up rows and
  // down columns: 3 x 128 x hidden codes and 3 x hidden / 128 scales each) than rank 0.
  const int64_t block = 3 * 128 * h + 3 * 4 * (h / 128);
  const int64_t moe_layers = c.num_hidden_layers - c.first_k_dense_replace;
  EXPECT_EQ(totals[2] - totals[0], moe_layers * (c.n_routed_experts + 1) * block);
  EXPECT_EQ(totals[1], totals[0]);
}

TEST(ParallelPlanTest, RefusalsNameTheNumbers) {
  // GLM-4.5 bf16 (~710 GB) on 4 x 80 GB: ~177 GB per rank against a 72 GB budget.
  const ModelConfig glm45 = Preset("glm-4.5");
  absl::StatusOr<ParallelPlan> p =
      PlanParallelMemory(glm45, Request(4, 80'000'000'000, PresetWeightForm(glm45, false)));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  std::printf("glm-4.5 on 4 x 80 GB: %s\n", std::string(p.status().message()).c_str());
  const int64_t weights = Glm45RankBytes(glm45, 4, Bytes{});
  const int64_t per_token = 93 * 2 * 2 * 128 * 2;
  const int64_t need = weights + RankArena(glm45, 4) + (int64_t{1} << 30) + 4096 * per_token;
  for (const std::string& part :
       {std::string("rank 0 of 4"), absl::StrFormat("weights %.2f GB", weights / 1e9),
        std::string("budget is 72.00 GB"), absl::StrFormat("= %.2f GB", need / 1e9),
        absl::StrFormat("short by %.2f GB", (need - 72e9) / 1e9), std::string("4 of 4 ranks")}) {
    EXPECT_NE(p.status().message().find(part), std::string::npos) << part << ": " << p.status();
  }
  // GLM-5-FP8 on 4 x 80 GB.
  const ModelConfig glm5 = Preset("glm-5-fp8");
  p = PlanParallelMemory(glm5, Request(4, 80'000'000'000, PresetWeightForm(glm5, true)));
  ASSERT_FALSE(p.ok());
  std::printf("glm-5-fp8 on 4 x 80 GB: %s\n", std::string(p.status().message()).c_str());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find(
                absl::StrFormat("weights %.2f GB", Glm5RankBytes(glm5, 4, Bytes{true, 128}) / 1e9)),
            std::string::npos)
      << p.status();
  // Weights that fit but leave less than min_kv_tokens of cache are refused too.
  const ModelConfig air = Preset("glm-4.5-air");
  ParallelPlanRequest q = Request(2, 141'000'000'000, PresetWeightForm(air, false));
  q.min_kv_tokens = 10'000'000;
  p = PlanParallelMemory(air, q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("KV cache for 10000000 tokens"), std::string::npos);
  // A cut the layout refuses: 96 heads and 8 KV heads over 6 ranks.
  p = PlanParallelMemory(glm45, Request(6, 141'000'000'000, PresetWeightForm(glm45, false)));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_NE(p.status().message().find("KV heads"), std::string::npos) << p.status();
  // An FP8 cache is GQA's only; fractions outside (0, 1].
  q = Request(8, 141'000'000'000, PresetWeightForm(glm5, true));
  q.fp8_kv = true;
  EXPECT_EQ(PlanParallelMemory(glm5, q).status().code(), absl::StatusCode::kInvalidArgument);
  q.fp8_kv = false;
  q.gpu_memory_fraction = 1.5;
  EXPECT_EQ(PlanParallelMemory(glm5, q).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParallelPlanTest, ParsesDeviceSpecs) {
  struct Good {
    const char* text;
    int count;
    int64_t bytes;
  };
  for (const Good& g :
       {Good{"8x80GB", 8, 80'000'000'000}, Good{"4x141GB", 4, 141'000'000'000},
        Good{"2xH200", 2, int64_t{143771} << 20}, Good{"2x80GiB", 2, int64_t{80} << 30},
        Good{"1x0.5TB", 1, 500'000'000'000}, Good{"16X40gb", 16, 40'000'000'000},
        Good{"3x81559MiB", 3, int64_t{81559} << 20}}) {
    const absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(g.text);
    ASSERT_TRUE(d.ok()) << g.text << ": " << d.status();
    EXPECT_EQ(d->count, g.count) << g.text;
    EXPECT_EQ(d->bytes, g.bytes) << g.text;
  }
  for (const char* bad :
       {"", "8", "x80GB", "8x", "8x80", "0x80GB", "-1x80GB", "2000x80GB", "8x-80GB", "8x80XB",
        "8xH100", "8x1e3GB", "8xnanGB", "eightx80GB", "8x80GBx", "8x0GB"}) {
    const absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find("expected COUNTxSIZE"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace glmserve
