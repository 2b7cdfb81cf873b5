// glm-run: run a GLM-4.5-family model (checkpoint directory or preset with seeded random
// weights) on prompt token ids, on the CPU or the CUDA runner, and print the greedy
// continuation with timings. Optionally writes the prompt's logits and each layer's hidden
// states as .npy files, and compares them with files an earlier run wrote: the way to ask
// "does the GPU path give the CPU path's logits on this checkpoint?" without writing code.
//
//   glm-run --model=glm-4.5-mini --prompt=151331,151333,9703 --max_new_tokens=16
//   glm-run --model=path/to/checkpoint --prompt=1,2,3 --logits_out=/tmp/cpu.npy
//   glm-run --model=path/to/checkpoint --prompt=1,2,3 --device=cuda
//       --compare_logits=/tmp/cpu.npy --max_relative_error=3e-2   (one command line)
//   glm-run --model=models/glm-4.5-kjv --perplexity=tests/golden/kjv/heldout.txt
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/file_io.h"
#include "core/base/npy.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"
#include "core/cuda/runner.h"
#include "core/engine/runner_factory.h"
#include "core/engine/scoring.h"
#include "core/model/checkpoint.h"
#include "core/model/model_runner.h"
#include "core/text/text_assets.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, model, "glm-4.5-mini",
          "checkpoint directory (with config.json) or preset, e.g. glm-4.5-air:layers=2");
ABSL_FLAG(std::string, device, "cpu",
          "cpu (the reference path), cuda (the CUDA runner: a GPU, or the emulated device in "
          "a -DGLMSERVE_CUDA_EMU=ON build) or auto (CUDA when a usable GPU is present)");
ABSL_FLAG(std::string, prompt, "151331,151333,9703,1435,11", "comma-separated prompt token ids");
ABSL_FLAG(int, max_new_tokens, 16, "greedy tokens to generate after the prompt");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights (presets only)");
ABSL_FLAG(std::string, dtype, "bf16", "dtype of random weights (presets only): bf16, f16, f32");
ABSL_FLAG(std::string, logits_out, "", "write the prompt's logits [tokens, vocab] to this .npy");
ABSL_FLAG(std::string, hidden_out, "",
          "write the residual stream after the embedding and each layer "
          "[layers + 1, tokens, hidden] to this .npy");
ABSL_FLAG(std::string, compare_logits, "",
          "a .npy of the same prompt's logits (e.g. another device's --logits_out): print the "
          "relative error of this run's logits against it and how many rows' argmax agree");
ABSL_FLAG(std::string, compare_hidden, "",
          "the same for the hidden states (another run's --hidden_out)");
ABSL_FLAG(double, max_relative_error, 0,
          "with --compare_logits / --compare_hidden: exit with status 1 when a relative error "
          "exceeds this (0: report only). The CUDA runner's bf16 bound against the CPU is 3e-2 "
          "(tests/core/engine/golden_test.cc)");
ABSL_FLAG(std::string, cpu_math, "exact",
          "CPU runner's linear-layer arithmetic: exact (fp32 activations), bf16 (activations "
          "rounded to bf16 for bf16 weights, vdpbf16ps order) or bf16_amx (the same rounding, "
          "Intel AMX tile order), both also running GLM-4.5's attention in bf16; see "
          "docs/cpu_math.md");
ABSL_FLAG(std::string, weight_dtype, "stored",
          "stored; int8 (linear layers quantized at load; CPU runner only, with "
          "--cpu_math=bf16 or bf16_amx); fp8_channel or fp8_block (a bf16 checkpoint made FP8 "
          "at load in the released FP8 checkpoints' forms; both runners; docs/fp8.md)");
ABSL_FLAG(std::string, fp8_tensor_cores, "off",
          "CUDA runner's FP8 GEMMs on FP8 tensor cores: auto (where the device supports them), "
          "on (refuse to run without them), off (CUDA-core kernels); docs/cuda.md");
ABSL_FLAG(std::string, save, "",
          "write the loaded model (e.g. a preset's seeded random weights in --dtype) to this "
          "directory as a Hugging Face checkpoint (config.json + model.safetensors) and exit");
ABSL_FLAG(int, threads, 0, "CPU worker threads (0: all cores, or GLM_NUM_THREADS)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "auto: the runner's choice (CUDA: bf16; CPU: bf16 where its attention rounds K and V "
          "to bf16 anyway, the bf16, int8 and bf16_amx modes on bf16 weights, else fp32); fp32 "
          "(CPU), bf16, or fp8_e4m3: e4m3 with a scale per token and KV head (bf16 and fp8_e4m3: "
          "GLM-4.5 only on the CPU; docs/kv_cache.md)");
