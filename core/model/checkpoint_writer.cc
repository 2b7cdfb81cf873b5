// SaveCheckpoint and ConfigToJson: ModelWeights out as a Hugging Face checkpoint directory.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/model/checkpoint.h"
#include "core/model/safetensors.h"
#include "core/model/safetensors_writer.h"
#include "core/model/weight_layout.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using Json = nlohmann::json;

const char* TorchDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF8E4M3:  // FP8 checkpoints: the dtype of the modules kept unquantized
    case DType::kF8E8M0:
      return "bfloat16";
  }
  return "bfloat16";
}

absl::Status MakeDirectories(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      path = dir.substr(0, i);
      if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot create directory ", path, ": ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

absl::Status ShapeError(const std::string& name, const std::vector<int64_t>& expected,
                        const std::vector<int64_t>& actual) {
  return absl::InvalidArgumentError(absl::StrCat("cannot save tensor '", name, "': holds ",
                                                 ShapeToString(actual), ", expected ",
                                                 ShapeToString(expected)));
}

// How FP8 weights are written (docs/fp8.md): per-channel scales as compressed-tensors
// (GLM-4.5-FP8's form), block scales as quant_method fp8 with weight_block_size. Every FP8
// matrix must share one scale layout; the dense linear layers are listed as kept unquantized.
struct Fp8Layout {
  bool any = false;
  bool per_channel = false;
  int64_t block_rows = 0, block_cols = 0;
  std::vector<std::string> unquantized;  // module names of the dense linear layers
};

absl::StatusOr<Fp8Layout> FindFp8Layout(ModelWeights* w) {
  Fp8Layout layout;
  for (const WeightSlot& slot : ListWeightSlots(w)) {
    if (slot.matrix == nullptr || slot.matrix->format != WeightFormat::kFp8Scaled) continue;
    const Matrix& m = *slot.matrix;
    const bool channel = m.scale_block_rows == 1 && m.scale_block_cols == m.cols;
    if (!layout.any) {
      layout = {true, channel, m.scale_block_rows, m.scale_block_cols, {}};
    } else if (channel != layout.per_channel ||
               (!channel && (m.scale_block_rows != layout.block_rows ||
                             m.scale_block_cols != layout.block_cols))) {
      return absl::UnimplementedError(
          absl::StrCat("cannot save '", slot.name, "': FP8 matrices with different scale layouts"));
    }
  }
  if (!layout.any) return layout;
  for (const WeightSlot& slot : ListWeightSlots(w)) {
    if (slot.matrix == nullptr || slot.matrix->format == WeightFormat::kFp8Scaled) continue;
    if (slot.name == "model.embed_tokens.weight") continue;                   // not a linear layer
    layout.unquantized.push_back(slot.name.substr(0, slot.name.size() - 7));  // less ".weight"
  }
  return layout;
}

Json Fp8QuantizationConfig(const Fp8Layout& l) {
  if (!l.per_channel) {
    return {{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {l.block_rows, l.block_cols}},
            {"modules_to_not_convert", l.unquantized}};
  }
  const Json weights = {{"num_bits", 8},
                        {"type", "float"},
                        {"symmetric", true},
                        {"strategy", "channel"},
                        {"dynamic", false}};
  const Json inputs = {{"num_bits", 8},
                       {"type", "float"},
                       {"symmetric", true},
                       {"strategy", "token"},
                       {"dynamic", true}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"kv_cache_scheme", nullptr},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", inputs},
              {"output_activations", nullptr}}}}},
          {"ignore", l.unquantized}};
}

