// CPU benchmark: a prefill and decode steps of a real-width preset cut to a few layers,
// against this machine's own limits measured in the same run (memory read bandwidth and the
// BLAS sgemm rate), so that ratios stay meaningful on shared, noisy machines.
//
//   build/bench/cpu_bench                         # glm-4.5-air:layers=2, bf16 weights
//   build/bench/cpu_bench --preset=glm-4.5-mini --prefill_tokens=256
//   build/bench/cpu_bench --preset=glm-5:layers=2    # GLM-5's two first (dense) layers
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/checkpoint.h"
#include "core/model.h"
#include "core/ops/linear.h"
#include "core/parallel.h"

ABSL_FLAG(std::string, preset, "glm-4.5-air:layers=2", "model preset (random bf16 weights)");
ABSL_FLAG(int, prefill_tokens, 128, "prompt length of the prefill measurement");
ABSL_FLAG(int, decode_steps, 8, "decode steps measured (after one warm-up step)");
ABSL_FLAG(int, threads, 0, "threads (0: all cores)");

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Best of `reps` runs of fn, in seconds.
template <typename Fn>
double BestOf(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = Clock::now();
    fn();
    best = std::min(best, Since(t));
  }
  return best;
}

// Sums [b, e) with 512-bit loads where the CPU has them (compiled for AVX-512 in this
// function only), else with 64-bit integer loads, which vectorise without reassociating floats.
__attribute__((target("avx512f"))) uint64_t SumAvx512(const uint64_t* p, int64_t b, int64_t e) {
  __m512i v0 = _mm512_setzero_si512(), v1 = _mm512_setzero_si512();
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    v0 = _mm512_add_epi64(v0, _mm512_loadu_si512(p + i));
    v1 = _mm512_add_epi64(v1, _mm512_loadu_si512(p + i + 8));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(v0, v1));
  uint64_t acc = 0;
  for (uint64_t x : lanes) acc += x;
  for (; i < e; ++i) acc += p[i];
  return acc;
}
uint64_t SumPortable(const uint64_t* p, int64_t b, int64_t e) {
  uint64_t acc = 0;
  for (int64_t i = b; i < e; ++i) acc += p[i];
  return acc;
}

// Read bandwidth: the pool's threads stream a 1 GiB buffer, best of 5.
double MeasureReadBandwidth() {
  const int64_t n = (int64_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buffer(n, 1);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  std::atomic<uint64_t> total{0};
  const int64_t grain = n / (8 * glmserve::NumThreads());
  const double s = BestOf(5, [&] {
    glmserve::ParallelFor(n, grain, [&](int64_t b, int64_t e) {
      total += avx512 ? SumAvx512(buffer.data(), b, e) : SumPortable(buffer.data(), b, e);
    });
  });
  if (total.load() == 0) std::printf("(impossible sum)\n");
  return n * sizeof(uint64_t) / s / 1e9;
}

// OpenBLAS sgemm rate at 2048^3: the machine's practical fp32 GEMM peak.
double MeasureBlasGflops() {
  const int n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const double s = BestOf(3, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
  });
  return 2.0 * n * n * n / s / 1e9;
}

struct StepCost {
  double weight_bytes = 0;  // weights read by one step
  double kv_bytes = 0;      // KV cache read by one step
  double flops = 0;         // multiply-adds x 2
};

// GLM-5's attention (docs/glm5.md): its projections (the indexer's on full layers), the
// absorbed W_uk^T copy, and per token the latent rows of min(context, index_topk)
// positions (scores over R + dr values, a weighted sum of R) plus the indexer's scores over
// the whole context; every latent row of the context is read once.
void AddMlaCost(const glmserve::MlaWeights& m, const glmserve::ModelConfig& c, int64_t tokens,
                int64_t context_after, StepCost* cost) {
  for (const glmserve::Matrix* x : {&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.o_proj,
                                    &m.indexer.wq_b, &m.indexer.wk, &m.indexer.weights_proj}) {
    cost->weight_bytes += x->bytes();
    cost->flops += 2.0 * tokens * x->rows * x->cols;
  }
  const double heads = c.num_attention_heads, r = c.kv_lora_rank;
  cost->weight_bytes += heads * r * c.qk_nope_head_dim * glmserve::DTypeSize(m.kv_b_proj.dtype);
  const double ctx = context_after - tokens / 2.0;  // mean causal context of the step's tokens
  const double attended = std::min<double>(ctx, c.index_topk);
  cost->kv_bytes += static_cast<double>(context_after) * c.cache_values_per_token_layer() * 4;
  cost->flops += 2.0 * tokens * heads * attended * (2 * r + c.qk_rope_head_dim);
  if (!m.indexer.empty()) cost->flops += 2.0 * tokens * ctx * c.index_n_heads * c.index_head_dim;
}

