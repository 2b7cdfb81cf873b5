// gpu_bench: the CUDA backend's throughput against the machine's own limits, measured in the
// same run. First the device copy bandwidth (cudaMemcpy device to device, read + write bytes)
// and the cuBLAS bf16 GEMM rate (the same cublasGemmEx call the model makes). Then, on a
// GLM-4.5-Air-shaped stack of a few real-width layers with seeded random weights:
//   decode at several batch sizes: tokens/s and the fraction of the copy bandwidth achieved,
//     counting the bytes a step must read (every non-routed weight, the routed experts the
//     step actually used, the KV cache of every sequence); each batch size once per
//     --decode_sampling mode: every logits row copied to the host ("rows"), or a token per
//     sequence sampled on the device, greedy or top-p ("greedy", "top_p");
//   prefill: tokens/s and the fraction of the GEMM rate achieved by the step's GEMM FLOPs;
//   a mixed step (a prefill chunk continuing a sequence, batched with decodes, as the engine
//     schedules them): ms/step replayed from a CUDA graph against the same step run eagerly.
// Prints one table at the end. Built only with the CUDA backend.
//
// FP8 presets (glm-4.5-air-fp8, glm-4.5-fp8, tiny-fp8; docs/fp8.md) generate their codes on
// the device (no host copy) and also measure our FP8 tiled kernel's rate. Bytes per decode step
// (the copy-bandwidth fraction): every non-routed matrix of the span (FP8: 1 byte per weight
// + 4 per fp32 scale; bf16: 2) incl. the bf16 lm_head, norms and fp32 routers, + the routed
// experts the step used x one expert's bytes (FP8: 3 I hidden + scales), + the KV cache of
// every sequence (kv_bytes_per_token x context, --kv_cache_dtype=fp8_e4m3 for the FP8 cache),
// printed as an exact byte count per batch size. The prefill fraction of an FP8 model is of
// the FP8 tensor-core GEMM rate measured in the same run (cuBLASLt, core/cuda/fp8_gemm.h;
// the bf16 cuBLAS rate where the device has no FP8 tensor cores).
//
//   gpu_bench --model=glm-4.5-air:layers=2 --batches=1,8,64 --context=512
//   gpu_bench --model=glm-4.5-air-fp8 --batches=1,8,64 --prefill_tokens=2048
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/cuda/cublas_api.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/fp8_gemm.h"
#include "core/cuda/gemm.h"
#include "core/cuda/model.h"
#include "core/cuda/runner.h"
#include "core/model/checkpoint.h"

ABSL_FLAG(std::string, model, "glm-4.5-air:layers=2",
          "preset with seeded random weights (bf16; FP8 for the -fp8 presets)");
ABSL_FLAG(std::string, batches, "1,8,64", "decode batch sizes");
ABSL_FLAG(int, context, 512, "prompt tokens per sequence before the timed decode steps");
ABSL_FLAG(int, decode_steps, 32, "timed decode steps per batch size");
ABSL_FLAG(std::string, decode_sampling, "rows,greedy,top_p",
          "per decode batch, what each step returns: rows (every logits row copied to the "
          "host, as before device sampling), greedy or top_p (T 1, top_p 0.95: tokens chosen "
          "on the device, core/cuda/row_sample.cu, no rows)");
ABSL_FLAG(int, prefill_tokens, 2048, "tokens of the timed single-sequence prefill step");
ABSL_FLAG(int, prefill_chunk, 4096, "most tokens per step when filling the decode contexts");
ABSL_FLAG(bool, cuda_graphs, true, "capture steps as CUDA graphs");
ABSL_FLAG(int, mixed_chunk, 96, "prefill tokens of the mixed step (0: no mixed row)");
ABSL_FLAG(int, mixed_decodes, 31, "decoding sequences batched with the mixed step's chunk");
ABSL_FLAG(int, gemm_size, 8192, "m = n = k of the GEMM-rate measurement");
ABSL_FLAG(int, copy_mib, 1024, "MiB per copy of the bandwidth measurement");
ABSL_FLAG(bool, fp8_tensor_cores, true,
          "FP8 prefill GEMMs on FP8 tensor cores (cuBLASLt; CudaModelOptions::fp8_tensor_cores)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache element format: auto (bf16) or fp8_e4m3 (GLM-4.5; docs/kv_cache.md)");

