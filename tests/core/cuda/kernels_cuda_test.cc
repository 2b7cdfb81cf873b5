// Each CUDA kernel against the CPU backend's op (core/cpu/ops) on fresh random inputs, several
// shapes including awkward ones. Outputs are poisoned (0xff bytes: NaN in fp32 and bf16)
// before every run, so an element a kernel forgets to write shows up as NaN.
//
// Tolerances (relative error of the norm): 1e-5 where the GPU result is fp32 from the same
// inputs (only the summation order differs), 1e-2 where it is rounded to bf16 (2^-9 relative
// per element).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/cpu/ops/attention.h"
#include "core/cpu/ops/embedding.h"
#include "core/cpu/ops/ffn.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/moe.h"
#include "core/cpu/ops/norm.h"
#include "core/cpu/ops/rope.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"
#include "core/cuda/step_plan.h"
#include "core/model/kv_cache.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/cuda/device_buffers.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::FromBf16;
using ::glmserve::testing::RandomVector;
using ::glmserve::testing::RelativeError;
using ::glmserve::testing::RoundBf16;
using ::glmserve::testing::ToBf16;

int64_t CountNan(const std::vector<float>& v) {
  return std::count_if(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_REQUIRE_CUDA_DEVICE();
    ASSERT_EQ(PrepareKernels(), cudaSuccess);
  }
};

TEST_F(CudaKernels, AddRmsNormMatchesCpu) {
  struct Shape {
    int64_t rows, width;
  };
  for (const Shape s :
       {Shape{1, 64}, Shape{3, 100}, Shape{17, 4096}, Shape{5, 33}, Shape{2, 5120}}) {
    for (const bool with_delta : {false, true}) {
      const int64_t n = s.rows * s.width;
      const std::vector<float> h = RandomVector(n, 1, 2.0f), delta = RandomVector(n, 2);
      const std::vector<float> gain = RandomVector(s.width, 3);
      std::vector<float> want_h = h;
      if (with_delta)
        for (int64_t i = 0; i < n; ++i) want_h[i] += delta[i];
      std::vector<float> want(n);
      RmsNorm(want_h.data(), gain.data(), s.rows, s.width, 1e-5f, want.data());

      DeviceBuffer dh = Upload(h), dd = Upload(delta), dg = Upload(gain);
      DeviceBuffer ob = Poisoned<uint16_t>(n), of = Poisoned<float>(n);
      ASSERT_EQ(LaunchAddRmsNorm(dh.as<float>(), with_delta ? dd.as<float>() : nullptr,
                                 dg.as<float>(), s.rows, s.width, 1e-5f, nullptr, ob.as<uint16_t>(),
                                 of.as<float>(), nullptr),
                cudaSuccess);
      const std::vector<float> got_h = Download<float>(dh, n);
      const std::vector<float> got_f = Download<float>(of, n);
      const std::vector<float> got_b = FromBf16(Download<uint16_t>(ob, n));
      EXPECT_EQ(got_h, want_h) << "residual add is one fp32 add per element";
      EXPECT_LT(RelativeError(got_f, want), 1e-5) << s.rows << "x" << s.width;
      EXPECT_LT(RelativeError(got_b, want), 1e-2) << s.rows << "x" << s.width;
      EXPECT_EQ(CountNan(got_b), 0);
    }
  }
  // Gathered rows (the final norm before lm_head).
  const int64_t width = 96;
  const std::vector<float> h = RandomVector(6 * width, 4), gain = RandomVector(width, 5);
  const std::vector<int32_t> rows = {5, 0, 3};
  std::vector<float> want(3 * width);
  for (int r = 0; r < 3; ++r) {
    RmsNorm(h.data() + rows[r] * width, gain.data(), 1, width, 1e-5f, want.data() + r * width);
  }
  DeviceBuffer dh = Upload(h), dg = Upload(gain), dr = Upload(rows);
  DeviceBuffer ob = Poisoned<uint16_t>(3 * width);
  ASSERT_EQ(LaunchAddRmsNorm(dh.as<float>(), nullptr, dg.as<float>(), 3, width, 1e-5f,
                             dr.as<int32_t>(), ob.as<uint16_t>(), nullptr, nullptr),
            cudaSuccess);
  EXPECT_LT(RelativeError(FromBf16(Download<uint16_t>(ob, 3 * width)), want), 1e-2);
}

