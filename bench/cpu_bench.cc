// CPU benchmark: a prefill and decode steps (batch 1 and 8) of a real-width preset cut to a
// few layers, in each CPU math mode (core/cpu/ops/linear.h), against this machine's own limits
// measured in the same run (bench/machine_limits.h: fp32 FMA peak, bf16 dot-product peak,
// read bandwidth with several streams per thread), so that ratios stay meaningful on shared,
// noisy machines. Prefill is compared with the peak of the arithmetic the mode uses; decode
// with the read bandwidth (the weights a step reads, once whatever the batch).
//
//   build/bench/cpu_bench                         # glm-4.5-air:layers=2, bf16 weights
//   build/bench/cpu_bench --preset=glm-4.5-mini --prefill_tokens=256 --modes=bf16
//   # Long prompts and deep contexts (one weight generation, rows for each):
//   build/bench/cpu_bench --preset=glm-4.5-air:layers=3 --prefill_tokens=128,2048,8192
//       --decode_context=0,4096,16384 --modes=bf16_amx,int8
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/cpu_modes.h"
#include "bench/int_list.h"
#include "bench/machine_limits.h"
#include "bench/step_cost.h"
#include "core/base/op_times.h"
#include "core/base/parallel.h"
#include "core/cpu/cpu_model.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"
#include "core/model/checkpoint.h"

ABSL_FLAG(std::string, preset, "glm-4.5-air:layers=2", "model preset (random bf16 weights)");
ABSL_FLAG(std::string, prefill_tokens, "128",
          "prompt lengths of the prefill measurements, comma-separated (128,2048,8192: one row "
          "each)");
ABSL_FLAG(int, prefill_chunk, 0,
          "0: each prompt in one forward; N: in forwards of at most N tokens, each after the "
          "cached earlier ones, as the engine splits a long prompt (--max_batch_tokens, 2048 by "
          "default; llama.cpp's prompt processing likewise takes ubatches of 512); bounds the "
          "activations' memory (an 8,192-token forward of Air needs about 5 GB)");
ABSL_FLAG(int, decode_steps, 8, "decode steps measured (after one warm-up step)");
ABSL_FLAG(int, decode_batch, 8, "sequences of the batched decode measurement");
ABSL_FLAG(std::string, modes, "exact,bf16,bf16_amx,int8",
          "modes to measure, comma-separated: exact, bf16, bf16_amx (--cpu_math), int8 "
          "(linear layers quantized to int8 at load, --weight_dtype=int8; int8 activations) and "
          "int8_amx (the same with --cpu_math=bf16_amx: AMX int8 tiles); int8_row_major: int8 "
          "with its codes row-major whatever this CPU prefers (the same bits; what the layout "
          "gains); exact_portable: exact on the portable kernels (what SIMD gains); exact_avx2, "
          "int8_avx2: on the kernels a CPU without AVX-512 runs (AVX2 + FMA); int8_avx_vnni: on "
          "those of one with AVX2 and AVX-VNNI");
