// glm-run: run a GLM-4.5 model (checkpoint directory or preset with seeded random weights) on
// prompt token ids and print the greedy continuation with timings. Optionally writes the
// prompt's logits and each layer's hidden states as .npy files.
//
//   glm-run --model=glm-4.5-mini --prompt=151331,151333,9703 --max_new_tokens=16
//   glm-run --model=path/to/checkpoint --prompt=1,2,3 --logits_out=/tmp/logits.npy
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/npy.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/cpu/cpu_model.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"
#include "core/model/checkpoint.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, model, "glm-4.5-mini",
          "checkpoint directory (with config.json) or preset, e.g. glm-4.5-air:layers=2");
ABSL_FLAG(std::string, prompt, "151331,151333,9703,1435,11", "comma-separated prompt token ids");
ABSL_FLAG(int, max_new_tokens, 16, "greedy tokens to generate after the prompt");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights (presets only)");
ABSL_FLAG(std::string, dtype, "bf16", "dtype of random weights (presets only): bf16, f16, f32");
ABSL_FLAG(std::string, logits_out, "", "write the prompt's logits [tokens, vocab] to this .npy");
ABSL_FLAG(std::string, hidden_out, "",
          "write the residual stream after the embedding and each layer "
          "[layers + 1, tokens, hidden] to this .npy");
ABSL_FLAG(std::string, cpu_math, "exact",
          "linear-layer arithmetic: exact (fp32 activations), bf16 (activations rounded to "
          "bf16 for bf16 weights, vdpbf16ps order) or bf16_amx (the same rounding, Intel AMX "
          "tile order); see docs/cpu_math.md");
ABSL_FLAG(std::string, weight_dtype, "stored",
          "stored or int8 (linear layers quantized at load; needs --cpu_math=bf16 or bf16_amx)");
ABSL_FLAG(std::string, save, "",
          "write the loaded model (e.g. a preset's seeded random weights in --dtype) to this "
          "directory as a Hugging Face checkpoint (config.json + model.safetensors) and exit");