struct QkvCase {
  int64_t heads, kv_heads, head_dim, rotary_dim;
  bool bias, qk_norm;
};

TEST_F(CudaKernels, QkNormRopeKvMatchesCpu) {
  for (const QkvCase c :
       {QkvCase{4, 2, 16, 8, true, true}, QkvCase{4, 2, 24, 12, true, false},
        QkvCase{12, 1, 128, 64, true, true}, QkvCase{8, 8, 64, 64, false, false},
        QkvCase{2, 1, 256, 128, false, true}, QkvCase{3, 3, 40, 20, true, true}}) {
    const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
    const int64_t width = q_dim + 2 * kv_dim;
    const int64_t block_size = 4, num_blocks = 8, tokens = 7;
    const std::vector<int32_t> positions = {0, 1, 5, 6, 100, 4095, 131071};
    const std::vector<int32_t> slots = {3, 0, 17, -1, 31, 8, 9};
    const std::vector<float> qkv = RandomVector(tokens * width, 6);
    const std::vector<float> bias = c.bias ? RandomVector(width, 7, 0.1f) : std::vector<float>{};
    const std::vector<float> q_norm = RandomVector(c.head_dim, 8),
                             k_norm = RandomVector(c.head_dim, 9);
    const RotaryEmbedding rope(c.head_dim, c.rotary_dim, 1e6);

    // CPU: bias, per-head RMSNorm, RoPE, as CpuModel::AttentionBlock.
    std::vector<float> q(tokens * q_dim), k(tokens * kv_dim), v(tokens * kv_dim);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < width; ++i) {
        const float x = qkv[t * width + i] + (c.bias ? bias[i] : 0.f);
        if (i < q_dim)
          q[t * q_dim + i] = x;
        else if (i < q_dim + kv_dim)
          k[t * kv_dim + i - q_dim] = x;
        else
          v[t * kv_dim + i - q_dim - kv_dim] = x;
      }
    }
    if (c.qk_norm) {
      RmsNorm(q.data(), q_norm.data(), tokens * c.heads, c.head_dim, 1e-5f, q.data());
      RmsNorm(k.data(), k_norm.data(), tokens * c.kv_heads, c.head_dim, 1e-5f, k.data());
    }
    rope.Apply(q.data(), tokens, c.heads, positions.data());
    rope.Apply(k.data(), tokens, c.kv_heads, positions.data());

    DeviceBuffer dqkv = Upload(qkv), db = Upload(bias), dqn = Upload(q_norm), dkn = Upload(k_norm);
    DeviceBuffer dfreq = Upload(rope.inv_freq()), dpos = Upload(positions), dslot = Upload(slots);
    const int64_t cache_elems = num_blocks * 2 * block_size * kv_dim;
    DeviceBuffer dcache = Poisoned<uint16_t>(cache_elems);
    QkvShape shape{c.heads, c.kv_heads, c.head_dim, c.rotary_dim};
    ASSERT_EQ(LaunchQkNormRopeKv(dqkv.as<float>(), tokens, shape, c.bias ? db.as<float>() : nullptr,
                                 c.qk_norm ? dqn.as<float>() : nullptr,
                                 c.qk_norm ? dkn.as<float>() : nullptr, 1e-5f, dfreq.as<float>(),
                                 dpos.as<int32_t>(), dslot.as<int32_t>(), dcache.as<uint16_t>(),
                                 block_size, nullptr),
              cudaSuccess);
    const std::vector<float> got_qkv = Download<float>(dqkv, tokens * width);
    const std::vector<float> cache = FromBf16(Download<uint16_t>(dcache, cache_elems));
    std::vector<float> got_q(tokens * q_dim);
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(got_qkv.begin() + t * width, q_dim, got_q.begin() + t * q_dim);
    EXPECT_LT(RelativeError(got_q, q), 1e-5) << "head_dim " << c.head_dim;
    std::vector<float> got_k, got_v, want_k, want_v;
    for (int64_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      const int64_t block = slots[t] / block_size, off = slots[t] % block_size;
      const int64_t at = (block * 2 * block_size + off) * kv_dim;
      got_k.insert(got_k.end(), cache.begin() + at, cache.begin() + at + kv_dim);
      got_v.insert(got_v.end(), cache.begin() + at + block_size * kv_dim,
                   cache.begin() + at + block_size * kv_dim + kv_dim);
      want_k.insert(want_k.end(), k.begin() + t * kv_dim, k.begin() + (t + 1) * kv_dim);
      want_v.insert(want_v.end(), v.begin() + t * kv_dim, v.begin() + (t + 1) * kv_dim);
    }
    EXPECT_LT(RelativeError(got_k, want_k), 1e-2);
    EXPECT_LT(RelativeError(got_v, want_v), 1e-2);
    // Exactly the 6 stored tokens' K and V rows were written; the rest stays poisoned.
    EXPECT_EQ(static_cast<int64_t>(cache.size()) - CountNan(cache), 6 * 2 * kv_dim);
  }
}