ABSL_FLAG(std::string, perplexity, "",
          "score this UTF-8 text file instead of generating: its tokens (the checkpoint's "
          "tokenizer) in windows of --perplexity_window, printing the perplexity "
          "(docs/quality.md)");
ABSL_FLAG(int, perplexity_window, 256, "tokens per scoring window of --perplexity (>= 2)");
ABSL_FLAG(bool, stop_at_eos, false, "stop at the config's eos token ids");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt: '", piece, "' is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt is empty");
  return ids;
}

absl::StatusOr<glmserve::DType> ParseDType(const std::string& s) {
  if (s == "bf16") return glmserve::DType::kBF16;
  if (s == "f16") return glmserve::DType::kF16;
  if (s == "f32") return glmserve::DType::kF32;
  return absl::InvalidArgumentError(absl::StrCat("--dtype: '", s, "' is not bf16, f16 or f32"));
}

// Every flag, parsed and checked against the others before anything is loaded.
struct RunFlags {
  std::vector<int32_t> prompt;
  glmserve::DType dtype;
  glmserve::DeviceKind device;
  glmserve::CpuMath cpu_math;
  glmserve::WeightQuant quant;
  glmserve::KvCacheDType kv_dtype;
  glmserve::Fp8TensorCores fp8_tensor_cores;
  int max_new_tokens;
};

absl::StatusOr<RunFlags> ParseRunFlags() {
  RunFlags f;
  ASSIGN_OR_RETURN(f.prompt, ParseIds(absl::GetFlag(FLAGS_prompt)));
  ASSIGN_OR_RETURN(f.dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  ASSIGN_OR_RETURN(f.device, glmserve::ParseDeviceKind(absl::GetFlag(FLAGS_device)));
  ASSIGN_OR_RETURN(f.cpu_math, glmserve::ParseCpuMath(absl::GetFlag(FLAGS_cpu_math)));
  ASSIGN_OR_RETURN(f.quant, glmserve::ParseWeightQuant(absl::GetFlag(FLAGS_weight_dtype)));
  RETURN_IF_ERROR(glmserve::CheckWeightQuantMath(f.quant, f.cpu_math));
  ASSIGN_OR_RETURN(f.kv_dtype, glmserve::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype)));
  ASSIGN_OR_RETURN(f.fp8_tensor_cores,
                   glmserve::ParseFp8TensorCores(absl::GetFlag(FLAGS_fp8_tensor_cores)));
  f.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  if (f.max_new_tokens < 0) return absl::InvalidArgumentError("--max_new_tokens must be >= 0");
  if (absl::GetFlag(FLAGS_max_relative_error) < 0) {
    return absl::InvalidArgumentError("--max_relative_error must be >= 0");
  }
  // Each runner's own options, refused on the other rather than silently ignored.
  if (f.device == glmserve::DeviceKind::kCuda && f.cpu_math != glmserve::CpuMath::kExact) {
    return absl::InvalidArgumentError(
        "--cpu_math chooses the CPU runner's arithmetic; the CUDA runner has its own (bf16 "
        "activations, fp32 accumulation; docs/cuda.md): drop it or use --device=cpu");
  }
  if (f.device == glmserve::DeviceKind::kCpu &&
      f.fp8_tensor_cores != glmserve::Fp8TensorCores::kOff) {
    return absl::InvalidArgumentError(
        "--fp8_tensor_cores is the CUDA runner's option: use it with --device=cuda or auto");
  }
  return f;
}