ABSL_FLAG(int, threads, 0, "worker threads (0: all cores, or GLM_NUM_THREADS)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "auto: fp32 KV cache; fp8_e4m3: e4m3 with a scale per token and KV head (GLM-4.5 "
          "only; docs/kv_cache.md)");
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

int32_t ArgMax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, ParseIds(absl::GetFlag(FLAGS_prompt)));
  ASSIGN_OR_RETURN(glmserve::DType dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  ASSIGN_OR_RETURN(const glmserve::CpuMath math,
                   glmserve::ParseCpuMath(absl::GetFlag(FLAGS_cpu_math)));
  ASSIGN_OR_RETURN(const glmserve::WeightQuant quant,
                   glmserve::ParseWeightQuant(absl::GetFlag(FLAGS_weight_dtype)));
  RETURN_IF_ERROR(glmserve::CheckWeightQuantMath(quant, math));
  ASSIGN_OR_RETURN(const glmserve::KvCacheDType kv_dtype,
                   glmserve::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype)));
  const int max_new = absl::GetFlag(FLAGS_max_new_tokens);
  if (max_new < 0) return absl::InvalidArgumentError("--max_new_tokens must be >= 0");

  const auto t_load = Clock::now();
  glmserve::RandomWeightOptions random;
  random.seed = absl::GetFlag(FLAGS_seed);
  random.dtype = dtype;
  absl::StatusOr<glmserve::ModelWeights> weights =
      glmserve::LoadModel(absl::GetFlag(FLAGS_model), glmserve::LayerSpan{}, random);
  if (!weights.ok()) return weights.status();
  if (const std::string dir = absl::GetFlag(FLAGS_save); !dir.empty()) {
    // Before any quantization: a checkpoint holds the weights as loaded.
    RETURN_IF_ERROR(glmserve::SaveCheckpoint(*weights, dir));
    std::printf("saved     %s (%.2f GB of %s weights) to %s in %.2f s\n",
                absl::GetFlag(FLAGS_model).c_str(), weights->ParameterBytes() / 1e9,
                std::string(glmserve::DTypeName(weights->weight_dtype)).c_str(), dir.c_str(),
                Seconds(t_load, Clock::now()));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(glmserve::QuantizeWeights(&*weights, quant));
  glmserve::CpuModel model(*std::move(weights), math);
  RETURN_IF_ERROR(model.SetKvCacheDType(kv_dtype));
  const glmserve::ModelConfig& c = model.config();
  std::printf("model     %s\n          %s\n          %.2f GB of weights (%s), loaded in %.2f s\n",
              absl::GetFlag(FLAGS_model).c_str(), glmserve::DescribeConfig(c).c_str(),
              model.weights().ParameterBytes() / 1e9,
              std::string(glmserve::DTypeName(model.weights().weight_dtype)).c_str(),
              Seconds(t_load, Clock::now()));
  std::printf("threads   %d, %s\n", glmserve::NumThreads(), model.compute_description().c_str());
  std::printf("kv cache  %s, %lld bytes per token\n", glmserve::KvCacheDTypeName(kv_dtype),
              static_cast<long long>(model.kv_bytes_per_token()));

  const int64_t total = static_cast<int64_t>(prompt.size()) + max_new;
  const int64_t block_size = 16;
  glmserve::KvCache cache(model.CacheShape((total + block_size - 1) / block_size, block_size));
  glmserve::BlockTable table;
  RETURN_IF_ERROR(cache.Reserve(&table, total));

  // Prefill: the whole prompt in one step.
  glmserve::ForwardOptions options;
  const bool want_prompt_logits = !absl::GetFlag(FLAGS_logits_out).empty();
  options.logits = want_prompt_logits ? glmserve::LogitsRows::kAll : glmserve::LogitsRows::kLast;
  options.return_layer_hidden = !absl::GetFlag(FLAGS_hidden_out).empty();
  glmserve::ForwardBatch batch;
  batch.sequences = {{static_cast<int64_t>(prompt.size()), 0, &table}};
  batch.token_ids = prompt;
  glmserve::ForwardResult result;
  const auto t_prefill = Clock::now();
  RETURN_IF_ERROR(model.Forward(batch, &cache, options, &result));
  const double prefill_s = Seconds(t_prefill, Clock::now());
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::printf("prefill   %lld tokens in %.3f s (%.1f tokens/s)\n", static_cast<long long>(n),
              prefill_s, n / prefill_s);

  if (want_prompt_logits) {
    if (absl::Status s = glmserve::WriteNpy(absl::GetFlag(FLAGS_logits_out), {n, c.vocab_size},
                                            result.logits.data());
        !s.ok())
      return s;
  }
  if (options.return_layer_hidden) {
    std::vector<float> stacked;
    for (const auto& layer : result.layer_hidden)
      stacked.insert(stacked.end(), layer.begin(), layer.end());
    const int64_t layers = static_cast<int64_t>(result.layer_hidden.size());
    if (absl::Status s = glmserve::WriteNpy(absl::GetFlag(FLAGS_hidden_out),
                                            {layers, n, c.hidden_size}, stacked.data());
        !s.ok())
      return s;
  }

  // Greedy decode, one token per step through the KV cache.
  std::vector<int32_t> generated;
  int32_t next = ArgMax(result.logits.data() + result.logits.size() - c.vocab_size, c.vocab_size);
  options = glmserve::ForwardOptions{};
  const auto t_decode = Clock::now();
  for (int step = 0; step < max_new; ++step) {
    generated.push_back(next);
    if (absl::GetFlag(FLAGS_stop_at_eos) &&
        std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end())
      break;
    if (step + 1 == max_new) break;
    batch.sequences = {{1, n + step, &table}};
    batch.token_ids = absl::MakeConstSpan(&next, 1);
    RETURN_IF_ERROR(model.Forward(batch, &cache, options, &result));
    next = ArgMax(result.logits.data(), c.vocab_size);
  }
  const double decode_s = Seconds(t_decode, Clock::now());
  const int64_t steps = std::max<int64_t>(0, static_cast<int64_t>(generated.size()) - 1);
  std::printf("decode    %lld steps in %.3f s (%.1f tokens/s, %.2f ms/token)\n",
              static_cast<long long>(steps), decode_s, steps > 0 ? steps / decode_s : 0.0,
              steps > 0 ? 1e3 * decode_s / steps : 0.0);
  std::printf("prompt    %s\n", absl::StrJoin(prompt, ",").c_str());
  std::printf("greedy    %s\n", absl::StrJoin(generated, ",").c_str());
  return absl::OkStatus();
}

const glmserve::cli::ProgramHelp& Help() {
  static const glmserve::cli::ProgramHelp* help = new glmserve::cli::ProgramHelp{
      "glm-run",
      "runs a GLM-4.5 model on prompt token ids and prints the greedy continuation",
      {"glm-run --model=glm-4.5-mini --prompt=151331,151333,9703 --max_new_tokens=16",
       "glm-run --model=/models/GLM-4.5-Air --prompt=1,2,3 --logits_out=/tmp/logits.npy",
       "glm-run --model=glm-4.5-air:layers=2 --save=/tmp/air2   # a checkpoint from a preset"},
      {{"Model",
        {"model", "seed", "dtype", "threads", "cpu_math", "weight_dtype", "kv_cache_dtype"}},
       {"Prompt and generation", {"prompt", "max_new_tokens", "stop_at_eos"}},
       {"Outputs", {"logits_out", "hidden_out", "save"}}},
      "tools/glm_run.cc",
      ""};
  return *help;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> code = glmserve::cli::HandleHelpAndVersion(argc, argv, Help()))
    return *code;
  absl::SetProgramUsageMessage(
      "Runs a GLM-4.5 model on prompt token ids and prints the greedy continuation.\n"
      "  glm-run --model=glm-4.5-mini --prompt=151331,151333,9703 --max_new_tokens=16");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "glm-run: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