namespace glmserve {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Row {
  std::string name, value, detail, fraction;
};

#define BENCH_CHECK(expr)                                                               \
  do {                                                                                  \
    if (absl::Status s_ = (expr); !s_.ok()) {                                           \
      std::fprintf(stderr, "gpu_bench: %s failed: %s\n", #expr, s_.ToString().c_str()); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (false)

// Every CUDA / cuBLAS call is checked; the benchmark stops at the first failure.
void CudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gpu_bench: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void CublasOk(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gpu_bench: %s failed: %s\n", what,
                 glmserve::cuda::Cublas().status_string(s));
    std::exit(1);
  }
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "gpu_bench: %s failed: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

double ElapsedMs(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.f;
  CudaOk(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  return ms;
}

// Device-to-device copy rate, read + write bytes per second.
double CopyBandwidth() {
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_copy_mib)) << 20;
  cuda::DeviceBuffer src = Check(cuda::DeviceBuffer::Create(bytes), "alloc");
  cuda::DeviceBuffer dst = Check(cuda::DeviceBuffer::Create(bytes), "alloc");
  cuda::Event start = Check(cuda::CreateEvent(true), "event");
  cuda::Event stop = Check(cuda::CreateEvent(true), "event");
  BENCH_CHECK(cuda::FillDevice(src.get(), 1, bytes));
  CudaOk(cudaMemcpy(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice), "warm-up copy");
  const int reps = 20;
  CudaOk(cudaEventRecord(start.get()), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) {
    CudaOk(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice), "copy");
  }
  CudaOk(cudaEventRecord(stop.get()), "cudaEventRecord");
  BENCH_CHECK(cuda::SynchronizeDevice());
  return 2.0 * bytes * reps / (ElapsedMs(start.get(), stop.get()) * 1e-3);
}

// cuBLAS bf16 x bf16 -> fp32 GEMM rate (FLOP/s) at m = n = k = size.
double GemmRate(int64_t size) {
  cuda::CublasHandle handle = Check(cuda::CreateCublas(), "cublas");
  cuda::DeviceBuffer a = Check(cuda::DeviceBuffer::Create(size * size * 2), "alloc");
  cuda::DeviceBuffer b = Check(cuda::DeviceBuffer::Create(size * size * 2), "alloc");
  cuda::DeviceBuffer c = Check(cuda::DeviceBuffer::Create(size * size * 4), "alloc");
  cuda::DeviceBuffer workspace = Check(cuda::DeviceBuffer::Create(32 << 20), "alloc");
  CublasOk(glmserve::cuda::Cublas().set_workspace(handle.get(), workspace.get(), 32 << 20),
           "cublasSetWorkspace");
  BENCH_CHECK(cuda::FillDevice(a.get(), 0x3c, size * size * 2));  // bf16 0x3c3c ~ 0.0115
  BENCH_CHECK(cuda::FillDevice(b.get(), 0x3c, size * size * 2));
  const auto run = [&] {
    BENCH_CHECK(cuda::Gemm(handle.get(), {a.get(), CUDA_R_16BF, size}, size, size,
                           {b.get(), CUDA_R_16BF, size}, size, c.get(), CUDA_R_32F, size));
  };
  run();
  cuda::Event start = Check(cuda::CreateEvent(true), "event");
  cuda::Event stop = Check(cuda::CreateEvent(true), "event");
  const int reps = 10;
  CudaOk(cudaEventRecord(start.get()), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) run();
  CudaOk(cudaEventRecord(stop.get()), "cudaEventRecord");
  BENCH_CHECK(cuda::SynchronizeDevice());
  return 2.0 * size * size * size * reps / (ElapsedMs(start.get(), stop.get()) * 1e-3);
}

// Our FP8 tiled kernel (fp8_linear.cu, the prefill path of FP8 weights) at m = n = k = size,
// per-channel scales, bf16 activations: FLOP/s.
double Fp8GemmRate(int64_t size) {
  cuda::DeviceBuffer codes = Check(cuda::DeviceBuffer::Create(size * size), "alloc");
  cuda::DeviceBuffer scales = Check(cuda::DeviceBuffer::Create(size * 4), "alloc");
  cuda::DeviceBuffer x = Check(cuda::DeviceBuffer::Create(size * size * 2), "alloc");
  cuda::DeviceBuffer y = Check(cuda::DeviceBuffer::Create(size * size * 4), "alloc");
  BENCH_CHECK(cuda::FillDevice(codes.get(), 0x30, size * size));  // e4m3 0x30 = 0.5
  BENCH_CHECK(cuda::FillDevice(scales.get(), 0x3c, size * 4));    // fp32 ~0.0115
  BENCH_CHECK(cuda::FillDevice(x.get(), 0x3c, size * size * 2));
  const cuda::Fp8DeviceMatrix w{codes.as<uint8_t>(), scales.as<float>(), size, size, 1, size};
  const auto run = [&] {
    CudaOk(cuda::LaunchFp8LinearBf16(x.as<uint16_t>(), size, w, y.as<float>(), size, nullptr),
           "LaunchFp8LinearBf16");
  };
  run();
  cuda::Event start = Check(cuda::CreateEvent(true), "event");
  cuda::Event stop = Check(cuda::CreateEvent(true), "event");
  const int reps = 3;
  CudaOk(cudaEventRecord(start.get()), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) run();
  CudaOk(cudaEventRecord(stop.get()), "cudaEventRecord");
  BENCH_CHECK(cuda::SynchronizeDevice());
  return 2.0 * size * size * size * reps / (ElapsedMs(start.get(), stop.get()) * 1e-3);
}

// The tensor-core FP8 GEMM (core/cuda/fp8_gemm.h: per-1x128-group quantization of bf16 x,
// cuBLASLt's block-scaled E4M3 x E4M3 matmul, the per-channel scale epilogue) at
// m = n = k = size: FLOP/s, or 0 with the reason when the device or library has no FP8
// tensor-core path for it.
double Fp8TensorCoreRate(int64_t size, std::string* why) {
  absl::StatusOr<std::unique_ptr<cuda::Fp8TensorCoreGemm>> gemm =
      cuda::Fp8TensorCoreGemm::Create(0);
  if (!gemm.ok()) {
    *why = std::string(gemm.status().message());
    return 0;
  }
  cuda::DeviceBuffer codes = Check(cuda::DeviceBuffer::Create(size * size), "alloc");
  cuda::DeviceBuffer scales = Check(cuda::DeviceBuffer::Create(size * 4), "alloc");
  cuda::DeviceBuffer x = Check(cuda::DeviceBuffer::Create(size * size * 2), "alloc");
  cuda::DeviceBuffer y = Check(cuda::DeviceBuffer::Create(size * size * 4), "alloc");
  cuda::DeviceBuffer x_codes = Check(cuda::DeviceBuffer::Create(size * size), "alloc");
  cuda::DeviceBuffer x_scales =
      Check(cuda::DeviceBuffer::Create(size * cuda::Fp8ActGroups(size) * 4), "alloc");
  BENCH_CHECK(cuda::FillDevice(codes.get(), 0x30, size * size));  // e4m3 0x30 = 0.5
  BENCH_CHECK(cuda::FillDevice(scales.get(), 0x3c, size * 4));
  BENCH_CHECK(cuda::FillDevice(x.get(), 0x3c, size * size * 2));
  const cuda::Fp8DeviceMatrix w{codes.as<uint8_t>(), scales.as<float>(), size, size, 1, size};
  bool ran = false;
  const auto run = [&] {
    BENCH_CHECK((*gemm)->Run(x.as<uint16_t>(), size, w, y.as<float>(), size, x_codes.as<uint8_t>(),
                             x_scales.as<float>(), nullptr, &ran, why));
  };
  run();
  if (!ran) return 0;
  cuda::Event start = Check(cuda::CreateEvent(true), "event");
  cuda::Event stop = Check(cuda::CreateEvent(true), "event");
  const int reps = 10;
  CudaOk(cudaEventRecord(start.get()), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) run();
  CudaOk(cudaEventRecord(stop.get()), "cudaEventRecord");
  BENCH_CHECK(cuda::SynchronizeDevice());
  return 2.0 * size * size * size * reps / (ElapsedMs(start.get(), stop.get()) * 1e-3);
}

// Attention FLOPs of an n-token prefill from position 0: QK and PV over the causal keys
// (GLM-4.5); for GLM-5 the latent scores and sums (2 (2R + dr) per head and attended key,
// at most index_topk keys) plus the indexer's scoring (2 Hi Di per causal key, full layers).
double AttentionFlops(const ModelConfig& c, int64_t n, int64_t layers) {
  const double pairs = static_cast<double>(n) * (n + 1) / 2;
  if (!c.is_mla()) return 4.0 * c.q_dim() * pairs * layers;
  double attended = 0;
  for (int64_t p = 0; p < n; ++p) attended += static_cast<double>(std::min(p + 1, c.index_topk));
  double f = 0;
  for (int64_t l = 0; l < layers; ++l) {
    f += 2.0 * c.num_attention_heads * (2.0 * c.kv_lora_rank + c.qk_rope_head_dim) * attended;
    if (c.has_indexer(l)) f += 2.0 * c.index_n_heads * c.index_head_dim * pairs;
  }
  return f;
}

// GEMM FLOPs per token of the span's projections (routed: top_k experts; lm_head excluded).
double GemmFlopsPerToken(const ModelConfig& c, int64_t layers) {
  double f = 0;
  for (int64_t l = 0; l < layers; ++l) {
    if (c.is_mla()) {  // GLM-5: q_a, q_b, kv_a, o, the absorb / expand per head, the indexer
      const double h = c.num_attention_heads, r = c.kv_lora_rank, dr = c.qk_rope_head_dim;
      f += 2.0 * c.hidden_size * (c.q_lora_rank + r + dr) +
           2.0 * c.q_lora_rank * h * c.qk_head_dim() + 2.0 * h * c.v_head_dim * c.hidden_size +
           2.0 * h * r * (c.qk_nope_head_dim + c.v_head_dim);
      if (c.has_indexer(l)) {
        f += 2.0 * c.q_lora_rank * c.index_n_heads * c.index_head_dim +
             2.0 * c.hidden_size * (c.index_head_dim + c.index_n_heads);
      }
    } else {
      f += 2.0 * c.hidden_size * (c.q_dim() + 2 * c.kv_dim()) + 2.0 * c.hidden_size * c.q_dim();
    }
    if (c.is_moe_layer(l)) {
      f += 2.0 * c.hidden_size * c.n_routed_experts;
      f += 2.0 * 3 * c.hidden_size * c.moe_intermediate_size *
           (c.num_experts_per_tok + c.n_shared_experts);
    } else {
      f += 2.0 * 3 * c.hidden_size * c.intermediate_size;
    }
  }
  return f;
}

// Runs `ids` of each sequence through the model in steps of at most `chunk` tokens.
void Prefill(cuda::CudaModel& model, KvCache* cache, std::vector<BlockTable>& tables,
             int64_t tokens_each, int64_t chunk) {
  std::vector<int32_t> ids;
  ForwardOptions options;
  options.logits = LogitsRows::kNone;
  ForwardResult result;
  for (size_t first = 0; first < tables.size();) {
    ForwardBatch batch;
    ids.clear();
    int64_t used = 0;
    size_t s = first;
    for (; s < tables.size() && (used == 0 || used + tokens_each <= chunk); ++s) {
      batch.sequences.push_back({tokens_each, 0, &tables[s]});
      for (int64_t i = 0; i < tokens_each; ++i) {
        ids.push_back(static_cast<int32_t>((i * 7919 + s * 104729) % model.config().vocab_size));
      }
      used += tokens_each;
    }
    batch.token_ids = ids;
    BENCH_CHECK(model.Forward(batch, cache, options, &result));
    first = s;
  }
}

// The machine's own limits, the denominators of the table's fractions.
struct MachineRates {
  double bandwidth = 0;  // D2D copy, bytes/s
  double gemm = 0;       // bf16 GEMM, FLOP/s
  // The prefill fraction's denominator: the FP8 tensor-core rate for FP8 models when the
  // device has it, else the bf16 GEMM rate.
  double prefill = 0;
  std::string prefill_name = "bf16 GEMM rate";
};

MachineRates MeasureMachine(bool fp8, std::vector<Row>& rows) {
  MachineRates m;
  m.bandwidth = CopyBandwidth();
  rows.push_back(
      {"D2D copy bandwidth (read+write)", absl::StrFormat("%.0f GB/s", m.bandwidth / 1e9),
       absl::StrFormat("%d MiB cudaMemcpyAsync x20", absl::GetFlag(FLAGS_copy_mib)), "-"});
  const int64_t gemm_size = absl::GetFlag(FLAGS_gemm_size);
  m.gemm = GemmRate(gemm_size);
  rows.push_back({absl::StrFormat("cuBLAS bf16 GEMM %d^3", gemm_size),
                  absl::StrFormat("%.0f TFLOP/s", m.gemm / 1e12), "cublasGemmEx bf16 in, fp32 out",
                  "-"});
  std::printf("gpu_bench: copy %.0f GB/s, GEMM %.0f TFLOP/s\n", m.bandwidth / 1e9, m.gemm / 1e12);
  m.prefill = m.gemm;
  if (!fp8) return m;
  const double fp8_rate = Fp8GemmRate(gemm_size);
  rows.push_back({absl::StrFormat("FP8 tiled kernel %d^3", gemm_size),
                  absl::StrFormat("%.1f TFLOP/s", fp8_rate / 1e12),
                  "LaunchFp8LinearBf16, CUDA cores (the fallback)",
                  absl::StrFormat("%.1f%% of bf16 GEMM", 100.0 * fp8_rate / m.gemm)});
  std::string why;
  const double tc_rate = Fp8TensorCoreRate(gemm_size, &why);
  if (tc_rate > 0) {
    rows.push_back({absl::StrFormat("cuBLASLt FP8 GEMM %d^3", gemm_size),
                    absl::StrFormat("%.0f TFLOP/s", tc_rate / 1e12),
                    "E4M3 x E4M3 -> fp32 incl. 1x128-group quantize + scale epilogue",
                    absl::StrFormat("%.1fx bf16 GEMM", tc_rate / m.gemm)});
    m.prefill = tc_rate;
    m.prefill_name = "FP8 GEMM rate";
  } else {
    std::printf("gpu_bench: no FP8 tensor-core GEMM: %s\n", why.c_str());
  }
  return m;
}

// The preset's random weights (FP8 codes generated on the device), uploaded, with the flags'
// graph, tensor-core and KV cache settings.
std::unique_ptr<cuda::CudaModel> LoadBenchModel(const std::string& spec, bool fp8) {
  ModelConfig config = Check(PresetConfig(spec), "preset");
  auto t0 = Clock::now();
  RandomWeightOptions random;
  random.dtype = fp8 ? DType::kF8E4M3 : DType::kBF16;
  random.fp8_codes_on_device = fp8;  // generated on the device: no host copy of the codes
  ModelWeights weights = Check(RandomWeights(config, random), "random weights");
  const double gen_s = Since(t0);
  t0 = Clock::now();
  std::unique_ptr<cuda::CudaModel> model =
      Check(cuda::CudaModel::Create(std::move(weights)), "upload");
  model->set_cuda_graphs(absl::GetFlag(FLAGS_cuda_graphs));
  model->set_fp8_tensor_cores(absl::GetFlag(FLAGS_fp8_tensor_cores));
  const KvCacheDType kv_dtype =
      Check(ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype)), "flag");
  BENCH_CHECK(model->SetKvCacheDType(kv_dtype));
  std::printf("gpu_bench: KV cache %s, %lld bytes per token\n",
              kv_dtype == KvCacheDType::kFp8E4M3 ? "fp8_e4m3 (codes + per-head scales)" : "bf16",
              static_cast<long long>(model->kv_bytes_per_token()));
  std::printf("gpu_bench: %s weights %.2f GB (generated %.1f s, uploaded %.1f s)\n", spec.c_str(),
              model->weight_bytes() / 1e9, gen_s, Since(t0));
  return model;
}