struct AttnCase {
  int64_t heads, kv_heads, head_dim, block_size;
};

TEST_F(CudaKernels, PagedAttentionMatchesCpu) {
  std::mt19937 rng(123);
  double worst[2] = {0, 0};  // per kernel: CUDA cores, tensor cores (printed: docs/cuda.md)
  for (const AttnCase c : {AttnCase{4, 2, 16, 4}, AttnCase{4, 1, 32, 16}, AttnCase{12, 1, 128, 16},
                           AttnCase{8, 8, 24, 8}, AttnCase{32, 1, 64, 16}, AttnCase{2, 2, 256, 16},
                           AttnCase{6, 2, 40, 5}}) {
    const int64_t kv_dim = c.kv_heads * c.head_dim, group = c.heads / c.kv_heads;
    const int64_t num_blocks = 160;
    KvCacheShape shape{1, c.kv_heads, c.head_dim, c.block_size, num_blocks};
    KvCache cpu(shape);
    // One bf16 image of K/V; the CPU cache holds the same values widened.
    const std::vector<uint16_t> image = ToBf16(RandomVector(cpu.num_elements(), 11));
    const std::vector<float> widened = FromBf16(image);
    std::copy(widened.begin(), widened.end(), static_cast<float*>(cpu.storage()));

    // Sequences: a long prefill chunk after a cached prefix, a fresh prompt, three decodes.
    struct Seq {
      int64_t start, tokens;
    };
    const std::vector<Seq> seqs = {{37, 29}, {0, 13}, {300, 1}, {1, 1}, {63, 1}};
    std::vector<int32_t> free_blocks(num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    std::vector<BlockTable> tables(seqs.size());
    ForwardBatch batch;
    int64_t next = 0, total = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t need = (seqs[i].start + seqs[i].tokens + c.block_size - 1) / c.block_size;
      for (int64_t b = 0; b < need; ++b) tables[i].push_back(free_blocks[next++]);
      total += seqs[i].tokens;
    }
    ASSERT_LE(next, num_blocks);
    for (size_t i = 0; i < seqs.size(); ++i) {
      batch.sequences.push_back({seqs[i].tokens, seqs[i].start, &tables[i]});
    }
    const int64_t q_dim = c.heads * c.head_dim, q_stride = q_dim + 2 * kv_dim;
    const std::vector<float> q = RandomVector(total * q_dim, 12);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want(total * q_dim);
    PagedAttention(q.data(), batch.sequences, cpu, 0, c.heads, scale, want.data());

    // Padded as a CUDA-graph step pads: two padding rows, and a tile per row (the tiles
    // beyond the real ones and the padding rows' are empty: they must write nothing).
    StepPlan plan;
    BuildStepPlan(batch, LogitsRows::kNone, c.block_size, AttentionTileTokens(group),
                  StepPadding{total + 2, total + 2}, /*with_ids=*/false, &plan);
    // q rows for every planned row, padding included, laid out as in the fused qkv buffer.
    std::vector<float> q_strided(plan.tokens * q_stride, 0.f);
    for (int64_t t = 0; t < total; ++t)
      std::copy_n(q.begin() + t * q_dim, q_dim, q_strided.begin() + t * q_stride);
    DeviceBuffer dq = Upload(q_strided), dcache = Upload(image), dtiles = Upload(plan.tiles);
    DeviceBuffer dbt = Upload(plan.block_tables);
    AttentionShape ashape{c.heads, c.kv_heads, c.head_dim, c.block_size, q_stride, scale};
    // The CUDA-core kernel and the tensor-core one (attention_tc.cu), which must agree with
    // the CPU as closely: its q and P enter the MMAs as hi + lo bf16 pairs.
    for (const bool tensor_cores : {false, true}) {
      const auto launch = tensor_cores ? LaunchPagedAttentionTc : LaunchPagedAttention;
      for (const int splits : {1, 3, 16}) {
        const int64_t scratch_floats =
            AttentionScratchFloats(plan.num_tiles, c.kv_heads, group, c.head_dim, splits);
        DeviceBuffer scratch = Poisoned<float>(scratch_floats);
        // Room for the two padding rows, which must come out as zeros.
        DeviceBuffer out = Poisoned<uint16_t>(plan.tokens * q_dim);
        ASSERT_EQ(launch(dq.as<float>(), dtiles.as<int32_t>(), static_cast<int>(plan.num_tiles),
                         dbt.as<int32_t>(), dcache.as<uint16_t>(), ashape, splits,
                         scratch.as<float>(), out.as<uint16_t>(), nullptr),
                  cudaSuccess);
        const std::vector<float> got = FromBf16(Download<uint16_t>(out, plan.tokens * q_dim));
        const std::vector<float> got_real(got.begin(), got.begin() + total * q_dim);
        // Both round only the output to bf16 (2^-9 relative): far inside 1e-2.
        const double err = RelativeError(got_real, want);
        worst[tensor_cores] = std::max(worst[tensor_cores], err);
        EXPECT_LT(err, 4e-3) << (tensor_cores ? "tensor cores" : "CUDA cores") << ": heads "
                             << c.heads << " kv " << c.kv_heads << " hd " << c.head_dim
                             << " splits " << splits;
        for (int64_t i = total * q_dim; i < plan.tokens * q_dim; ++i) {
          ASSERT_EQ(got[i], 0.f) << "padding row element " << i;
        }
      }
    }
  }
  std::printf(
      "paged attention vs the CPU, worst relative error: CUDA cores %.2e, tensor cores %.2e\n",
      worst[0], worst[1]);
}

