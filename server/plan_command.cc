#include "server/plan_command.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/model/config.h"
#include "core/model/fp8.h"
#include "core/model/parallel_plan.h"
#include "core/model/safetensors.h"

namespace glmserve {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The tensor names of a checkpoint: its index's weight_map, else the one file's header (read,
// not its data).
absl::StatusOr<std::vector<std::string>> TensorNames(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (std::ifstream(index).good()) {
    ASSIGN_OR_RETURN(const std::string text, ReadText(index));
    ASSIGN_OR_RETURN(const ShardIndex shards, ParseShardIndex(text, index));
    std::vector<std::string> names;
    for (const auto& [file, tensors] : shards)
      names.insert(names.end(), tensors.begin(), tensors.end());
    return names;
  }
  ASSIGN_OR_RETURN(const TensorStore store, TensorStore::OpenFile(dir + "/model.safetensors"));
  return store.Names();
}

struct PlannedModel {
  ModelConfig config;
  PlanWeightForm form;
  std::string source;  // "preset glm-4.5-fp8", "checkpoint DIR (fp8 128x128 blocks)"
};

absl::StatusOr<PlannedModel> ModelOf(const std::string& model) {
  PlannedModel m;
  if (!IsDirectory(model)) {
    ASSIGN_OR_RETURN(m.config, PresetConfig(model));
    m.form = PresetWeightForm(m.config, PresetIsFp8(model));
    m.source = absl::StrCat("preset ", model, " (the released checkpoint's shapes and form)");
    return m;
  }
  ASSIGN_OR_RETURN(const std::string json, ReadText(model + "/config.json"));
  ASSIGN_OR_RETURN(m.config, ParseConfigJson(json));
  ASSIGN_OR_RETURN(const Fp8Scheme scheme, ParseFp8Scheme(json));
  if (scheme.quantized()) {
    if (!scheme.per_channel() && scheme.block_rows != scheme.block_cols) {
      return absl::UnimplementedError(
          absl::StrCat("the planner takes square FP8 scale blocks; this checkpoint's are ",
                       scheme.block_rows, "x", scheme.block_cols));
    }
    m.form.fp8 = true;
    m.form.fp8_block = scheme.per_channel() ? 0 : scheme.block_rows;
  }
  // The MTP layer is loaded when the checkpoint stores it (core/model/checkpoint.cc).
  ASSIGN_OR_RETURN(const std::vector<std::string> names, TensorNames(model));
  const std::string mtp = absl::StrCat("model.layers.", m.config.num_hidden_layers, ".");
  const auto has = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  m.form.mtp = m.config.num_nextn_predict_layers >= 1 && has(mtp + "eh_proj.weight");
  m.form.mtp_head_stored = m.form.mtp && has(mtp + "shared_head.head.weight");
  m.source = absl::StrCat("checkpoint ", model,
                          scheme.quantized() ? absl::StrCat(" (", scheme.Describe(), ")") : "");
  return m;
}

}  // namespace

absl::StatusOr<std::string> PlanCommand(const PlanCommandOptions& o) {
  if (o.devices.empty()) {
    return absl::InvalidArgumentError("--plan needs --devices (e.g. --devices=8x80GB)");
  }
  ASSIGN_OR_RETURN(const DeviceSpec devices, ParseDeviceSpec(o.devices));
  if (o.tensor_parallel != 0 && o.tensor_parallel != devices.count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor_parallel=", o.tensor_parallel, " with --devices=", o.devices,
        ": the plan places one rank on each device, so the tensor-parallel size is the device "
        "count (",
        devices.count, ")"));
  }
  ASSIGN_OR_RETURN(PlannedModel m, ModelOf(o.model));
  if (o.weight_dtype == "fp8_channel" || o.weight_dtype == "fp8_block") {
    if (m.form.fp8) {
      return absl::InvalidArgumentError(
          absl::StrCat("--weight_dtype=", o.weight_dtype, ": the weights are FP8 already"));
    }
    m.form.fp8 = true;
    m.form.fp8_block = o.weight_dtype == "fp8_block" ? 128 : 0;
    m.form.converted_at_load = true;
  } else if (o.weight_dtype != "stored") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--weight_dtype=", o.weight_dtype,
        ": a GPU plan takes stored, fp8_channel or fp8_block (int8 is the CPU backend's)"));
  }
  ParallelPlanRequest q;
  q.devices = devices.count;
  q.device_bytes = devices.bytes;
  q.gpu_memory_fraction = o.gpu_memory_fraction == 0 ? 0.9 : o.gpu_memory_fraction;
  q.expert_parallel = o.expert_parallel;
  q.form = m.form;
  q.fp8_kv = o.fp8_kv;
  q.mtp_cache = o.mtp_cache;
  q.max_batch_tokens = o.max_batch_tokens;
  q.max_running = o.max_running;
  q.block_size = o.block_size;
  // As the server's own plan (server/main.cc): one sequence of up to 4096 positions.
  q.min_kv_tokens = std::min<int64_t>(m.config.max_position_embeddings, 4096);
  const absl::StatusOr<ParallelPlan> plan = PlanParallelMemory(m.config, q);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(m.source, ": ", plan.status().message()));
  }
  return absl::StrCat("model: ", m.source, "\n", DescribeConfig(m.config), "\n", plan->Describe());
}

}  // namespace glmserve