constexpr int64_t kBenchBlock = 16;

// Prefill: one sequence, the whole prompt in one step.
Row BenchPrefill(cuda::CudaModel& model, const MachineRates& rates) {
  const int64_t n = absl::GetFlag(FLAGS_prefill_tokens);
  const int64_t layers = model.num_span_layers();
  std::unique_ptr<KvCache> cache =
      Check(model.CreateCache(n / kBenchBlock + 2, kBenchBlock), "cache");
  std::vector<BlockTable> tables(1);
  BENCH_CHECK(cache->Reserve(&tables[0], n));
  Prefill(model, cache.get(), tables, n, n);  // warm-up (arena growth, cuBLAS heuristics)
  const int reps = 3;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) Prefill(model, cache.get(), tables, n, n);
  const double step = Since(t0) / reps;
  const double flops = GemmFlopsPerToken(model.config(), layers) * n;
  const double attn_flops = AttentionFlops(model.config(), n, layers);
  return {
      absl::StrFormat("prefill %d tokens", n), absl::StrFormat("%.0f tok/s", n / step),
      absl::StrFormat("%.1f ms/step, GEMM %.2f TFLOP + attention %.2f TFLOP", step * 1e3,
                      flops / 1e12, attn_flops / 1e12),
      absl::StrFormat("%.1f%% of %s", 100.0 * flops / step / rates.prefill, rates.prefill_name)};
}