TEST_F(CudaKernels, RouterMatchesCpu) {
  struct Case {
    int n_experts, top_k, n_group, topk_group;
    bool norm;
    float scale;
  };
  for (const Case c : {Case{8, 2, 1, 1, true, 2.5f}, Case{8, 3, 4, 2, false, 1.7f},
                       Case{128, 8, 1, 1, true, 1.0f}, Case{160, 8, 1, 1, true, 2.5f},
                       Case{256, 8, 8, 4, true, 2.5f}, Case{512, 32, 64, 8, false, 1.0f}}) {
    for (const int64_t tokens : {1, 7, 300}) {
      RouterParams p;
      p.n_experts = c.n_experts;
      p.top_k = c.top_k;
      p.n_group = c.n_group;
      p.topk_group = c.topk_group;
      p.norm_topk_prob = c.norm;
      p.routed_scaling_factor = c.scale;
      rowmath::RouterRowParams q{c.n_experts, c.top_k, c.n_group, c.topk_group, c.norm, c.scale};
      const std::vector<float> logits = RandomVector(tokens * c.n_experts, 13, 2.0f);
      const std::vector<float> bias = RandomVector(c.n_experts, 14, 0.1f);
      std::vector<int32_t> want_ids(tokens * c.top_k);
      std::vector<float> want_w(tokens * c.top_k);
      RouteTokens(logits.data(), tokens, bias.data(), p, want_ids.data(), want_w.data());
      DeviceBuffer dl = Upload(logits), db = Upload(bias);
      DeviceBuffer ids = Poisoned<int32_t>(tokens * c.top_k), w = Poisoned<float>(tokens * c.top_k);
      ASSERT_EQ(LaunchRouter(dl.as<float>(), tokens, db.as<float>(), q, ids.as<int32_t>(),
                             w.as<float>(), nullptr),
                cudaSuccess);
      EXPECT_EQ(Download<int32_t>(ids, tokens * c.top_k), want_ids) << c.n_experts;
      EXPECT_LT(RelativeError(Download<float>(w, tokens * c.top_k), want_w), 1e-5);
    }
  }
}