ABSL_FLAG(int, threads, 0, "threads (0: all cores)");
ABSL_FLAG(std::string, decode_context, "-1",
          "contexts of the decode measurements, comma-separated (0,4096,16384: rows for each): "
          "-1 decodes batch 1 after the last measured prompt and the batch after 16-token "
          "prompts; N >= 0 gives every decoded sequence N cached positions of synthetic keys and "
          "values first (a decode step's cost does not depend on their values; GLM-4.5 presets)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "the KV cache of every mode (--kv_cache_dtype of glm-server): auto (bf16 where the "
          "mode's attention rounds K and V to bf16 anyway: bf16, bf16_amx, int8, int8_amx), "
          "fp32 or bf16; the mode column names each mode's");
ABSL_FLAG(bool, breakdown, false,
          "also print where the time of each prefill and of each decode step of batch 1 goes, by "
          "op family (core/base/op_times.h)");

namespace {

using glmserve::bench::Clock;
using glmserve::bench::Since;

// OpenBLAS sgemm rate at 2048^3: a practical fp32 GEMM rate, next to the FMA peak.
double MeasureBlasGflops() {
  const int n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const double s = glmserve::bench::BestOf(3, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
  });
  return 2.0 * n * n * n / s / 1e9;
}

using OpSeconds = std::array<double, static_cast<int>(glmserve::OpFamily::kCount)>;
struct PrefillResult {
  int tokens = 0;
  double s = 0;
  OpSeconds ops{};
};
struct DecodeResult {
  double decode1_s = 0;     // per step
  OpSeconds decode1_ops{};  // --breakdown: per step
  double decode_batch_s = 0;
  int64_t decode1_context = 0, decode_batch_context = 0;  // positions cached at the first step
};

// Positions [0, n) of every table given random keys and values in every layer of the cache.
void FillSyntheticContext(const std::vector<glmserve::BlockTable*>& tables, int64_t n,
                          glmserve::KvCache* cache) {
  const int64_t bs = cache->shape().block_size, width = bs * cache->kv_dim();
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / (1 << 23);
  };
  for (int64_t layer = 0; layer < cache->shape().num_layers; ++layer) {
    for (glmserve::BlockTable* t : tables) {
      for (int64_t b = 0; b * bs < n; ++b) {
        if (cache->host_bf16()) {
          uint16_t* k = cache->bf16_rows(layer, (*t)[b], 0);
          uint16_t* v = cache->bf16_rows(layer, (*t)[b], 1);
          for (int64_t i = 0; i < width; ++i) {
            k[i] = glmserve::FloatToBf16(next()), v[i] = glmserve::FloatToBf16(next());
          }
          continue;
        }
        float* k = cache->keys(layer, (*t)[b]);
        float* v = cache->values(layer, (*t)[b]);
        for (int64_t i = 0; i < width; ++i) k[i] = next(), v[i] = next();
      }
    }
  }
}