// The tensors of the weights in checkpoint form: one per slot, or per layer for fused experts.
absl::StatusOr<std::vector<TensorToWrite>> CollectTensors(ModelWeights* w, bool fused,
                                                          const Fp8Layout& fp8) {
  std::vector<TensorToWrite> out;
  // layer -> (gate_up pieces, down pieces), in expert order.
  std::map<int64_t, TensorToWrite> gate_up, down;
  const ModelConfig& c = w->config;
  for (const WeightSlot& slot : ListWeightSlots(w)) {
    if (slot.vector != nullptr) {
      const std::vector<int64_t> actual = {static_cast<int64_t>(slot.vector->size())};
      if (actual != slot.shape) return ShapeError(slot.name, slot.shape, actual);
      out.push_back({slot.name, DType::kF32, slot.shape, {{slot.vector->data(), actual[0] * 4}}});
      continue;
    }
    const Matrix& m = *slot.matrix;
    const std::vector<int64_t> actual = {m.rows, m.cols};
    if (m.empty() || actual != slot.shape) return ShapeError(slot.name, slot.shape, actual);
    if (m.format == WeightFormat::kFp8Scaled) {
      // Codes, then the fp32 scales under the form's name.
      out.push_back({slot.name, DType::kF8E4M3, slot.shape, {{m.data, m.rows * m.cols}}});
      const std::string module = slot.name.substr(0, slot.name.size() - 7);
      out.push_back({module + (fp8.per_channel ? ".weight_scale" : ".weight_scale_inv"),
                     DType::kF32,
                     {m.scale_rows(), m.scale_cols()},
                     {{m.scales, m.scale_rows() * m.scale_cols() * int64_t{sizeof(float)}}}});
      continue;
    }
    if (!fused || slot.expert < 0) {
      out.push_back({slot.name, m.dtype, slot.shape, {{m.data, m.bytes()}}});
      continue;
    }
    const std::string prefix = LayerPrefix(slot.layer) + "mlp.experts.";
    const int64_t width = c.moe_intermediate_size, n = c.n_routed_experts;
    TensorToWrite& t = slot.part == ExpertPart::kDown ? down[slot.layer] : gate_up[slot.layer];
    if (t.name.empty()) {
      if (slot.part == ExpertPart::kDown) {
        t = {prefix + "down_proj", m.dtype, {n, c.hidden_size, width}, {}};
      } else {
        t = {prefix + "gate_up_proj", m.dtype, {n, 2 * width, c.hidden_size}, {}};
      }
    }
    if (t.dtype != m.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot fuse experts of layer ", slot.layer, ": mixed dtypes"));
    }
    // Slots come gate, up, down per expert: appending keeps [gate_e; up_e] row blocks.
    t.pieces.push_back({m.data, m.bytes()});
  }
  for (auto* fused_map : {&gate_up, &down}) {
    for (auto& [layer, t] : *fused_map) out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

std::string ConfigToJson(const ModelConfig& c, DType dtype) {
  Json j = {
      {"architectures", {c.is_mla() ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM"}},
      {"rope_scaling", nullptr},
      {"torch_dtype", TorchDTypeName(dtype)},
  };
  // Each architecture's config.json carries its own fields only.
  const ConfigField::Arch other = c.is_mla() ? ConfigField::Arch::kGlm45 : ConfigField::Arch::kGlm5;
  ForEachConfigField(c, [&](const ConfigField& f, const auto& member) {
    if (f.arch != other) j[f.key()] = member;
  });
  // GLM-5's head_dim is derived (= qk_rope_head_dim) and its RoPE spans it all.
  if (c.is_mla()) j.erase("head_dim");
  // "None" is spelled by leaving the key out, as Transformers writes it.
  if (c.eos_token_ids.empty()) j.erase("eos_token_id");
  if (c.pad_token_id < 0) j.erase("pad_token_id");
  return j.dump(2) + "\n";
}

absl::Status SaveCheckpoint(const ModelWeights& weights, const std::string& dir,
                            const SaveCheckpointOptions& options) {
  if (weights.linear_format == WeightFormat::kInt8Groups) {
    return absl::FailedPreconditionError(
        "weights quantized at load cannot be saved as a checkpoint; save before quantizing");
  }
  if (!weights.device_generated_fp8.empty()) {
    return absl::FailedPreconditionError(
        "an FP8 preset generated for the device has no host codes to save; load it without "
        "--device=cuda to save it");
  }
  RETURN_IF_ERROR(ValidateConfig(weights.config));
  // Slots point into the weights they list; a shallow copy (views and small vectors) keeps
  // `weights` const.
  ModelWeights copy = weights;
  ASSIGN_OR_RETURN(const Fp8Layout fp8, FindFp8Layout(&copy));
  if (fp8.any && options.fused_experts) {
    return absl::UnimplementedError("FP8 checkpoints are written with per-expert tensors only");
  }
  ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors,
                   CollectTensors(&copy, options.fused_experts, fp8));
  RETURN_IF_ERROR(MakeDirectories(dir));
  std::string config_text = ConfigToJson(weights.config, weights.weight_dtype);
  if (fp8.any) {
    Json j = Json::parse(config_text);
    j["quantization_config"] = Fp8QuantizationConfig(fp8);
    config_text = j.dump(2) + "\n";
  }
  RETURN_IF_ERROR(WriteTextFile(dir + "/config.json", config_text));
  // A leftover file of the other layout would shadow or confuse the new one on load.
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::remove(options.max_shard_bytes <= 0 ? index_path.c_str() : single.c_str());
  if (options.max_shard_bytes <= 0) return WriteSafetensors(single, tensors);

  // Greedy sharding in slot order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<TensorToWrite>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (TensorToWrite& t : tensors) {
    int64_t bytes = 0;
    for (const ByteRange& r : t.pieces) bytes += r.size;
    if (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shard_bytes += bytes;
    total += bytes;
    shards.back().push_back(std::move(t));
  }
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    RETURN_IF_ERROR(WriteSafetensors(dir + "/" + file, shards[i]));
    for (const TensorToWrite& t : shards[i]) weight_map[t.name] = file;
  }
  Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteTextFile(index_path, index.dump(2) + "\n");
}

}  // namespace glmserve