TEST_F(CudaKernels, MoeSortGroupsPairsStably) {
  for (const int64_t n_experts : {8, 128, 512}) {
    for (const int64_t pairs : {1, 64, 5000}) {
      std::mt19937 rng(static_cast<uint32_t>(n_experts * 7 + pairs));
      std::vector<int32_t> experts(pairs);
      for (int32_t& e : experts) e = static_cast<int32_t>(rng() % std::min<int64_t>(n_experts, 13));
      DeviceBuffer de = Upload(experts);
      DeviceBuffer off = Poisoned<int32_t>(n_experts + 1), sorted = Poisoned<int32_t>(pairs),
                   pos = Poisoned<int32_t>(pairs);
      ASSERT_EQ(LaunchMoeSort(de.as<int32_t>(), pairs, n_experts, off.as<int32_t>(),
                              sorted.as<int32_t>(), pos.as<int32_t>(), nullptr),
                cudaSuccess);
      const std::vector<int32_t> o = Download<int32_t>(off, n_experts + 1);
      const std::vector<int32_t> s = Download<int32_t>(sorted, pairs);
      const std::vector<int32_t> ps = Download<int32_t>(pos, pairs);
      std::vector<int32_t> want_s(pairs);
      std::iota(want_s.begin(), want_s.end(), 0);
      std::stable_sort(want_s.begin(), want_s.end(),
                       [&](int32_t a, int32_t b) { return experts[a] < experts[b]; });
      EXPECT_EQ(s, want_s);
      for (int64_t e = 0; e < n_experts; ++e) {
        EXPECT_EQ(o[e + 1] - o[e], std::count(experts.begin(), experts.end(), e));
      }
      EXPECT_EQ(o[n_experts], pairs);
      for (int64_t i = 0; i < pairs; ++i) ASSERT_EQ(ps[s[i]], i);
    }
  }
}

// Routed experts' inputs grouped by expert and the CPU's Linear per expert: w [n_experts, n,
// k] and in [rows, k] bf16 (seeded), offsets [n_experts + 1], want [rows, n].
struct GroupedExperts {
  std::vector<uint16_t> w, in;
  std::vector<int32_t> offsets = {0};
  std::vector<float> want;
  int64_t n_experts = 0, rows = 0;
};

