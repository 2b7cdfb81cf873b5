// Memory plans for a model cut across tensor-parallel ranks (docs/parallel_memory.md): what
// each rank of core/model/parallel_layout.h's layout holds, in bytes, and how the KV cache
// then fills D identical devices, one rank per device (D = the tensor-parallel size).
//
// Per rank:   budget    = device bytes x gpu_memory_fraction
//             KV bytes  = budget - the rank's weights - its activation arena - reserve
//             KV tokens = KV bytes / the rank's KV bytes per token, in whole blocks
// Instance:   KV tokens = the fewest any rank holds (every rank caches every token: its own KV
//             heads, or the whole latent row under MLA), so every rank allocates that many.
// Refused (RESOURCE_EXHAUSTED, naming the rank, every number and the shortfall) when a rank's
// weights, arena, reserve and min_kv_tokens of cache exceed its budget; INVALID_ARGUMENT when
// CheckParallelLayout refuses the cut.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/dtype.h"
#include "core/model/config.h"
#include "core/model/parallel_layout.h"
#include "core/model/weight_layout.h"

namespace glmserve {

// How the weights are stored on the device.
struct PlanWeightForm {
  DType dtype = DType::kBF16;  // the matrices that are not FP8
  bool fp8 = false;            // e4m3 codes with fp32 scales for the quantized matrices
  int64_t fp8_block = 0;       // 0: a scale per output row (per channel); else block x block
  // Which matrices are FP8: false, the released checkpoints' rule (all but the embedding,
  // heads, routers, eh_proj and GLM-5's indexer weights_proj: Fp8PresetKeepsUnquantized);
  // true, --weight_dtype=fp8_* converting a bf16 checkpoint at load (core/cpu/quantize.cc:
  // the slots marked linear except the heads, so GLM-5's latent attention stays bf16).
  bool converted_at_load = false;
  bool mtp = false;              // the MTP layer is loaded (num_nextn_predict_layers >= 1)
  bool mtp_head_stored = false;  // it has its own shared_head.head (else the model's head)

  // The FFN split unit parallel_layout.h asks for: the scale block, so a rank's slice of the
  // width holds whole blocks and its scales are its own; 1 when there is no block.
  int64_t width_unit() const { return fp8 && fp8_block > 0 ? fp8_block : 1; }
  // "bf16", "FP8 per-channel", "FP8 128x128 blocks"
  std::string Describe() const;
};

// The form of a preset's weights: bf16, or for an FP8 preset the released checkpoint's form
// (GLM-4.5: per-channel scales, GLM-5: 128x128 blocks; Fp8PresetScaleCount). The MTP layer is
// counted when the config has one (the released checkpoints store it), with the model's head.
PlanWeightForm PresetWeightForm(const ModelConfig& config, bool fp8);

// The part of one weight tensor a rank holds: rows x cols of the slot's [rows, cols] (a vector:
// rows only, cols {0, 1}); `whole_on_every_rank` for the replicated tensors (norms, routers,
// MLA's q_a/kv_a and indexer, eh_proj).
struct SlotSlice {
  IndexRange rows;
  IndexRange cols;
  bool whole_on_every_rank = false;
  bool empty() const { return rows.count == 0 || cols.count == 0; }
};
SlotSlice SliceOfSlot(const ModelConfig& config, const RankLayout& layout, const WeightSlot& slot);

// The bytes of a rank's weights, and of the part every rank holds identically (replicated
// tensors, and the per-channel scales of matrices split by columns: each rank keeps every row's
// scale).
struct RankWeightBytes {
  int64_t total = 0;
  int64_t replicated = 0;
};
RankWeightBytes RankWeights(const ModelConfig& config, const RankLayout& layout,
                            const PlanWeightForm& form);

// KV cache bytes per token on a rank over `cache_layers` layers: its KV heads' K and V (GQA;
// `fp8_kv`: a code per value and a 4-byte scale per token, kind and head, as the CUDA cache),
// or the whole latent row (MLA, replicated), bf16.
int64_t RankKvBytesPerToken(const ModelConfig& config, const RankLayout& layout,
                            int64_t cache_layers, bool fp8_kv = false);

// ActivationArenaBytes's estimate with the rank's sizes: its query and KV heads, its slices of
// the dense and shared widths, and its routed experts' width for up to top-k of the experts it
// holds (all top-k may route to one rank). The logits stay whole-vocabulary rows: the gathered
// row every rank samples from. Equal to ActivationArenaBytes at TP 1.
int64_t RankActivationArenaBytes(const ModelConfig& config, const RankLayout& layout,
                                 int64_t max_batch_tokens, int64_t max_running);

struct ParallelPlanRequest {
  int devices = 1;           // D identical devices, one rank each: D = tensor_parallel
  int64_t device_bytes = 0;  // each device's memory
  double gpu_memory_fraction = 0.9;
  bool expert_parallel = true;
  PlanWeightForm form;
  bool fp8_kv = false;    // --kv_cache_dtype=fp8_e4m3 (GQA only)
  bool mtp_cache = true;  // the MTP layer's KV cache layer (when form.mtp)
  int64_t max_batch_tokens = 2048;
  int64_t max_running = 64;
  int64_t block_size = 16;
  int64_t min_kv_tokens = 4096;
  int64_t reserve_bytes = int64_t{1} << 30;  // per device, as GpuMemoryRequest's
};

struct RankPlan {
  RankLayout layout;
  int64_t budget_bytes = 0;
  RankWeightBytes weights;
  int64_t activation_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t own_kv_tokens = 0;  // what this rank alone could cache (whole blocks)
  int64_t kv_bytes = 0;       // the instance's KV tokens on this rank
};

struct ParallelPlan {
  ParallelPlanRequest request;
  std::string layout;  // DescribeParallel
  std::vector<RankPlan> ranks;
  int64_t kv_tokens = 0;  // the instance's: the fewest any rank holds
  int64_t kv_blocks = 0;
  int limiting_rank = 0;
  int64_t TotalWeightBytes() const;
  // A table, one row per kind of rank (ranks with identical numbers share a row), then the
  // instance's KV tokens.
  std::string Describe() const;
};

absl::StatusOr<ParallelPlan> PlanParallelMemory(const ModelConfig& config,
                                                const ParallelPlanRequest& request);

// "8x80GB", "4x141GB", "2x80GiB", "8xH200" (143771 MiB each, kH200Bytes): a count of 1..1024 and
// one device's memory (GB = 1e9 bytes, GiB = 2^30; MB, MiB and TB likewise).
struct DeviceSpec {
  int count = 0;
  int64_t bytes = 0;
};
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

}  // namespace glmserve
