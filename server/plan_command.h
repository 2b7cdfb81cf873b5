// glm-server --plan (docs/parallel_memory.md): the memory plan of a model over a set of identical
// devices, one tensor-parallel rank each, from the model's config alone (a preset, or a
// checkpoint's config.json and tensor index: no weight is read).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace glmserve {

struct PlanCommandOptions {
  std::string model;               // a preset spec or a checkpoint directory
  std::string devices;             // "8x80GB", "4x141GB", "2xH200" (ParseDeviceSpec)
  int tensor_parallel = 0;         // 0: the device count (the only size planned: one rank a device)
  bool expert_parallel = true;     // routed experts whole per rank
  double gpu_memory_fraction = 0;  // 0: 0.9
  std::string weight_dtype = "stored";  // stored, fp8_channel or fp8_block (--weight_dtype)
  bool fp8_kv = false;                  // --kv_cache_dtype=fp8_e4m3
  bool mtp_cache = true;                // --mtp_draft_tokens != 0: the MTP layer's cache layer
  int64_t max_batch_tokens = 2048;
  int64_t max_running = 64;
  int64_t block_size = 16;
};

// The printed plan, or why not: INVALID_ARGUMENT for a bad option or a cut the layout refuses,
// RESOURCE_EXHAUSTED (with the numbers) when the model does not fit.
absl::StatusOr<std::string> PlanCommand(const PlanCommandOptions& options);

}  // namespace glmserve