// What one step reads and computes: every matrix is read once per step (the batch shares
// it), each token multiplies the dense matrices and its top-k experts.
StepCost Cost(const glmserve::Model& model, int64_t tokens, int64_t context_after,
              int64_t distinct_experts) {
  const glmserve::ModelWeights& w = model.weights();
  const glmserve::ModelConfig& c = model.config();
  StepCost cost;
  auto mat = [&](const glmserve::Matrix& m, double rows_used_fraction = 1.0) {
    cost.weight_bytes += m.bytes() * rows_used_fraction;
  };
  for (const glmserve::LayerWeights& l : w.layers) {
    if (c.is_mla()) {
      AddMlaCost(l.mla, c, tokens, context_after, &cost);
    } else {
      for (const glmserve::Matrix* m :
           {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj}) {
        mat(*m);
        cost.flops += 2.0 * tokens * m->rows * m->cols;
      }
      // Attention reads every cached key and value of the context once per step.
      cost.kv_bytes += 2.0 * context_after * c.kv_dim() * sizeof(float);
      cost.flops += 4.0 * tokens * (context_after - tokens / 2.0) * c.q_dim();
    }
    const glmserve::FfnWeights* ffns[] = {&l.dense};
    if (l.is_moe) {
      mat(l.moe.router);
      cost.flops += 2.0 * tokens * l.moe.router.rows * l.moe.router.cols;
      const glmserve::FfnWeights& e = l.moe.experts[0];
      const double expert_bytes = e.gate.bytes() + e.up.bytes() + e.down.bytes();
      cost.weight_bytes += expert_bytes * distinct_experts;
      cost.flops += 2.0 * tokens * c.num_experts_per_tok * 3 * e.gate.rows * e.gate.cols;
      ffns[0] = &l.moe.shared;
    }
    for (const glmserve::Matrix* m : {&ffns[0]->gate, &ffns[0]->up, &ffns[0]->down}) {
      mat(*m);
      cost.flops += 2.0 * tokens * m->rows * m->cols;
    }
  }
  mat(w.lm_head);
  cost.flops += 2.0 * w.lm_head.rows * w.lm_head.cols;  // logits of one row per sequence
  return cost;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  const int prefill = absl::GetFlag(FLAGS_prefill_tokens);
  const int steps = absl::GetFlag(FLAGS_decode_steps);

  std::printf("threads %d, linear kernel %s\n", glmserve::NumThreads(),
              glmserve::LinearKernelName());
  const double bandwidth = MeasureReadBandwidth();
  const double blas = MeasureBlasGflops();
  std::printf("machine: read bandwidth %.1f GB/s, OpenBLAS sgemm 2048^3 %.0f GFLOP/s\n", bandwidth,
              blas);

  const auto t_load = Clock::now();
  absl::StatusOr<glmserve::ModelConfig> config =
      glmserve::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<glmserve::ModelWeights> weights = glmserve::RandomWeights(*config);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  glmserve::Model model(*std::move(weights));
  std::printf("model: %s (%s)\n       %.2f GB bf16 weights, generated in %.1f s\n",
              absl::GetFlag(FLAGS_preset).c_str(), glmserve::DescribeConfig(*config).c_str(),
              model.weight_bytes() / 1e9, Since(t_load));
  std::printf("       KV cache %lld bytes per token (%lld per layer, fp32)\n",
              static_cast<long long>(model.kv_bytes_per_token()),
              static_cast<long long>(model.kv_bytes_per_token() / model.num_span_layers()));

  glmserve::KvCache cache(model.CacheShape((prefill + steps + 2 + 15) / 16, 16));
  glmserve::BlockTable table;
  if (!cache.Reserve(&table, prefill + steps + 2).ok()) return 1;
  std::vector<int32_t> ids(prefill);
  for (int i = 0; i < prefill; ++i) ids[i] = (i * 7919 + 13) % static_cast<int>(config->vocab_size);
  glmserve::ForwardBatch batch;
  glmserve::ForwardOptions options;
  glmserve::ForwardResult result;

  batch.sequences = {{prefill, 0, &table}};
  batch.token_ids = ids;
  const auto t_prefill = Clock::now();
  if (!model.Forward(batch, &cache, options, &result).ok()) return 1;
  const double prefill_s = Since(t_prefill);
  const StepCost prefill_cost = Cost(model, prefill, prefill, config->n_routed_experts);

  int32_t next = 1;
  double decode_s = 0;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up
    batch.sequences = {{1, prefill + step, &table}};
    batch.token_ids = absl::MakeConstSpan(&next, 1);
    const auto t = Clock::now();
    if (!model.Forward(batch, &cache, options, &result).ok()) return 1;
    if (step > 0) decode_s += Since(t);
  }
  const double step_s = decode_s / steps;
  const StepCost decode_cost = Cost(model, 1, prefill + steps / 2 + 1, config->num_experts_per_tok);
  const double decode_gbs = (decode_cost.weight_bytes + decode_cost.kv_bytes) / step_s / 1e9;
  const double prefill_gflops = prefill_cost.flops / prefill_s / 1e9;

  std::printf("\n| phase | tokens | time | tokens/s | achieved | limit | fraction |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| prefill | %d | %.3f s | %.1f | %.0f GFLOP/s | %.0f GFLOP/s (sgemm) | %.2f |\n",
              prefill, prefill_s, prefill / prefill_s, prefill_gflops, blas, prefill_gflops / blas);
  std::printf(
      "| decode (batch 1) | %d | %.1f ms/step | %.2f | %.1f GB/s (%.2f GB read) | %.1f GB/s "
      "(read) | %.2f |\n",
      steps, step_s * 1e3, 1.0 / step_s, decode_gbs,
      (decode_cost.weight_bytes + decode_cost.kv_bytes) / 1e9, bandwidth, decode_gbs / bandwidth);
  return 0;
}