GroupedExperts MakeGroupedExperts(int64_t n, int64_t k, const std::vector<int64_t>& rows_per_expert,
                                  uint32_t seed) {
  GroupedExperts g;
  g.n_experts = static_cast<int64_t>(rows_per_expert.size());
  for (int64_t r : rows_per_expert) g.offsets.push_back(g.offsets.back() + static_cast<int32_t>(r));
  g.rows = g.offsets.back();
  g.w = ToBf16(RandomVector(g.n_experts * n * k, seed));
  g.in = ToBf16(RandomVector(g.rows * k, seed + 1));
  const std::vector<float> in_f = FromBf16(g.in);
  g.want.assign(g.rows * n, 0.f);
  for (int64_t e = 0; e < g.n_experts; ++e) {
    if (rows_per_expert[e] == 0) continue;
    const Matrix m{DType::kBF16, n, k, g.w.data() + e * n * k};
    Linear(in_f.data() + g.offsets[e] * k, rows_per_expert[e], m, nullptr,
           g.want.data() + g.offsets[e] * n);
  }
  return g;
}

TEST_F(CudaKernels, ExpertGemvMatchesLinear) {
  // k = 64 and 1408 take the 16-byte path, k = 37 the scalar one; n = 50 is not a multiple of
  // the 32-row block. Row counts include 0, 1, 8 (one pass), 9 and 20 (several passes).
  for (const auto& [n, k] :
       std::vector<std::pair<int64_t, int64_t>>{{50, 64}, {2816, 1408}, {33, 37}}) {
    const GroupedExperts g = MakeGroupedExperts(n, k, {3, 0, 1, 9, 8, 20}, 15);
    DeviceBuffer dw = Upload(g.w), din = Upload(g.in), doff = Upload(g.offsets);
    DeviceBuffer out = Poisoned<float>(g.rows * n);
    ASSERT_EQ(LaunchExpertGemv(dw.as<uint16_t>(), n, k, g.n_experts, doff.as<int32_t>(),
                               din.as<uint16_t>(), out.as<float>(), nullptr),
              cudaSuccess);
    const std::vector<float> got = Download<float>(out, g.rows * n);
    EXPECT_EQ(CountNan(got), 0);
    EXPECT_LT(RelativeError(got, g.want), 1e-5) << n << "x" << k;
  }
}

// The grouped tensor-core GEMM of large MoE steps: row counts around its 64-row tiles (0, 1,
// 63, 64, 65, 130) and several experts without rows, n and k not multiples of its 64-column
// or 32-deep tiles. Exact products, fp32 sums: the same 1e-5 as the GEMV. Every output row is
// written (NaN-poisoned), none past `pairs` (the grid is sized from `pairs` alone, as the
// runner does, with room for a partial tile per expert).
TEST_F(CudaKernels, ExpertGemmTcMatchesLinear) {
  for (const auto& [n, k] :
       std::vector<std::pair<int64_t, int64_t>>{{50, 64}, {130, 96}, {33, 37}, {64, 200}}) {
    const GroupedExperts g = MakeGroupedExperts(n, k, {63, 0, 1, 130, 0, 64, 65, 0}, 25);
    DeviceBuffer dw = Upload(g.w), din = Upload(g.in), doff = Upload(g.offsets);
    const int64_t guard = 3 * n;  // rows past `pairs` must stay untouched (NaN)
    DeviceBuffer out = Poisoned<float>(g.rows * n + guard);
    ASSERT_EQ(LaunchExpertGemmTc(dw.as<uint16_t>(), n, k, g.n_experts, doff.as<int32_t>(), g.rows,
                                 din.as<uint16_t>(), out.as<float>(), nullptr),
              cudaSuccess);
    const std::vector<float> all = Download<float>(out, g.rows * n + guard);
    const std::vector<float> got(all.begin(), all.begin() + g.rows * n);
    EXPECT_EQ(CountNan(got), 0) << n << "x" << k;
    EXPECT_LT(RelativeError(got, g.want), 1e-5) << n << "x" << k;
    EXPECT_EQ(CountNan(std::vector<float>(all.begin() + g.rows * n, all.end())), guard);
  }
}