// A mixed step: --mixed_chunk tokens of one sequence's prompt after --context cached ones,
// batched with --mixed_decodes sequences decoding at --context, each sequence's last logits
// row returned; timed as a CUDA graph and eagerly (the launches a graph saves). Every run
// repeats the same positions (rewriting the same K/V), so contexts stay put.
Row BenchMixed(cuda::CudaModel& model, bool graphs) {
  const int64_t chunk = absl::GetFlag(FLAGS_mixed_chunk);
  const int64_t decodes = absl::GetFlag(FLAGS_mixed_decodes);
  const int64_t context = absl::GetFlag(FLAGS_context);
  const int reps = 8, warm = 3;
  const int64_t longest = context + chunk;
  const int64_t per_seq = (longest + kBenchBlock - 1) / kBenchBlock;
  std::unique_ptr<KvCache> cache =
      Check(model.CreateCache((decodes + 1) * per_seq, kBenchBlock), "cache");
  std::vector<BlockTable> tables(decodes + 1);
  for (BlockTable& t : tables) BENCH_CHECK(cache->Reserve(&t, longest));
  Prefill(model, cache.get(), tables, context, absl::GetFlag(FLAGS_prefill_chunk));
  const int64_t pos = context;
  const int64_t vocab = model.config().vocab_size;
  ForwardOptions options;
  ForwardResult result;
  std::vector<int32_t> ids;
  const auto step = [&] {
    ForwardBatch batch;
    ids.clear();
    batch.sequences.push_back({chunk, pos, &tables[0]});
    for (int64_t i = 0; i < chunk; ++i) ids.push_back(static_cast<int32_t>((pos + i) % vocab));
    for (int64_t s = 1; s <= decodes; ++s) {
      batch.sequences.push_back({1, pos, &tables[s]});
      ids.push_back(static_cast<int32_t>((pos * 31 + s) % vocab));
    }
    batch.token_ids = ids;
    BENCH_CHECK(model.Forward(batch, cache.get(), options, &result));
  };
  const auto time = [&](bool on) {
    model.set_cuda_graphs(on);
    for (int i = 0; i < warm; ++i) step();  // capture, arena growth, cuBLAS heuristics
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) step();
    return Since(t0) / reps;
  };
  const double eager = time(false);
  const int64_t graphs_before = model.mixed_graph_launches();
  const double graph = time(true);
  const int64_t graph_steps = model.mixed_graph_launches() - graphs_before;
  model.set_cuda_graphs(graphs);
  return {absl::StrFormat("mixed step: %d prefill + %d decodes", chunk, decodes),
          absl::StrFormat("%.3f ms/step", graph * 1e3),
          absl::StrFormat("graph replay (%lld of %d steps graphs); eager %.3f ms/step",
                          static_cast<long long>(graph_steps), reps + warm, eager * 1e3),
          absl::StrFormat("eager / graph %.2fx", eager / graph)};
}

