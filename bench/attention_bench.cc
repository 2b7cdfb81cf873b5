// The CPU attention kernels alone, on GLM-4.5 Air's shape (96 query heads, 8 KV heads of 128):
// a prefill of --tokens after --context cached ones, and decode steps (one token per sequence,
// --decode_batch sequences) at each of --decode_contexts. Prefill rows are set against the
// machine's FMA peak (measured in the same run; the fp32 path's mul + add pairs count as two
// flops, like an FMA), decode rows against the larger of the read time (a step reads every
// cached K and V row once) and the compute time. --modes: fp32 (PagedAttention: exact, bf16 and
// int8 modes), amx (PagedAttentionAmx: the bf16_amx mode; its portable emulation where the CPU has
// no AMX), bf16 (PagedAttentionBf16: the bf16 and int8 modes since 2026-12-05; its portable code
// where the CPU has no AVX512_BF16). bf16 and amx rows are set against the vdpbf16ps and AMX peaks.
// --kv_caches: the cache formats each mode reads, fp32 and/or bf16 (--kv_cache_dtype; the bf16
// and amx modes give the same bits from either, the fp32 mode widens bf16 rows). --layers: the
// cache layers the timed calls take in turn, one a call (each row's time is a call's): in the
// model every layer's cache is its own memory, so a decode step reads it from DRAM, where one
// layer of a 4,096-token bf16 cache (16 MiB) stays in a large L3 between calls.
//
//   build/bench/attention_bench
//   build/bench/attention_bench --tokens=8192 --decode_contexts=4096,16384 --modes=fp32,bf16,amx
//   build/bench/attention_bench --modes=bf16 --kv_caches=fp32,bf16 --decode_batch=8
//   build/bench/attention_bench --tokens=0 --modes=bf16 --kv_caches=bf16 --layers=4
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/int_list.h"
#include "bench/machine_limits.h"
#include "core/base/aligned_vector.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/attention.h"
#include "core/cpu/ops/attention_amx.h"
#include "core/cpu/ops/attention_bf16.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/model/kv_cache.h"

ABSL_FLAG(int, tokens, 2048, "prefill tokens (0: no prefill row)");
ABSL_FLAG(int, context, 0, "tokens cached before the prefill chunk");
ABSL_FLAG(std::string, decode_contexts, "4096", "decode contexts, comma-separated (empty: none)");
ABSL_FLAG(int, decode_batch, 1, "sequences per decode step");
ABSL_FLAG(std::string, modes, "fp32", "fp32, bf16, amx (comma-separated)");
ABSL_FLAG(std::string, kv_caches, "fp32", "KV cache formats: fp32, bf16 (comma-separated)");
ABSL_FLAG(std::string, kernels, "native",
          "native (what this CPU has), avx2 (what a CPU without AVX-512 runs: AVX2 + FMA) or "
          "portable");
ABSL_FLAG(int, rounds, 3, "timed runs per row (the median is shown)");
ABSL_FLAG(int, threads, 0, "threads (0: all cores)");
ABSL_FLAG(int, layers, 1,
          "cache layers the timed calls take in turn (more than one: each call's rows come from "
          "memory, as in the model; 1: they may stay in L3)");

namespace {

using glmserve::bench::Clock;
using glmserve::bench::Median;
using glmserve::bench::Since;

constexpr int64_t kHeads = 96, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

// `seqs` sequences of `length` tokens each, their K/V rows random in [-1, 1) (the same in every
// one of `layers` layers), in an fp32 or a bf16 cache.
struct Filled {
  glmserve::KvCache cache;
  std::vector<glmserve::BlockTable> tables;
  Filled(int64_t seqs, int64_t length, bool bf16, int64_t layers)
      : cache({.num_layers = layers,
               .kv_heads = kKvHeads,
               .head_dim = kHeadDim,
               .block_size = kBlockSize,
               .num_blocks = seqs * ((length + kBlockSize - 1) / kBlockSize),
               .bf16 = bf16}),
        tables(seqs) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    glmserve::AlignedVector<float> k(length * kKvHeads * kHeadDim), v(k.size());
    for (glmserve::BlockTable& table : tables) {
      if (!cache.Reserve(&table, length).ok()) std::abort();
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      const glmserve::SequenceSlice all{length, 0, &table};
      for (int64_t layer = 0; layer < layers; ++layer) {
        glmserve::WriteKv(k.data(), v.data(), {all}, layer, &cache);
      }
    }
  }
};