TEST_F(CudaKernels, GatherAndCombineMatchCpu) {
  const int64_t tokens = 11, top_k = 3, width = 72, n_experts = 6;
  std::mt19937 rng(5);
  std::vector<int32_t> experts(tokens * top_k);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> e(n_experts);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    std::copy_n(e.begin(), top_k, experts.begin() + t * top_k);
  }
  const std::vector<float> weights = RandomVector(tokens * top_k, 17);
  const std::vector<uint16_t> x = ToBf16(RandomVector(tokens * width, 18));
  const std::vector<float> shared = RandomVector(tokens * width, 19);
  DeviceBuffer de = Upload(experts), dw = Upload(weights), dx = Upload(x);
  const int64_t pairs = tokens * top_k;
  DeviceBuffer off = Poisoned<int32_t>(n_experts + 1), sorted = Poisoned<int32_t>(pairs),
               pos = Poisoned<int32_t>(pairs), xp = Poisoned<uint16_t>(pairs * width);
  ASSERT_EQ(LaunchMoeSort(de.as<int32_t>(), pairs, n_experts, off.as<int32_t>(),
                          sorted.as<int32_t>(), pos.as<int32_t>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchGatherRows(dx.as<uint16_t>(), width, sorted.as<int32_t>(), pairs, top_k,
                             xp.as<uint16_t>(), nullptr),
            cudaSuccess);
  const std::vector<int32_t> s = Download<int32_t>(sorted, pairs);
  const std::vector<uint16_t> got_xp = Download<uint16_t>(xp, pairs * width);
  for (int64_t i = 0; i < pairs; ++i) {
    for (int64_t d = 0; d < width; ++d) {
      ASSERT_EQ(got_xp[i * width + d], x[(s[i] / top_k) * width + d]);
    }
  }
  // Expert outputs: a value per (pair slot, d); the combine must weight and sum them back.
  const std::vector<float> yp = RandomVector(pairs * width, 20);
  const std::vector<int32_t> ps = Download<int32_t>(pos, pairs);
  std::vector<float> want(tokens * width);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t d = 0; d < width; ++d) {
      float sum = 0.f;
      for (int64_t k = 0; k < top_k; ++k) {
        sum += yp[ps[t * top_k + k] * width + d] * weights[t * top_k + k];
      }
      want[t * width + d] = sum + shared[t * width + d];
    }
  }
  DeviceBuffer dyp = Upload(yp), out = Upload(shared);
  ASSERT_EQ(LaunchMoeCombine(dyp.as<float>(), pos.as<int32_t>(), de.as<int32_t>(), dw.as<float>(),
                             tokens, top_k, width, /*accumulate=*/true, out.as<float>(), nullptr),
            cudaSuccess);
  EXPECT_LT(RelativeError(Download<float>(out, tokens * width), want), 1e-6);
}

