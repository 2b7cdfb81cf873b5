#include "core/model/gpu_memory_plan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/checkpoint.h"
#include "core/model/weight_layout.h"
#include "core/model/weights.h"

namespace glmserve {
namespace {

std::string Gb(int64_t bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

}  // namespace

std::string GpuMemoryPlan::Describe() const {
  return absl::StrCat("budget ", Gb(budget_bytes), ": weights ", Gb(weight_bytes), ", activations ",
                      Gb(activation_bytes), ", reserve ", Gb(reserve_bytes), ", KV cache ",
                      Gb(kv_bytes), " = ", kv_tokens, " tokens (", kv_blocks, " blocks)");
}

absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const GpuMemoryInfo& device,
                                            const GpuMemoryRequest& r) {
  if (!(r.gpu_memory_fraction > 0.0 && r.gpu_memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_memory_fraction=", r.gpu_memory_fraction, " must be in (0, 1]"));
  }
  if (device.total_bytes <= 0 || device.free_bytes < 0 || device.free_bytes > device.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("device memory: ", device.free_bytes,
                                                   " free of ", device.total_bytes, " bytes"));
  }
  if (r.weight_bytes < 0 || r.activation_bytes < 0 || r.reserve_bytes < 0 ||
      r.kv_bytes_per_token <= 0 || r.block_size <= 0 || r.min_kv_tokens < 0) {
    return absl::InvalidArgumentError("memory request: sizes must be >= 0 (per token, block > 0)");
  }
  GpuMemoryPlan p;
  const int64_t by_fraction = static_cast<int64_t>(
      std::floor(static_cast<double>(device.total_bytes) * r.gpu_memory_fraction));
  p.budget_bytes = std::min(by_fraction, device.free_bytes);
  p.weight_bytes = r.weight_bytes;
  p.activation_bytes = r.activation_bytes;
  p.reserve_bytes = r.reserve_bytes;
  const std::string budget_text = absl::StrCat(
      "the budget is ", Gb(p.budget_bytes), " (--gpu_memory_fraction=", r.gpu_memory_fraction,
      " of ", Gb(device.total_bytes), ", ", Gb(device.free_bytes), " free)");
  const int64_t fixed = r.weight_bytes + r.activation_bytes + r.reserve_bytes;
  const int64_t min_kv = r.min_kv_tokens * r.kv_bytes_per_token;
  if (fixed + min_kv > p.budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model does not fit this GPU: weights ", Gb(r.weight_bytes), " + activations ",
        Gb(r.activation_bytes), " + reserve ", Gb(r.reserve_bytes), " + KV cache for ",
        r.min_kv_tokens, " tokens ", Gb(min_kv), " = ", Gb(fixed + min_kv), ", but ", budget_text,
        "; split it over several GPUs (docs/fp8.md) or serve fewer layers"));
  }
  p.kv_blocks = (p.budget_bytes - fixed) / r.kv_bytes_per_token / r.block_size;
  p.kv_tokens = p.kv_blocks * r.block_size;
  p.kv_bytes = p.kv_tokens * r.kv_bytes_per_token;
  if (p.kv_tokens < r.min_kv_tokens || p.kv_tokens == 0) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV cache would hold ", p.kv_tokens,
                                                     " tokens, fewer than ", r.min_kv_tokens, ": ",
                                                     budget_text));
  }
  return p;
}

int64_t ModelWeightBytes(const ModelConfig& config, bool fp8, DType dtype) {
  ModelWeights w;
  PrepareWeights(config, 0, config.num_hidden_layers, &w);
  int64_t total = 0;
  for (const WeightSlot& slot : ListWeightSlots(&w)) {
    if (slot.vector != nullptr) {
      total += slot.shape[0] * int64_t{sizeof(float)};
    } else if (fp8 && !Fp8PresetKeepsUnquantized(config, slot.name)) {
      total += slot.shape[0] * slot.shape[1] +
               Fp8PresetScaleCount(config, slot.shape[0], slot.shape[1]) * int64_t{sizeof(float)};
    } else {
      total += slot.shape[0] * slot.shape[1] * DTypeSize(dtype);
    }
  }
  return total;
}

int64_t KvBytesPerToken(const ModelConfig& config, int64_t layers, int64_t bytes_per_value) {
  return layers * config.cache_values_per_token_layer() * bytes_per_value;
}

int64_t ActivationArenaBytes(const ModelConfig& c, int64_t max_batch_tokens, int64_t max_running) {
  const int64_t ffn = std::max(
      c.intermediate_size, c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts));
  const int64_t per_token =
      2 * c.hidden_size + c.q_dim() + 2 * c.kv_dim() + c.q_dim() + 2 * ffn + c.hidden_size;
  return (max_batch_tokens * per_token + max_running * c.vocab_size) * int64_t{sizeof(float)};
}

}  // namespace glmserve