// The median seconds of one PagedAttention call over `batch`, the calls taking the cache's
// layers in turn (a round times one call on each, and counts their mean).
double Time(const std::string& mode, const std::vector<glmserve::SequenceSlice>& batch,
            const glmserve::KvCache& cache, int rounds) {
  const int64_t layers = cache.shape().num_layers;
  int64_t rows = 0;
  for (const auto& s : batch) rows += s.num_tokens;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  glmserve::AlignedVector<float> q(rows * kHeads * kHeadDim), out(q.size());
  for (float& x : q) x = dist(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  auto run = [&](int64_t layer) {
    if (mode == "amx") {
      glmserve::PagedAttentionAmx(q.data(), batch, cache, layer, kHeads, scale, out.data());
    } else if (mode == "bf16") {
      glmserve::PagedAttentionBf16(q.data(), batch, cache, layer, kHeads, scale, out.data());
    } else {
      glmserve::PagedAttention(q.data(), batch, cache, layer, kHeads, scale, out.data());
    }
  };
  run(0);  // warm-up: the caches and the pool's threads
  std::vector<double> s;
  for (int r = 0; r < rounds; ++r) {
    const auto t = Clock::now();
    for (int64_t layer = 0; layer < layers; ++layer) run(layer);
    s.push_back(Since(t) / static_cast<double>(layers));
  }
  return Median(s);
}

// The peak of the arithmetic `mode` runs: AMX's or vdpbf16ps's where the kernels use them (their
// AVX2 and portable forms are set against the FMA peak), the FMA peak for fp32.
double Peak(const std::string& mode, const glmserve::bench::MachineLimits& limits) {
  if (mode == "amx" && glmserve::internal::CpuHasAmx() && limits.amx_gflops > 0) {
    return limits.amx_gflops;
  }
  if (mode == "bf16" && glmserve::internal::CpuHasAvx512Bf16() && limits.bf16_gflops > 0) {
    return limits.bf16_gflops;
  }
  return limits.fma_gflops;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  for (const std::string& mode : modes) {
    if (mode != "fp32" && mode != "bf16" && mode != "amx") {
      std::fprintf(stderr, "unknown mode '%s' (fp32, bf16, amx)\n", mode.c_str());
      return 1;
    }
  }
  const std::string kernels = absl::GetFlag(FLAGS_kernels);
  if (kernels != "native" && kernels != "avx2" && kernels != "portable") {
    std::fprintf(stderr, "unknown --kernels '%s' (native, avx2, portable)\n", kernels.c_str());
    return 1;
  }
  glmserve::internal::ForceAvx2Kernels(kernels == "avx2");
  glmserve::internal::ForceGenericKernels(kernels == "portable");
  const std::vector<std::string> kv_caches = absl::StrSplit(absl::GetFlag(FLAGS_kv_caches), ',');
  for (const std::string& kv : kv_caches) {
    if (kv != "fp32" && kv != "bf16") {
      std::fprintf(stderr, "unknown KV cache format '%s' (fp32, bf16)\n", kv.c_str());
      return 1;
    }
  }
  std::vector<int> decode_contexts;
  if (!absl::GetFlag(FLAGS_decode_contexts).empty()) {
    const auto parsed =
        glmserve::bench::ParseIntList("decode_contexts", absl::GetFlag(FLAGS_decode_contexts), 1);
    if (!parsed.ok()) {
      std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
      return 1;
    }
    decode_contexts = *parsed;
  }
  const int64_t tokens = absl::GetFlag(FLAGS_tokens), context = absl::GetFlag(FLAGS_context);
  const int64_t batch = absl::GetFlag(FLAGS_decode_batch);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const int64_t layers = absl::GetFlag(FLAGS_layers);
  if (tokens < 0 || context < 0 || batch < 1 || layers < 1) {
    std::fprintf(stderr, "--tokens and --context must be >= 0, --decode_batch and --layers >= 1\n");
    return 1;
  }

  const glmserve::bench::MachineLimits limits = glmserve::bench::MeasureMachine();
  std::printf(
      "threads %d; fp32 FMA peak %.0f GFLOP/s, vdpbf16ps peak %.0f GFLOP/s, AMX bf16 peak %.0f "
      "GFLOP/s, read %.1f GB/s\n",
      glmserve::NumThreads(), limits.fma_gflops, limits.bf16_gflops, limits.amx_gflops,
      limits.read_gbs);
  std::printf("%lld heads / %lld KV heads x %lld, one layer a call, %lld cache layer%s in turn\n\n",
              static_cast<long long>(kHeads), static_cast<long long>(kKvHeads),
              static_cast<long long>(kHeadDim), static_cast<long long>(layers),
              layers == 1 ? "" : "s");
  std::printf("| mode (kernel), KV cache | phase | time | achieved | limit | fraction |\n");
  std::printf("|---|---|---|---|---|---|\n");
  auto kernel = [](const std::string& mode) {
    if (mode == "amx") return glmserve::internal::AttentionAmxKernelName();
    if (mode == "bf16") return glmserve::internal::AttentionBf16KernelName();
    return glmserve::internal::CpuHasAvx512()    ? "avx512"
           : glmserve::internal::CpuHasAvx2Fma() ? "avx2"
                                                 : "generic";
  };
  for (const std::string& kv : kv_caches) {
    const bool bf16_kv = kv == "bf16";
    if (tokens > 0) {
      const Filled filled(1, context + tokens, bf16_kv, layers);
      const std::vector<glmserve::SequenceSlice> slice = {{tokens, context, &filled.tables[0]}};
      // Row t attends to context + t + 1 keys: QK^T and PV, 2 flops per product each.
      const double pairs =
          static_cast<double>(tokens) * context + static_cast<double>(tokens) * (tokens + 1) / 2;
      const double flops = pairs * kHeads * kHeadDim * 4;
      for (const std::string& mode : modes) {
        const double s = Time(mode, slice, filled.cache, rounds);
        const double peak = Peak(mode, limits);
        std::printf(
            "| %s (%s), %s | prefill %lld at context %lld | %.3f s | %.0f GFLOP/s | %.0f "
            "GFLOP/s | %.2f |\n",
            mode.c_str(), kernel(mode), kv.c_str(), static_cast<long long>(tokens),
            static_cast<long long>(context), s, flops / s / 1e9, peak, flops / s / 1e9 / peak);
      }
    }
    for (const int64_t c : decode_contexts) {
      // Each sequence holds c tokens and decodes its next (position c): c + 1 K and V rows.
      const Filled filled(batch, c + 1, bf16_kv, layers);
      std::vector<glmserve::SequenceSlice> step;
      for (const auto& table : filled.tables) step.push_back({1, c, &table});
      // A KV head's 12 query heads share its rows: 12 products per value read, so on few cores
      // the arithmetic, not the read, may bound the step. The limit is the larger time.
      const double bytes =
          static_cast<double>(batch) * (c + 1) * kKvHeads * kHeadDim * 2 * (bf16_kv ? 2 : 4);
      const double flops = static_cast<double>(batch) * (c + 1) * kHeads * kHeadDim * 4;
      for (const std::string& mode : modes) {
        const double s = Time(mode, step, filled.cache, rounds);
        const double peak = Peak(mode, limits);
        const double read_s = bytes / (limits.read_gbs * 1e9), compute_s = flops / (peak * 1e9);
        std::printf(
            "| %s (%s), %s | decode batch %lld at context %lld | %.3f ms | %.1f GB/s, %.0f "
            "GFLOP/s | %.3f ms (%s-bound) | %.2f |\n",
            mode.c_str(), kernel(mode), kv.c_str(), static_cast<long long>(batch),
            static_cast<long long>(c), s * 1e3, bytes / s / 1e9, flops / s / 1e9,
            std::max(read_s, compute_s) * 1e3, read_s >= compute_s ? "read" : "compute",
            std::max(read_s, compute_s) / s);
      }
    }
  }
  return 0;
}