TEST_F(CudaKernels, EmbeddingSwiGluAndConversionsMatchCpu) {
  const int64_t vocab = 50, width = 40;
  const std::vector<uint16_t> table = ToBf16(RandomVector(vocab * width, 21));
  const std::vector<int32_t> ids = {3, 49, 0, 3};
  std::vector<float> want(ids.size() * width);
  EmbedTokens(Matrix{DType::kBF16, vocab, width, table.data()}, ids.data(), 4, want.data());
  DeviceBuffer dt = Upload(table), di = Upload(ids), h = Poisoned<float>(4 * width);
  ASSERT_EQ(LaunchEmbedding(dt.as<uint16_t>(), di.as<int32_t>(), 4, width, h.as<float>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(Download<float>(h, 4 * width), want);

  for (const auto& [rows, w] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {7, 1408}, {300, 3}}) {
    const std::vector<float> gu = RandomVector(rows * 2 * w, 22, 3.0f);
    std::vector<float> g(rows * w), u(rows * w);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(gu.begin() + r * 2 * w, w, g.begin() + r * w);
      std::copy_n(gu.begin() + r * 2 * w + w, w, u.begin() + r * w);
    }
    SiluMul(g.data(), u.data(), rows * w);
    DeviceBuffer dgu = Upload(gu), out = Poisoned<uint16_t>(rows * w);
    ASSERT_EQ(LaunchSwiGlu(dgu.as<float>(), rows, w, out.as<uint16_t>(), nullptr), cudaSuccess);
    EXPECT_LT(RelativeError(FromBf16(Download<uint16_t>(out, rows * w)), g), 1e-2);
  }

  const std::vector<float> f = RandomVector(1001, 23);
  DeviceBuffer df = Upload(f), b = Poisoned<uint16_t>(1001), back = Poisoned<float>(1001);
  ASSERT_EQ(LaunchFloatToBf16(df.as<float>(), 1001, b.as<uint16_t>(), nullptr), cudaSuccess);
  ASSERT_EQ(LaunchBf16ToFloat(b.as<uint16_t>(), 1001, back.as<float>(), nullptr), cudaSuccess);
  EXPECT_EQ(Download<uint16_t>(b, 1001), ToBf16(f)) << "device and host bf16 rounding agree";
  EXPECT_EQ(Download<float>(back, 1001), RoundBf16(f));

  // The first `cols` of strided fp32 rows, packed as bf16 (cuDNN attention's q from qkv rows).
  const int64_t rows = 7, cols = 48, stride = 80;
  const std::vector<float> strided = RandomVector(rows * stride, 24);
  std::vector<float> packed(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(strided.begin() + r * stride, cols, packed.begin() + r * cols);
  }
  DeviceBuffer ds = Upload(strided), dp = Poisoned<uint16_t>(rows * cols);
  ASSERT_EQ(LaunchRowsToBf16(ds.as<float>(), rows, cols, stride, dp.as<uint16_t>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(Download<uint16_t>(dp, rows * cols), ToBf16(packed));
}

TEST_F(CudaKernels, GemmMatchesLinear) {
  absl::StatusOr<CublasHandle> handle = CreateCublas();
  ASSERT_TRUE(handle.ok()) << handle.status();
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s : {Shape{1, 1, 8}, Shape{3, 17, 100}, Shape{37, 100, 37}, Shape{64, 512, 4096},
                        Shape{200, 33, 64}}) {
    const std::vector<uint16_t> w = ToBf16(RandomVector(s.n * s.k, 24));
    const std::vector<uint16_t> x = ToBf16(RandomVector(s.m * s.k, 25));
    const std::vector<float> x_f = FromBf16(x);
    std::vector<float> want(s.m * s.n);
    Linear(x_f.data(), s.m, Matrix{DType::kBF16, s.n, s.k, w.data()}, nullptr, want.data());
    DeviceBuffer dw = Upload(w), dx = Upload(x), y = Poisoned<float>(s.m * s.n);
    ASSERT_TRUE(Gemm(handle->get(), {dw.get(), CUDA_R_16BF, s.k}, s.n, s.k,
                     {dx.get(), CUDA_R_16BF, s.k}, s.m, y.get(), CUDA_R_32F, s.n)
                    .ok());
    EXPECT_LT(RelativeError(Download<float>(y, s.m * s.n), want), 1e-5) << s.m << " " << s.n;

    // fp32 (the router): no TF32, so fp32-accurate.
    const std::vector<float> w32 = RandomVector(s.n * s.k, 26), x32 = RandomVector(s.m * s.k, 27);
    Linear(x32.data(), s.m, Matrix{DType::kF32, s.n, s.k, w32.data()}, nullptr, want.data());
    DeviceBuffer dw32 = Upload(w32), dx32 = Upload(x32), y32 = Poisoned<float>(s.m * s.n);
    ASSERT_TRUE(Gemm(handle->get(), {dw32.get(), CUDA_R_32F, s.k}, s.n, s.k,
                     {dx32.get(), CUDA_R_32F, s.k}, s.m, y32.get(), CUDA_R_32F, s.n)
                    .ok());
    EXPECT_LT(RelativeError(Download<float>(y32, s.m * s.n), want), 1e-5);
  }
}

}  // namespace
}  // namespace glmserve::cuda