// The runner the flags ask for, over the loaded (and, on the CPU, possibly quantized) weights.
absl::StatusOr<std::unique_ptr<glmserve::ModelRunner>> LoadRunner(const RunFlags& f) {
  const bool on_cuda = f.device == glmserve::DeviceKind::kCuda ||
                       (f.device == glmserve::DeviceKind::kAuto &&
                        f.quant != glmserve::WeightQuant::kInt8 && glmserve::CudaDeviceAvailable());
  glmserve::RandomWeightOptions random;
  random.seed = absl::GetFlag(FLAGS_seed);
  random.dtype = f.dtype;
  // An FP8 preset's codes are generated on the device when the CUDA runner takes it (no host
  // copy), as glm-server does; --save needs them on the host.
  random.fp8_codes_on_device = on_cuda && absl::GetFlag(FLAGS_save).empty();
  const auto t_load = Clock::now();
  ASSIGN_OR_RETURN(glmserve::ModelWeights weights,
                   glmserve::LoadModel(absl::GetFlag(FLAGS_model), glmserve::LayerSpan{}, random));
  if (const std::string dir = absl::GetFlag(FLAGS_save); !dir.empty()) {
    // Before any quantization: a checkpoint holds the weights as loaded.
    RETURN_IF_ERROR(glmserve::SaveCheckpoint(weights, dir));
    std::printf("saved     %s (%.2f GB of %s weights) to %s in %.2f s\n",
                absl::GetFlag(FLAGS_model).c_str(), weights.ParameterBytes() / 1e9,
                std::string(glmserve::DTypeName(weights.weight_dtype)).c_str(), dir.c_str(),
                Seconds(t_load, Clock::now()));
    return nullptr;
  }
  RETURN_IF_ERROR(glmserve::QuantizeWeights(&weights, f.quant));
  const std::string description = glmserve::DescribeConfig(weights.config);
  const double gigabytes = weights.ParameterBytes() / 1e9;
  const std::string weight_dtype(glmserve::DTypeName(weights.weight_dtype));
  ASSIGN_OR_RETURN(std::unique_ptr<glmserve::ModelRunner> runner,
                   glmserve::CreateModelRunner(std::move(weights), f.device, f.cpu_math, nullptr,
                                               f.fp8_tensor_cores));
  RETURN_IF_ERROR(runner->SetKvCacheDType(f.kv_dtype));
  std::printf("model     %s\n          %s\n          %.2f GB of weights (%s), loaded in %.2f s\n",
              absl::GetFlag(FLAGS_model).c_str(), description.c_str(), gigabytes,
              weight_dtype.c_str(), Seconds(t_load, Clock::now()));
  std::printf("device    %s\n", runner->device_name().c_str());
  // The CUDA runner's description counts the kernels it ran: printed after the run instead.
  if (runner->device_name() == "cpu") {
    std::printf("threads   %d, %s\n", glmserve::NumThreads(),
                runner->compute_description().c_str());
  }
  // The format the runner chose (auto resolves per backend and arithmetic), from a 1-block cache.
  ASSIGN_OR_RETURN(const std::unique_ptr<glmserve::KvCache> probe, runner->CreateCache(1, 16));
  std::printf("kv cache  %s, %lld bytes per token\n",
              glmserve::KvCacheDTypeName(glmserve::KvCacheDTypeOf(probe->dtype())),
              static_cast<long long>(runner->kv_bytes_per_token()));
  return runner;
}

// `what`'s relative error of the norm against the array in `path` (same shape), its largest
// absolute difference and, for logits, how many rows' argmax agree; false when over the bound.
absl::StatusOr<bool> Compare(const std::string& what, const std::string& path,
                             const std::vector<int64_t>& shape, const std::vector<float>& data) {
  ASSIGN_OR_RETURN(glmserve::NpyArray ref, glmserve::ReadNpy(path));
  if (ref.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("--compare_", what, ": ", path, " has shape [",
                                                   absl::StrJoin(ref.shape, ", "), "], this run's ",
                                                   what, " [", absl::StrJoin(shape, ", "), "]"));
  }
  double diff2 = 0, ref2 = 0, max_abs = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const double d = static_cast<double>(data[i]) - ref.data[i];
    diff2 += d * d;
    ref2 += static_cast<double>(ref.data[i]) * ref.data[i];
    max_abs = std::max(max_abs, std::abs(d));
  }
  // NaN anywhere makes the error NaN, which fails any bound below.
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  std::string line = absl::StrFormat("compare   %s vs %s: relative error %.3g, max |diff| %.3g",
                                     what, path, rel, max_abs);
  if (what == "logits") {
    const int64_t vocab = shape.back(), rows = static_cast<int64_t>(data.size()) / vocab;
    int64_t agree = 0;
    for (int64_t r = 0; r < rows; ++r) {
      agree += glmserve::ArgMaxRow(&data[r * vocab], vocab) ==
               glmserve::ArgMaxRow(&ref.data[r * vocab], vocab);
    }
    absl::StrAppendFormat(&line, ", argmax %d/%d rows", agree, rows);
  }
  const double bound = absl::GetFlag(FLAGS_max_relative_error);
  const bool ok = bound == 0 || rel <= bound;
  if (bound > 0) absl::StrAppendFormat(&line, " (bound %.3g: %s)", bound, ok ? "ok" : "EXCEEDED");
  std::printf("%s\n", line.c_str());
  return ok;
}