// Decode steps of `batch_size` sequences at --context positions, against the bytes they read.
Row BenchDecode(cuda::CudaModel& model, int64_t batch_size, const std::string& sampling,
                const MachineRates& rates) {
  const int64_t context = absl::GetFlag(FLAGS_context);
  const int64_t steps = absl::GetFlag(FLAGS_decode_steps);
  const int64_t per_seq = (context + steps + 8 + kBenchBlock - 1) / kBenchBlock;
  std::unique_ptr<KvCache> cache =
      Check(model.CreateCache(batch_size * per_seq, kBenchBlock), "cache");
  std::vector<BlockTable> tables(batch_size);
  for (BlockTable& t : tables) BENCH_CHECK(cache->Reserve(&t, context + steps + 8));
  Prefill(model, cache.get(), tables, context, absl::GetFlag(FLAGS_prefill_chunk));
  ForwardBatch batch;
  std::vector<int32_t> ids(batch_size);
  ForwardOptions options;  // logits of every sequence's new token, as serving does
  ForwardResult result;
  int64_t pos = context;
  const auto step = [&] {
    batch.sequences.clear();
    for (int64_t s = 0; s < batch_size; ++s) {
      batch.sequences.push_back({1, pos, &tables[s]});
      ids[s] = static_cast<int32_t>((pos * 31 + s) % model.config().vocab_size);
    }
    batch.token_ids = ids;
    if (sampling != "rows") {
      // One device draw per sequence, nothing copied back but the tokens.
      options.sample.assign(batch_size, RowSampleRequest{});
      for (int64_t s = 0; s < batch_size; ++s) {
        RowSampleRequest& r = options.sample[s];
        r.sample = true;
        r.keep_logits = false;
        r.params.temperature = sampling == "greedy" ? 0.0f : 1.0f;
        r.params.top_p = sampling == "greedy" ? 1.0f : 0.95f;
        r.params.seed = static_cast<uint64_t>(s);
        r.params.token_index = static_cast<uint64_t>(pos);
      }
    }
    BENCH_CHECK(model.Forward(batch, cache.get(), options, &result));
    ++pos;
  };
  for (int i = 0; i < 3; ++i) step();  // warm-up: graph capture
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  const double step_s = Since(t0) / steps;
  // Bytes the steps had to read: the experts the last steps used (sampled over 4 more).
  double experts = 0;
  for (int i = 0; i < 4; ++i) {
    step();
    experts += static_cast<double>(Check(model.LastStepActiveExperts(), "experts")) / 4;
  }
  const cuda::DeviceWeights& dw = model.device_weights();
  const double kv_bytes =
      static_cast<double>(model.kv_bytes_per_token()) * batch_size * (context + steps / 2.0);
  const double bytes = dw.dense_step_bytes + experts * dw.routed_expert_bytes + kv_bytes;
  // The exact byte count behind the fraction (the expert count is a mean over 4 steps).
  std::printf(
      "gpu_bench: decode batch %lld bytes/step = %lld (non-routed weights incl. head) + "
      "%.2f experts x %lld + KV %lld bytes/token x %.1f tokens = %.0f\n",
      static_cast<long long>(batch_size), static_cast<long long>(dw.dense_step_bytes), experts,
      static_cast<long long>(dw.routed_expert_bytes),
      static_cast<long long>(model.kv_bytes_per_token()), batch_size * (context + steps / 2.0),
      bytes);
  return {absl::StrFormat("decode batch %d, %s", batch_size, sampling),
          absl::StrFormat("%.0f tok/s", batch_size / step_s),
          absl::StrFormat("%.2f ms/step, %.2f GB read/step (%.0f experts, KV %.2f GB)",
                          step_s * 1e3, bytes / 1e9, experts, kv_bytes / 1e9),
          absl::StrFormat("%.1f%% of copy bw", 100.0 * bytes / step_s / rates.bandwidth)};
}

