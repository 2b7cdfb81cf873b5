// FP8 checkpoints: the quantization_config of config.json, read once per load, and what it
// says about each linear layer (docs/fp8.md records the released configs' exact fields).
//
// Two forms are accepted, each only as the released checkpoints write it; anything else is
// refused naming the field and the value:
//  * compressed-tensors (GLM-4.5-FP8, GLM-4.5-Air-FP8): quant_method "compressed-tensors",
//    format "float-quantized", one config group targeting "Linear" whose weights are 8-bit
//    float, symmetric, static, strategy "channel" (a `weight_scale` [out, 1] per matrix) or
//    "block" (`weight_scale` [ceil(out / br), ceil(in / bc)] with block_structure [br, bc]);
//    input activations absent or dynamic (per token or per group); the `ignore` list names the
//    modules kept unquantized (exact names or "re:" regular expressions).
//  * block-scaled fp8 (DeepSeek-V3, GLM-5-FP8, Transformers' FineGrainedFP8Config):
//    quant_method "fp8", fmt "e4m3", activation_scheme "dynamic", weight_block_size [br, bc],
//    a `weight_scale_inv` [ceil(out / br), ceil(in / bc)] per matrix (fp32, or UE8M0 stored
//    as F8_E8M0 or as fp32 powers of two when scale_fmt is "ue8m0"); modules_to_not_convert /
//    ignored_layers name the modules kept unquantized.
// Either way the weight is e4m3 x its scale (a multiplier, despite the name weight_scale_inv).
// Activation quantization is the GPU's business: the CPU multiplies fp32 activations by the
// exactly widened weights, i.e. computes the dequantized model (the goldens' reference).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace glmserve {

struct Fp8Scheme {
  enum class Kind : uint8_t { kNone, kCompressedTensors, kBlockFp8 };
  Kind kind = Kind::kNone;
  // Scale block: br x bc elements of the weight share one scale; per channel: br = 1 and
  // bc = 0, meaning the whole row.
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  bool ue8m0 = false;                      // scales must be powers of two (scale_fmt "ue8m0")
  std::vector<std::string> keep_names;     // modules kept unquantized, by name
  std::vector<std::string> keep_patterns;  // compressed-tensors "re:" entries, without "re:"

  bool quantized() const { return kind != Kind::kNone; }
  bool per_channel() const { return block_cols == 0; }
  // "weight_scale" (compressed-tensors) or "weight_scale_inv" (fp8).
  const char* scale_suffix() const;
  // "compressed-tensors per-channel", "fp8 128x128 blocks", ...
  std::string Describe() const;
  // Whether the checkpoint keeps `module` (e.g. "model.layers.3.mlp.gate") unquantized.
  bool KeepsUnquantized(const std::string& module) const;
};

// config.json's text to its scheme: kNone without a quantization_config (or null).
// INVALID_ARGUMENT for malformed fields; UNIMPLEMENTED naming any other quant_method, format,
// strategy or activation scheme.
absl::StatusOr<Fp8Scheme> ParseFp8Scheme(absl::string_view config_json);

// Bounds: a block side and the ignore list (a hostile config cannot make the loader spend
// time or memory on them).
inline constexpr int64_t kMaxFp8BlockSide = 1 << 16;
inline constexpr size_t kMaxFp8IgnoreEntries = 1 << 16;

}  // namespace glmserve