// Writes and compares the prompt step's outputs; false when a comparison exceeds its bound.
absl::StatusOr<bool> PromptOutputs(const glmserve::ForwardResult& result, int64_t tokens,
                                   const glmserve::ModelConfig& c) {
  bool ok = true;
  const std::vector<int64_t> logits_shape = {tokens, c.vocab_size};
  if (const std::string path = absl::GetFlag(FLAGS_logits_out); !path.empty()) {
    RETURN_IF_ERROR(glmserve::WriteNpy(path, logits_shape, result.logits.data()));
  }
  if (const std::string path = absl::GetFlag(FLAGS_compare_logits); !path.empty()) {
    ASSIGN_OR_RETURN(const bool within, Compare("logits", path, logits_shape, result.logits));
    ok &= within;
  }
  if (absl::GetFlag(FLAGS_hidden_out).empty() && absl::GetFlag(FLAGS_compare_hidden).empty()) {
    return ok;
  }
  std::vector<float> stacked;
  for (const auto& layer : result.layer_hidden)
    stacked.insert(stacked.end(), layer.begin(), layer.end());
  const std::vector<int64_t> hidden_shape = {static_cast<int64_t>(result.layer_hidden.size()),
                                             tokens, c.hidden_size};
  if (const std::string path = absl::GetFlag(FLAGS_hidden_out); !path.empty()) {
    RETURN_IF_ERROR(glmserve::WriteNpy(path, hidden_shape, stacked.data()));
  }
  if (const std::string path = absl::GetFlag(FLAGS_compare_hidden); !path.empty()) {
    ASSIGN_OR_RETURN(const bool within, Compare("hidden", path, hidden_shape, stacked));
    ok &= within;
  }
  return ok;
}

// --perplexity: the file's tokens scored window by window (core/engine/scoring.h).
absl::Status Perplexity(glmserve::ModelRunner& runner) {
  const std::string model = absl::GetFlag(FLAGS_model);
  ASSIGN_OR_RETURN(glmserve::TextAssets assets, glmserve::LoadTextAssets(model));
  if (assets.tokenizer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--perplexity needs the checkpoint's tokenizer.json in ", model));
  }
  ASSIGN_OR_RETURN(const std::string text,
                   glmserve::ReadRegularFile(absl::GetFlag(FLAGS_perplexity), uint64_t{16} << 20));
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids, assets.tokenizer->Encode(text));
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(const glmserve::TokenScores scores,
                   glmserve::ScoreTokens(runner, ids, absl::GetFlag(FLAGS_perplexity_window)));
  std::printf(
      "perplexity %.6f over %lld predicted tokens (mean nll %.8f nats, window %d) in "
      "%.2f s\n",
      scores.perplexity(), static_cast<long long>(scores.predicted), scores.mean_nll(),
      absl::GetFlag(FLAGS_perplexity_window), Seconds(t0, Clock::now()));
  return absl::OkStatus();
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  ASSIGN_OR_RETURN(const RunFlags f, ParseRunFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<glmserve::ModelRunner> runner, LoadRunner(f));
  if (runner == nullptr) return absl::OkStatus();  // --save
  if (!absl::GetFlag(FLAGS_perplexity).empty()) return Perplexity(*runner);
  const glmserve::ModelConfig& c = runner->config();
  const std::vector<int32_t>& prompt = f.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t total = n + f.max_new_tokens;
  const int64_t block_size = 16;
  ASSIGN_OR_RETURN(std::unique_ptr<glmserve::KvCache> cache,
                   runner->CreateCache((total + block_size - 1) / block_size, block_size));
  glmserve::BlockTable table;
  RETURN_IF_ERROR(cache->Reserve(&table, total));

  // Prefill: the whole prompt in one step.
  glmserve::ForwardOptions options;
  const bool all_rows =
      !absl::GetFlag(FLAGS_logits_out).empty() || !absl::GetFlag(FLAGS_compare_logits).empty();
  options.logits = all_rows ? glmserve::LogitsRows::kAll : glmserve::LogitsRows::kLast;
  options.return_layer_hidden =
      !absl::GetFlag(FLAGS_hidden_out).empty() || !absl::GetFlag(FLAGS_compare_hidden).empty();
  glmserve::ForwardBatch batch;
  batch.sequences = {{n, 0, &table}};
  batch.token_ids = prompt;
  glmserve::ForwardResult result;
  const auto t_prefill = Clock::now();
  RETURN_IF_ERROR(runner->Forward(batch, cache.get(), options, &result));
  const double prefill_s = Seconds(t_prefill, Clock::now());
  std::printf("prefill   %lld tokens in %.3f s (%.1f tokens/s)\n", static_cast<long long>(n),
              prefill_s, n / prefill_s);
  ASSIGN_OR_RETURN(const bool within_bounds, PromptOutputs(result, n, c));

  // Greedy decode, one token per step through the KV cache.
  std::vector<int32_t> generated;
  int32_t next =
      glmserve::ArgMaxRow(result.logits.data() + result.logits.size() - c.vocab_size, c.vocab_size);
  options = glmserve::ForwardOptions{};
  const auto t_decode = Clock::now();
  for (int step = 0; step < f.max_new_tokens; ++step) {
    generated.push_back(next);
    if (absl::GetFlag(FLAGS_stop_at_eos) &&
        std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end())
      break;
    if (step + 1 == f.max_new_tokens) break;
    batch.sequences = {{1, n + step, &table}};
    batch.token_ids = absl::MakeConstSpan(&next, 1);
    RETURN_IF_ERROR(runner->Forward(batch, cache.get(), options, &result));
    next = glmserve::ArgMaxRow(result.logits.data(), c.vocab_size);
  }
  const double decode_s = Seconds(t_decode, Clock::now());
  const int64_t steps = std::max<int64_t>(0, static_cast<int64_t>(generated.size()) - 1);
  std::printf("decode    %lld steps in %.3f s (%.1f tokens/s, %.2f ms/token)\n",
              static_cast<long long>(steps), decode_s, steps > 0 ? steps / decode_s : 0.0,
              steps > 0 ? 1e3 * decode_s / steps : 0.0);
  if (const std::string compute = runner->compute_description();
      runner->device_name() != "cpu" && !compute.empty()) {
    std::printf("compute   %s\n", compute.c_str());
  }
  std::printf("prompt    %s\n", absl::StrJoin(prompt, ",").c_str());
  std::printf("greedy    %s\n", absl::StrJoin(generated, ",").c_str());
  if (!within_bounds) {
    return absl::OutOfRangeError("a comparison exceeded --max_relative_error (see 'compare')");
  }
  return absl::OkStatus();
}