void PrintTable(const cuda::CudaModel& model, const std::string& spec,
                const std::vector<Row>& rows) {
  std::printf("\n%s, %s (%lld layers, graphs %s: %lld captured, %lld launches)\n",
              model.device_name().c_str(), spec.c_str(),
              static_cast<long long>(model.num_span_layers()),
              absl::GetFlag(FLAGS_cuda_graphs) ? "on" : "off",
              static_cast<long long>(model.graphs_captured()),
              static_cast<long long>(model.graph_launches()));
  size_t w0 = 0, w1 = 0, w3 = 0;
  for (const Row& r : rows) {
    w0 = std::max(w0, r.name.size());
    w1 = std::max(w1, r.value.size());
    w3 = std::max(w3, r.fraction.size());
  }
  for (const Row& r : rows) {
    std::printf("| %-*s | %*s | %-*s | %s\n", static_cast<int>(w0), r.name.c_str(),
                static_cast<int>(w1), r.value.c_str(), static_cast<int>(w3), r.fraction.c_str(),
                r.detail.c_str());
  }
}

int Main() {
  if (!CudaDeviceAvailable()) {
    std::fprintf(stderr, "gpu_bench: %s\n", CudaDeviceDescription().c_str());
    return 1;
  }
  std::vector<Row> rows;
  std::printf("gpu_bench: %s\n", CudaDeviceDescription().c_str());
  const std::string spec = absl::GetFlag(FLAGS_model);
  const bool fp8 = PresetIsFp8(spec);
  const MachineRates rates = MeasureMachine(fp8, rows);
  std::unique_ptr<cuda::CudaModel> model = LoadBenchModel(spec, fp8);
  rows.push_back(BenchPrefill(*model, rates));
  if (absl::GetFlag(FLAGS_mixed_chunk) > 0) {
    rows.push_back(BenchMixed(*model, absl::GetFlag(FLAGS_cuda_graphs)));
  }
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int64_t batch_size = 0;
    if (!absl::SimpleAtoi(b, &batch_size) || batch_size <= 0) continue;
    for (const std::string& sampling :
         std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_decode_sampling), ','))) {
      if (sampling != "rows" && sampling != "greedy" && sampling != "top_p") {
        std::fprintf(stderr, "gpu_bench: --decode_sampling: unknown '%s'\n", sampling.c_str());
        return 2;
      }
      rows.push_back(BenchDecode(*model, batch_size, sampling, rates));
    }
  }
  PrintTable(*model, spec, rows);
  return 0;
}

}  // namespace
}  // namespace glmserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return glmserve::Main();
}
