// Loading ModelWeights: from a Hugging Face checkpoint directory (config.json plus
// safetensors, single file or sharded) or from a preset with seeded random weights.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/dtype.h"
#include "core/model/config.h"
#include "core/model/weight_check.h"
#include "core/model/weights.h"

namespace glmserve {

struct LayerSpan {
  int64_t begin = 0;
  int64_t end = -1;  // -1: through the last layer
};

// The span with end = -1 replaced by num_hidden_layers; an error unless
// 0 <= begin < end <= num_hidden_layers.
absl::StatusOr<LayerSpan> ResolveLayerSpan(const ModelConfig& config, LayerSpan span);

// Reads `dir`/config.json and the safetensors it names. Only layers [span.begin, span.end)
// are mapped (with the embedding when begin is 0, final norm and lm_head when end is the
// last layer). Every tensor of the span must be present with the right shape; a tensor the
// loader does not recognise is an error naming it, except the MTP layer(s) (index
// num_hidden_layers and up): with the whole model, the first one is loaded into
// ModelWeights::mtp when the checkpoint stores it (docs/mtp.md); otherwise they are skipped.
// Accepts per-expert and fused
// (`mlp.experts.gate_up_proj` / `mlp.experts.down_proj`) expert tensors.
//
// With `progress`, the bytes of every tensor the span uses are also read once before
// returning (the files are memory-mapped: without this, a 200 GB checkpoint loads "instantly"
// and its reading happens in page faults during the first requests, invisibly), and
// `progress` is called as the read advances: once at 0, after about every 64 MiB, and once at
// the end with bytes_done == bytes_total.
struct LoadProgress {
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  int64_t tensors_done = 0;
  int64_t tensors_total = 0;
  double seconds = 0;  // since the read began
};
using LoadProgressCallback = std::function<void(const LoadProgress&)>;
// "12.3 of 213.7 GB (5.8%), 1.52 GB/s, ETA 2m15s" (rate and ETA once measurable).
std::string DescribeLoadProgress(const LoadProgress& progress);

absl::StatusOr<ModelWeights> LoadCheckpoint(const std::string& dir, LayerSpan span = {},
                                            const LoadProgressCallback& progress = nullptr);

// Seeded random weights for a config, HF-like init (normal, std 0.02; norm gains 1; biases
// and correction bias 0), bit-identical on every machine for the same seed and dtype.
// Each tensor's values depend only on (seed, its HF name, element index), so a span's weights
// equal the same layers of the whole model, and a saved-then-loaded copy is identical.
struct RandomWeightOptions {
  uint64_t seed = 0;
  DType dtype = DType::kBF16;  // dtype of the large matrices
  double stddev = 0.02;
  // FP8 presets for the CUDA backend: the e4m3 codes are not generated (nor allocated) on the
  // host; each FP8 matrix keeps its shape and scales with null data and is listed in
  // ModelWeights::device_generated_fp8, and the CUDA uploader generates its codes on the
  // device, bit for bit the host's (so a 110 GB preset needs no host copy). Only the CUDA
  // runner accepts such weights.
  bool fp8_codes_on_device = false;
  // Also the MTP layer (docs/mtp.md; the whole model only), its tensors seeded by name as
  // every other.
  bool mtp = false;
};
// FP8 presets (docs/fp8.md): whether the matrix `name` stays bf16 (embedding, head, routers,
// and GLM-5's indexer weights_proj), and how many fp32 scales an FP8 matrix [rows, cols] has
// (one per row for GLM-4.5's per-channel form, one per 128x128 block for GLM-5's).
bool Fp8PresetKeepsUnquantized(const ModelConfig& config, const std::string& name);
int64_t Fp8PresetScaleCount(const ModelConfig& config, int64_t rows, int64_t cols);
inline constexpr int64_t kFp8PresetBlock = 128;  // GLM-5 presets' scale block side

// What RandomWeights fills an FP8 matrix named `name` with, for generators elsewhere (the
// device, core/cuda/kernels.h's LaunchRandomFp8): element i is FloatToE4m3(v * value_scale)
// where v = (sum of the four 16-bit fields of Mix64(key + (i + 1) * 0x9e3779b97f4a7c15))
// - 2 * 65535, and every row's scale is `fp8_scale`.
struct RandomFp8Stream {
  uint64_t key = 0;
  float value_scale = 0;
  float fp8_scale = 0;
};
RandomFp8Stream RandomFp8StreamFor(const std::string& name, const RandomWeightOptions& options);

absl::StatusOr<ModelWeights> RandomWeights(const ModelConfig& config,
                                           const RandomWeightOptions& options = {},
                                           LayerSpan span = {});

struct LoadOptions {
  // NaN/Inf check of a checkpoint's weights (core/model/weight_check.h); presets are finite by
  // construction and not checked.
  VerifyWeights verify = VerifyWeights::kAuto;
  // Set: the checkpoint's bytes are read up front with progress reports (see LoadCheckpoint).
  LoadProgressCallback progress;
};

// A model directory (contains config.json) or a preset spec ("glm-4.5-air:layers=2").
// `load_options.progress` applies to checkpoint directories; presets ignore it.
absl::StatusOr<ModelWeights> LoadModel(const std::string& dir_or_preset, LayerSpan span = {},
                                       const RandomWeightOptions& random_options = {},
                                       const LoadOptions& load_options = {});

// config.json text for a config (model_type glm4_moe, legacy top-level rope fields); `dtype`
// becomes torch_dtype. ParseConfigJson of the result gives back the same config.
std::string ConfigToJson(const ModelConfig& config, DType dtype = DType::kBF16);

struct SaveCheckpointOptions {
  // Write routed experts as mlp.experts.gate_up_proj [E, 2I, hidden] and
  // mlp.experts.down_proj [E, hidden, I] instead of one tensor per expert matrix.
  bool fused_experts = false;
  // > 0: split into model-0000i-of-0000N.safetensors shards of at most about this many bytes
  // (a tensor is never split) plus model.safetensors.index.json; 0: one model.safetensors.
  int64_t max_shard_bytes = 0;
};

// Writes `weights` as a Hugging Face checkpoint directory (created if needed): config.json and
// safetensors, matrices in their stored dtype, 1-D parameters as F32. A span writes only its
// own tensors (LoadCheckpoint then loads it with the same span).
absl::Status SaveCheckpoint(const ModelWeights& weights, const std::string& dir,
                            const SaveCheckpointOptions& options = {});

}  // namespace glmserve
