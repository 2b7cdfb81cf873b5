// GPU memory planning (host-side, testable without a GPU; docs/fp8.md): how a device's memory
// splits into the weights, the activation arena and the KV cache, vLLM-style.
//
// budget   = min(total x gpu_memory_fraction, free)   (what this process may use)
// kv bytes = budget - weights - activation arena - reserve
// kv tokens = kv bytes / (bytes per token over every layer), rounded down to whole blocks.
// The plan is refused (RESOURCE_EXHAUSTED, every number in the message) when the weights and
// the arena do not fit, or the KV cache would not hold min_kv_tokens (one sequence of the
// longest length the server accepts).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/base/dtype.h"
#include "core/model/config.h"

namespace glmserve {

struct GpuMemoryInfo {
  int64_t free_bytes = 0;   // cudaMemGetInfo's free, after the CUDA context exists
  int64_t total_bytes = 0;  // the device's memory
};

// The H200's memory as nvidia-smi reports it (143771 MiB), for plans made on the host.
inline constexpr int64_t kH200Bytes = int64_t{143771} << 20;

struct GpuMemoryRequest {
  double gpu_memory_fraction = 0.9;  // (0, 1]
  int64_t weight_bytes = 0;          // the weights as placed on the device
  int64_t activation_bytes = 0;      // the step's activation arena (ActivationArenaBytes)
  int64_t kv_bytes_per_token = 0;    // over every layer the device holds (KvBytesPerToken)
  int64_t block_size = 16;           // tokens per KV block
  int64_t min_kv_tokens = 0;         // refuse below this many KV tokens
  // cuBLAS workspaces, the sampler's buffers, allocator slack: kept free.
  int64_t reserve_bytes = int64_t{1} << 30;
};

struct GpuMemoryPlan {
  int64_t budget_bytes = 0;
  int64_t weight_bytes = 0;
  int64_t activation_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t kv_bytes = 0;  // kv_tokens x bytes per token
  int64_t kv_tokens = 0;
  int64_t kv_blocks = 0;
  // "budget 134.0 GB (0.90 of 150.8 GB, 150.0 GB free): weights 110.5 GB, activations ..."
  std::string Describe() const;
};

absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const GpuMemoryInfo& device,
                                            const GpuMemoryRequest& request);

// Bytes of the weights of `config` (all layers) as the loader places them, computed from the
// shapes without allocating: FP8 (e4m3 with fp32 per-channel scales) for the linear layers
// when `fp8`, else `dtype`; the embedding, routers and head in `dtype`; 1-D parameters fp32.
int64_t ModelWeightBytes(const ModelConfig& config, bool fp8, DType dtype = DType::kBF16);

// KV cache bytes per token over `layers` layers (bf16 values: 2 bytes each).
int64_t KvBytesPerToken(const ModelConfig& config, int64_t layers, int64_t bytes_per_value = 2);

// An upper estimate of one step's fp32 activations for up to `max_batch_tokens` tokens and
// `max_running` sequences: per token the residual stream, the norm output, q/k/v, the
// attention output, the routed experts' gate/up (top-k) or the dense FFN's, and the logits of
// each sequence's last token.
int64_t ActivationArenaBytes(const ModelConfig& config, int64_t max_batch_tokens,
                             int64_t max_running);

}  // namespace glmserve