const glmserve::cli::ProgramHelp& Help() {
  static const glmserve::cli::ProgramHelp* help = new glmserve::cli::ProgramHelp{
      "glm-run",
      "runs a GLM-4.5-family model on prompt token ids (CPU or CUDA runner) and prints the "
      "greedy continuation",
      {"glm-run --model=glm-4.5-mini --prompt=151331,151333,9703 --max_new_tokens=16",
       "glm-run --model=/models/GLM-4.5-Air --prompt=1,2,3 --logits_out=/tmp/cpu.npy",
       "glm-run --model=/models/GLM-4.5-Air --prompt=1,2,3 --device=cuda "
       "--compare_logits=/tmp/cpu.npy --max_relative_error=3e-2",
       "glm-run --model=glm-4.5-air:layers=2 --save=/tmp/air2   # a checkpoint from a preset",
       "glm-run --model=models/glm-4.5-kjv --perplexity=tests/golden/kjv/heldout.txt "
       "--weight_dtype=fp8_block"},
      {{"Model", {"model", "seed", "dtype", "kv_cache_dtype"}},
       {"Runner", {"device", "threads", "cpu_math", "weight_dtype", "fp8_tensor_cores"}},
       {"Prompt and generation", {"prompt", "max_new_tokens", "stop_at_eos"}},
       {"Outputs", {"logits_out", "hidden_out", "save"}},
       {"Checking one runner against another",
        {"compare_logits", "compare_hidden", "max_relative_error"}},
       {"Scoring text (docs/quality.md)", {"perplexity", "perplexity_window"}}},
      "tools/glm_run.cc",
      ""};
  return *help;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> code = glmserve::cli::HandleHelpAndVersion(argc, argv, Help()))
    return *code;
  absl::SetProgramUsageMessage(
      "Runs a GLM-4.5-family model on prompt token ids and prints the greedy continuation.\n"
      "  glm-run --model=glm-4.5-mini --prompt=151331,151333,9703 --max_new_tokens=16");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "glm-run: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