// One prefill of each length in `prefills` (after one warm-up prefill of the longest: a
// server's prefills find their scratch buffers allocated and faulted in by earlier ones, and a
// 2,048-token chunk's MoE buffers are ~0.7 GB); then, for each of `contexts`, `steps` decode
// steps of one sequence and `steps` of `batch` sequences, each after one warm-up step
// (context -1: batch 1 continues the last prompt, the batch follows 16-token prompts; N >= 0:
// every sequence first holds N synthetic positions).
bool RunPhases(glmserve::CpuModel& model, const std::vector<int>& prefills,
               const std::vector<int>& contexts, int steps, int batch,
               std::vector<PrefillResult>* prefill_results,
               std::vector<DecodeResult>* decode_results) {
  const int64_t vocab = model.config().vocab_size;
  const int longest = *std::max_element(prefills.begin(), prefills.end());
  const int deepest = *std::max_element(contexts.begin(), contexts.end());
  const int per_seq = std::max(longest, std::max(deepest, 16)) + 2 * steps + 4;
  const int64_t blocks_per_seq = (per_seq + 15) / 16;
  glmserve::KvCache cache(model.CacheShape(blocks_per_seq * (batch + 1), 16));
  std::vector<glmserve::BlockTable> tables(batch + 1);
  for (glmserve::BlockTable& t : tables) {
    if (!cache.Reserve(&t, per_seq).ok()) return false;
  }
  glmserve::ForwardOptions options;
  glmserve::ForwardResult result;
  std::vector<int32_t> ids;
  glmserve::ForwardBatch fb;
  const int chunk = absl::GetFlag(FLAGS_prefill_chunk);
  auto prefill = [&](int n) {  // positions [0, n) of tables[0], in chunks when asked
    ids.resize(n);
    for (int i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
    for (int start = 0; start<n; start += chunk> 0 ? chunk : n) {
      const int len = chunk > 0 ? std::min(chunk, n - start) : n;
      fb.sequences = {{len, start, &tables[0]}};
      fb.token_ids = absl::MakeConstSpan(ids.data() + start, len);
      if (!model.Forward(fb, &cache, options, &result).ok()) return false;
    }
    return true;
  };
  // The warm-up: the largest forward the measurements make.
  if (!prefill(chunk > 0 ? std::min(longest, chunk) : longest)) return false;
  for (int n : prefills) {
    glmserve::TakeOpTimes();
    glmserve::EnableOpTimes(absl::GetFlag(FLAGS_breakdown));
    PrefillResult r;
    r.tokens = n;
    const auto t_prefill = Clock::now();
    if (!prefill(n)) return false;
    r.s = Since(t_prefill);
    glmserve::EnableOpTimes(false);
    r.ops = glmserve::TakeOpTimes();
    prefill_results->push_back(r);
  }
  // tables[0] now holds the last prompt.
  std::vector<int32_t> next(batch, 1);
  for (int decode_context : contexts) {
    DecodeResult r;
    double decode_s = 0;
    glmserve::BlockTable* decode1_table = &tables[0];
    r.decode1_context = prefills.back();
    if (decode_context >= 0) {
      std::vector<glmserve::BlockTable*> batch_tables;
      for (int k = 0; k < batch; ++k) batch_tables.push_back(&tables[k + 1]);
      FillSyntheticContext(batch_tables, decode_context, &cache);
      decode1_table = &tables[1];
      r.decode1_context = decode_context;
    }
    glmserve::TakeOpTimes();
    for (int step = 0; step <= steps; ++step) {  // step 0 warms up
      fb.sequences = {{1, r.decode1_context + step, decode1_table}};
      fb.token_ids = absl::MakeConstSpan(next.data(), 1);
      glmserve::EnableOpTimes(step > 0 && absl::GetFlag(FLAGS_breakdown));
      const auto t = Clock::now();
      if (!model.Forward(fb, &cache, options, &result).ok()) return false;
      if (step > 0) decode_s += Since(t);
    }
    glmserve::EnableOpTimes(false);
    r.decode1_s = decode_s / steps;
    r.decode1_ops = glmserve::TakeOpTimes();
    for (double& s : r.decode1_ops) s /= steps;

    int64_t context = 16;
    if (decode_context >= 0) {  // table 1 decoded steps + 1 positions above: all start past them
      context = decode_context + steps + 1;
    } else {
      std::vector<int32_t> prompts(batch * context);
      for (int i = 0; i < batch * context; ++i) {
        prompts[i] = static_cast<int32_t>((i * 104729) % vocab);
      }
      fb.sequences.clear();
      for (int k = 0; k < batch; ++k) fb.sequences.push_back({context, 0, &tables[k + 1]});
      fb.token_ids = prompts;
      if (!model.Forward(fb, &cache, options, &result).ok()) return false;
    }
    r.decode_batch_context = context;
    decode_s = 0;
    for (int step = 0; step <= steps; ++step) {
      fb.sequences.clear();
      for (int k = 0; k < batch; ++k) fb.sequences.push_back({1, context + step, &tables[k + 1]});
      fb.token_ids = next;
      const auto t = Clock::now();
      if (!model.Forward(fb, &cache, options, &result).ok()) return false;
      if (step > 0) decode_s += Since(t);
    }
    r.decode_batch_s = decode_s / steps;
    decode_results->push_back(r);
  }
  return true;
}

// The table rows of one mode: each prefill against the peak of the arithmetic the mode runs
// and against its roofline, each decode context's batch 1 and `batch` against the read
// bandwidth.
void PrintModeRows(const std::string& mode_name, glmserve::CpuMath math,
                   const glmserve::CpuModel& model, const std::vector<PrefillResult>& prefills,
                   const std::vector<DecodeResult>& decodes,
                   const glmserve::bench::MachineLimits& limits,
                   const glmserve::ModelConfig& config, int steps, int batch) {
  const bool int8 = glmserve::bench::Int8Weights(mode_name);
  const bool bf16_kv = model.CacheShape(1).bf16;
  const std::string mode_label =
      mode_name + " (" +
      (int8 ? glmserve::LinearInt8KernelName() : glmserve::LinearKernelName(math)) +
      (bf16_kv ? ", bf16 KV" : ", fp32 KV") + ")";
  const double kv_element_bytes = bf16_kv ? 2 : 4;
  const char* mode = mode_label.c_str();
  // The peak of the arithmetic the mode runs (int8: vpdpbusd; AMX or vdpbf16ps missing:
  // their emulation is fp32 scalar code, so the FMA peak).
  const bool amx_int8_math =
      int8 && math == glmserve::CpuMath::kBf16Amx && limits.amx_int8_gops > 0;
  const bool int8_math = int8 && math != glmserve::CpuMath::kBf16Amx && limits.int8_gops > 0;
  const bool amx_math = !int8 && math == glmserve::CpuMath::kBf16Amx && limits.amx_gflops > 0;
  const bool bf16_math = !int8 && math == glmserve::CpuMath::kBf16 && limits.bf16_gflops > 0;
  const double peak = amx_int8_math ? limits.amx_int8_gops
                      : int8_math   ? limits.int8_gops
                      : amx_math    ? limits.amx_gflops
                      : bf16_math   ? limits.bf16_gflops
                                    : limits.fma_gflops;
  for (const PrefillResult& p : prefills) {
    const int prefill = p.tokens;
    const glmserve::bench::StepCost prefill_cost = glmserve::bench::Cost(
        model.weights(), prefill, prefill, config.n_routed_experts, 1, kv_element_bytes);
    const double prefill_gflops = prefill_cost.flops / p.s / 1e9;
    std::printf(
        "| %s | prefill %d | %.3f s | %.1f | %.0f GFLOP/s | %.0f GFLOP/s (%s peak) | %.2f |\n",
        mode, prefill, p.s, prefill / p.s, prefill_gflops, peak,
        amx_int8_math ? "AMX int8"
        : int8_math   ? "int8 dot"
        : amx_math    ? "AMX bf16"
        : bf16_math   ? "bf16 dot"
                      : "fp32 FMA",
        peak > 0 ? prefill_gflops / peak : 0.0);
    // The prefill's roofline: it must both do its FLOPs and read every weight it touches
    // once (a 128-token prompt reaches nearly every expert), so its least possible time is
    // the larger of the two; which one binds says where the mode stands.
    const double t_compute = peak > 0 ? prefill_cost.flops / (peak * 1e9) : 0.0;
    const double prefill_gb = (prefill_cost.weight_bytes + prefill_cost.kv_bytes) / 1e9;
    const double t_read = prefill_gb / limits.read_gbs;
    const double t_floor = std::max(t_compute, t_read);
    std::printf(
        "| %s | prefill %d roofline | %.3f s | | %.2f GB read, %.0f GFLOP | %.3f s (%s-bound; "
        "compute %.3f s, read %.3f s) | %.2f |\n",
        mode, prefill, p.s, prefill_gb, prefill_cost.flops / 1e9, t_floor,
        t_read >= t_compute ? "read" : "compute", t_compute, t_read, t_floor / p.s);
  }
  for (const DecodeResult& r : decodes) {
    const glmserve::bench::StepCost d1 =
        glmserve::bench::Cost(model.weights(), 1, r.decode1_context + steps / 2 + 1,
                              config.num_experts_per_tok, 1, kv_element_bytes);
    const double d1_gb = (d1.weight_bytes + d1.kv_bytes) / 1e9;
    std::printf(
        "| %s | decode batch 1, context %lld | %.1f ms/step | %.2f | %.1f GB/s (%.2f GB/step) | "
        "%.1f "
        "GB/s (read) "
        "| %.2f |\n",
        mode, static_cast<long long>(r.decode1_context), r.decode1_s * 1e3, 1.0 / r.decode1_s,
        d1_gb / r.decode1_s, d1_gb, limits.read_gbs, d1_gb / r.decode1_s / limits.read_gbs);
    // Batch: the experts some token chose, at most top_k per token (an upper bound of the
    // distinct experts read).
    const int64_t distinct =
        std::min<int64_t>(config.n_routed_experts, batch * config.num_experts_per_tok);
    const glmserve::bench::StepCost db =
        glmserve::bench::Cost(model.weights(), batch, r.decode_batch_context + steps / 2 + 1,
                              distinct, batch, kv_element_bytes);
    const double db_gb = (db.weight_bytes + db.kv_bytes * batch) / 1e9;  // KV: per sequence
    std::printf(
        "| %s | decode batch %d, context %lld | %.1f ms/step | %.2f | <= %.1f GB/s (<= %.2f "
        "GB/step) "
        "| %.1f GB/s "
        "(read) | <= %.2f |\n",
        mode, batch, static_cast<long long>(r.decode_batch_context), r.decode_batch_s * 1e3,
        batch / r.decode_batch_s, db_gb / r.decode_batch_s, db_gb, limits.read_gbs,
        db_gb / r.decode_batch_s / limits.read_gbs);
  }
}

// Where a phase's time went (--breakdown): each op family's wall time and share, and the
// GEMM-rate families' achieved rate is left to the reader with the roofline row above.
// `scale` converts seconds to the printed unit.
void PrintBreakdown(const std::string& title, const OpSeconds& ops, double total, double scale,
                    const char* unit) {
  double timed = 0;
  for (double s : ops) timed += s;
  std::printf("\n| %s breakdown | %s | share |\n|---|---|---|\n", title.c_str(), unit);
  for (int f = 0; f < static_cast<int>(glmserve::OpFamily::kCount); ++f) {
    std::printf("| %s | %.3f | %.2f |\n",
                glmserve::OpFamilyName(static_cast<glmserve::OpFamily>(f)), ops[f] * scale,
                ops[f] / total);
  }
  std::printf("| (untimed) | %.3f | %.2f |\n\n", (total - timed) * scale, (total - timed) / total);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  const absl::StatusOr<std::vector<int>> parsed_prefills =
      glmserve::bench::ParseIntList("prefill_tokens", absl::GetFlag(FLAGS_prefill_tokens), 1);
  const absl::StatusOr<std::vector<int>> parsed_contexts =
      glmserve::bench::ParseIntList("decode_context", absl::GetFlag(FLAGS_decode_context), -1);
  for (const absl::Status& s : {parsed_prefills.status(), parsed_contexts.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  const std::vector<int>& prefills = *parsed_prefills;
  const std::vector<int>& contexts = *parsed_contexts;
  const int steps = absl::GetFlag(FLAGS_decode_steps);
  const int batch = absl::GetFlag(FLAGS_decode_batch);
  if (absl::GetFlag(FLAGS_prefill_chunk) < 0) {
    std::fprintf(stderr, "--prefill_chunk must be >= 0\n");
    return 1;
  }
  if (steps < 1 || batch < 1) {
    std::fprintf(stderr, "--decode_steps and --decode_batch must be >= 1\n");
    return 1;
  }
  const absl::StatusOr<glmserve::KvCacheDType> kv_dtype =
      glmserve::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv_dtype.ok() || *kv_dtype == glmserve::KvCacheDType::kFp8E4M3) {
    std::fprintf(stderr, "--kv_cache_dtype must be auto, fp32 or bf16\n");
    return 1;
  }
  const bool synthetic = *std::max_element(contexts.begin(), contexts.end()) >= 0;
  absl::StatusOr<std::vector<std::string>> parsed_modes =
      glmserve::bench::ParseModes(absl::GetFlag(FLAGS_modes));
  if (!parsed_modes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed_modes.status().message()).c_str());
    return 1;
  }
  const std::vector<std::string> modes = *std::move(parsed_modes);

  const glmserve::bench::MachineLimits limits = glmserve::bench::MeasureMachine();
  std::printf("threads %d\n", glmserve::NumThreads());
  std::printf(
      "machine: fp32 FMA peak %.0f GFLOP/s, bf16 dot-product peak %.0f GFLOP/s, AMX bf16 peak "
      "%.0f GFLOP/s, int8 dot-product peak %.0f GOP/s, AMX int8 peak %.0f GOP/s, read bandwidth "
      "%.1f GB/s (the best of: plain sum %.1f GB/s with %d streams per thread, 1 stream %.1f; "
      "decode kernels over 1 GiB: bf16 %.1f, exact %.1f, int8 %.1f), OpenBLAS sgemm 2048^3 %.0f "
      "GFLOP/s\n",
      limits.fma_gflops, limits.bf16_gflops, limits.amx_gflops, limits.int8_gops,
      limits.amx_int8_gops, limits.read_gbs, limits.read_sum_gbs, limits.read_best_streams,
      limits.read_one_stream_gbs, limits.read_bf16_kernel_gbs, limits.read_exact_kernel_gbs,
      limits.read_int8_kernel_gbs, MeasureBlasGflops());

  const auto t_load = Clock::now();
  absl::StatusOr<glmserve::ModelConfig> config =
      glmserve::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  if (config->is_mla() && synthetic) {
    std::fprintf(stderr, "--decode_context fills GLM-4.5 keys and values; %s is a GLM-5 preset\n",
                 absl::GetFlag(FLAGS_preset).c_str());
    return 1;
  }
  // "-fp8" presets: e4m3 linear layers with per-channel scales (docs/fp8.md).
  glmserve::RandomWeightOptions random;
  if (glmserve::PresetIsFp8(absl::GetFlag(FLAGS_preset))) random.dtype = glmserve::DType::kF8E4M3;
  absl::StatusOr<glmserve::ModelWeights> weights = glmserve::RandomWeights(*config, random);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  std::printf("model: %s (%s)\n       %.2f GB %s weights, generated in %.1f s\n",
              absl::GetFlag(FLAGS_preset).c_str(), glmserve::DescribeConfig(*config).c_str(),
              weights->ParameterBytes() / 1e9,
              std::string(glmserve::DTypeName(weights->weight_dtype)).c_str(), Since(t_load));

  if (absl::GetFlag(FLAGS_prefill_chunk) > 0) {
    std::printf("prompts run in forwards of at most %d tokens (the rooflines count one)\n",
                absl::GetFlag(FLAGS_prefill_chunk));
  }
  std::printf("\n| mode | phase | time | tokens/s | achieved | limit | fraction |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const std::string& mode_name : modes) {
    glmserve::bench::UseKernelsOf(mode_name);  // before WeightsForMode: the int8 layout follows
    absl::StatusOr<glmserve::ModelWeights> mode_weights =
        glmserve::bench::WeightsForMode(*weights, mode_name);
    if (!mode_weights.ok()) {
      std::fprintf(stderr, "%s\n", std::string(mode_weights.status().message()).c_str());
      return 1;
    }
    const glmserve::CpuMath math = glmserve::bench::MathOf(mode_name);
    glmserve::CpuModel model(*std::move(mode_weights), math);
    if (absl::Status s = model.SetKvCacheDType(*kv_dtype); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::vector<PrefillResult> prefill_results;
    std::vector<DecodeResult> decode_results;
    if (!RunPhases(model, prefills, contexts, steps, batch, &prefill_results, &decode_results)) {
      return 1;
    }
    PrintModeRows(mode_name, math, model, prefill_results, decode_results, limits, *config, steps,
                  batch);
    if (absl::GetFlag(FLAGS_breakdown)) {
      for (const PrefillResult& p : prefill_results) {
        PrintBreakdown(mode_name + " prefill " + std::to_string(p.tokens), p.ops, p.s, 1.0,
                       "seconds");
      }
      for (const DecodeResult& d : decode_results) {
        PrintBreakdown(
            mode_name + " decode batch 1, context " + std::to_string(d.decode1_context) + ",",
            d.decode1_ops, d.decode1_s, 1e3, "ms per step");
      }
    }
  }
  return 0;
}
